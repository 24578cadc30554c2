"""Pure parts of ``dsv4ctl watch``: what it probes and scrapes (from the resolved Deployment), the
probe request, the in-process alert conditions of ``--on-alert`` and the bookkeeping that keeps
its memory bounded. No I/O.

Probe traffic: every probed target gets at most one probe in flight and at most one probe per
``interval`` seconds (default :data:`DEFAULT_INTERVAL`: 6 per minute). A probe is one known-answer
tool turn of the ``check load`` workload (:class:`dsv4ctl.check.workload.Session` with every tool
turn known-answer), judged by :func:`dsv4ctl.check.expect.judge`: the same classifier as the gate.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Optional

from ..check import classify as C
from ..check.workload import Session
from ..errors import InputError

DEFAULT_INTERVAL = 10.0
"""Seconds between probes of one target (6 per minute)."""
MIN_INTERVAL = 1.0
"""The cap: never more than one probe per second per target (and one in flight)."""
DEFAULT_RELEASE_EVERY = 60.0
"""Seconds between reads of the hosts' active releases (one SSH command per host)."""
CLIENT_ERROR = "client_error"
"""A probe this machine could not send (DNS, out of descriptors or ports): not the server's answer."""
AUTH_REFUSED = "auth_refused"
"""A probe answered HTTP 401/403: the API key watch sends is refused."""
FAILED_CLASSES = C.NO_ANSWER + (CLIENT_ERROR, AUTH_REFUSED)
"""Classes that are no judged answer (counted as failed, not corrupted): HTTP errors, the PD
transfer and bootstrap failures, stalls, this machine's failures and a refused API key."""
PROBE_MAX_TOKENS = 512
CONDITIONS = ("corruption", "stuck")
"""``--on-alert`` conditions: ``corruption`` (the fast burn of the shipped rules, computed in
process) and ``stuck`` (a probe in flight past the stall timeout)."""


@dataclass(frozen=True)
class Target:
    """One thing ``watch`` looks at: ``name`` (group, or ``G#R`` for replica R), ``role``
    (``router``, ``prefill``, ``decode``, ``colocated``), ``url`` (HTTP base at node 0),
    ``metrics_url`` (its Prometheus endpoint: a server's ``/metrics``, a router's own listener),
    ``host`` (the node-0 host, whose active release labels the target) and ``probe`` (whether
    probes go to it: routers and colocated servers; prefill and decode servers of a PD pair only
    serve through their router, so they are scraped, not probed)."""

    name: str
    role: str
    url: str
    metrics_url: Optional[str]
    host: str
    probe: bool

    @property
    def source(self) -> str:
        """``gateway`` for a router's metrics, ``sglang`` for a server's."""
        return "gateway" if self.role == "router" else "sglang"


def targets(dep) -> list[Target]:
    """Every target of a :class:`~dsv4ctl.profile.deployment.Deployment`: routers first (profile
    order), then each server group's replicas at node 0. InputError (exit 2) when nothing would
    be probed (no router and no colocated server)."""
    out: list[Target] = []
    for g in dep.routers():
        out.append(Target(g.name, "router", g.url, g.metrics_url, g.group.host, True))
    for g in dep.servers():
        for (name, url), nodes in zip(g.replica_urls, g.server_nodes):
            out.append(Target(name, g.role, url, url + "/metrics", nodes[0].host, g.role == "colocated"))
    if not any(t.probe for t in out):
        raise InputError(f"{dep.path}: nothing to probe: watch probes through a router group or a colocated "
                         "server group, and the profile has neither")
    return out


def probe_session(n: int) -> Session:
    """The ``n``-th probe (0-based): one known-answer tool turn (the scenario, tool and
    ``tool_choice`` follow from ``n``, deterministically); even ``n`` stream (SSE), odd do not."""
    return Session(sid=n, turns=1, stream=n % 2 == 0, known_share=1.0, tool_max_tokens=PROBE_MAX_TOKENS)


def outcome(cls: str) -> str:
    """``ok``, ``failed`` (no judged answer: :data:`FAILED_CLASSES`) or ``corrupted``."""
    if cls == C.OK:
        return "ok"
    return "failed" if cls in FAILED_CLASSES else "corrupted"


@dataclass
class BurnWindow:
    """The fast-burn condition of the shipped alert ``DSV4ToolCallCorruptionFastBurn``, in process
    and, like the alert, per ``(target, release)``: the corrupted share of the judged probes of
    one release on one target is above ``burn`` × ``slo`` over both the ``long_s`` window and the
    ``short_s`` window, with at least ``min_probes`` probes in the long one. A release's probes
    never count for another one (a fix deployed over a corrupting release starts from nothing).
    Memory and time per key are bounded by the number of buckets (``short_s`` / 10 seconds each:
    120 over the long window), whatever the probe rate or the window; a key whose probes have
    all left the long window is dropped."""

    slo: float
    long_s: float = 3600.0
    short_s: float = 300.0
    burn: float = 10.0
    min_probes: int = 10
    _seen: dict = field(default_factory=dict)

    @property
    def bucket_s(self) -> float:
        return max(self.short_s / 10.0, 1e-3)

    def add(self, key: tuple[str, str], t: float, corrupted: bool) -> None:
        """Record one judged probe of ``key`` (target, release) at monotonic time ``t`` (seconds)."""
        q = self._seen.setdefault(key, collections.deque())
        b = int(t // self.bucket_s)
        if q and q[-1][0] == b:
            q[-1][1] += int(corrupted)
            q[-1][2] += 1
        else:
            q.append([b, int(corrupted), 1])
        self._trim(q, t)

    def _trim(self, q, now: float) -> None:
        oldest = int((now - self.long_s) // self.bucket_s)
        while q and q[0][0] < oldest:
            q.popleft()

    def ratio(self, key: tuple[str, str], now: float, window: float) -> tuple[int, int]:
        """(corrupted, judged) probes of ``key`` (target, release) in the last ``window`` seconds
        (whole buckets: the window's start rounds down to a bucket edge)."""
        first = int((now - window) // self.bucket_s)
        k = n = 0
        for b, kb, nb in self._seen.get(key) or ():
            if b >= first:
                k, n = k + kb, n + nb
        return k, n

    def burning(self, now: float) -> list[tuple[str, str, float, int]]:
        """(target, release) pairs whose corruption burns now: [(target, release, long-window
        corrupted share, judged probes in the long window)]."""
        out = []
        limit = self.burn * self.slo
        for key, q in list(self._seen.items()):
            self._trim(q, now)
            if not q:
                del self._seen[key]
                continue
            k_long, n_long = self.ratio(key, now, self.long_s)
            k_short, n_short = self.ratio(key, now, self.short_s)
            if n_long >= self.min_probes and n_short and k_long / n_long > limit and k_short / n_short > limit:
                out.append((key[0], key[1], k_long / n_long, n_long))
        return out


@dataclass
class ReleaseLabels:
    """Which release labels each target's series carry, and which to drop: a release that has
    not been active on the target for ``keep`` release changes loses its series (memory stays
    bounded over months of deploys)."""

    keep: int = 8
    _history: dict = field(default_factory=dict)     # target -> [release ids, most recent last]

    def activate(self, target: str, release: str) -> list[str]:
        """``release`` is active on ``target`` now; returns the releases whose series to remove."""
        h = self._history.setdefault(target, [])
        if h and h[-1] == release:
            return []
        if release in h:
            h.remove(release)
        h.append(release)
        drop, h[:] = h[:-self.keep - 1], h[-self.keep - 1:]
        return drop


def parse_on_alert(values: list[str], known_runbooks: list[str]) -> dict[str, str]:
    """``--on-alert [CONDITION=]RUNBOOK`` values → {condition: runbook}; the condition defaults to
    ``corruption``. InputError (exit 2) for an unknown condition or runbook, or a condition given
    twice."""
    out: dict[str, str] = {}
    for v in values:
        cond, sep, book = v.partition("=")
        if not sep:
            cond, book = "corruption", v
        cond, book = cond.strip(), book.strip()
        if cond not in CONDITIONS:
            raise InputError(f"--on-alert {v!r}: unknown condition {cond!r} (expected one of: {', '.join(CONDITIONS)})")
        if book not in known_runbooks:
            raise InputError(f"--on-alert {v!r}: no runbook {book!r} (shipped: {', '.join(sorted(known_runbooks))})")
        if cond in out:
            raise InputError(f"--on-alert: condition {cond!r} given twice")
        out[cond] = book
    return out


@dataclass
class ActionGate:
    """At most one ``--on-alert`` run per condition per ``window_s`` seconds (monotonic time);
    a run skipped because a deploy holds the lock does not use the window up."""

    window_s: float
    _last: dict = field(default_factory=dict)

    def due(self, condition: str, now: float) -> bool:
        """True when ``condition`` may run now."""
        last = self._last.get(condition)
        return last is None or now - last >= self.window_s

    def ran(self, condition: str, now: float) -> None:
        """A run of ``condition`` started at ``now``."""
        self._last[condition] = now
