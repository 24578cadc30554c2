"""``dsv4ctl watch --once --json`` through a REAL PD gateway, end to end through the CLI.

Real: the gateways (PyPI sglang-router 0.3.2 and smg 1.13.0 of .venv-router, started in PD mode
by :func:`tests.gateway.pd_gateway`; skipped, as tests/test_gateway.py is, when that environment
cannot be built), every HTTP hop (watch's probe -> gateway -> prefill and decode, watch's scrapes
of the gateway's Prometheus listener and of both servers' /metrics) and the ``dsv4ctl`` process.
Stand-in: the prefill and decode SGLang servers (tests/standin: no model runs; the answer goes
through SGLang 0.5.23's served path; ``--fault markup_as_text`` is the HiCache race's main
corruption, forced on every turn of the decode). All on 127.0.0.1 with free ports."""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_cli
from tests.gateway import PD, pd_gateway
from tests.promserver import poll
from tests.standin.harness import write_config

pytestmark = pytest.mark.gateway
KINDS = ["sglang-router", "smg"]
GPUS = {"model": "NVIDIA B200", "count": 8, "memory_mib": 183359}


def _port(url: str) -> int:
    return int(url.removesuffix("/metrics").rsplit(":", 1)[1])


def _profile(tmp: Path, pd: PD) -> Path:
    """A PD profile naming what :func:`pd_gateway` started: prefill and decode at the stand-ins'
    ports, the router at the gateway's port with its Prometheus listener."""
    write_config(tmp / "prefill.yaml", port=_port(pd.prefill), disaggregation_mode="prefill",
                 disaggregation_bootstrap_port=pd.bootstrap_port)
    write_config(tmp / "decode.yaml", port=_port(pd.decode), disaggregation_mode="decode")
    prof = {"version": 1, "name": f"watch-{pd.kind}", "model": "deepseek-v4-flash",
            "hosts": [{"name": "local", "address": "127.0.0.1", "gpus": GPUS}],
            "groups": [{"name": "prefill", "role": "prefill", "host": "local", "gpus": [0, 1, 2, 3], "tp": 4,
                        "serve_config": "prefill.yaml"},
                       {"name": "decode", "role": "decode", "host": "local", "gpus": [4, 5, 6, 7], "tp": 4,
                        "serve_config": "decode.yaml"},
                       {"name": "router", "role": "router", "host": "local", "port": _port(pd.url),
                        "prefill": ["prefill"], "decode": ["decode"], "gateway": pd.kind,
                        "prometheus_host": "127.0.0.1", "prometheus_port": _port(pd.metrics_url)}]}
    p = tmp / "profile.yaml"
    p.write_text(yaml.safe_dump(prof, sort_keys=False))
    return p


def _watch(p: Path):
    r = run_cli("watch", str(p), "--once", "--json", "--no-releases", timeout=180)
    assert "Traceback" not in r.err, r.err
    return r, {t["name"]: t for t in r.json()["targets"]}


def _chats(pd: PD, server: str) -> list[dict]:
    return [x for x in pd.seen(server)["requests"] if x["path"] == "/v1/chat/completions"]


def _through_the_gateway(pd: PD, rid: str) -> None:
    """The probe ``rid`` reached prefill and decode once each, as the gateway sends a PD request
    (one bootstrap_room for both, the prefill's bootstrap port), and nothing else came to them."""
    pc, dc = _chats(pd, pd.prefill), _chats(pd, pd.decode)
    assert [x["x_request_id"] for x in pc] == [x["x_request_id"] for x in dc] == [rid], (pc, dc)
    assert isinstance(pc[0]["bootstrap_room"], int) and pc[0]["bootstrap_room"] == dc[0]["bootstrap_room"]
    assert pc[0]["bootstrap_port"] == dc[0]["bootstrap_port"] == pd.bootstrap_port


@pytest.mark.parametrize("kind", KINDS)
def test_clean_pd_is_probed_through_the_gateway_and_the_servers_scraped(kind, tmp_path):
    with pd_gateway(kind, tmp_path) as pd:
        p = _profile(tmp_path, pd)
        r, t = _watch(p)
        assert r.code == 0, r.err
        _through_the_gateway(pd, t["router"]["probe"]["rid"])
    doc = r.json()
    assert doc["schema"] == "dsv4ctl.watch/1" and doc["ok"] is True and doc["profile"] == f"watch-{kind}"
    import jsonschema
    from dsv4ctl.resources import schema_path
    jsonschema.Draft202012Validator(json.loads(schema_path("watch").read_text())).validate(doc)
    assert [(x["name"], x["role"], x["url"]) for x in doc["targets"]] == [
        ("router", "router", pd.url), ("prefill", "prefill", pd.prefill), ("decode", "decode", pd.decode)]
    probe = t["router"]["probe"]
    assert (probe["target"], probe["class"], probe["outcome"]) == ("router", "ok", "ok"), probe
    assert probe["rid"].startswith("dsv4ctl-watch-") and probe["stream"] is True
    assert 0 < probe["ttft_s"] <= probe["e2e_s"] < 60
    # PD servers serve only through their router: scraped, never probed
    assert t["prefill"]["probe"] is None and t["decode"]["probe"] is None
    # the gateway's own Prometheus listener: nothing re-sent, no breaker open
    assert t["router"]["scrape"] == {"up": True, "retries": 0, "retries_exhausted": 0, "circuit_open": []}
    for name in ("prefill", "decode"):
        s = t[name]["scrape"]
        assert s["up"] is True and "error" not in s, (name, s)
        # smg may still hold the prefill's stream open when the scrape comes: running 0 or 1
        assert s["running"] in (0, 1) and s["queued"] == 0 and s["transfer_failed"] == 0, (name, s)
    assert t["decode"]["scrape"]["generation_tokens"] > 0      # the decode wrote the probe's answer
    assert all(x["release"] == "unknown" and x["host"] == "local" for x in doc["targets"])


@pytest.mark.parametrize("kind", KINDS)
def test_a_corrupting_decode_fails_the_router_probe_with_its_class(kind, tmp_path):
    with pd_gateway(kind, tmp_path, decode_flags=("--fault", "markup_as_text")) as pd:
        p = _profile(tmp_path, pd)
        r, t = _watch(p)
        assert r.code == 1, (r.code, r.err)
        _through_the_gateway(pd, t["router"]["probe"]["rid"])
    probe = t["router"]["probe"]
    assert (probe["class"], probe["outcome"]) == ("dsml_in_content", "corrupted"), probe
    assert r.json()["ok"] is False
    assert r.err.count("\n") == 1 and "gate failed: 1 of 1 probes not ok: router dsml_in_content" in r.err, r.err
    assert t["prefill"]["probe"] is None and t["decode"]["probe"] is None
    assert t["decode"]["scrape"]["up"] is True and t["prefill"]["scrape"]["up"] is True


@pytest.mark.parametrize("kind", KINDS)
def test_a_request_the_gateway_retried_is_ok_to_the_probe_and_counted_in_its_scrape(kind, tmp_path):
    """A decode that answers every other request 503: the gateway retries (its default), the probe
    sees ok, and watch's scrape of the gateway says it re-sent one client request (the PD pair is
    counted once under prefill and once under decode), none exhausted: what DSV4GatewayRetrying
    alerts on, since the corruption rate cannot see it."""
    with pd_gateway(kind, tmp_path, decode_flags=("--fault", "http_503")) as pd:
        p = _profile(tmp_path, pd)
        r, t = _watch(p)
        assert r.code == 0, r.err
    probe = t["router"]["probe"]
    assert (probe["class"], probe["outcome"]) == ("ok", "ok"), probe
    s = t["router"]["scrape"]
    assert (s["up"], s["retries"], s["retries_exhausted"]) == (True, 1, 0), s


def _kill_gateway(pd: PD) -> None:
    """SIGKILL the gateway :func:`pd_gateway` started: the child of this process that listens on
    the gateway's port (the gateways retitle their process: no module in /proc/PID/cmdline); wait
    until the port refuses connections."""
    rows = [x.split() for x in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    sockets = {f"socket:[{x[9]}]" for x in rows if x[1] == f"0100007F:{_port(pd.url):04X}" and x[3] == "0A"}

    def links(d: Path) -> set:
        out = set()
        for f in d.joinpath("fd").iterdir():
            try:
                out.add(os.readlink(f))
            except OSError:              # closed meanwhile
                pass
        return out
    mine = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid() \
                    and sockets & links(d):
                mine.append(int(d.name))
        except (OSError, ValueError, IndexError):
            continue
    assert len(mine) == 1, (sockets, mine)
    os.kill(mine[0], signal.SIGKILL)

    def refused() -> bool:
        try:
            socket.create_connection(("127.0.0.1", _port(pd.url)), timeout=2).close()
            return False
        except ConnectionRefusedError:
            return True
        except ConnectionResetError:
            # the SYN reached the listen queue of the dying process and was reset with it: ask again
            return False
    poll(refused, 30, f"{pd.kind} port {_port(pd.url)} to refuse connections")


@pytest.mark.parametrize("kind", KINDS)
def test_the_router_down_is_exit_3_in_one_line(kind, tmp_path):
    with pd_gateway(kind, tmp_path) as pd:
        p = _profile(tmp_path, pd)
        _kill_gateway(pd)
        r, t = _watch(p)
        assert r.code == 3, (r.code, r.err)
        # the servers are up, but watch never goes round the router to them
        assert _chats(pd, pd.prefill) == [] and _chats(pd, pd.decode) == []
    assert r.err.count("\n") == 1, r.err
    assert "watch --once: no probed target could be reached: router: " in r.err
    probe = t["router"]["probe"]
    assert (probe["class"], probe["outcome"]) == ("http_error", "failed"), probe
    assert probe["reason"].startswith("ClientConnectorError") and f"127.0.0.1:{_port(pd.url)}" in probe["reason"]
    assert r.json()["ok"] is False
    assert t["router"]["scrape"]["up"] is False and t["router"]["scrape"]["error"], t["router"]["scrape"]
    assert t["prefill"]["scrape"]["up"] is True and t["decode"]["scrape"]["up"] is True
    assert t["prefill"]["probe"] is None and t["decode"]["probe"] is None
