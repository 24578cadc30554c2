"""STAND-IN SGLang 0.5.23 / DeepSeek-V4 HTTP server (aiohttp) for tests, benchmarks and launcher
dry runs. Not SGLang: no model runs. A scripted model (:mod:`tests.standin.model`) writes raw
DeepSeek-V4 text; the text becomes token IDs with the DeepSeek-V4 tokenizer and goes through SGLang
0.5.23's own ``DeepSeekRecipeOutputParser`` and PyPI ``deepseek-recipe``'s ``StreamProcessor``
(:mod:`tests.standin.served`), framed into JSON / SSE the way ``serving_chat`` and
``token_output_sse_chunks`` frame it. Corruption is injected into the model text only.

CLI (stable; the release launcher starts it)::

    python -m tests.standin.server --config serve.yaml [--port N] [--host H]
        [--seed S] [--ttft-ms 20] [--itl-ms 2] [--stuck-rate 0.0] [--corruption-scale 1.0]
        [--fault KIND ...] [--sglang-version 0.5.23]

``--sglang-version V`` (0.5.18-0.5.23, default 0.5.23) is the release ``/server_info`` reports and
the output path it speaks: 0.5.23 parses on token IDs with deepseek-recipe (above); 0.5.18-0.5.22
decode to text and run *their own* regex ``DeepSeekV4Detector`` from the release's wheel source
(:mod:`tests.standin.detector`: markup sampled as text is parsed like the real tags, malformed
invokes are dropped by 0.5.21/0.5.22 and leak the raw text in 0.5.18-0.5.20, undeclared tools are
dropped, string arguments stripped), framed as 0.5.22's ``serving_chat`` frames it.

The serve config is a real SGLang ``--config`` YAML (dashed keys, read like SGLang: CLI flags win).
Keys it honours: ``served-model-name``/``model-path``, ``host``, ``port``, ``tool-call-parser``
(without it DSML is not parsed and lands in ``content``), ``reasoning-parser``,
``enable-hierarchical-cache`` (alias ``enable-hicache``; the corruption switch),
``context-length`` (prompts at or over it get SGLang's HTTP 400; ``/v1/models`` ``max_model_len``),
``max-total-tokens`` (the KV pool: prompts at or over ``max_req_input_len`` = min(context, pool) − 6 get the
scheduler's HTTP 400; both in ``/server_info``),
``enable-metrics`` (``/metrics`` exists only with it), ``enable-cache-report``
(``usage.prompt_tokens_details.cached_tokens``), ``stream-interval``, ``disaggregation-mode``
and the HiCache flags (reported in ``/server_info``), ``api-key`` (bearer token required as SGLang
does, except on /health, /ready, /metrics). Other keys are reported, not used.

Corruption model (the issue-6 incident): with HiCache on, a turn is corrupted with probability
:func:`corruption_probability` of the effective in-flight concurrency (the larger of the current
in-flight count and its peak over the last second, sampled after the TTFT, when the request is in
the decode batch); 0 with HiCache off. Draws use error diffusion (an accumulator), so the observed
rate tracks the probability closely and tests are not flaky. A corrupted turn gets a kind drawn from
:data:`tests.standin.model.INCIDENT_KINDS`; ``--fault KIND`` (repeatable) instead corrupts *every*
turn with the given kinds in turn (``overlength_200`` answers an over-length prompt with HTTP 200,
garbage and ``prompt_tokens: 1``, the PD fault; ``transfer_500`` answers every fourth chat request
with SGLang's HTTP 500 for a failed PD KV transfer ("Decode transfer failed for request …") and
counts it in ``sglang:num_transfer_failed_reqs``; ``replay_differs`` changes an argument of every
answer whose whole prompt is in its prefix cache (a request repeated before ``/flush_cache``);
``load_back_indexer`` corrupts (``wrong_args``) every answer whose cached prefix was loaded back
from the HiCache host tier (:mod:`tests.standin.tiers`: evicted from the device tier, still on the
host): the load-back that loses the indexer keys; a prefix from the device tier, or computed after
``/flush_cache`` (which resets both tiers), is answered right;
``pd_aborts`` answers every other chat request, the first included, with one of SGLang's PD abort
messages in turn (:data:`PD_ABORT_MESSAGES`: transfer, bootstrap, ``AbortReq``), logs it to stdout
and counts it in ``sglang:num_transfer_failed_reqs`` or ``sglang:num_bootstrap_failed_reqs``;
``--fault-rate P`` makes the ``--fault`` kinds hit a share P of the turns only, never a ``check
smoke`` probe (a release that corrupts under load); ``http_503`` answers every other chat request,
the first included, with HTTP 503 before any work: a gateway that retries hides it). ``--stuck-rate`` wedges that fraction
of requests after the response headers (streaming: after the role chunk), as a decode request
stuck in a KV transfer (field report P1); they count in ``sglang:num_decode_transfer_queue_reqs``.

Process faults for ``dsv4ctl diagnose`` and the runbooks (issue 17): ``--crash-after N`` prints the
``--fault-log`` file (its ``# `` marker lines left out) to stdout and exits with status 1 when chat
request N+1 arrives (``0``: at start-up, before listening: an OOM at start-up);
``--stall-after N`` prints it once at chat N+1 and from then on holds every chat request forever
(counted as running, no tokens) and answers ``/health`` with 503 after 1 s, as SGLang does when no
scheduler output arrives; ``--fault-needs-hicache`` arms both only when the config turns HiCache on
(the server restarted with HiCache off serves normally); with ``kv-canary: log`` (or ``raise``) in the
config a KV canary violation in SGLang's log format is printed before the fault log.

PD behind a real gateway (tests/gateway.py): with ``disaggregation-mode: prefill`` it listens on
``disaggregation-bootstrap-port`` too (default 8998, SGLang's; :func:`start_bootstrap`).
``GET /_standin/requests`` (test-only) returns what it received (:attr:`StandIn.seen`) and the
number of bootstrap-port connections.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Optional

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from . import model, multinode
from .tiers import PrefixCache
from .served import ServedPathUnavailable, served_path

VERSION = "0.5.23"
VERSIONS = ("0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")   # what --sglang-version may report
SERVER_FAULTS = ("overlength_200", "http_503", "transfer_500", "replay_differs", "pd_aborts", "load_back_indexer")

PD_ABORT_MESSAGES = (
    # (counter, message with {rid} and {room}): SGLang 0.5.18-0.5.23 srt/disaggregation decode.py /
    # prefill.py abort texts with the KV manager's reason (common/conn.py), as logged and as answered
    ("transfer", "Decode transfer failed for request rank=0 decode_req.req.rid='{rid}' decode_req.req.bootstrap_room={room} "
                 "with exception KVTransferError(bootstrap_room={room}): Request {room} timed out after 300.0s in "
                 "KVPoll.WaitingForInput"),
    ("bootstrap", "Prefill bootstrap failed for request rank=0 req.rid='{rid}' req.bootstrap_room={room} with exception "
                  "KVTransferError(bootstrap_room={room}): Request {room} timed out after 300.0s in KVPoll.Bootstrapping"),
    ("transfer", "Decode transfer failed for request rank=0 decode_req.req.rid='{rid}' decode_req.req.bootstrap_room={room} "
                 "with exception KVTransferError(bootstrap_room={room}): Aborted by AbortReq."),
    ("bootstrap", "Decode handshake failed for request rank=0 decode_req.req.rid='{rid}' decode_req.req.bootstrap_room={room} "
                  "with exception KVTransferError(bootstrap_room={room}): Lost connection with prefill instance "
                  "(bootstrap_addr: 10.0.0.1:8998)"),
    ("transfer", "Prefill transfer failed for request rank=0 req.rid='{rid}' req.bootstrap_room={room}"),
)
"""The ``pd_aborts`` fault's answers, in turn: WaitingForInput timeout (transfer), Bootstrapping
timeout (bootstrap), aborted by AbortReq, lost prefill in the handshake (bootstrap), a prefill
transfer failure with no reason (older prefill text)."""
SEEN_MAX = 4096                      # requests kept for GET /_standin/requests
DEFAULT_BOOTSTRAP_PORT = 8998        # SGLang 0.5.23 server_args: disaggregation_bootstrap_port
READY_LINE = "The server is fired up and ready to roll!"   # SGLang's ready log line

DEFAULTS: dict[str, Any] = {
    "model_path": "deepseek-ai/DeepSeek-V4-Flash", "served_model_name": None, "host": "127.0.0.1",
    "port": 30000, "tp_size": 1, "dp_size": 1, "page_size": 256, "kv_cache_dtype": "fp8_e4m3",
    "attention_backend": "dsv4", "max_running_requests": 256, "stream_interval": 1,
    "tool_call_parser": None, "reasoning_parser": None, "disaggregation_mode": "null",
    "enable_hierarchical_cache": False, "hicache_ratio": None, "hicache_write_policy": "write_through",
    "hicache_io_backend": "kernel", "hicache_mem_layout": "page_first", "hicache_storage_backend": None,
    "enable_metrics": False, "enable_cache_report": False, "api_key": None, "context_length": None,
    "max_total_tokens": None,
    "disaggregation_bootstrap_port": DEFAULT_BOOTSTRAP_PORT, "kv_canary": "none",
}

#: what SGLang 0.5.23's KV canary logs for one violation in ``--kv-canary log`` mode (a WARNING of
#: srt/kv_canary/runner/violation_reporter.py ``_format_violation``: the frozen one-line
#: ``kv_canary violation:`` summary, then the readable block); the values are the stand-in's, the
#: shape is SGLang's: a write-position mismatch of the SWA pool, the sglang#33656 corruption
CANARY_VIOLATION = (
    "[{ts} TP0] kv_canary violation: launch_tag=SWEEP_K_SWA fail_reason=write_position slot_idx=18432 "
    "position=4097 stored_token=128825 expected_token=128825 stored_chain_hash=0x5a1c3e77d2b40c19 "
    "expected_aux=0x0000000000001000\n"
    "KV cache canary violation detected (kernel_kind=SWEEP_K_SWA, slot_idx=18432, position=4097)\n"
    "canary_kind:       sweep_k_swa\n"
    "  fail_reasons: write_position\n"
    "  actual:   token_id=128825   position=4097 prev_hash=0x5a1c3e77d2b40c19\n"
    "  expected: token_id=128825   position=4096\n"
    "  total_violations=1 ring_overflow=False step_when_pumped={step}\n")


def corruption_probability(concurrency: float, hicache: bool, scale: float = 1.0) -> float:
    """P(turn corrupted) at ``concurrency`` in-flight requests (incident shape, issue 6):
    0 without HiCache or at ≤ 8; linear 0 → 15 % from 8 to 40; 15 % from 40 to 70; linear to
    18 % at 80; 18 % above. ``scale`` multiplies the result (capped at 1)."""
    if not hicache or concurrency <= 8:
        return 0.0
    if concurrency < 40:
        p = 0.15 * (concurrency - 8) / 32
    elif concurrency <= 70:
        p = 0.15
    elif concurrency < 80:
        p = 0.15 + 0.03 * (concurrency - 70) / 10
    else:
        p = 0.18
    return min(1.0, p * scale)


class Diffuser:
    """Error-diffusion Bernoulli draws: ``draw(p)`` is True about a fraction p of the time,
    deterministically (accumulates p, fires when the sum reaches 1)."""

    def __init__(self, start: float = 0.5):
        self.acc = start

    def draw(self, p: float) -> bool:
        if p <= 0:
            return False
        self.acc += p
        if self.acc >= 1.0:
            self.acc -= 1.0
            return True
        return False


def load_config(path: Path) -> dict[str, Any]:
    """Resolved server args: DEFAULTS < YAML (dashed keys → underscores, aliases resolved)."""
    from dsv4ctl.profile.serveconfig import read_serve_config
    raw = read_serve_config(path).args()
    args = dict(DEFAULTS)
    args.update({k.replace("-", "_"): v for k, v in raw.items()})
    if not args["served_model_name"]:
        args["served_model_name"] = args["model_path"]
    return args


class StandIn:
    """State of one stand-in server: in-flight counts, draws, prefix cache, Prometheus registry."""

    def __init__(self, args: dict[str, Any], *, seed: int = 0, ttft_ms: float = 20.0, itl_ms: float = 2.0,
                 stuck_rate: float = 0.0, corruption_scale: float = 1.0, launch_command: str = "",
                 faults: tuple[str, ...] = (), version: str = VERSION, fault_rate: float = 1.0):
        self.args = args
        self.version = version          # the SGLang release /server_info reports
        # and its DeepSeek-V4 output path: 0.5.23's deepseek-recipe, else the release's own regex detector
        self.output_path = "deepseek-recipe" if version == "0.5.23" else "detector"
        self.served = served_path()
        self.faults = tuple(f for f in faults if f in model.KINDS)
        self.server_faults = frozenset(f for f in faults if f not in model.KINDS)
        self._fault_i = 0
        self.fault_rate = fault_rate    # --fault-rate: the share of load turns the --fault kinds hit
        self.fault_draw = Diffuser()
        self.chats = 0                # chat requests received (the http_503 fault answers the odd ones)
        self.context_length = int(args.get("context_length") or 1048576)
        # the KV pool in tokens (``max-total-tokens`` caps it, as SGLang's --max-total-tokens does);
        # SGLang 0.5.23 tp_worker.py: max_req_input_len = min(context_len - 1, pool - 1) - 5
        self.pool_tokens = int(args.get("max_total_tokens") or 4 * self.context_length)
        self.max_req_input_len = min(self.context_length - 1, self.pool_tokens - 1) - 5
        self.model = str(args["served_model_name"])
        self.hicache = bool(args["enable_hierarchical_cache"])
        self.ttft = ttft_ms / 1000
        self.itl = itl_ms / 1000
        self.stream_interval = max(1, int(args.get("stream_interval") or 1))
        self.stuck_rate = stuck_rate
        self.scale = corruption_scale
        self.rng = random.Random(seed)
        self.corrupt = Diffuser()
        self.stuck = Diffuser()
        self.inflight = 0
        self.wedged = 0
        self._window: collections.deque = collections.deque()   # (time, in-flight), decreasing in-flight
        # the radix cache: device tier = the KV pool, host tier = hicache-ratio x it (HiCache on)
        self.prefix = PrefixCache(self.pool_tokens, float(args.get("hicache_ratio") or 2.0) if self.hicache else None)
        self.launch_command = launch_command
        self.started = time.time()
        self.wedge_event = asyncio.Event()
        disable_created_metrics()   # SGLang's /metrics has no *_created series
        r = self.registry = CollectorRegistry()
        labels = {"model_name": self.model, "engine_type": "unified" if args["disaggregation_mode"] in (None, "null")
                  else str(args["disaggregation_mode"]), "tp_rank": "0", "pp_rank": "0"}
        self.labels = labels
        names = list(labels)
        self.m_running = Gauge("sglang:num_running_reqs", "running requests", names, registry=r).labels(**labels)
        self.m_queue = Gauge("sglang:num_queue_reqs", "queued requests", names, registry=r).labels(**labels)
        self.m_transfer = Gauge("sglang:num_decode_transfer_queue_reqs", "decode transfer queue", names,
                                registry=r).labels(**labels)
        self.m_token_usage = Gauge("sglang:token_usage", "token usage", names, registry=r).labels(**labels)
        self.m_hit = Gauge("sglang:cache_hit_rate", "cache hit rate", names, registry=r).labels(**labels)
        self.m_requests = Counter("sglang:num_requests", "requests", names + ["is_streaming"], registry=r)
        self.m_aborted = Counter("sglang:num_aborted_requests", "aborted", names, registry=r).labels(**labels)
        self.m_transfer_failed = Counter("sglang:num_transfer_failed_reqs", "transfer failed", names,
                                         registry=r).labels(**labels)
        self.m_bootstrap_failed = Counter("sglang:num_bootstrap_failed_reqs", "bootstrap failed", names,
                                          registry=r).labels(**labels)
        self.m_prompt = Counter("sglang:prompt_tokens", "prompt tokens", names, registry=r).labels(**labels)
        self.m_gen = Counter("sglang:generation_tokens", "generation tokens", names, registry=r).labels(**labels)
        self.m_cached = Counter("sglang:cached_tokens", "cached tokens", names + ["cache_source"], registry=r)
        self._prompt_total = 0
        self._cached_total = 0
        self.seen: collections.deque = collections.deque(maxlen=SEEN_MAX)
        """The last :data:`SEEN_MAX` requests: {method, path, x_request_id, rid, bootstrap_host,
        bootstrap_port, bootstrap_room, override_headers (x-override-*), keys, chat_template_kwargs,
        max_tokens, max_completion_tokens (the last four of a chat body)}
        (rid and the bootstrap fields from a chat body; None otherwise), served by
        ``GET /_standin/requests`` (test-only)."""
        self.bootstrap_connections = 0
        self.crash_after: Optional[int] = None
        self.stall_after: Optional[int] = None
        self.fault_log = ""
        self.stalled = False
        self.pd_aborts = 0            # PD aborts answered by the pd_aborts fault

    def fire(self) -> None:
        """Write the fault log to stdout (the server log) once, stamped with the current time;
        with ``kv-canary: log|raise`` a :data:`CANARY_VIOLATION` first (the canary sees the
        corruption before it crashes the server)."""
        if self.fault_log and self.args.get("kv_canary") in ("log", "raise"):
            from datetime import datetime, timezone
            ts = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
            sys.stdout.write(CANARY_VIOLATION.format(ts=ts, step=self.chats))
        if self.fault_log:
            sys.stdout.write(stamp_now(self.fault_log))
            sys.stdout.flush()
            self.fault_log = ""

    # --- load accounting -------------------------------------------------------------------
    def enter(self) -> None:
        self.inflight += 1
        w = self._window
        while w and w[-1][1] <= self.inflight:
            w.pop()
        w.append((time.monotonic(), self.inflight))
        self.m_running.set(self.inflight - self.wedged)
        self.m_token_usage.set(min(1.0, self.inflight / 256))

    def leave(self) -> None:
        self.inflight -= 1
        self.m_running.set(self.inflight - self.wedged)
        self.m_token_usage.set(min(1.0, self.inflight / 256))

    def effective_concurrency(self) -> int:
        """max(in-flight now, the in-flight peak of the last second): a sliding-window maximum."""
        w, old = self._window, time.monotonic() - 1.0
        while w and w[0][0] < old:
            w.popleft()
        return max(self.inflight, w[0][1] if w else 0)

    # --- prompt accounting (prefix cache) ---------------------------------------------------
    def prompt_tokens(self, messages: list) -> tuple[int, int, int]:
        """(prompt tokens, cached tokens, of them loaded back from the host tier): ~4 characters
        per token; the cached part is the longest message prefix in either tier
        (:class:`tests.standin.tiers.PrefixCache`)."""
        h, keys, sizes = 0, [], []
        for m in messages:
            piece = json.dumps(m, sort_keys=True, ensure_ascii=False)
            sizes.append(max(1, len(piece) // 4))
            h = hash((h, piece))
            keys.append(h)
        if len(self.prefix) > 200_000:
            self.prefix.clear()
        total = sum(sizes)
        cached, host = self.prefix.lookup(keys, sizes)
        self._prompt_total += total
        self._cached_total += cached
        self.m_prompt.inc(total)
        self.m_cached.labels(**self.labels, cache_source="device").inc(cached - host)
        self.m_cached.labels(**self.labels, cache_source="host").inc(host)
        self.m_hit.set(self._cached_total / self._prompt_total if self._prompt_total else 0)
        return total, cached, host

    # --- the model ----------------------------------------------------------------------------
    def kind_for(self, corrupt: bool, rid: str = "") -> Optional[str]:
        """The corruption kind of a turn: the forced ``--fault`` kinds in turn, else an incident
        kind when the HiCache race hit it, else None. With ``--fault-rate P`` < 1 the forced kinds
        hit a share P of the turns (error diffusion) and never a ``check smoke`` probe (``rid``
        ``dsv4ctl-smoke-…``): a release that corrupts under load only."""
        if self.faults and self.fault_rate < 1:
            if rid.startswith("dsv4ctl-smoke-") or not self.fault_draw.draw(self.fault_rate):
                return model.incident_kind(self.rng) if corrupt else None
        if self.faults:
            k = self.faults[self._fault_i % len(self.faults)]
            self._fault_i += 1
            return k
        return model.incident_kind(self.rng) if corrupt else None

def stamp_now(text: str) -> str:
    """``text`` with every ``YYYY-MM-DD HH:MM:SS`` replaced by the current UTC time (fault logs
    are written as a server would write them now)."""
    import re
    return re.sub(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}", time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), text)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"object": "error", "message": message, "type": "BadRequestError",
                              "param": None, "code": status}, status=status)


def pd_abort(state: "StandIn", body: dict) -> web.Response:
    """The ``pd_aborts`` fault's next answer (:data:`PD_ABORT_MESSAGES` in turn): logged to stdout
    (the server log) in SGLang's format, counted in its failure counter, answered with HTTP 500
    as SGLang's ``prepare_abort`` does."""
    counter, text = PD_ABORT_MESSAGES[state.pd_aborts % len(PD_ABORT_MESSAGES)]
    state.pd_aborts += 1
    msg = text.format(rid=body.get("rid") or uuid.uuid4().hex, room=7000 + state.pd_aborts)
    (state.m_transfer_failed if counter == "transfer" else state.m_bootstrap_failed).inc()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    sys.stdout.write(f"[{stamp} TP0] {msg}\n")
    sys.stdout.flush()
    return web.json_response({"object": "error", "type": "InternalServerError", "param": None, "code": 500,
                              "message": msg}, status=500)


def _chunk(rid: str, created: int, model: str, delta: dict, finish: Optional[str] = None,
           usage: Optional[dict] = None) -> bytes:
    obj = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
           "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish,
                        "matched_stop": None}]}
    if usage is not None:
        obj["usage"] = usage
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


async def detector_reply(state: StandIn, resp: Optional[web.StreamResponse], body: dict, ids: list, finish: str,
                         parse: bool, separate: bool, thinking: bool, usage: dict, rid: str, created: int):
    """The answer of a 0.5.18-0.5.22 stand-in (``--sglang-version``): the release's own regex
    detector on the decoded text (:func:`tests.standin.detector.parse`), framed as 0.5.22's
    ``serving_chat`` frames it: JSON with ``tool_calls`` (``call_<24 hex>`` ids, ``finish_reason``
    ``tool_calls`` only from ``stop``), or, streaming (``resp``: the role chunk already sent), the
    reasoning, the content, one chunk per call (id, name and the whole arguments: a complete
    invoke, as 0.5.21+ stream it; 0.5.18-0.5.20 send the arguments in pieces that add up to the
    same), the finish chunk, usage on request, ``[DONE]``."""
    from .detector import parse as detector_parse
    if ids:
        await asyncio.sleep(state.itl * len(ids))
    out = detector_parse(state.version, state.served.tokenizer, ids, body, parse_tools=parse,
                         separate_reasoning=separate, thinking=thinking)
    calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "index": i, "type": "function",
              "function": {"name": n, "arguments": args}} for i, (n, args) in enumerate(out.calls)]
    if calls and finish == "stop":
        finish = "tool_calls"
    if resp is None:
        return web.json_response({
            "id": rid, "object": "chat.completion", "created": created, "model": state.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": out.content,
                                                 "reasoning_content": out.reasoning or None,
                                                 "tool_calls": calls or None},
                         "logprobs": None, "finish_reason": finish, "matched_stop": None}],
            "usage": usage}, dumps=lambda o: json.dumps(o, ensure_ascii=False))
    parts = []
    if out.reasoning:
        parts.append(_chunk(rid, created, state.model, {"reasoning_content": out.reasoning}))
    if out.content:
        parts.append(_chunk(rid, created, state.model, {"content": out.content}))
    parts += [_chunk(rid, created, state.model, {"tool_calls": [c]}) for c in calls]
    parts.append(_chunk(rid, created, state.model, {}, finish))
    if (body.get("stream_options") or {}).get("include_usage"):
        parts.append(b"data: " + json.dumps({"id": rid, "object": "chat.completion.chunk", "created": created,
                                             "model": state.model, "choices": [], "usage": usage}).encode() + b"\n\n")
    await resp.write(b"".join(parts) + b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def make_app(state: StandIn) -> web.Application:
    """The aiohttp application serving SGLang's endpoints for ``state``."""
    a = state.args

    @web.middleware
    async def auth(request: web.Request, handler):
        # SGLang srt/utils/auth.py: with --api-key every endpoint but /health*, /ready*, /metrics*
        # needs "Authorization: Bearer <key>"; otherwise 401 {"error": "Unauthorized"}.
        key = a.get("api_key")
        if key and not request.path.startswith(("/health", "/ready", "/metrics")):
            if request.headers.get("Authorization", "") != f"Bearer {key}":
                return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    @web.middleware
    async def record(request: web.Request, handler):
        # test-only: what reached this server (a gateway's registration probes, the PD fields)
        if not request.path.startswith("/_standin/"):
            request["seen"] = {"method": request.method, "path": request.path,
                               "x_request_id": request.headers.get("X-Request-Id"), "rid": None,
                               "bootstrap_host": None, "bootstrap_port": None, "bootstrap_room": None,
                               "override_headers": {k.lower(): v for k, v in request.headers.items()
                                                    if k.lower().startswith("x-override-")}}
            state.seen.append(request["seen"])
        return await handler(request)

    app = web.Application(client_max_size=64 * 2**20, middlewares=[record, auth])

    async def seen(request: web.Request) -> web.Response:
        return web.json_response({"requests": list(state.seen), "bootstrap_connections": state.bootstrap_connections})

    async def health(request: web.Request) -> web.Response:
        if state.stalled:
            await asyncio.sleep(1.0)
            return web.Response(status=503)
        return web.Response(status=200)

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": state.model, "object": "model", "created": int(state.started), "owned_by": "sglang",
            "root": state.model, "max_model_len": state.context_length}]})

    async def model_one(request: web.Request) -> web.Response:
        if request.match_info["mid"] != state.model:
            return web.json_response({"error": {"message": f"The model '{request.match_info['mid']}' does not exist",
                                                "type": "NotFoundError", "code": "model_not_found"}}, status=404)
        return await models(request)

    async def server_info(request: web.Request) -> web.Response:
        return web.json_response({**{k: v for k, v in a.items() if k != "api_key"}, "version": state.version, "launch_command": state.launch_command,
                                  "frontend": "standin", "startup_time": state.started,
                                  "max_total_num_tokens": state.pool_tokens, "max_req_input_len": state.max_req_input_len,
                                  "internal_states": [{**{k: a[k] for k in ("tp_size", "dp_size", "page_size")},
                                                       "disaggregation_mode": a["disaggregation_mode"],
                                                       "effective_max_running_requests_per_dp": a["max_running_requests"],
                                                       "last_gen_throughput": 0.0}]})

    async def model_info(request: web.Request) -> web.Response:
        return web.json_response({"model_path": a["model_path"], "served_model_name": state.model,
                                  "tool_call_parser": a["tool_call_parser"], "reasoning_parser": a["reasoning_parser"],
                                  "disaggregation_mode": a["disaggregation_mode"], "is_generation": True,
                                  "architectures": ["DeepseekV4ForCausalLM"]})

    async def metrics(request: web.Request) -> web.Response:
        if not a["enable_metrics"]:
            return web.Response(status=404, text="Not Found")
        return web.Response(body=generate_latest(state.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def flush_cache(request: web.Request) -> web.Response:
        if state.inflight:
            return web.Response(status=400, text="Flush cache failed: requests are running")
        state.prefix.clear()
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details.")

    async def chat(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "request body is not JSON")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            return _error(400, "messages: a non-empty list is required")
        state.chats += 1
        if state.crash_after is not None and state.chats > state.crash_after:
            state.fire()
            os._exit(1)
        if state.stall_after is not None and state.chats > state.stall_after:
            if not state.stalled:
                state.stalled = True
                state.fire()
            state.enter()
            try:
                await asyncio.Event().wait()      # held forever: the scheduler is stuck
            finally:
                state.leave()
        if "http_503" in state.server_faults and state.chats % 2 == 1:
            return _error(503, "Service Unavailable (stand-in fault http_503)")
        if "transfer_500" in state.server_faults and state.chats % 4 == 1:
            # SGLang 0.5.23 decode.py pop_transferred: a failed KV transfer aborts the request with
            # HTTP 500 and counts it in sglang:num_transfer_failed_reqs
            state.m_transfer_failed.inc()
            return web.json_response({"object": "error", "type": "InternalServerError", "param": None, "code": 500,
                                      "message": f"Decode transfer failed for request rank=0 decode_req.req.rid="
                                                 f"'{body.get('rid')}' decode_req.req.bootstrap_room=7 with exception "
                                                 "KVTransferError(bootstrap_room=7): Failed to get kvcache from "
                                                 "prefill instance, it might be dead"}, status=500)
        if "pd_aborts" in state.server_faults and state.chats % 2 == 1:
            return pd_abort(state, body)
        stream = bool(body.get("stream"))
        if "seen" in request:
            request["seen"].update({k: body.get(k) for k in ("rid", "bootstrap_host", "bootstrap_port", "bootstrap_room")},
                                   keys=sorted(body), chat_template_kwargs=body.get("chat_template_kwargs"),
                                   max_tokens=body.get("max_tokens"), max_completion_tokens=body.get("max_completion_tokens"))
        rid = str(body.get("rid") or uuid.uuid4().hex)
        created = int(time.time())
        state.m_requests.labels(**state.labels, is_streaming=str(stream).lower()).inc()
        state.enter()
        resp: Optional[web.StreamResponse] = None
        try:
            prompt, cached, from_host = state.prompt_tokens(body["messages"])
            full_hit = bool(cached) and cached == prompt      # every message seen before: a repeated request
            if prompt >= min(state.context_length, state.max_req_input_len) // 2:
                prompt = state.served.count("".join(json.dumps(m, ensure_ascii=False) for m in body["messages"]))
            if prompt >= state.max_req_input_len and prompt < state.context_length \
                    and "overlength_200" not in state.server_faults:
                # SGLang 0.5.23 scheduler: validate_input_length aborts the request (HTTP 400)
                return _error(400, f"Input length ({prompt} tokens) exceeds the maximum allowed length "
                                   f"({state.max_req_input_len} tokens). Use a shorter input or enable "
                                   "--allow-auto-truncate.")
            if prompt >= state.max_req_input_len:
                if "overlength_200" not in state.server_faults:
                    # SGLang 0.5.23 tokenizer_manager._validate_one_request
                    return _error(400, f"The input ({prompt} tokens) is longer than the model's context length "
                                       f"({state.context_length} tokens).")
                # the PD fault: a prefill abort answered by decode with HTTP 200 and garbage
                return web.json_response({
                    "id": rid, "object": "chat.completion", "created": created, "model": state.model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "\u0000,,,,", "reasoning_content": None,
                                                         "tool_calls": None}, "logprobs": None,
                                 "finish_reason": "stop", "matched_stop": None}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5}})
            if stream:
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
                await resp.prepare(request)
                await resp.write(_chunk(rid, created, state.model,
                                        {"role": "assistant", "content": "", "reasoning_content": None}))
            if state.stuck.draw(state.stuck_rate):
                state.wedged += 1
                state.m_transfer.set(state.wedged)
                state.m_running.set(state.inflight - state.wedged)
                try:
                    await state.wedge_event.wait()      # never set: a receiver stuck in Transferring
                finally:
                    state.wedged -= 1
                    state.m_transfer.set(state.wedged)
                    state.m_aborted.inc()
                    state.m_transfer_failed.inc()
            await asyncio.sleep(state.ttft)
            corrupt = state.corrupt.draw(corruption_probability(state.effective_concurrency(), state.hicache,
                                                                 state.scale))
            kind = state.kind_for(corrupt, rid)
            if "replay_differs" in state.server_faults and full_hit and kind is None:
                kind = "wrong_args"     # an answer built on a restored prefix differs (HiCache restore race)
            if "load_back_indexer" in state.server_faults and from_host and kind is None:
                kind = "wrong_args"     # the prefix loaded back from the host tier lost its indexer keys
            tool_choice = body.get("tool_choice", "auto")
            thinking = bool((body.get("chat_template_kwargs") or {}).get("thinking"))
            out = model.write(body, state.rng, kind, thinking=thinking)
            ids = state.served.ids(out.segs)
            max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 4096
            cap = len(ids) - 6 if out.cap == -1 else (out.cap or max_tokens)
            cap = min(cap, int(max_tokens))
            finish = "stop"
            if len(ids) > cap:
                ids, finish = ids[:cap], "length"
            # SGLang 0.5.23 serving_chat._tool_call_parsing_active + _new_output_parser's options
            parse = bool(a["tool_call_parser"]) and bool(body.get("tools")) and tool_choice != "none" and not (
                (body.get("response_format") or {}).get("type") in ("json_object", "json_schema"))
            separate = bool(a["reasoning_parser"]) and body.get("separate_reasoning", True) is not False
            parser = state.served.parser(thinking=thinking, parse_tool_calls=parse, separate_reasoning=separate,
                                         stream_reasoning=body.get("stream_reasoning", True) is not False)
            state.m_gen.inc(len(ids))
            usage = {"prompt_tokens": prompt, "completion_tokens": len(ids), "total_tokens": prompt + len(ids)}
            if a["enable_cache_report"]:
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
            # SGLang's return_cached_tokens_details (protocol.py SglExt.cached_tokens_details)
            sglext = {"cached_tokens_details": {"device": cached - from_host, "host": from_host}} \
                if body.get("return_cached_tokens_details") else None
            if state.output_path == "detector":      # 0.5.18-0.5.22: FunctionCallParser + the regex detector
                return await detector_reply(state, resp if stream else None, body, ids, finish, parse, separate,
                                            thinking, usage, rid, created)
            if not stream:
                if ids:
                    await asyncio.sleep(state.itl * len(ids))
                delta = parser.finish(ids, {"type": finish})
                calls = state.served.whole_tool_calls(delta)
                tool_calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "index": c.index, "type": "function",
                               "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
                if tool_calls and finish == "stop":
                    finish = "tool_calls"
                return web.json_response({
                    "id": rid, "object": "chat.completion", "created": created, "model": state.model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": delta.content or "",
                                                         "reasoning_content": delta.reasoning or None,
                                                         "tool_calls": tool_calls or None},
                                 "logprobs": None, "finish_reason": finish, "matched_stop": None}],
                    "usage": usage, **({"sglext": sglext} if sglext else {})}, dumps=lambda o: json.dumps(o, ensure_ascii=False))
            had_calls = False
            k = state.stream_interval
            steps = range(0, max(len(ids), 1), k)
            # paced against the clock: token i is due itl * (i + 1) after the first. One
            # asyncio.sleep per token would wait at least the event loop's 1 ms epoll tick
            # (--itl-ms 0.1 became ~1 ms a token: 80 ms a turn instead of 8), so a delay under
            # a millisecond only yields and is made up by the next real sleep.
            loop = asyncio.get_running_loop()
            t_first = loop.time()
            for i in steps:
                group = ids[i:i + k]
                delay = t_first + state.itl * (i + len(group)) - loop.time()
                await asyncio.sleep(delay if delay >= 0.001 else 0)
                last = i + k >= len(ids)
                # token_output_sse_chunks (chat_encoding_adapters.py): reasoning, content, then one
                # chunk per tool-call piece; the first piece of a call carries its id and name
                delta = parser.finish(group, {"type": finish}) if last else parser.feed(group)
                chunks = []
                if delta.reasoning:
                    chunks.append(_chunk(rid, created, state.model, {"reasoning_content": delta.reasoning}))
                if delta.content:
                    chunks.append(_chunk(rid, created, state.model, {"reasoning_content": None, "content": delta.content}))
                for piece in delta.tool_calls:
                    had_calls = True
                    tc = {"id": f"call_{uuid.uuid4().hex[:24]}" if piece.name is not None else None,
                          "index": piece.index, "type": "function",
                          "function": {"name": piece.name, "arguments": piece.arguments}}
                    chunks.append(_chunk(rid, created, state.model, {"role": None, "content": None,
                                                                     "reasoning_content": None, "tool_calls": [tc]}))
                if chunks:
                    await resp.write(b"".join(chunks))
            if had_calls and finish == "stop":
                finish = "tool_calls"
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            await resp.write(_chunk(rid, created, state.model, {"reasoning_content": None}, finish))
            if include_usage:
                await resp.write(b"data: " + json.dumps({"id": rid, "object": "chat.completion.chunk",
                                                         "created": created, "model": state.model,
                                                         "choices": [], "usage": usage}).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        finally:
            state.leave()

    app.router.add_get("/health", health)
    app.router.add_get("/health_generate", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{mid}", model_one)
    app.router.add_get("/server_info", server_info)
    app.router.add_get("/get_server_info", server_info)
    app.router.add_get("/model_info", model_info)
    app.router.add_get("/metrics", metrics)
    app.router.add_route("*", "/flush_cache", flush_cache)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/_standin/requests", seen)
    return app


async def start_bootstrap(state: StandIn, host: str, port: int) -> tuple[asyncio.AbstractServer, web.AppRunner]:
    """The prefill's KV bootstrap listener on ``host``:``port`` (SGLang 0.5.23
    ``CommonKVBootstrapServer``: an HTTP server with ``GET /health`` -> ``OK``; ``/route`` is
    answered 404 here, no KV moves). Every accepted connection counts in
    ``state.bootstrap_connections`` (a gateway's probe of the port)."""
    app = web.Application()

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="OK")

    app.router.add_get("/health", ok)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()

    def protocol():
        state.bootstrap_connections += 1
        return runner.server()
    server = await asyncio.get_running_loop().create_server(protocol, host, port, reuse_address=True)
    return server, runner


async def stop_bootstrap(boot: tuple[asyncio.AbstractServer, web.AppRunner]) -> None:
    """Close the listener of :func:`start_bootstrap` and its application."""
    boot[0].close()
    await boot[1].cleanup()


def main(argv: Optional[list[str]] = None) -> int:
    """Parse the CLI (module docstring), serve until SIGINT/SIGTERM. Exit 2 on a bad config."""
    ap = argparse.ArgumentParser(prog="python -m tests.standin.server",
                                 description="STAND-IN SGLang 0.5.23 DeepSeek-V4 server (tests only; no model).")
    ap.add_argument("--config", required=True, help="SGLang --config serve YAML")
    ap.add_argument("--host", default=None, help="bind address (default: the config's host, else 127.0.0.1)")
    ap.add_argument("--port", type=int, default=None, help="port (default: the config's port, else 30000)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the corruption-kind draws")
    ap.add_argument("--ttft-ms", type=float, default=20.0, help="time to first token (ms)")
    ap.add_argument("--itl-ms", type=float, default=2.0, help="inter-token latency (ms)")
    ap.add_argument("--stuck-rate", type=float, default=0.0, help="fraction of requests that wedge forever")
    ap.add_argument("--corruption-scale", type=float, default=1.0, help="multiplies the corruption curve")
    ap.add_argument("--fault", action="append", default=[], metavar="KIND",
                    help="corrupt every turn with KIND (repeat: in turn); model kinds: "
                         + ", ".join(model.KINDS) + "; server kinds: " + ", ".join(SERVER_FAULTS))
    ap.add_argument("--fault-rate", type=float, default=1.0, metavar="P",
                    help="with --fault: corrupt only a share P of the turns, never a check smoke probe (default 1)")
    ap.add_argument("--crash-after", type=int, default=None, metavar="N",
                    help="print --fault-log and exit 1 at chat request N+1 (0: at start-up)")
    ap.add_argument("--stall-after", type=int, default=None, metavar="N",
                    help="print --fault-log at chat request N+1 and hold every chat from then on")
    ap.add_argument("--fault-log", default=None, help="text file written to stdout when a fault fires")
    ap.add_argument("--fault-needs-hicache", action="store_true", help="arm the faults only with HiCache on")
    ap.add_argument("--sglang-version", default=VERSION, choices=VERSIONS,
                    help="the SGLang release /server_info reports and whose DeepSeek-V4 output path it speaks")
    multinode.add_args(ap)
    ns = ap.parse_args(argv)
    if ns.node_rank > 0:                 # SGLang's node 1..N-1: no HTTP, lives while node 0 does
        return multinode.run_member(ns.nnodes, ns.node_rank, ns.dist_init_addr)
    from dsv4ctl.errors import DsvError
    unknown = [f for f in ns.fault if f not in model.KINDS and f not in SERVER_FAULTS]
    if unknown:
        print(f"standin: error: unknown --fault {unknown[0]!r}", file=sys.stderr)
        return 2
    try:
        args = load_config(Path(ns.config))
        served_path()
    except DsvError as e:
        print(f"standin: error: {e}", file=sys.stderr)
        return 2
    except ServedPathUnavailable as e:
        print(f"standin: error: {e}", file=sys.stderr)
        return 2
    if ns.host:
        args["host"] = ns.host
    if ns.port:
        args["port"] = ns.port
    fault_log = ""
    if ns.fault_log:
        fault_log = "".join(ln for ln in Path(ns.fault_log).read_text().splitlines(True)
                            if not ln.startswith(("# ", "=== dsv4ctl")))
    armed = not ns.fault_needs_hicache or bool(args["enable_hierarchical_cache"])
    if armed and ns.crash_after == 0:
        sys.stdout.write(stamp_now(fault_log))
        sys.stdout.flush()
        return 1
    launch = " ".join(["python", "-m", "tests.standin.server"] + (argv if argv is not None else sys.argv[1:]))

    async def run() -> None:
        state = StandIn(args, seed=ns.seed, ttft_ms=ns.ttft_ms, itl_ms=ns.itl_ms, stuck_rate=ns.stuck_rate,
                        corruption_scale=ns.corruption_scale, launch_command=launch, faults=tuple(ns.fault), fault_rate=ns.fault_rate,
                        version=ns.sglang_version)
        if armed:
            state.crash_after, state.stall_after, state.fault_log = ns.crash_after, ns.stall_after, fault_log
        await multinode.Node0(ns.nnodes, ns.dist_init_addr, on_lost=lambda: setattr(state, "stalled", True)).join()
        runner = web.AppRunner(make_app(state), handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, args["host"], int(args["port"]), backlog=1024)
        await site.start()
        boot = None
        if args["disaggregation_mode"] == "prefill":
            boot = await start_bootstrap(state, args["host"], int(args["disaggregation_bootstrap_port"]))
        print(f"standin: serving {state.model} on http://{args['host']}:{args['port']} "
              f"(hicache={'on' if state.hicache else 'off'}, tool-call-parser={args['tool_call_parser']})", flush=True)
        print(READY_LINE, flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            if boot is not None:
                await stop_bootstrap(boot)
            await runner.cleanup()

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
