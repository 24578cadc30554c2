"""A promotion test world: two real sshd hosts, each running one colocated group served by the
SGLang DSV4 **stand-in** of tests/standin (the one that corrupts tool calls with HiCache on at
high concurrency), started by the deploy launcher from the release's serve config."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import yaml

from tests.sshd.harness import Cluster, free_port
from tests.sshd.world import REPO, STANDIN as SSHD_STANDIN, make_tree

STANDIN = (f"env PYTHONPATH={REPO} {{python}} -m tests.standin.server --config {{config}} --host {{address}} "
           f"--port {{port}} --ttft-ms 2 --itl-ms 0")

SERVE = {"model-path": "deepseek-ai/DeepSeek-V4-Flash", "served-model-name": "deepseek-v4-flash",
         "host": "0.0.0.0", "tp-size": 8, "reasoning-parser": "deepseek-v4", "tool-call-parser": "deepseekv4",
         "enable-metrics": True}

#: Serve-config keys for a world whose promotions run ``check smoke``: its over-length probe sends
#: (context length + 1,024) x 4 characters, and the stand-in tokenizes them as SGLang would: about
#: 3.5 s of CPU per probe at DSV4's 1M-token context, a few ms at 16K. Nothing here depends on
#: the model's full context length.
SHORT_CONTEXT = {"context-length": 16384}


class PromoteWorld:
    """Profile with groups ``a`` (colocated, h0) and ``b`` (colocated, h1); with ``pd``:
    ``prefill`` (h0), ``decode`` (h1) and a ``router`` (h2, the tests/sshd stand-in router in
    front of the decode group; with ``gateway`` (sglang-router | smg) the REAL gateway of
    .venv-router in PD mode in front of prefill and decode, args from dsv4ctl's launch spec).
    The prefill's bootstrap port is a free one. ``hicache(on)`` rewrites the serve configs (a new release id on
    the next deploy); ``extra`` adds serve-config keys, ``launch_extra`` stand-in flags (both take effect at
the next ``hicache()``; ``extra`` may be given at construction too, e.g. :data:`SHORT_CONTEXT`). With ``nnodes`` N (not with ``pd``): ``a`` is one
    server over h0..h(N-1) and ``b`` over the next N hosts (SGLang ``--nnodes N``, TP 8N, node 0 first)."""

    def __init__(self, cluster: Cluster, tmp: Path, check: dict | None = None, pd: bool = False,
                 gateway: str | None = None, nnodes: int = 1, extra: dict | None = None):
        self.c = cluster
        self.tmp = tmp
        self.pd = pd
        self.gateway = gateway
        self.nnodes = nnodes
        self.extra: dict = dict(extra or {})
        self.launch_extra = ""          # stand-in flags appended to the launch command (a release's own)
        self.groups = ("prefill", "decode") if pd else ("a", "b")
        self.hosts = cluster.hosts[:3 if pd else 2 * nnodes]
        self.nodes = {g: self.hosts[i * nnodes:(i + 1) * nnodes] for i, g in enumerate(self.groups)} if not pd else \
            {g: [self.hosts[i]] for i, g in enumerate(self.groups)}
        self.tree = make_tree(tmp / "sglang", files=8)
        self.cache = tmp / "cache"
        self.state_dir = tmp / "state"    # run log, promotion evidence
        self.cfgdir = tmp / "profile"
        self.cfgdir.mkdir()
        self.roots = {h.name: tmp / "roots" / h.name for h in self.hosts}
        self.ports = {g: free_port(self.nodes[g][0].address) for g in self.groups}
        self.dist = {g: free_port(self.nodes[g][0].address) for g in self.groups} if nnodes > 1 else {}
        if pd:
            self.ports["router"] = free_port(self.hosts[2].address)
            self.ports["bootstrap"] = free_port(self.hosts[0].address)
            self.ports["prometheus"] = free_port(self.hosts[2].address)
        self.check = check or {"concurrency": 60, "max_corruption": 0.01, "turns": 2, "stall_timeout_s": 20}
        self.hicache(False)

    def hicache(self, on: bool, groups: tuple[str, ...] | None = None) -> None:
        for g in self.groups:
            cfg = dict(SERVE, port=self.ports[g], **self.extra)
            if self.nnodes > 1:   # DP attention: Flash's 8 output groups take attention TP 8 at most
                cfg.update({"tp-size": 8 * self.nnodes, "nnodes": self.nnodes, "attn-dp-size": self.nnodes})
            if self.pd:
                cfg.update({"disaggregation-mode": g, "disaggregation-bootstrap-port": self.ports["bootstrap"]})
            if on and (groups is None or g in groups):
                cfg.update({"enable-hierarchical-cache": True, "hicache-ratio": 2.0})
            (self.cfgdir / f"{g}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        h = self.hosts
        prof = {
            "version": 1, "name": "promote-test", "model": "deepseek-v4-flash",
            "sglang": {"version": "0.5.23", "tree": str(self.tree), "base_ref": "v0.5.23", "series": None},
            "deploy": {"root": "/nonexistent", "keep_releases": 5, "service": "launcher", "health_timeout_s": 30,
                       "python": sys.executable, "launch": {"server": STANDIN + self.launch_extra}},
            "check": self.check,
            "hosts": [self.c.host_yaml(x, self.roots[x.name]) for x in h],
            "groups": [{"name": g, "role": g if self.pd else "colocated", "host": h[i].name, "gpus": list(range(8)),
                        "tp": 8, "serve_config": f"{g}.yaml"} for i, g in enumerate(self.groups)],
        }
        if self.nnodes > 1:
            for grp in prof["groups"]:
                del grp["host"]
                grp.update(nodes=[x.name for x in self.nodes[grp["name"]]], tp=8 * self.nnodes,
                           dist_init_port=self.dist[grp["name"]])
        if self.pd:
            decode_url = f"http://{h[1].address}:{self.ports['decode']}"
            router = {"name": "router", "role": "router", "host": h[2].name,
                      "port": self.ports["router"], "prefill": ["prefill"], "decode": ["decode"]}
            if self.gateway:
                from dsv4ctl.profile.model import GATEWAYS
                from tests.gateway import router_env
                router.update(gateway=self.gateway, prometheus_host=h[2].address,
                              prometheus_port=self.ports["prometheus"], env={"HF_HUB_OFFLINE": "1"},
                              # a worker that is down at the gateway's start is retried every
                              # --worker-startup-check-interval s (default 30: longer than this
                              # world's 30 s health gate when prefill and router restart together)
                              launch=f"{router_env()} -m {GATEWAYS[self.gateway]} {{router_args}} "
                                     "--worker-startup-check-interval 1 --host {address} --port {port}")
            else:
                prof["deploy"]["launch"]["router"] = (SSHD_STANDIN + " --host {address} --port {port} --router "
                                                      + decode_url)
            prof["groups"].append(router)
        self.profile = self.cfgdir / "profile.yaml"
        self.profile.write_text(yaml.safe_dump(prof, sort_keys=False))

    def env(self) -> dict:
        return {"DSV4CTL_CACHE": str(self.cache), "DSV4CTL_STATE_DIR": str(self.state_dir)}

    def current(self, host: str) -> str | None:
        p = self.roots[host] / "current"
        return os.readlink(p).rsplit("/", 1)[-1] if p.is_symlink() else None

    def currents(self) -> dict:
        return {h: self.current(h) for h in self.roots}

    def state(self, host: str) -> dict:
        return json.loads((self.roots[host] / "state.json").read_text())

    def audit(self, host: str) -> list[dict]:
        p = self.roots[host] / "audit.jsonl"
        return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []

    def running_config(self, host: str) -> str:
        """The serve config the host's server process was started with (from its command line)."""
        root = self.roots[host]
        for pf in (root / "run").glob("*.pid"):
            pid = int(pf.read_text())
            for child in [pid] + _children(pid):
                try:
                    argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if b"tests.standin.server" in argv:
                    return argv[argv.index(b"--config") + 1].decode()
        return ""

    def stop_services(self) -> None:
        for r in self.roots.values():
            for pf in (r / "run").glob("*.pid") if (r / "run").exists() else []:
                try:
                    os.killpg(int(pf.read_text()), signal.SIGKILL)
                except (ProcessLookupError, ValueError, PermissionError):
                    pass


def _children(pid: int) -> list[int]:
    from tests.sshd.harness import descendants
    return descendants(pid)
