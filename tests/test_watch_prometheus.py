"""``dsv4ctl watch`` under a real Prometheus (2.42, tests/promserver.py): the stand-in SGLang server
with HiCache on, ``dsv4ctl watch`` probing it every second, Prometheus scraping watch's /metrics
every second and evaluating the shipped rules with every window compressed 60x
(``render_rules(scale=1/60)``). A clean phase fires nothing; a load of 55 requests in flight
(the HiCache race of the stand-in corrupts turns at that concurrency) fires
``DSV4ToolCallCorruptionFastBurn`` with the target's labels; stopping the load resolves it.

Measured on the 2-core test machine while a full parallel suite ran (load average 12-14): 42-57 s
in all (start-up 7-10 s, clean phase ~15 s, the alert firing 11-20 s after 40 requests are in
flight, resolved 6-8 s after the load stops); about 5 CPU-s for the whole test, and the fault
phase ~0.08 CPU-s per second (stand-in 0.05, watch, Prometheus and the load threads ~0.01 each).
With ``-s`` the test prints its phases and CPU use."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from dsv4ctl.watch.rules import (ALERTS, FAST_FOR, FAST_LONG, FAST_SHORT, MIN_PROBES, RECORDS, RUNBOOKS, WINDOWS,
                                 ratio_record, render_rules)
from tests.conftest import REPO, loopback
from tests.promserver import Prometheus, poll, prometheus_binary
from tests.standin.harness import free_port, popen_standin, wait_health
from tests.test_watch import _profile

ALERT = "DSV4ToolCallCorruptionFastBurn"
SCALE = 1 / 60
"""Rule time scale: the fast burn's 1h/5m windows become 1m/5s and its ``for: 2m`` 2s. At the
watch's cap of one probe per second the 1m window holds up to 60 probes, well over the rules'
10-probe guard, so the guard does not call for a gentler scale; and 1/60 still leaves five 1 s
scrapes in the 5s short window. (The 2m windows of DSV4SchedulerStall and DSV4ProbeStuck become
2s: two samples, so DSV4SchedulerStall goes *pending* whenever two scrapes of watch see the same
token count while a probe waits for its first token; it cannot *fire* while probes finish every
second, which is why the probes here finish well within the 1 s interval.)"""
LONG_S, SHORT_S, FOR_S = WINDOWS[FAST_LONG] * SCALE, WINDOWS[FAST_SHORT] * SCALE, FAST_FOR * SCALE
STEP_S = 1.0
"""Prometheus' scrape and evaluation interval, and watch's probe interval and scrape interval."""

TTFT_MS, ITL_MS = 300, 5
"""Stand-in timing: 0.3 s to the first token, then 5 ms a token: a probe (~40 tokens) answers in
~0.5 s, so watch probes once a second; a load request (~420 tokens, :data:`LOAD_TEXT`) takes
~2.4 s, so ~23 requests a second keep 55 in flight."""
LOAD_IN_FLIGHT = 55
"""Load threads, each with one request in flight at a time: the stand-in's corruption probability
is flat at its 40-70 in-flight plateau (tests/standin/server.py corruption_probability)."""
CORRUPTION_SCALE = 2.0
"""The stand-in's ``--corruption-scale``: 2 x the incident's 15 % plateau = 30 % of turns corrupted
under the load. Why not the incident's 15 %: the compressed 1m window holds at most 60 probes
(in production the 1h window holds 360 at the default 10 s interval), and 15 % is only 1.5x the
alert's 10 % threshold, so binomial noise keeps the long-window ratio under the threshold a good
part of the time. A simulation of this setting (1 probe/s, 15 s clean phase, both windows, the
guard and ``for:``) misses the alert within 75 s in 6.8 % of the runs at 15 %, 0.6 % at 20 %,
and never at 30 % (median 13 s, 99.9 % within 54 s)."""
LOAD_TEXT = "The scheduler keeps the decode batch busy while the cache fills. " * 35
"""Load requests are scripted plain chat answers (``standin_output``): no tool parsing, the
stand-in only tokenizes and frames them."""
LOAD_S = TTFT_MS / 1000 + 450 * ITL_MS / 1000
"""Seconds one load request takes at most (~420 tokens)."""

RAMP_BOUND = 30.0
"""Seconds for the load to reach 40 requests in flight (55 threads starting at once)."""
CLEAN_BOUND = 60.0
"""Seconds from the start of Prometheus to MIN_PROBES probes in its long window (one probe a
second, plus watch's first round and the first scrapes and evaluations)."""
FIRE_BOUND = LONG_S + 15
"""Seconds from 40 requests in flight to the alert firing: after one long window the clean probes
of the first phase have left it and it holds only probes drawn at 30 % (3x the 10 % threshold),
so the long condition holds; then the short window needs one more corrupted probe (about one in
three), ``for:`` (2 s), watch's scrape, Prometheus' scrape and an evaluation (1 s each): 15 s for
all that on a busy machine."""
RESOLVE_BOUND = LOAD_S + 1 + 2 * STEP_S + SHORT_S + 3 * STEP_S + 5
"""Seconds from the end of the load to the alert resolved: the last load request ends and the
stand-in forgets its in-flight peak 1 s later, so the last probe it can corrupt starts by then
and ends within a probe interval; then the short window (5 s) passes over it, plus watch's
scrape, Prometheus' scrape and an evaluation; 5 s for a busy machine."""


class Load:
    """``n`` threads, each keeping one plain chat request in flight against ``addr:port`` (a
    keep-alive connection per thread) until :meth:`stop`. Counts requests done and failed."""

    def __init__(self, addr: str, port: int, n: int, model: str = "deepseek-v4-flash"):
        self.addr, self.port, self.n = addr, port, n
        self.body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Say something long."}],
                                "max_tokens": 1024, "standin_output": LOAD_TEXT})
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.done = 0
        self.errors: list[str] = []
        self.threads: list[threading.Thread] = []

    def start(self) -> "Load":
        """Start the threads."""
        for i in range(self.n):
            t = threading.Thread(target=self._run, name=f"load-{i}", daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def _run(self) -> None:
        conn = http.client.HTTPConnection(self.addr, self.port, timeout=60)
        try:
            while not self.stopping.is_set():
                try:
                    conn.request("POST", "/v1/chat/completions", self.body, {"Content-Type": "application/json"})
                    r = conn.getresponse()
                    data = r.read()
                    ok = r.status == 200 and json.loads(data)["choices"][0]["message"]["content"]
                except (OSError, http.client.HTTPException, ValueError) as e:
                    ok, data = False, repr(e).encode()
                    conn.close()
                    conn = http.client.HTTPConnection(self.addr, self.port, timeout=60)
                with self.lock:
                    if ok:
                        self.done += 1
                    else:
                        self.errors.append(data[:200].decode("utf-8", "replace"))
        finally:
            conn.close()

    def stop(self, timeout: float = 30) -> None:
        """Ask every thread to stop after its current request and wait for them."""
        self.stopping.set()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _sglang_running(url: str) -> float:
    """``sglang:num_running_reqs`` of the stand-in at ``url`` (one rank)."""
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "sglang:num_running_reqs")


def _watch_counts(murl: str) -> tuple[float, float]:
    """(probes judged, probes corrupted) of target ``one`` on watch's own /metrics."""
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(murl, timeout=5) as r:
        text = r.read().decode()
    probes = corrupted = 0.0
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            if s.labels.get("target") != "one":
                continue
            if s.name == "dsv4ctl_watch_probes_total":
                probes += s.value
            elif s.name == "dsv4ctl_watch_probes_corrupted_total":
                corrupted += s.value
    return probes, corrupted


def _fast_burn(prom: Prometheus, state: str):
    """The FastBurn alert of target ``one`` in ``state`` (``firing``, ``pending``), or None."""
    for a in prom.alerts():
        if a["labels"].get("alertname") == ALERT and a["labels"].get("target") == "one" and a["state"] == state:
            return a
    return None


def test_fast_burn_fires_under_the_hicache_race_and_resolves_when_it_ends(tmp_path):
    prometheus_binary()                       # fail first, saying how to install it
    t_begin = time.monotonic()
    addr = loopback(47)
    port, mport, pport = free_port(), free_port(), free_port()
    p = _profile(tmp_path, """\
        - {name: one, role: colocated, host: local, gpus: [0, 1, 2, 3, 4, 5, 6, 7], tp: 8, serve_config: c.yaml}
        """, port=port, address=addr)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(cfg.read_text() + "enable-hierarchical-cache: true\n")
    url, murl = f"http://{addr}:{port}", f"http://{addr}:{mport}/metrics"
    server = watch = prom = load = None
    watch_err = open(tmp_path / "watch.err", "w")
    times: dict[str, float] = {}
    try:
        server = popen_standin(["--config", str(cfg), "--host", addr, "--port", str(port), "--ttft-ms", str(TTFT_MS),
                                "--itl-ms", str(ITL_MS), "--corruption-scale", str(CORRUPTION_SCALE)], quiet=True)
        wait_health(url, timeout=60)
        watch = subprocess.Popen(
            [sys.executable, "-m", "dsv4ctl", "watch", str(p), "--no-releases", "--interval", "1s",
             "--scrape-every", "1s", "--listen", f"{addr}:{mport}", "--log", str(tmp_path / "watch.jsonl"), "-q"],
            cwd=REPO, env=dict(os.environ, NO_COLOR="1"), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=watch_err, start_new_session=True)
        prom = Prometheus(tmp_path / "prom", addr, pport, [f"{addr}:{mport}"],
                          {"rules.yml": render_rules(scale=SCALE, min_window=5)}).start()
        t_prom = time.monotonic()
        times["ready"] = t_prom - t_begin

        # the rules loaded as rendered: every group and rule, evaluated without error
        poll(lambda: all(r["health"] == "ok" for r in prom.rules()), 30, "every rule evaluated")
        rules = prom.rules()
        assert sorted(r["name"] for r in rules if r["type"] == "alerting") == sorted(ALERTS)
        assert sorted(r["name"] for r in rules if r["type"] == "recording") == sorted(RECORDS)
        burn = next(r for r in rules if r["name"] == ALERT)
        assert burn["duration"] == FOR_S == 2 and burn["labels"] == {"severity": "page"}
        assert all(not r.get("lastError") for r in rules), [r for r in rules if r.get("lastError")]

        # --- clean phase: probes judged ok, enough of them for the guard, nothing fires ---
        long_ratio, short_ratio = ratio_record(FAST_LONG), ratio_record(FAST_SHORT)
        long_n = f'sum(increase(dsv4ctl_watch_probes_total{{target="one"}}[{int(LONG_S)}s]))'
        poll(lambda: (prom.value(long_n) or 0) >= MIN_PROBES, CLEAN_BOUND,
             f"{MIN_PROBES} probes in the long window")
        assert prom.value('up{job="dsv4ctl-watch"}') == 1.0
        assert prom.value(f'{long_ratio}{{target="one",release="unknown"}}') == 0.0
        assert prom.value('dsv4ctl_watch_scrape_up{target="one",source="sglang"}') == 1.0
        probes, corrupted = _watch_counts(murl)
        assert probes >= MIN_PROBES and corrupted == 0
        clean_s = time.monotonic() - t_prom
        # at no evaluation of the clean phase (not only now) did an alert fire, nor did a
        # corruption alert even go pending
        span = f"{int(clean_s) + 2}s"
        assert prom.query(f'count_over_time(ALERTS{{alertstate="firing"}}[{span}])') == []
        assert prom.query(f'count_over_time(ALERTS{{alertname=~"DSV4ToolCallCorruption.*"}}[{span}])') == []
        assert [a for a in prom.alerts() if a["state"] == "firing"] == []
        times["clean"] = time.monotonic() - t_begin

        # --- fault: ~55 requests in flight, the stand-in's HiCache race corrupts turns ---
        cpu0 = {"standin": _cpu_s(server.pid), "watch": _cpu_s(watch.pid), "prometheus": _cpu_s(prom.proc.pid),
                "test": time.process_time()}
        t_load = time.monotonic()
        load = Load(addr, port, LOAD_IN_FLIGHT).start()
        poll(lambda: _sglang_running(url) >= 40, RAMP_BOUND, "40 requests in flight")
        t_fault = time.monotonic()
        times["ramp"] = t_fault - t_load
        firing = poll(lambda: _fast_burn(prom, "firing"), FIRE_BOUND, f"{ALERT} firing")
        t_fire = time.monotonic()
        times["fire"] = t_fire - t_fault
        assert firing["labels"] == {"alertname": ALERT, "target": "one", "release": "unknown", "severity": "page"}
        assert firing["annotations"]["runbook"] == f"dsv4ctl runbook run {RUNBOOKS[ALERT]} PROFILE"
        assert firing["annotations"]["runbook_url"] == \
            "https://github.com/dsv4ctl/dsv4ctl/blob/main/docs/alerts.md#dsv4toolcallcorruptionfastburn"
        assert "one (release unknown)" in firing["annotations"]["summary"]
        # the alert's value is the long-window ratio: over 10x the SLO, under what the race draws
        value = float(firing["value"])
        assert 0.1 < value <= 0.9, value
        ratio = prom.value(f'{long_ratio}{{target="one",release="unknown"}}')
        assert ratio is not None and 0.05 <= ratio <= 0.9, ratio
        running = prom.value('dsv4ctl_watch_sglang_running_requests{target="one"}')
        assert running is not None and 40 <= running <= LOAD_IN_FLIGHT + 1, running
        probes, corrupted = _watch_counts(murl)
        assert corrupted >= 2, (probes, corrupted)

        # --- the fault ends: the short window empties and the alert resolves ---
        t_stop = time.monotonic()
        load.stop()
        cpu1 = {"standin": _cpu_s(server.pid), "watch": _cpu_s(watch.pid), "prometheus": _cpu_s(prom.proc.pid),
                "test": time.process_time()}
        fault_wall = time.monotonic() - t_load
        assert not load.errors, load.errors[:3]
        assert load.done > 0
        poll(lambda: _sglang_running(url) <= 1, 30, "the load drained")
        # the stand-in draws a turn's corruption at its first token from the in-flight peak of
        # the last second: the probes that start a second after the drain are clean, so watch's
        # corrupted count is final once three more probes are judged
        drained = _watch_counts(murl)[0]
        poll(lambda: _watch_counts(murl)[0] >= drained + 3, 30, "three probes after the drain")
        final = _watch_counts(murl)[1]
        poll(lambda: prom.value('sum(dsv4ctl_watch_probes_corrupted_total{target="one"})') == final, 10,
             f"Prometheus scraped the final count of {final:.0f} corrupted probes")

        def resolved():
            return (_fast_burn(prom, "firing") is None and _fast_burn(prom, "pending") is None
                    and prom.value(f'{short_ratio}{{target="one"}}') == 0.0)
        poll(resolved, max(0.0, t_stop + RESOLVE_BOUND - time.monotonic()), f"{ALERT} resolved")
        times["resolve"] = time.monotonic() - t_stop
        # it stays resolved: three more probes, all clean, and the alert does not come back
        probes = _watch_counts(murl)[0]
        poll(lambda: _watch_counts(murl)[0] >= probes + 3, 30, "three more probes")
        assert _watch_counts(murl)[1] == final
        assert _fast_burn(prom, "firing") is None
        # the short ratio reads 0 again once Prometheus has scraped and evaluated after the probes
        # (under load a scrape can lag the probes by a few seconds: the series is briefly absent)
        poll(resolved, 15, f"{ALERT} still resolved")
        corrupted = final
        times["total"] = time.monotonic() - t_begin
        use = {k: cpu1[k] - cpu0[k] for k in cpu0}
        print(f"\nwatch+prometheus: phases {json.dumps({k: round(v, 1) for k, v in times.items()})}; "
              f"fault phase {fault_wall:.1f} s wall, CPU s {json.dumps({k: round(v, 2) for k, v in use.items()})}, "
              f"{load.done} load requests; probes {probes:.0f} ({corrupted:.0f} corrupted); "
              f"alert value {value:.3f}, long ratio {ratio:.3f}")
    finally:
        if load is not None:
            load.stop()
        if prom is not None:
            prom.stop()
        if watch is not None and watch.poll() is None:
            watch.send_signal(signal.SIGTERM)
            try:
                watch.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(watch.pid, signal.SIGKILL)
                watch.wait()
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        watch_err.close()
