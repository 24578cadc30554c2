"""Diagnosis rules: pure functions from one server group's collected evidence to findings.

Input shape (:class:`Evidence`, built by :mod:`.collect` or by tests from fixtures)::

    Evidence(group="decode", host="h1", role="decode",        # role: colocated | prefill | decode
             alive=True | False | None,                        # process state (None: not known)
             exit_status=None | int,                           # "=== dsv4ctl: G exited with status N"
             restarts=0,                                       # start/restart headers in the log window
             log="...", log_source="h1:/srv/dsv4/logs/decode.log",
             health=None | "ok" | "<why not>",                 # GET /health (None: not probed)
             server_info=None | {...},                         # GET /server_info
             metrics_before=None | {name: value}, metrics_after=None | {name: value}, window_s=5.0,
             gpus=None | [{"index", "util_pct", "power_w", "power_limit_w", "used_mib", ...}],
             hicache=None | bool,                              # HiCache on (server_info or serve config)
             node=0, nnodes=1, release=None | RID,             # multi-node: this node's rank, its host's release
             dist_init=None | "HOST:PORT")                     # multi-node: node 0's --dist-init-addr

Output: :class:`Finding` objects: ``rule`` (stable id), ``cause`` (one line), ``evidence`` (the
lines or numbers it rests on, quoted), ``source`` (the public report the rule follows:
``shared/reference/field-reports.md`` entries and SGLang issues), ``runbook`` (the shipped runbook
to run, or None) and ``severity`` (``crash`` > ``stall`` > ``degraded`` > ``ok``).

Each rule is ``rule(ev: Evidence) -> list[Finding]``; :func:`diagnose` runs them all and adds
``healthy`` when nothing fired and the group answers. A server over several nodes
(``--nnodes``) is judged by :func:`diagnose_server` over every node's evidence (node 0 carries
the HTTP probes): the same rules on every node's log, plus the rules that need all nodes — a lost
node (node 0 stuck in a collective until its watchdog fires), an unreachable or clashing
dist-init address, nodes on different releases. Log patterns are SGLang 0.5.23's messages
as quoted in the public reports (the fixtures under ``tests/data/diagnose/`` are written after
those reports and say so)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Callable, Optional

SEVERITY = {"crash": 3, "stall": 2, "degraded": 1, "ok": 0}

#: nvidia-smi utilisation (%) at or above which a GPU counts as busy
BUSY_UTIL_PCT = 90.0
#: pool snapshot: ``available`` at or below this share of ``total`` is "no free slots"
POOL_FREE_SHARE = 0.05
#: pool snapshot: ``evictable`` at or above this share of ``total`` makes it an eviction deadlock
POOL_EVICTABLE_SHARE = 0.5


MAX_LINE = 2000       # characters of one log line the rules read
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]{0,512}(?:\x07|\x1b\\)")
# SGLang's request logging (--log-requests, the HTTP server's request echo): user-controlled text
_ECHO = re.compile(r"Receive: obj=|Finish: obj=|GenerateReqInput\(|ChatCompletionRequest\(|EmbeddingReqInput\("
                   r"|[\"']messages[\"']\s*:|\btext=[\"']|\bprompt=[\"']|input_ids=\["
                   # uvicorn's access log: the request line (path and query string as the client sent them)
                   r"|\"(?:GET|POST|PUT|DELETE|HEAD|OPTIONS|PATCH) \S* ?HTTP/\d")


@dataclass
class Evidence:
    """What was collected for one server group (module docstring)."""

    group: str
    host: str = ""
    role: str = "colocated"
    alive: Optional[bool] = None
    exit_status: Optional[int] = None
    restarts: int = 0
    log: str = ""
    log_source: str = ""
    health: Optional[str] = None
    server_info: Optional[dict] = None
    metrics_before: Optional[dict] = None
    metrics_after: Optional[dict] = None
    window_s: float = 0.0
    gpus: Optional[list] = None
    hicache: Optional[bool] = None
    node: int = 0                     # SGLang --node-rank of this node (multi-node servers)
    nnodes: int = 1
    release: Optional[str] = None     # the release active on this node's host
    dist_init: Optional[str] = None   # --dist-init-addr HOST:PORT (multi-node servers)
    stopped: Optional[dict] = None    # the audit record of the ``dsv4ctl stop`` that left it down
    clock_offset_s: Optional[float] = None   # this node's host clock minus this machine's (None: not read)

    _lines: Optional[list] = field(default=None, repr=False, compare=False)

    def lines(self) -> list[str]:
        """The log's lines as the rules read them: ANSI colour codes removed, each cut at
        :data:`MAX_LINE` characters (rules stay linear on a hostile 1 MB line), and lines that echo
        a request (``--log-requests``: the user's own text, which may say "CUDA out of memory")
        blanked, so line numbers still match the collected tail."""
        if self._lines is not None:
            return self._lines
        out = []
        for ln in self.log.splitlines():
            ln = _ANSI.sub("", ln[:MAX_LINE * 2])[:MAX_LINE]
            out.append("" if _ECHO.search(ln) else ln)
        self._lines = out          # every rule reads them: split and cleaned once
        return out


@dataclass
class Finding:
    """One diagnosis: see the module docstring."""

    rule: str
    cause: str
    severity: str
    evidence: list[str]
    source: str
    runbook: Optional[str]
    group: str = ""
    host: str = ""
    detail: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def _find(lines: list[str], pattern: str, flags: int = 0) -> list[tuple[int, str]]:
    rx = re.compile(pattern, flags)
    return [(i, ln) for i, ln in enumerate(lines) if rx.search(ln)]


def _cite(ev: Evidence, i: int, line: str) -> str:
    """``source:line-number: text`` (1-based within the collected tail)."""
    return f"{ev.log_source or ev.group}:{i + 1}: {line.strip()[:300]}"


def _mk(ev: Evidence, rule: str, cause: str, severity: str, evidence: list[str], source: str,
        runbook: Optional[str], **detail) -> Finding:
    return Finding(rule, cause, severity, evidence, source, runbook, ev.group, ev.host, detail)


def _hicache_runbook(ev: Evidence, other: str = "bad-release") -> str:
    return "hicache-crash" if ev.hicache else other


# -- crashes -------------------------------------------------------------------------------------

_OOM = r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError: CUDA"
_OOM_WHERE = (  # (where, pattern over the lines before the OOM line), first match wins
    ("indexer kernel", r"fp8_paged_mqa_logits|paged_mqa_logits|indexer"),
    ("graph capture", r"cuda_graph|CudaGraphRunner|capture_one_batch|Capture cuda graph|capture\("),
    ("pool build", r"init_memory_pool|memory_pool|KVCache|profile_max_num_token|TokenToKVPool|mem_fraction_static"),
)


def rule_cuda_oom(ev: Evidence) -> list[Finding]:
    """CUDA OOM, and where: the indexer kernel (C2: ``fp8_paged_mqa_logits`` logits not covered
    by ``mem_fraction_static``, sglang#35201), graph capture, or the KV pool build (at start-up).
    Looks up to 40 lines before the OOM line for the frame that names the place."""
    lines = ev.lines()
    hits = _find(lines, _OOM)
    if not hits:
        return []
    i, line = hits[0]
    ctx = "\n".join(lines[max(0, i - 40):i + 1])
    where = next((w for w, p in _OOM_WHERE if re.search(p, ctx)), "unknown place")
    m = re.search(r"Tried to allocate ([\d.]+ [KMGT]i?B)", line)
    src = {"indexer kernel": "field-reports C2; sglang#35201, #39095",
           "graph capture": "field-reports C2 (memory outside mem_fraction_static); sglang#33246",
           "pool build": "field-reports C1/C2; dsv4ctl plan"}.get(where, "field-reports C2")
    cause = f"CUDA out of memory in the {where}" + (f" (tried to allocate {m[1]})" if m else "")
    return [_mk(ev, "cuda_oom", cause, "crash", [_cite(ev, i, line)], src, "oom-at-startup",
                where=where, tried=m[1] if m else None)]


def rule_illegal_memory_access(ev: Evidence) -> list[Finding]:
    """``CUDA error: an illegal memory access was encountered`` (H5: sglang#35811, B200 multi-turn
    with HiCache). With HiCache on the runbook is ``hicache-crash``, else ``bad-release``."""
    hits = _find(ev.lines(), r"illegal memory access")
    if not hits:
        return []
    i, line = hits[0]
    return [_mk(ev, "illegal_memory_access", "CUDA illegal memory access" + (" with HiCache on" if ev.hicache else ""),
                "crash", [_cite(ev, i, line)], "field-reports H5; sglang#35811", _hicache_runbook(ev),
                count=len(hits), hicache=ev.hicache)]


def rule_nan_sampling(ev: Evidence) -> list[Finding]:
    """The sampling assert that kills every TP rank when logits hold NaN/inf (sglang#33656: HiCache
    SWA write-position corruption, caught with ``--kv-canary=log``)."""
    lines = ev.lines()
    hits = _find(lines, r"probability tensor contains either `?inf`?, `?nan`?|NaN (?:in|detected in) (?:logits|sampling)"
                        r"|\bnan\b.{0,80}\bsampl|\bsampl\w*\b.{0,80}\bnan\b", re.I)
    if not hits:
        return []
    i, line = hits[0]
    ranks = sorted({m[1] for _, ln in hits for m in [re.search(r"\bTP(\d+)\b", ln)] if m}, key=int)
    return [_mk(ev, "nan_sampling", "NaN/inf in sampling probabilities (crash of "
                + (f"TP ranks {','.join(ranks)}" if ranks else "the scheduler") + ")",
                "crash", [_cite(ev, i, line)], "sglang#33656 (HiCache SWA write position); field-reports H5",
                _hicache_runbook(ev), ranks=ranks, hicache=ev.hicache)]


def rule_hicache_load_back(ev: Evidence) -> list[Finding]:
    """HiCache load-back errors (H5): the ``commit_hicache_transfer`` / LOAD_BACK
    ``TypeError: object of type 'NoneType' has no len()`` (sglang#32331) and
    ``cudaMemcpyBatchAsync failed ... invalid argument`` of the host pool (PR #26691 review)."""
    lines = ev.lines()
    hits = _find(lines, r"commit_hicache_transfer|LOAD_BACK|load_back|cudaMemcpyBatchAsync failed")
    if not hits:
        return []
    errs = _find(lines, r"TypeError: object of type 'NoneType' has no len\(\)|cudaMemcpyBatchAsync failed")
    if not errs:
        return []
    cites = [_cite(ev, i, ln) for i, ln in (hits[:1] + [e for e in errs if e != hits[0]][:2])]
    return [_mk(ev, "hicache_load_back", "HiCache load-back error (host pool -> device)", "crash", cites,
                "field-reports H5; sglang#32331, PR #26691", "hicache-crash")]


_KERNEL_ARG = r"(?:CUDA error|RuntimeError).{0,200}invalid argument|invalid argument.{0,200}(?:flash_mla|FlashMLA|kernel)"


def rule_kernel_argument(ev: Evidence) -> list[Finding]:
    """A kernel argument error under load (sglang#25620: FlashMLA ``invalid argument`` at
    concurrency >= 16): the concurrency is the last ``#running-req`` before the error.
    ``cudaMemcpyBatchAsync`` errors are HiCache load-back (:func:`rule_hicache_load_back`)."""
    lines = ev.lines()
    hits = [(i, ln) for i, ln in _find(lines, _KERNEL_ARG) if "cudaMemcpyBatchAsync" not in ln]
    if not hits:
        return []
    i, line = hits[0]
    conc = None
    for ln in reversed(lines[:i]):
        m = re.search(r"#running-req: (\d+)", ln)
        if m:
            conc = int(m[1])
            break
    kern = "FlashMLA" if re.search(r"flash_mla|FlashMLA", "\n".join(lines[max(0, i - 30):i + 1])) else "a kernel"
    return [_mk(ev, "kernel_argument", f"{kern} invalid argument" + (f" at concurrency {conc}" if conc else ""),
                "crash", [_cite(ev, i, line)], "sglang#25620", "bad-release", concurrency=conc, kernel=kern)]


# -- stalls ------------------------------------------------------------------------------------

def _pool(lines: list[str]) -> Optional[tuple[int, str, dict]]:
    """The last pool snapshot in the log: ``available_size=… evictable_size=… total=…`` (also
    ``available: …, evictable: …, total: …``; token counts)."""
    for i in range(len(lines) - 1, -1, -1):
        ln = lines[i]
        vals = {}
        for key in ("available", "evictable", "total", "protected"):
            m = re.search(rf"{key}(?:_size|_tokens)?\s*[=:]\s*(\d+)", ln)
            if m:
                vals[key] = int(m[1])
        if "available" in vals and "total" in vals:
            return i, ln, vals
    return None


def rule_watchdog_stall(ev: Evidence) -> list[Finding]:
    """Watchdog / scheduler stall (sglang#30532, #34235, #33549: a stall that ends in a watchdog
    kill). With a pool snapshot: ``available`` <= 5 % of ``total`` while ``evictable`` >= 50 % is
    an eviction deadlock (nothing frees what could be freed); ``available`` and ``evictable`` both
    low is a full pool (too much admitted: lower max-running-requests)."""
    lines = ev.lines()
    hits = _find(lines, r"[Ww]atchdog timeout|[Ss]cheduler watchdog|watchdog.{0,200}(?:kill|hang|stuck)|Scheduler hang")
    if not hits:
        return []
    i, line = hits[-1]
    cites = [_cite(ev, i, line)]
    pool = _pool(lines)
    kind, detail = "scheduler stall (watchdog)", {}
    if pool:
        pi, pl, v = pool
        cites.append(_cite(ev, pi, pl))
        tot = max(v["total"], 1)
        detail = dict(pool=v)
        if v["available"] <= POOL_FREE_SHARE * tot and v.get("evictable", 0) >= POOL_EVICTABLE_SHARE * tot:
            kind = "eviction deadlock (pool full of evictable tokens, none freed)"
        elif v["available"] <= POOL_FREE_SHARE * tot:
            kind = "full KV pool (no free or evictable tokens)"
    return [_mk(ev, "watchdog_stall", kind, "stall", cites, "sglang#30532, #34235, #33549", "scheduler-stall", **detail)]


_PHASE = re.compile(r"KVPoll\.(\w+)")


def rule_transfer(ev: Evidence) -> list[Finding]:
    """Wedged PD transfers. Log: ``KVTransferError`` lines (other than the PD abort lines of
    :func:`rule_pd_aborts`) counted by ``KVPoll`` phase
    (``Bootstrapping``: prefill never got the decode's indices; ``WaitingForInput``: the decode
    never got "transfer done", SGLANG_DISAGGREGATION_WAITING_TIMEOUT; sglang#11648, #10204), and
    the frozen transfer queue of field report P1: ``#transfer-req`` constant and > 0 over the last
    decode batch lines with ``#running-req`` <= 1. Metrics: ``sglang:num_decode_transfer_queue_reqs``
    > 0 and unchanged over the window with no generated tokens, or transfer failures rising."""
    from ..check.classify.pd import pd_abort_class
    lines = ev.lines()
    out: list[Finding] = []
    aborts = {i for i, ln in enumerate(lines) if pd_abort_class(ln)}         # rule_pd_aborts' lines
    errs = [(i, ln) for i, ln in _find(lines, r"KVTransferError") if i not in aborts]
    if errs:
        phases: dict[str, int] = {}
        for _, ln in errs:
            m = _PHASE.search(ln)
            phases[m[1] if m else "unknown"] = phases.get(m[1] if m else "unknown", 0) + 1
        top = max(phases, key=phases.get)
        out.append(_mk(ev, "transfer_error", f"KV transfers failing ({', '.join(f'{k}: {v}' for k, v in sorted(phases.items()))})",
                       "stall", [_cite(ev, i, ln) for i, ln in errs[:2]], "sglang#11648, #10204; field-reports P1",
                       "transfer-wedge", phases=phases, phase=top))
    batches = [(i, ln, int(m[1]), int(r[1])) for i, ln in _find(lines, r"Decode batch")
               for m in [re.search(r"#transfer-req: (\d+)", ln)] for r in [re.search(r"#running-req: (\d+)", ln)] if m and r]
    tail = batches[-3:]
    if len(tail) >= 3 and len({b[2] for b in tail}) == 1 and tail[0][2] > 0 and all(b[3] <= 1 for b in tail):
        out.append(_mk(ev, "transfer_wedge", f"decode transfer queue frozen at {tail[0][2]} with ≤1 running request",
                       "stall", [_cite(ev, tail[0][0], tail[0][1]), _cite(ev, tail[-1][0], tail[-1][1])],
                       "field-reports P1; sglang PR #31800", "transfer-wedge", transfer_queue=tail[0][2]))
    b, a = ev.metrics_before, ev.metrics_after
    if b and a and not any(f.rule == "transfer_wedge" for f in out):
        q0, q1 = b.get("sglang:num_decode_transfer_queue_reqs", 0), a.get("sglang:num_decode_transfer_queue_reqs", 0)
        gen = a.get("sglang:generation_tokens_total", 0) - b.get("sglang:generation_tokens_total", 0)
        failed = a.get("sglang:num_transfer_failed_reqs_total", 0) - b.get("sglang:num_transfer_failed_reqs_total", 0)
        if q1 > 0 and q0 == q1 and gen <= 0:
            out.append(_mk(ev, "transfer_wedge", f"decode transfer queue frozen at {q1:g} over {ev.window_s:g} s, no tokens generated",
                           "stall", [f"/metrics: sglang:num_decode_transfer_queue_reqs {q0:g} -> {q1:g}, "
                                     f"generation_tokens_total +{gen:g} in {ev.window_s:g} s"],
                           "field-reports P1; sglang PR #31800", "transfer-wedge", transfer_queue=q1))
        if failed > 0 and not errs and not aborts:
            out.append(_mk(ev, "transfer_error", f"{failed:g} KV transfers failed in {ev.window_s:g} s", "stall",
                           [f"/metrics: sglang:num_transfer_failed_reqs_total +{failed:g}"], "sglang#11648, #10204",
                           "transfer-wedge", failed=failed))
    return out


_PD_LABEL = {"pd_transfer_failed": "KV transfer failed", "pd_bootstrap_failed": "bootstrap or handshake failed",
             "pd_aborted": "aborted by AbortReq"}


def rule_pd_aborts(ev: Evidence) -> list[Finding]:
    """PD requests SGLang aborted, counted by class with the table ``check load`` judges its HTTP
    500s with (:data:`dsv4ctl.check.classify.pd.PD_ABORTS`: the stage ``Decode|Prefill
    transfer|handshake|bootstrap failed for request`` and the KV manager's reason, SGLang
    0.5.18-0.5.23). Transfer or bootstrap failures are a ``stall`` (runbook ``transfer-wedge``);
    aborts by ``AbortReq`` alone (the client, the router or the peer cancelled the request) are
    ``degraded`` with no runbook: the cause is on the other side."""
    from ..check.classify.pd import pd_abort_class
    counts: dict[str, int] = {}
    first: dict[str, tuple[int, str]] = {}
    for i, ln in enumerate(ev.lines()):
        cls = pd_abort_class(ln)
        if cls is not None:
            counts[cls] = counts.get(cls, 0) + 1
            first.setdefault(cls, (i, ln))
    if not counts:
        return []
    failed = any(c != "pd_aborted" for c in counts)
    order = [c for c in _PD_LABEL if c in counts]
    cause = "PD requests aborted: " + ", ".join(f"{counts[c]} {_PD_LABEL[c]}" for c in order)
    return [_mk(ev, "pd_aborts", cause, "stall" if failed else "degraded", [_cite(ev, *first[c]) for c in order],
                "SGLang srt/disaggregation decode.py, prefill.py, common/conn.py (0.5.18-0.5.23); sglang#11648, #10204",
                "transfer-wedge" if failed else None, classes=counts)]


def _group_gpus(ev: Evidence) -> list[dict]:
    return list(ev.gpus or [])


def rule_gpu_busy_no_progress(ev: Evidence) -> list[Finding]:
    """GPUs busy without progress: every GPU of the group at >= 90 % utilisation while /metrics
    shows no generated tokens over the window and requests are running or queued (a spinning
    kernel or a collective waiting on a dead peer). Also field report D1, accepted but never
    scheduled: requests running or queued, no tokens, every GPU at 0 %."""
    gpus, b, a = _group_gpus(ev), ev.metrics_before, ev.metrics_after
    if not gpus or not b or not a:
        return []
    gen = a.get("sglang:generation_tokens_total", 0) - b.get("sglang:generation_tokens_total", 0)
    waiting = a.get("sglang:num_running_reqs", 0) + a.get("sglang:num_queue_reqs", 0)
    if gen > 0 or waiting <= 0:
        return []
    utils = [g.get("util_pct") for g in gpus if g.get("util_pct") is not None]
    if not utils:
        return []
    ev_line = (f"nvidia-smi: GPUs {','.join(str(g['index']) for g in gpus)} at "
               f"{','.join(f'{u:g}' for u in utils)} % (power {','.join(str(g.get('power_w')) for g in gpus)} W); "
               f"/metrics: {waiting:g} requests running/queued, generation_tokens_total +{gen:g} in {ev.window_s:g} s")
    if min(utils) >= BUSY_UTIL_PCT:
        return [_mk(ev, "gpu_busy_no_progress", "GPUs busy with no token progress", "stall", [ev_line],
                    "sglang#30532, #34235 (stalls ending in a watchdog kill)", "scheduler-stall", util=utils)]
    if max(utils) == 0:
        return [_mk(ev, "never_scheduled", "requests accepted but never scheduled (GPUs idle)", "stall", [ev_line],
                    "field-reports D1; sglang#26783", "bad-release", util=utils)]
    return []


def rule_dead_rank(ev: Evidence) -> list[Finding]:
    """A dead process or rank: the group's process is not running (with its exit status when the
    service wrapper logged one), or a child/rank died (``Rank N scheduler is dead``, ``Child
    process unexpectedly failed``, ``Scheduler hit an exception``) while /health does not answer."""
    lines = ev.lines()
    cites: list[str] = []
    died = _find(lines, r"scheduler is dead|Child process unexpectedly failed|Scheduler hit an exception|"
                        r"exited with status [1-9]|received SIGQUIT|killed by signal")
    if died:
        cites.append(_cite(ev, *died[-1]))
    down = ev.alive is False or (died and ev.health not in (None, "ok"))
    if not down:
        return []
    if ev.alive is False:
        cites.insert(0, "process state: not running" + (f", exit status {ev.exit_status}" if ev.exit_status is not None else "")
                     + (f", {ev.restarts} start(s) in the window" if ev.restarts else ""))
    return [_mk(ev, "dead_rank", "server process (or a rank) is dead", "crash", cites,
                "sglang#32331 (worker dies, 5-6 min restart); field-reports H5", "scheduler-stall",
                exit_status=ev.exit_status, health=ev.health)]


def rule_kv_canary(ev: Evidence) -> list[Finding]:
    """KV canary violations (SGLang ``--kv-canary=log``, the check that caught sglang#33656's
    HiCache SWA write-position corruption): log lines naming the canary and a violation,
    mismatch or corruption. The exact wording is not pinned in the ops reference, so the pattern
    is deliberately loose: ``kv[ _-]?canary`` and ``violat|mismatch|corrupt`` on one line."""
    hits = _find(ev.lines(), r"(?i)kv[ _-]?canary.{0,200}(?:violat|mismatch|corrupt)")
    if not hits:
        return []
    return [_mk(ev, "kv_canary", f"{len(hits)} KV canary violation(s) logged", "degraded",
                [_cite(ev, i, ln) for i, ln in hits[:2]], "sglang#33656 (--kv-canary=log)", "hicache-crash",
                count=len(hits))]


RULES: tuple[Callable[[Evidence], list[Finding]], ...] = (
    rule_cuda_oom, rule_illegal_memory_access, rule_nan_sampling, rule_hicache_load_back, rule_kernel_argument,
    rule_watchdog_stall, rule_transfer, rule_pd_aborts, rule_gpu_busy_no_progress, rule_kv_canary, rule_dead_rank)

#: a specific crash signature explains a dead process: dead_rank then names that runbook
_SPECIFIC = ("cuda_oom", "illegal_memory_access", "nan_sampling", "hicache_load_back", "kernel_argument", "watchdog_stall")


def stopped_finding(ev: Evidence) -> Finding:
    """A group that is down because an operator stopped it (``dsv4ctl stop``, the last audit
    record that concerns it): no failure, no runbook (status says ``stopped`` too)."""
    rec = ev.stopped or {}
    msg = f' ("{rec["message"]}")' if rec.get("message") else ""
    return _mk(ev, "stopped", f"stopped on purpose by {rec.get('who', '?')} at {rec.get('ts', '?')}{msg}: not a "
               "failure (dsv4ctl start serves it again)", "ok", [f"audit: {rec.get('action')} {rec.get('detail', '')}"],
               "-", None)


def diagnose(ev: Evidence) -> list[Finding]:
    """Every rule over ``ev``, most severe first (a specific crash before ``dead_rank``). With no
    finding: ``healthy`` when /health answered ok (and the process is not known dead), else
    ``unknown`` (nothing matched; read the evidence)."""
    if ev.alive is False and ev.stopped is not None:
        return [stopped_finding(ev)]
    found = [f for rule in RULES for f in rule(ev)]
    specific = [f for f in found if f.rule in _SPECIFIC]
    for f in found:
        if f.rule == "dead_rank" and specific:
            f.runbook = specific[0].runbook
            f.detail["explained_by"] = specific[0].rule
    order = {r.__name__[5:]: i for i, r in enumerate(RULES)}
    found.sort(key=lambda f: (-SEVERITY[f.severity], f.rule == "dead_rank", order.get(f.rule, 99)))
    if found:
        return found
    if ev.health == "ok" and ev.alive is not False:
        return [_mk(ev, "healthy", "healthy: /health answers, no failure signature in the log or metrics", "ok",
                    [f"/health: ok; {len(ev.lines())} log lines read"], "-", None)]
    return [_mk(ev, "unknown", f"not serving ({ev.health or 'not probed'}) and no known signature", "degraded",
                [f"/health: {ev.health or 'not probed'}; process alive: "
                 f"{ {True: 'yes', False: 'no', None: 'unknown (host not read)'}[ev.alive] }"], "-", None)]


# -- servers over several nodes (--nnodes) -------------------------------------------------------

#: a node that could not reach node 0's dist-init address (torch.distributed's TCPStore client;
#: the stand-in's wording last)
_DIST_CONNECT = (r"client socket has timed out.{0,200}connect|DistNetworkError|[Ff]ailed to connect to .{0,200}"
                 r"(?:[Cc]onnection refused|errno: 111|timed out)|timed out initializing the process group")
#: node 0 could not open the dist-init listener (TCPStore server)
_DIST_BIND = r"server socket has failed to (?:listen|bind)|EADDRINUSE"
#: node 0 stuck on a collective whose peer is gone (torch ProcessGroupNCCL's watchdog)
_COLLECTIVE_TIMEOUT = r"Watchdog caught collective operation timeout|collective operation timeout|NCCL.{0,80}timed? ?out"
#: a node > 0 ending because node 0 went away
_NODE0_GONE = r"connection to node 0 .{0,80}closed|Connection reset by peer|NCCL.{0,80}remote process exited|Broken pipe"


def rule_lost_node(nodes: list[Evidence]) -> list[Finding]:
    """A node > 0 of a multi-node server is dead. SGLang cannot lose a rank: node 0 stays stuck in
    the collective it was in (``/health`` stops answering) until torch's NCCL watchdog fires
    (``TORCH_NCCL_... timeout``, SGLang ``--watchdog-timeout``), then exits. The finding sits on
    the dead node (its exit status and last lines) and quotes node 0's collective timeout when
    logged. Not raised when node 0 died first and the others followed it (their logs say node 0
    went away): that is node 0's own finding."""
    head = nodes[0]
    dead = [ev for ev in nodes[1:] if ev.alive is False]
    out = []
    stuck = _find(head.lines(), _COLLECTIVE_TIMEOUT)
    for ev in dead:
        lines = ev.lines()
        followed = _find(lines, _NODE0_GONE)
        if head.alive is False and followed and not stuck:
            continue
        cites = [f"{ev.host}: node {ev.node} process not running"
                 + (f", exit status {ev.exit_status}" if ev.exit_status is not None else "")]
        tail = [(i, ln) for i, ln in enumerate(lines) if ln.strip()][-2:]
        cites += [_cite(ev, i, ln) for i, ln in tail]
        if stuck:
            cites.append(_cite(head, *stuck[-1]))
        state = ("node 0 exited on its collective watchdog" if head.alive is False and stuck
                 else "node 0 is not running either" if head.alive is False
                 else f"node 0 stays stuck in a collective until its watchdog fires (/health: {head.health or 'not probed'})")
        out.append(_mk(ev, "lost_node", f"node {ev.node} of {ev.nnodes} is dead: {state}; restart every node of the "
                       "server together (a server cannot take a node back)", "crash", cites,
                       "SGLang multi-node (--nnodes): a lost rank is fatal to the server", None,
                       node=ev.node, exit_status=ev.exit_status, node0_alive=head.alive))
    return out


def rule_dist_init(nodes: list[Evidence]) -> list[Finding]:
    """The dist-init address (``--dist-init-addr`` HOST:PORT, node 0's torch.distributed store)
    does not work: node 0 could not listen on it (the port is taken: another server's dist-init
    or HTTP port, a leftover process), or a node > 0 timed out connecting to it (firewall, wrong
    address, node 0 not started). Node 0 then waits for every node before it serves HTTP."""
    out = []
    head = nodes[0]
    addr = head.dist_init or "the dist-init address"
    port = head.dist_init.rpartition(":")[2] if head.dist_init else None
    names = rf"(?:port:?\s*|[:,]\s?)({re.escape(port)})(?!\d)" if port else None
    bind = [(i, ln) for i, ln in _find(head.lines(), _DIST_BIND)      # a line naming another port is not ours
            if not (port and re.search(r"port:?\s*\d", ln) and not re.search(names, ln))]
    if not bind and port:
        bind = [(i, ln) for i, ln in _find(head.lines(), r"(?i)address already in use") if re.search(names, ln)]
    if bind:
        out.append(_mk(head, "dist_init_bind", f"node 0 cannot listen on {addr}: the port is taken; give the group "
                       "another dist_init_port (profile) or stop what holds it", "crash",
                       [_cite(head, *bind[-1])], "torch.distributed TCPStore (SGLang --dist-init-addr)", None,
                       dist_init=head.dist_init))
    for ev in nodes[1:]:
        hits = _find(ev.lines(), _DIST_CONNECT)
        if hits:
            out.append(_mk(ev, "dist_init_unreachable", f"node {ev.node} of {ev.nnodes} cannot reach node 0 at {addr}: "
                           "check the address, that node 0 started, and the firewall between the hosts", "crash",
                           [_cite(ev, *hits[-1])], "torch.distributed TCPStore (SGLang --dist-init-addr)", None,
                           node=ev.node, dist_init=head.dist_init))
    return out


def rule_release_split(nodes: list[Evidence]) -> list[Finding]:
    """The nodes of one server run different releases (a deploy or rollback that did not finish
    on every host): every node must run the same tree, or ranks disagree on the model code."""
    rel = {ev.node: ev.release for ev in nodes if ev.release}
    if len(set(rel.values())) <= 1:
        return []
    return [_mk(nodes[0], "release_split", "the nodes of this server run different releases: finish that deploy or "
                "roll back (dsv4ctl rollback) so every node runs one", "crash",
                [f"{ev.host}: node {ev.node} runs {ev.release or 'no release'}" for ev in nodes],
                "SGLang multi-node: every rank loads the same model code", None, releases=rel)]


#: torch's NCCL watchdog: ``[rank4]:[E223 11:14:34.991762039 ProcessGroupNCCL.cpp:616] [Rank 4] Watchdog
#: caught collective operation timeout: WorkNCCL(SeqNum=91885, OpType=ALLREDUCE, NumelIn=1290240, …,
#: Timeout(ms)=600000) ran for 600037 milliseconds before timing out.`` (sglang#3784, PR #3709; the
#: glog stamp is absent in torch < 2.2), and torch >= 2.4's ``failure detected by watchdog at work
#: sequence id: N`` (sglang#10216)
_NCCL_WATCHDOG = re.compile(r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(\d+), OpType=(\w+)"
                            r"|failure detected by watchdog at work sequence id: (\d+)")
#: gloo (the CPU group): ``RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81]
#: Timed out waiting 1800000ms for recv operation to complete``; the collective is the traceback's
_GLOO_TIMEOUT = re.compile(r"gloo/transport/\S+\] Timed out waiting (\d+)ms for (?:recv|send) operation")
_GLOO_OP = re.compile(r"\bin (all_reduce|all_gather|reduce_scatter|all_to_all|broadcast|barrier|gather|scatter|reduce)"
                      r"(?:_\w+)?\b")
_GLOG_TS = re.compile(r"\[(?:rank\d+\]:\[)?[EWIF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?")
_FULL_TS = re.compile(r"(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)")
_COLLECTIVE_RX = re.compile(_COLLECTIVE_TIMEOUT)
_RANK = re.compile(r"\[(?:PG [^\]]*?)?Rank (\d+)\]")


def _stamp(line: str, year: Optional[int]) -> Optional[float]:
    """Seconds (UTC, this host's clock) of a log line's glog stamp (``E1203 09:11:10.51``, the
    year from the log's last full date) or full stamp (``2026-12-03 09:11:10``), else None."""
    from calendar import timegm
    m = _GLOG_TS.search(line)
    if m and year is not None:
        mo, d, h, mi, se, frac = m.groups()
        try:
            return timegm((year, int(mo), int(d), int(h), int(mi), int(se))) + float(f"0.{frac or 0}")
        except (ValueError, OverflowError):
            return None
    m = _FULL_TS.search(line)
    return float(timegm(tuple(int(x) for x in m.groups()))) if m else None


def collective_timeouts(ev: Evidence, year: Optional[int] = None) -> list[dict]:
    """Every collective watchdog event of one node's log, in log order: ``{"i": line index,
    "line", "backend": "nccl" | "gloo", "op": "ALLREDUCE" | "ALLGATHER" | … | "unknown", "seq":
    int | None, "rank": int | None, "at": seconds or None}`` (``at`` on this machine's clock:
    the line's stamp, else the last stamp before it, minus ``ev.clock_offset_s``). A glog stamp
    has no year: the log's last full date before it gives it, else ``year``."""
    out: list[dict] = []
    last: Optional[float] = None
    lines = ev.lines()
    for i, ln in enumerate(lines):
        full = _FULL_TS.search(ln)
        if full:
            year = int(full[1])
        at = _stamp(ln, year)
        last = at if at is not None else last
        n, g = _NCCL_WATCHDOG.search(ln), _GLOO_TIMEOUT.search(ln)
        if not n and not g:
            if _COLLECTIVE_RX.search(ln):            # another wording of a collective timeout: unnamed
                out.append({"i": i, "line": ln, "backend": "nccl", "op": "unknown", "seq": None, "rank": None,
                            "at": None if last is None else last - (ev.clock_offset_s or 0.0)})
            continue
        if n:
            op, seq = (n[2], int(n[1])) if n[2] else ("unknown", int(n[3]))
            if op == "unknown":
                near = [e for e in out if e["seq"] == seq and e["op"] != "unknown"]
                if near:
                    continue                         # the same work item, already named
        else:
            back = [m for x in lines[max(0, i - 40):i] for m in [_GLOO_OP.search(x)] if m]
            op, seq = (back[-1][1].replace("_", "").upper() if back else "unknown"), None
            op = "REDUCE_SCATTER" if op == "REDUCESCATTER" else op
        r = _RANK.search(ln) or re.search(r"\[rank(\d+)\]", ln)
        stamp = at if at is not None else last
        out.append({"i": i, "line": ln, "backend": "nccl" if n else "gloo", "op": op, "seq": seq,
                    "rank": int(r[1]) if r else None,
                    "at": None if stamp is None else stamp - (ev.clock_offset_s or 0.0)})
    return out


def rule_collective_timeout(nodes: list[Evidence]) -> list[Finding]:
    """A collective across the nodes that never finished, read on **every** node: torch's NCCL
    watchdog (``OpType=ALLREDUCE`` …) or gloo's timeout, with the collective it names. The node
    whose watchdog fired first (log stamps, each host's clock offset applied) is where to look:
    a rank that never joined the collective (DeepSeek-V4 DP attention: ranks with an empty batch
    skip the all-reduce the others wait in, sglang#28915), a stalled node or the network between
    the nodes (NCCL_SOCKET_IFNAME, IB). The finding sits on that node and cites every node's first
    watchdog line; runbook ``scheduler-stall`` (restart every node together, roll back if it comes
    back)."""
    year = next((int(m[1]) for ev in nodes for m in [_FULL_TS.search(ev.log)] if m), None)
    events = [(ev, e) for ev in nodes for e in collective_timeouts(ev, year)[:1]]
    if not events:
        return []
    ev, first = min(events, key=lambda x: (x[1]["at"] is None, x[1]["at"] or 0.0, x[0].node))
    when = "" if first["at"] is None else " at " + datetime.fromtimestamp(first["at"], timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S")
    others = [x.node for x, _ in events if x is not ev]
    rank = f", rank {first['rank']}" if first["rank"] is not None else ""
    cause = (f"{first['op']} ({first['backend'].upper()}) timed out first on node {ev.node} of {ev.nnodes} "
             f"({ev.host}{rank}{when})" + (f", then on node(s) {', '.join(map(str, others))}" if others else "")
             + ": a collective across the nodes hung (a rank that never joined it, e.g. DP attention's all-reduce "
             "skipped by ranks with an empty batch, or a stalled node or network); restart every node of the server "
             "together")
    cites = [_cite(x, e["i"], e["line"]) for x, e in sorted(events, key=lambda x: x[0] is not ev)]
    return [_mk(ev, "collective_timeout", cause, "crash", cites,
                "PyTorch ProcessGroupNCCL / gloo watchdog; sglang#28915 (DP-attention all-reduce hang), #3784",
                "scheduler-stall", collective=first["op"], backend=first["backend"], first_node=ev.node,
                first_host=ev.host, rank=first["rank"], seq=first["seq"],
                nodes={x.node: {"op": e["op"], "at": e["at"]} for x, e in events})]


def diagnose_server(nodes: list[Evidence]) -> list[Finding]:
    """Findings for one server from its nodes' evidence (node-rank order; ``nodes[0]`` carries the
    HTTP probes, the others their process and log). One node: :func:`diagnose`. Several: every
    rule over every node's log (a crash signature anywhere counts) plus :func:`rule_lost_node`,
    :func:`rule_dist_init` and :func:`rule_release_split`; a node > 0 found dead is reported as a
    lost node, not a second ``dead_rank``. ``healthy`` only when node 0 is healthy, every node
    is alive and nothing else fired; most severe first."""
    if len(nodes) == 1 or all(ev.alive is False and ev.stopped is not None for ev in nodes):
        return diagnose(nodes[0])
    head = diagnose(nodes[0])
    found = [f for f in head if f.rule not in ("healthy", "unknown")]
    for ev in nodes[1:]:
        found += [f for rule in RULES if rule is not rule_dead_rank for f in rule(ev)]
    cross = rule_lost_node(nodes) + rule_dist_init(nodes) + rule_release_split(nodes)
    if not any(f.rule == "lost_node" for f in cross):
        cross += rule_collective_timeout(nodes)
    for c in [f for f in cross if f.rule == "collective_timeout"]:   # the scheduler stalled in it: one cause
        stalls = [f for f in found if f.rule == "watchdog_stall"]
        found = [f for f in found if f.rule != "watchdog_stall"]
        c.evidence += [f"{f.host}: {e}" if not e.startswith(f.host) else e for f in stalls for e in f.evidence[:1]]
        c.detail["explains"] = [f"watchdog_stall@{f.host}" for f in stalls]
    unread = [ev for ev in nodes[1:] if ev.alive is None]
    cross += [_mk(ev, "node_not_read", f"node {ev.node} of {ev.nnodes} was not read: whether it runs, and which "
                  "release, is unknown", "degraded", [f"{ev.host}: node {ev.node}: process state not read"], "-", None,
                  node=ev.node) for ev in unread]
    found += cross
    if cross and any(f.rule == "dead_rank" for f in found):
        first = cross[0]
        for f in found:
            if f.rule == "dead_rank" and f.detail.get("explained_by") is None:
                f.detail["explained_by"] = first.rule
                f.runbook = first.runbook
    down = [ev for ev in nodes[1:] if ev.alive is False]
    if not found and down:           # a node > 0 is dead and no rule explains it (node 0 died first)
        found.append(_mk(down[0], "dead_rank", f"node {down[0].node} of {down[0].nnodes} is not running", "crash",
                         [f"{ev.host}: node {ev.node} not running" for ev in down], "-", None))
    order = {r.__name__[5:]: i for i, r in enumerate(RULES)}
    found.sort(key=lambda f: (-SEVERITY[f.severity], f.rule == "dead_rank", order.get(f.rule, 99)))
    if found:
        return found
    return head
