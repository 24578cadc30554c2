"""The REAL SGLang PD gateways (PyPI sglang-router 0.3.2 and smg 1.13.0, built into .venv-router
by scripts/router-env.sh) in front of stand-in prefill and decode servers (tests/standin), all on
127.0.0.1 with free ports, ``HF_HUB_OFFLINE=1``.

:func:`router_env` builds the environment once (skips the test with the reason when PyPI cannot
be reached); :func:`pd_gateway` starts prefill + decode stand-ins and the gateway and yields a
:class:`PD` once the gateway lists both workers as healthy and answers /v1/models."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import pytest

from tests.standin.harness import REPO, free_port, standin, write_config

ROUTER_VENV = REPO / ".venv-router"
ROUTER_PY = ROUTER_VENV / "bin" / "python"
GATEWAYS = {"sglang-router": "sglang_router.launch_router", "smg": "smg.launch_router"}
_env_error: Optional[str] = None


def router_env() -> Path:
    """The gateways' python (.venv-router), built by scripts/router-env.sh when missing (about a
    minute); ``pytest.skip`` with the script's reason when it cannot be built (no registry)."""
    global _env_error
    if (ROUTER_VENV / ".complete").exists():
        return ROUTER_PY
    if _env_error is None:
        p = subprocess.run(["bash", str(REPO / "scripts" / "router-env.sh")], capture_output=True, text=True,
                           timeout=900)
        _env_error = "" if p.returncode == 0 else (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
    if _env_error:
        pytest.skip(f"real gateways unavailable: {_env_error}")
    return ROUTER_PY


def get_json(url: str, timeout: float = 2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


@dataclass
class PD:
    """A running gateway in PD mode: ``url`` (its HTTP port), ``metrics_url`` (its Prometheus
    listener), ``prefill``/``decode`` (stand-in URLs), ``bootstrap_port`` (the prefill's),
    ``kind`` (sglang-router | smg), ``log`` (the gateway's stdout+stderr file)."""

    kind: str
    url: str
    metrics_url: str
    prefill: str
    decode: str
    bootstrap_port: int
    log: Path

    def seen(self, server: str) -> dict:
        """What a stand-in received: ``GET /_standin/requests``."""
        return get_json(server + "/_standin/requests")


@contextlib.contextmanager
def pd_gateway(kind: str, tmp: Path, *, decode_flags: tuple[str, ...] = (), prefill_flags: tuple[str, ...] = (),
               timeout: float = 60.0) -> Iterator[PD]:
    """Stand-in prefill (bootstrap listener on a free port) and decode, then the real ``kind``
    gateway: ``python -m MODULE --pd-disaggregation --prefill URL BOOT --decode URL --host
    127.0.0.1 --port P --prometheus-host 127.0.0.1 --prometheus-port Q``; ready when ``/workers``
    lists both healthy and ``/v1/models`` answers. Stops everything afterwards."""
    py = router_env()
    boot = free_port()
    pcfg = write_config(tmp / f"{kind}-prefill.yaml", disaggregation_mode="prefill",
                        disaggregation_bootstrap_port=boot, port=None, host=None)
    dcfg = write_config(tmp / f"{kind}-decode.yaml", disaggregation_mode="decode", port=None, host=None)
    with standin(pcfg, "--ttft-ms", "2", "--itl-ms", "0", *prefill_flags) as p, \
            standin(dcfg, "--ttft-ms", "2", "--itl-ms", "0", *decode_flags) as d:
        port, prom = free_port(), free_port()
        log = tmp / f"{kind}-gateway.log"
        cmd = [str(py), "-m", GATEWAYS[kind], "--pd-disaggregation", "--prefill", p, str(boot), "--decode", d,
               "--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
               "--prometheus-port", str(prom)]
        with open(log, "wb") as lf:
            proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, start_new_session=True,
                                    env=dict(os.environ, HF_HUB_OFFLINE="1", NO_COLOR="1", RUST_LOG_STYLE="never"))
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{kind} exited {proc.returncode}: {log.read_text()[-2000:]}")
                try:
                    ws = get_json(url + "/workers").get("workers", [])
                    if len(ws) == 2 and all(w.get("is_healthy") for w in ws) and get_json(url + "/v1/models")["data"]:
                        break
                except (OSError, ValueError, KeyError, TypeError, AttributeError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{kind} did not list both workers healthy: {log.read_text()[-2000:]}")
                time.sleep(0.1)
            yield PD(kind=kind, url=url, metrics_url=f"http://127.0.0.1:{prom}/metrics", prefill=p, decode=d,
                     bootstrap_port=boot, log=log)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
