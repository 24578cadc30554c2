"""A real Prometheus server (``/usr/bin/prometheus``, Debian package ``prometheus``; scripts/test.sh
installs it) as a test process: a temporary configuration (scrape and rule evaluation intervals,
static scrape targets, rule files), its TSDB in a temporary folder, its web listener on a
loopback address, nothing remote (no remote write or read; alerts go to the Alertmanagers given,
else nowhere). The HTTP API is read with urllib (:meth:`Prometheus.query`, :meth:`Prometheus.alerts`,
:meth:`Prometheus.rules`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable, Optional

import pytest
import yaml

INSTALL_HINT = ("prometheus not found on PATH or at /usr/bin/prometheus: bash scripts/test.sh installs it "
                "(Debian package prometheus; by hand: apt-get install --no-install-recommends prometheus)")


def prometheus_binary() -> str:
    """Path of the ``prometheus`` server; the test fails (never skips) when it is missing."""
    path = shutil.which("prometheus") or ("/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)
    if path is None:
        pytest.fail(INSTALL_HINT)
    return path


def poll(pred: Callable[[], object], timeout: float, what: str, every: float = 0.2):
    """Call ``pred`` until it returns something truthy (returned) or ``timeout`` seconds have
    passed (AssertionError naming ``what`` and the last value)."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {v!r})")
        time.sleep(every)


class _Server:
    """A server process of the Prometheus family run by a test: ``argv`` started in its own
    session with its log in ``self.log``, ready when ``GET /-/ready`` answers 200."""

    name = "server"
    url: str
    log: Path
    workdir: Path
    proc: Optional[subprocess.Popen] = None

    def _start(self, argv: list[str], ready_timeout: float) -> None:
        """Start ``argv`` (own session, output to ``self.log``) and wait for ``/-/ready``;
        AssertionError with the log's tail when it exits or is not ready in time."""
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(argv, cwd=self.workdir, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as r:
                    return r.status == 200
            except OSError:
                return False
        try:
            poll(ready, ready_timeout, f"{self.name} /-/ready", every=0.1)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.tail()}") from None

    def tail(self, n: int = 30) -> str:
        """The last ``n`` lines of the server's log."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; nothing when it was never started or is gone."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Prometheus(_Server):
    """One Prometheus process: ``workdir`` holds its configuration, the rule files, its TSDB and
    its log; it listens on ``addr:port`` and scrapes ``targets`` (``host:port`` strings, job
    ``job``) every ``interval`` seconds, evaluating ``rules`` (file name -> YAML text) as often,
    and sends its alerts to ``alertmanagers`` (``host:port`` strings; none by default)."""

    def __init__(self, workdir: Path, addr: str, port: int, targets: list[str], rules: dict[str, str],
                 interval: str = "1s", job: str = "dsv4ctl-watch", alertmanagers: tuple[str, ...] = ()):
        self.workdir = Path(workdir)
        self.url = f"http://{addr}:{port}"
        self.listen = f"{addr}:{port}"
        self.proc: Optional[subprocess.Popen] = None
        self.log = self.workdir / "prometheus.log"
        self.workdir.mkdir(parents=True, exist_ok=True)
        for name, text in rules.items():
            (self.workdir / name).write_text(text)
        self.config = self.workdir / "prometheus.yml"
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
            "rule_files": [str(self.workdir / name) for name in rules],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(targets)}]}],
        }
        if alertmanagers:
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": list(alertmanagers)}]}]}
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))

    name = "prometheus"

    def start(self, ready_timeout: float = 60) -> "Prometheus":
        """Start the server (own session, log to ``prometheus.log``) and wait for ``/-/ready``;
        AssertionError with the log's tail when it exits or is not ready in time."""
        self._start([prometheus_binary(), f"--config.file={self.config}", f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                     f"--web.listen-address={self.listen}", "--storage.tsdb.retention.time=1h", "--log.level=info"],
                    ready_timeout)
        return self

    def api(self, path: str, **params) -> object:
        """GET ``/api/v1/PATH`` with ``params``; its ``data`` (AssertionError unless ``status`` is
        ``success``)."""
        q = ("?" + urllib.parse.urlencode(params)) if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{q}", timeout=10) as r:
            doc = json.loads(r.read())
        assert doc.get("status") == "success", doc
        return doc["data"]

    def query(self, expr: str) -> list[tuple[dict, float]]:
        """An instant query: [(labels, value)] of its vector result (a scalar as one unlabelled item)."""
        data = self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [({}, float(data["result"][1]))]
        return [(s["metric"], float(s["value"][1])) for s in data["result"]]

    def value(self, expr: str) -> Optional[float]:
        """The value of an instant query with at most one series; None when it has none."""
        res = self.query(expr)
        assert len(res) <= 1, (expr, res)
        return res[0][1] if res else None

    def alerts(self) -> list[dict]:
        """``/api/v1/alerts``: every pending or firing alert (labels, annotations, state, activeAt, value)."""
        return self.api("alerts")["alerts"]

    def rules(self) -> list[dict]:
        """``/api/v1/rules``: every rule of every group, with its group name under ``group``."""
        return [dict(r, group=g["name"]) for g in self.api("rules")["groups"] for r in g["rules"]]


AM_HINT = ("prometheus-alertmanager not found on PATH or in /usr/bin: bash scripts/test.sh installs it "
           "(Debian package prometheus-alertmanager; by hand: apt-get install --no-install-recommends "
           "prometheus-alertmanager)")


def alertmanager_binary() -> str:
    """Path of Alertmanager (Debian's ``prometheus-alertmanager``, or ``alertmanager``); the test
    fails (never skips) when it is missing."""
    for name in ("prometheus-alertmanager", "alertmanager"):
        path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
        if path:
            return path
    pytest.fail(AM_HINT)


class Alertmanager(_Server):
    """One Alertmanager process (0.25): ``workdir`` holds ``config`` (a dict, written as
    alertmanager.yml), its storage and its log; it listens on ``addr:port``, clustering off (no
    gossip port is opened)."""

    name = "alertmanager"

    def __init__(self, workdir: Path, addr: str, port: int, config: dict):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.listen = f"{addr}:{port}"
        self.url = f"http://{self.listen}"
        self.log = self.workdir / "alertmanager.log"
        self.config = self.workdir / "alertmanager.yml"
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))

    def start(self, ready_timeout: float = 60) -> "Alertmanager":
        """Start it and wait for ``/-/ready``; AssertionError with the log's tail otherwise."""
        self._start([alertmanager_binary(), f"--config.file={self.config}", f"--storage.path={self.workdir / 'data'}",
                     f"--web.listen-address={self.listen}", "--cluster.listen-address=", "--log.level=info"],
                    ready_timeout)
        return self
