"""The metrics ``dsv4ctl watch`` serves on its own ``/metrics`` (prometheus_client), names and
labels in one place: the rules (:mod:`.rules`), the dashboard and the docs use these names.

Labels: ``target`` is the group probed (a router group, a server group, or ``G#R`` for replica R
of a multi-node group); ``role`` its role (``router``, ``server``; prefill and decode servers of a
PD pair are probed through their router and only scraped); ``release`` the release id active on
the target's node-0 host (``unknown`` until read); ``class`` a classifier class
(:data:`dsv4ctl.check.classify.CLASSES`).

Bounded memory: label sets of a release that has not been active for :data:`RELEASE_KEEP`
release reads are removed (a watch that runs for months through many deploys keeps a fixed
number of series per target).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily

# No ``*_created`` series beside every counter and histogram (prometheus_client's default): they
# doubled the series a watch serves and nothing reads them (process-wide; watch runs alone).
disable_created_metrics()

PREFIX = "dsv4ctl_watch_"

PROBES = PREFIX + "probes_total"
"""Counter {target, role, release}: probes judged (any class)."""
CORRUPTED = PREFIX + "probes_corrupted_total"
"""Counter {target, role, release, class}: probes the classifier judged corrupted (every class
but ``http_error`` and ``stuck``)."""
FAILED = PREFIX + "probes_failed_total"
"""Counter {target, role, release, class}: probes with no judged answer: ``http_error`` (HTTP or
protocol error, connection refused or reset), ``pd_transfer_failed`` / ``pd_bootstrap_failed`` /
``pd_aborted`` (SGLang's PD abort of a request whose KV transfer or bootstrap failed, or that an
``AbortReq`` cancelled), ``stuck`` (no progress within the stall timeout), ``auth_refused`` and
``client_error`` (this machine's side: :data:`dsv4ctl.watch.model.FAILED_CLASSES`)."""
STUCK_NOW = PREFIX + "probes_stuck"
"""Gauge {target}: 1 while the target is stuck: a probe in flight longer than the stall timeout,
or its last finished probe ended ``stuck`` (no progress within the stall timeout) and none has
finished since; else 0."""
TTFT = PREFIX + "probe_ttft_seconds"
"""Histogram {target, role, release}: time to first streamed token of streaming probes."""
E2E = PREFIX + "probe_duration_seconds"
"""Histogram {target, role, release}: probe request to complete answer (a release's latency
beside the one before it; dropped with the release's other series)."""
RELEASE = PREFIX + "release"
"""Gauge {target, host, release, state} = 1: the release active on the target's node-0 host and
its recorded state (``active``: health gate passed, not promoted; ``good``: promoted;
``failed``). One series per target; it follows deploys and rollbacks."""
RELEASE_READ_ERRORS = PREFIX + "release_read_errors_total"
"""Counter {host}: failed reads of a host's active release (SSH)."""
SCRAPE_UP = PREFIX + "scrape_up"
"""Gauge {target, source}: 1 when the last ``/metrics`` scrape of the target worked (source
``sglang`` or ``gateway``), else 0."""
SGLANG_RUNNING = PREFIX + "sglang_running_requests"
"""Gauge {target}: ``sglang:num_running_reqs`` summed over the target's ranks."""
SGLANG_QUEUED = PREFIX + "sglang_queued_requests"
"""Gauge {target}: ``sglang:num_queue_reqs`` summed over ranks."""
SGLANG_GENERATED = PREFIX + "sglang_generation_tokens_total"
"""Counter {target}: ``sglang:generation_tokens_total`` summed over ranks, re-exported as the
counter it is (``rate()`` of it is the generation throughput; it falls when the server restarts,
which ``rate()``/``increase()`` read as a counter reset). Named ``..._generation_tokens`` and typed
gauge before issue 45."""
SGLANG_TOKEN_USAGE = PREFIX + "sglang_token_usage"
"""Gauge {target}: ``sglang:token_usage`` (KV pool fraction in use, 0..1), the largest over ranks."""
SGLANG_TRANSFER_FAILED = PREFIX + "sglang_transfer_failed_requests_total"
"""Counter {target}: ``sglang:num_transfer_failed_reqs_total`` + ``sglang:num_bootstrap_failed_reqs_total``
(PD KV transfer failures as SGLang counts them; a counter, reset when the server restarts)."""
GATEWAY_RETRIES = PREFIX + "gateway_retries_total"
"""Counter {target, worker_type}: the PD gateway's ``smg_worker_retries_total`` summed per worker
type (sglang-router and smg; a counter, reset when the gateway restarts): attempts it re-sent,
which the client and the probes see as ok (a gateway that retries hides failures from the
corruption rate)."""
GATEWAY_RETRIES_EXHAUSTED = PREFIX + "gateway_retries_exhausted_total"
"""Counter {target, worker_type}: ``smg_worker_retries_exhausted_total`` (requests that failed
after the gateway's last retry)."""
GATEWAY_CIRCUIT_OPEN = PREFIX + "gateway_circuit_open"
"""Gauge {target}: workers whose circuit breaker the gateway holds open or half-open
(``smg_worker_cb_state`` not 0): it sends them nothing."""
ROUNDS = PREFIX + "rounds_total"
"""Counter: probe rounds started."""
INTERNAL_ERRORS = PREFIX + "internal_errors_total"
"""Counter: unexpected exceptions inside watch's loops (each is also an event; the loop goes on)."""
ALERT_ACTIONS = PREFIX + "alert_actions_total"
"""Counter {alert, runbook, outcome}: ``--on-alert`` runbook runs (outcome ``completed`` /
``failed`` with ``--auto``; ``dry_run``, ``dry_run_would_stop`` or ``failed`` without (see
:func:`dsv4ctl.watch.run.action_outcome`); ``skipped_lock`` (a host's deploy lock held or not
read), ``interrupted`` (watch stopped while it ran))."""

RELEASE_KEEP = 8
"""Releases per target whose probe series are kept after they stop being active."""

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class _Value:
    """One labelled series of an :class:`UpstreamCounter` (``set``)."""

    def __init__(self, values: dict, key: tuple) -> None:
        self._values, self._key = values, key

    def set(self, value: float) -> None:
        """The upstream counter's current value (as read; a fall is the upstream's reset)."""
        self._values[self._key] = float(value)


class UpstreamCounter:
    """A counter another process counts (SGLang, the PD gateway) re-exported with its value as
    read: served with ``# TYPE ... counter`` and the ``_total`` name, so ``rate()`` and
    ``increase()`` apply and a fall (the upstream restarted) reads as a counter reset.
    prometheus_client's :class:`Counter` can only be incremented, so this is a collector of
    its own. ``name`` ends in ``_total``; ``labels(*values).set(v)`` like a Gauge; ``remove``."""

    def __init__(self, name: str, documentation: str, labelnames: list[str], registry: CollectorRegistry) -> None:
        if not name.endswith("_total"):
            raise ValueError(f"counter {name!r}: the name of a counter ends in _total")
        self.name, self.documentation, self.labelnames = name, documentation, tuple(labelnames)
        self._values: dict[tuple, float] = {}
        registry.register(self)

    def labels(self, *values: str) -> _Value:
        """The series of these label values (in ``labelnames`` order)."""
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values!r}")
        return _Value(self._values, tuple(str(v) for v in values))

    def remove(self, *values: str) -> None:
        """Drop the series of these label values (nothing when it is not there)."""
        self._values.pop(tuple(str(v) for v in values), None)

    def describe(self):
        """The family, empty (registration checks names without collecting)."""
        return [CounterMetricFamily(self.name[:-6], self.documentation, labels=self.labelnames)]

    def collect(self):
        """One counter family with every series set so far."""
        fam = CounterMetricFamily(self.name[:-6], self.documentation, labels=self.labelnames)
        for key, v in sorted(self._values.items()):
            fam.add_metric(list(key), v)
        return [fam]


class WatchMetrics:
    """Every metric of one watch process in its own registry (no process/platform collectors
    other than prometheus_client's defaults are added; tests build several in one process)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.probes = Counter(PROBES[:-6], "Known-answer probes judged.", ["target", "role", "release"], registry=r)
        self.corrupted = Counter(CORRUPTED[:-6], "Probes judged corrupted, by class.",
                                 ["target", "role", "release", "class"], registry=r)
        self.failed = Counter(FAILED[:-6], "Probes without a judged answer (http_error, pd_transfer_failed, pd_bootstrap_failed, pd_aborted, stuck, auth_refused, client_error).",
                              ["target", "role", "release", "class"], registry=r)
        self.stuck_now = Gauge(STUCK_NOW, "Probes in flight longer than the stall timeout.", ["target"], registry=r)
        self.ttft = Histogram(TTFT, "Time to first token of streaming probes.", ["target", "role", "release"],
                              buckets=TTFT_BUCKETS, registry=r)
        self.e2e = Histogram(E2E, "Probe end to end latency.", ["target", "role", "release"], buckets=E2E_BUCKETS,
                             registry=r)
        self.release = Gauge(RELEASE, "Release active on the target's node-0 host (value 1).",
                             ["target", "host", "release", "state"], registry=r)
        self.release_errors = Counter(RELEASE_READ_ERRORS[:-6], "Failed reads of a host's active release.",
                                      ["host"], registry=r)
        self.scrape_up = Gauge(SCRAPE_UP, "Last /metrics scrape of the target worked.", ["target", "source"],
                               registry=r)
        self.running = Gauge(SGLANG_RUNNING, "sglang:num_running_reqs summed over ranks.", ["target"], registry=r)
        self.queued = Gauge(SGLANG_QUEUED, "sglang:num_queue_reqs summed over ranks.", ["target"], registry=r)
        self.generated = UpstreamCounter(SGLANG_GENERATED, "sglang:generation_tokens_total summed over ranks.",
                                         ["target"], registry=r)
        self.token_usage = Gauge(SGLANG_TOKEN_USAGE, "sglang:token_usage, the largest over ranks.", ["target"],
                                 registry=r)
        self.gw_retries = UpstreamCounter(GATEWAY_RETRIES, "PD gateway retries (smg_worker_retries_total).",
                                          ["target", "worker_type"], registry=r)
        self.gw_exhausted = UpstreamCounter(GATEWAY_RETRIES_EXHAUSTED, "PD gateway requests failed after the last "
                                            "retry (smg_worker_retries_exhausted_total).", ["target", "worker_type"],
                                            registry=r)
        self.gw_open = Gauge(GATEWAY_CIRCUIT_OPEN, "Workers whose gateway circuit breaker is open (smg_worker_cb_state != 0).",
                             ["target"], registry=r)
        self.transfer_failed = UpstreamCounter(SGLANG_TRANSFER_FAILED, "SGLang PD transfer + bootstrap failures.",
                                               ["target"], registry=r)
        self.rounds = Counter(ROUNDS[:-6], "Probe rounds started.", registry=r)
        self.internal_errors = Counter(INTERNAL_ERRORS[:-6], "Unexpected exceptions inside watch's loops.", registry=r)
        self.alert_actions = Counter(ALERT_ACTIONS[:-6], "--on-alert runbook runs.", ["alert", "runbook", "outcome"],
                                     registry=r)
