"""Pure reading of SGLang's Prometheus text (``GET /metrics`` of a server started with
``--enable-metrics``; SGLang 0.5.23 ``srt/observability/metrics_collector.py``, reference
``sglang-0.5.23-ops.md`` §4.2) into the few numbers ``watch`` re-exports per target."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

#: SGLang sample names (the parser gives counters with their ``_total`` suffix).
RUNNING = "sglang:num_running_reqs"
QUEUED = "sglang:num_queue_reqs"
GENERATED = "sglang:generation_tokens_total"
TOKEN_USAGE = "sglang:token_usage"
TRANSFER_FAILED = ("sglang:num_transfer_failed_reqs_total", "sglang:num_bootstrap_failed_reqs_total")


@dataclass(frozen=True)
class ServerGauges:
    """One server's load as ``watch`` exports it: ``running`` and ``queued`` requests (summed over
    the ranks that export), ``generated`` tokens (a counter value, summed), ``token_usage`` (KV
    pool fraction in use, 0..1, the largest rank's; None when not exported), ``transfer_failed``
    (PD transfer + bootstrap failures, a counter value)."""

    running: float = 0.0
    queued: float = 0.0
    generated: float = 0.0
    token_usage: Optional[float] = None
    transfer_failed: float = 0.0


def parse_sglang(text: str) -> ServerGauges:
    """:class:`ServerGauges` of one ``/metrics`` body. ValueError when the text is not the
    Prometheus text format (prometheus_client's parser decides)."""
    from prometheus_client.parser import text_string_to_metric_families
    sums: dict[str, float] = {}
    usage: Optional[float] = None
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == TOKEN_USAGE:
                    usage = float(s.value) if usage is None else max(usage, float(s.value))
                elif s.name in (RUNNING, QUEUED, GENERATED) or s.name in TRANSFER_FAILED:
                    sums[s.name] = sums.get(s.name, 0.0) + float(s.value)
    except (ValueError, IndexError, TypeError, KeyError) as e:
        raise ValueError(f"not Prometheus text: {e}") from None
    return ServerGauges(running=sums.get(RUNNING, 0.0), queued=sums.get(QUEUED, 0.0),
                        generated=sums.get(GENERATED, 0.0), token_usage=usage,
                        transfer_failed=sum(sums.get(n, 0.0) for n in TRANSFER_FAILED))
