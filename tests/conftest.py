"""Shared test helpers: run the real CLI in a subprocess, paths of shipped data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEFAULT_PROFILE = REPO / "profiles" / "dsv4-flash-8xb200-pd.yaml"
ORACLE_PY = REPO / ".venv-oracle" / "bin" / "python"


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)


def worker_index() -> int:
    """This pytest-xdist worker's number (``gw3`` -> 3); 0 without xdist. ``DSV4CTL_TEST_NET=N``
    sets it (6..254) so that several pytest runs on one machine keep apart."""
    net = os.environ.get("DSV4CTL_TEST_NET", "")
    if net.isdigit() and 0 < int(net) < 255:
        return int(net)
    w = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(w[2:]) if w.startswith("gw") and w[2:].isdigit() else 0


def loopback(n: int) -> str:
    """Loopback address ``n`` of this worker: ``127.0.<worker>.<n>`` (workers never share an
    address, so ports picked on one cannot collide with another worker's)."""
    return f"127.0.{worker_index()}.{n}"


def mount_tmpfs(path: Path, size: str) -> None:
    """Mount a tmpfs of ``size`` (``64k``, ``3m``) on the existing folder ``path`` (a small disk
    to fill); the test skips where mounting is not allowed. Undo with :func:`umount`."""
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True)
    if m.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {m.stderr.strip()}")


def umount(path: Path) -> None:
    """Unmount ``path`` (lazily when it is still busy)."""
    if subprocess.run(["umount", str(path)], capture_output=True).returncode:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, input: str | None = None,
            timeout: float = 120) -> Result:
    """Run ``dsv4ctl ARGS`` as a user would and capture everything: a child forked from the
    per-process pre-imported server of :mod:`tests.cliserver` (what ``python -m dsv4ctl.cli``
    would be, without paying Python's start-up and the imports per run), or with
    ``DSV4CTL_TEST_FORK=0`` a new process per run."""
    e = dict(os.environ, COLUMNS="200", NO_COLOR="1")
    e.update(env or {})
    server = _cli_server()
    if server is not None:
        code, out, err = server.run([str(a) for a in args], e, str(cwd or REPO), input, timeout)
        return Result(code, out, err)
    p = subprocess.run([sys.executable, "-m", "dsv4ctl.cli", *args], cwd=cwd or REPO, env=e,
                       capture_output=True, text=True, timeout=timeout, input=input)
    return Result(p.returncode, p.stdout, p.stderr)


_SERVER: list = []


def _cli_server():
    """This process's :class:`tests.cliserver.Server` (started on first use, stopped at exit);
    None with ``DSV4CTL_TEST_FORK=0``."""
    if os.environ.get("DSV4CTL_TEST_FORK", "1") == "0":
        return None
    if not _SERVER:
        import atexit
        import tempfile

        from tests.cliserver import Server
        d = tempfile.mkdtemp(prefix="dsv4ctl-cli-")
        srv = Server(os.path.join(d, "sock"), str(REPO), os.path.join(d, "server.log"))
        _SERVER.append(srv)
        atexit.register(srv.close)
    return _SERVER[0]


@pytest.fixture
def cli():
    return run_cli


def oracle_available() -> bool:
    return ORACLE_PY.exists()


# -- measuring the suite: CPU seconds per test (docs/testing.md) ---------------------------------

_CPU_LOG = os.environ.get("DSV4CTL_TEST_CPU")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With ``DSV4CTL_TEST_CPU=FILE``: append ``nodeid<TAB>cpu_s<TAB>wall_s<TAB>worker<TAB>start``
    per test, where cpu_s counts this process and the children it reaped during the test (a CLI
    run, a stand-in), worker is the xdist worker number and start the Unix time the test began
    (``python -m tests.durations FILE --schedule`` prints each worker's timeline from them)."""
    if not _CPU_LOG:
        yield
        return
    import resource
    import time

    def cpu() -> float:
        s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
    c0, t0, start = cpu(), time.monotonic(), time.time()
    yield
    with open(_CPU_LOG, "a") as f:
        f.write(f"{item.nodeid}\t{cpu() - c0:.2f}\t{time.monotonic() - t0:.2f}\t{worker_index()}\t{start:.1f}\n")


# -- scheduling: units of work, the longest first --------------------------------------------------

_DURATIONS = REPO / "tests" / "data" / "durations.json"
# Session-scoped fixtures every worker builds for itself anyway (cheap, or per-worker by design):
# a test that uses only these and function-scoped fixtures is a unit of work of its own.
_PER_WORKER = {"sshd_cluster", "cache_env", "tmp_path_factory", "worker_id", "testrun_uid"}


def _units_file(testrunuid: str) -> Path:
    """Where the workers leave the map from test id to unit for the controller (one per run)."""
    import tempfile
    return Path(tempfile.gettempdir()) / f"dsv4ctl-units-{testrunuid}.json"


def pytest_configure(config):
    """The processes the tests start get the SIGINT disposition a terminal gives: a suite started
    as a background job (``cmd &`` in a non-interactive shell) inherits SIGINT ignored, which
    every child would inherit too, so a test's Ctrl-C to dsv4ctl would never land.

    Under pytest-xdist the controller schedules :func:`unit_of` units (see
    :func:`pytest_collection_modifyitems`): the workers, which collect, write the map from test
    id to unit into :func:`_units_file` of the run's ``--testrunuid``, fixed here before the
    controller starts them."""
    import signal
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput") \
            and getattr(config.option, "dist", "no") == "loadscope":
        import uuid
        if not config.option.testrunuid:
            config.option.testrunuid = uuid.uuid4().hex
        path = _units_file(config.option.testrunuid)
        path.unlink(missing_ok=True)
        config.pluginmanager.register(_UnitScheduling(path), "dsv4ctl-units")


def unit_of(item) -> str:
    """The unit of work a test belongs to: the tests that share an expensive fixture run on one
    worker, one after another; the others are each a unit of their own.

    - a session-scoped fixture not in ``_PER_WORKER`` (the patched SGLang tree and its oracle
      runs): ``session:NAME``, so every test using it, across modules, is one unit and the
      fixture is built once;
    - a module- or class-scoped fixture (a module's stand-in server, the booted systemd, the
      CPU oracle matrix, a built wheel): the module (``tests/test_x.py``);
    - otherwise the test id itself."""
    module = item.nodeid.split("::", 1)[0]
    info = getattr(item, "_fixtureinfo", None)
    scoped = False
    if info is not None:
        for name, defs in sorted(info.name2fixturedefs.items()):
            scope = defs[-1].scope if defs else "function"
            if scope == "session" and name not in _PER_WORKER:
                return f"session:{name}"
            if scope in ("module", "class", "package"):
                scoped = True
    return module if scoped else item.nodeid


def pytest_collection_modifyitems(session, config, items):
    """Units of work (:func:`unit_of`), the longest first. ``tests/data/durations.json`` holds
    seconds per test id of a recorded run (tests over 1 s); a unit weighs the sum of its tests.
    scripts/test.sh runs pytest-xdist with ``--dist loadscope --no-loadscope-reorder`` and a
    scheduler (:class:`_UnitScheduling`) whose scopes are these units: each idle worker takes the
    next unit in this order, longest-processing-time-first, so the long waits overlap at the start
    instead of one worker finishing alone at the end, and a module of independent tests (the
    promotion matrix over sshd hosts) is spread over every worker instead of running on one.
    Refresh the file with ``python -m tests.durations FILE`` after a ``DSV4CTL_TEST_CPU=FILE`` run."""
    try:
        known = json.loads(_DURATIONS.read_text())
    except (OSError, ValueError):
        known = {}
    units = {it.nodeid: unit_of(it) for it in items}
    weight: dict[str, float] = {}
    for it in items:
        weight[units[it.nodeid]] = weight.get(units[it.nodeid], 0.0) + known.get(it.nodeid, 0.0)
    order = {id(it): i for i, it in enumerate(items)}
    items.sort(key=lambda it: (-weight[units[it.nodeid]], units[it.nodeid], order[id(it)]))
    if hasattr(config, "workerinput"):
        path = _units_file(config.workerinput["testrunuid"])
        tmp = path.with_name(f"{path.name}.{config.workerinput['workerid']}")
        tmp.write_text(json.dumps(units))
        os.replace(tmp, path)


class _UnitScheduling:
    """The pytest-xdist hook that makes ``--dist loadscope`` schedule :func:`unit_of` units
    instead of modules (xdist 3.8: ``LoadScopeScheduling._split_scope`` is the grouping)."""

    def __init__(self, path: Path):
        self.path = path

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config, log):
        from xdist.scheduler import LoadScopeScheduling
        path = self.path

        class Units(LoadScopeScheduling):
            _units: dict | None = None

            def _split_scope(self, nodeid):
                if self._units is None:
                    try:
                        self._units = json.loads(path.read_text() or "{}")
                    except (OSError, ValueError):
                        self._units = {}
                return self._units.get(nodeid) or nodeid.split("::", 1)[0]

        return Units(config, log)

    def pytest_unconfigure(self, config):
        self.path.unlink(missing_ok=True)
