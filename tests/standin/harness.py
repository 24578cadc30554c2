"""Start the stand-in server as a real process on 127.0.0.1 for tests and benchmarks."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import yaml

REPO = Path(__file__).resolve().parents[2]

SERVE_CONFIG = {
    "model-path": "deepseek-ai/DeepSeek-V4-Flash",
    "served-model-name": "deepseek-v4-flash",
    "host": "0.0.0.0",
    "port": 30000,
    "tp-size": 4,
    "reasoning-parser": "deepseek-v4",
    "tool-call-parser": "deepseekv4",
    "enable-metrics": True,
    "enable-cache-report": True,
    "context-length": 65536,
}
"""A minimal SGLang 0.5.23 serve config for DeepSeek-V4 (HiCache off)."""


def kill_groups(pids) -> None:
    """SIGKILL the process groups led by ``pids`` (servers a test started through the launcher);
    groups already gone are skipped."""
    for pid in pids:
        try:
            os.killpg(pid, 9)
        except (ProcessLookupError, PermissionError):
            pass


def wait_health(url: str, timeout: float = 20) -> None:
    """Poll ``url``/health until it answers 200; RuntimeError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} not healthy")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(path: Path, **changes) -> Path:
    """Write SERVE_CONFIG with ``changes`` (dashed keys given with underscores; None removes)."""
    cfg = dict(SERVE_CONFIG)
    for k, v in changes.items():
        k = k.replace("_", "-")
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


_ZYGOTE: list = []


def _zygote():
    """This process's stand-in fork server (:class:`tests.cliserver.Server` of kind ``standin``,
    started on first use, stopped at exit), None with ``DSV4CTL_TEST_FORK=0``."""
    if os.environ.get("DSV4CTL_TEST_FORK", "1") == "0":
        return None
    if not _ZYGOTE:
        import atexit
        import tempfile

        from tests.cliserver import Server
        d = tempfile.mkdtemp(prefix="dsv4ctl-standin-")
        srv = Server(os.path.join(d, "sock"), str(REPO), os.path.join(d, "server.log"), kind="standin")
        _ZYGOTE.append(srv)
        atexit.register(srv.close)
    return _ZYGOTE[0]


def popen_standin(args: list[str], env: dict | None = None, quiet: bool = False):
    """Start ``python -m tests.standin.server ARGS`` (stdout and stderr to one text pipe,
    ``.stdout``; ``PYTHONUNBUFFERED=1``): forked from the pre-loaded stand-in server (about 0.05
    instead of 1.6 CPU-s: the tokenizer and SGLang's recipe are loaded once per pytest process),
    or a new process with ``DSV4CTL_TEST_FORK=0``. The handle has Popen's ``pid``, ``poll``,
    ``wait``, ``terminate``, ``kill``, ``returncode`` and ``stdout`` (None when ``quiet``: the
    output goes to /dev/null)."""
    env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    z = _zygote()
    if z is None:
        out = subprocess.DEVNULL if quiet else subprocess.PIPE
        return subprocess.Popen([sys.executable, "-m", "tests.standin.server", *args], cwd=REPO,
                                stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
    if quiet:
        nul, sink = os.open(os.devnull, os.O_RDONLY), os.open(os.devnull, os.O_WRONLY)
        try:
            proc = z.spawn([str(a) for a in args], env, str(REPO), nul, sink, sink)
        finally:
            os.close(nul)
            os.close(sink)
        proc.stdout = None
        return proc
    r, w = os.pipe()
    nul = os.open(os.devnull, os.O_RDONLY)
    try:
        proc = z.spawn([str(a) for a in args], env, str(REPO), nul, w, w)
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
        os.close(nul)
    proc.stdout = os.fdopen(r, "r", encoding="utf-8", errors="replace")
    return proc


@contextlib.contextmanager
def standin(config: Path, *flags: str, port: int | None = None, timeout: float = 60.0) -> Iterator[str]:
    """Run ``python -m tests.standin.server --config CONFIG --host 127.0.0.1 --port P FLAGS``;
    yield its base URL once ``/health`` answers 200; terminate it afterwards."""
    port = port or free_port()
    proc = popen_standin(["--config", str(config), "--host", "127.0.0.1", "--port", str(port), *flags])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"stand-in exited {proc.returncode}: {proc.stdout.read()}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("stand-in did not become healthy")
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
