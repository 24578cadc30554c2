"""A deploy test world: a small SGLang-like git tree, a patch, serve configs and a profile whose
hosts are the real sshd hosts of the harness and whose launch commands start the stand-in."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.sshd.harness import Cluster, free_port

REPO = Path(__file__).resolve().parents[2]
STANDIN = f"env PYTHONPATH={REPO} {{python}} -m tests.sshd.standin_sglang"


def git(tree: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(tree), *args], check=True, capture_output=True, text=True,
                          env=dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                                   GIT_COMMITTER_EMAIL="t@t")).stdout


def make_tree(path: Path, files: int = 40) -> Path:
    """A git checkout shaped like SGLang (python/sglang/...), tagged v0.5.23."""
    pkg = path / "python" / "sglang" / "srt"
    pkg.mkdir(parents=True)
    (path / "python" / "sglang" / "__init__.py").write_text('__version__ = "0.5.23"\n')
    for i in range(files):
        (pkg / f"mod{i:03d}.py").write_text(f"# module {i}\n" + "x = 1\n" * (50 + i))
    (pkg / "mem_cache.py").write_text("INDEX_K_BYTES = 132\n")
    os.symlink("mod000.py", pkg / "alias.py")
    git(path, "init", "-q")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "base")
    git(path, "tag", "v0.5.23")
    return path


def make_patch(tree: Path, out: Path) -> Path:
    """A patch changing one file of the tree (the index-K sizing fix, in spirit)."""
    f = tree / "python" / "sglang" / "srt" / "mem_cache.py"
    old = f.read_text()
    f.write_text("INDEX_K_BYTES = 256\n")
    out.write_text(git(tree, "diff"))
    f.write_text(old)
    return out


#: Measured memory of the test groups (GiB): a DSV4-Flash rank that fits one B200 in the plan.
MEMORY = {"free_gib_before_load": 177.0, "weights_gib_per_rank": 40.0}

class World:
    """Profile + configs for ``hosts`` sshd hosts. Groups: prefill on h0, decode on h1, router on h2."""

    def __init__(self, cluster: Cluster, tmp: Path, nhosts: int = 4, keep: int = 5, known_hosts: Path | None = None):
        self.c = cluster
        self.tmp = tmp
        self.hosts = cluster.hosts[:nhosts]
        self.tree = make_tree(tmp / "sglang")
        self.patch = make_patch(self.tree, tmp / "0001-index-k.patch")
        self.cache = tmp / "cache"
        self.state_dir = tmp / "state"    # run log, promotion evidence
        self.cfgdir = tmp / "profile"
        self.cfgdir.mkdir()
        self.roots = {h.name: tmp / "roots" / h.name for h in self.hosts}
        self.ports = {"prefill": free_port(self.hosts[0].address), "decode": free_port(self.hosts[1].address),
                      "router": free_port(self.hosts[2].address)}
        self.keep = keep
        self.known_hosts = known_hosts
        self.extra = {"prefill": {}, "decode": {}}
        self.write()

    def write(self) -> None:
        for g in ("prefill", "decode"):
            cfg = {"model-path": "deepseek-ai/DeepSeek-V4-Flash", "served-model-name": "deepseek-v4-flash",
                   "host": "0.0.0.0", "port": self.ports[g], "tp-size": 1, "disaggregation-mode": g,
                   "disaggregation-bootstrap-port": 8998, "reasoning-parser": "deepseek-v4",
                   "tool-call-parser": "deepseekv4", **self.extra[g]}
            (self.cfgdir / f"{g}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        h = self.hosts
        decode_url = f"http://{h[1].address}:{self.ports['decode']}"
        prof = {
            "version": 1, "name": "deploy-test", "model": "deepseek-v4-flash",
            "sglang": {"version": "0.5.23", "tree": str(self.tree), "base_ref": "v0.5.23", "series": None},
            "deploy": {"root": "/nonexistent", "keep_releases": self.keep, "service": "auto", "health_timeout_s": 20,
                       "python": sys.executable,
                       "launch": {"server": STANDIN + " --config {config} --host {address} --port {port}",
                                  "router": STANDIN + " --host {address} --port {port} --router " + decode_url}},
            "hosts": [self.c.host_yaml(x, self.roots[x.name], known_hosts=self.known_hosts) for x in h],
            "groups": [
                # measured memory as an operator would give it: the deploy preflight plans these groups
                {"name": "prefill", "role": "prefill", "host": h[0].name, "gpus": [0], "tp": 1, "serve_config": "prefill.yaml",
                 "memory": MEMORY},
                {"name": "decode", "role": "decode", "host": h[1].name, "gpus": [0], "tp": 1, "serve_config": "decode.yaml",
                 "memory": MEMORY},
                {"name": "router", "role": "router", "host": h[2].name, "port": self.ports["router"],
                 "prefill": ["prefill"], "decode": ["decode"]},
            ],
        }
        self.profile = self.cfgdir / "profile.yaml"
        self.profile.write_text(yaml.safe_dump(prof, sort_keys=False))

    def env(self) -> dict:
        return {"DSV4CTL_CACHE": str(self.cache), "DSV4CTL_STATE_DIR": str(self.state_dir)}

    # -- host state -------------------------------------------------------------------------
    def current(self, host: str) -> str | None:
        p = self.roots[host] / "current"
        return os.readlink(p).rsplit("/", 1)[-1] if p.is_symlink() else None

    def currents(self) -> dict:
        return {h: self.current(h) for h in self.roots}

    def assert_complete(self, host: str) -> str:
        """``current`` resolves to a complete release whose files match its manifest."""
        rid = self.current(host)
        rel = self.roots[host] / "current"
        assert rel.resolve().parent == (self.roots[host] / "releases").resolve(), rel.resolve()
        man = json.loads((rel / "MANIFEST.json").read_text())
        assert json.loads((rel / "RELEASE.json").read_text())["id"] == rid
        for p, (h, size, _) in man["files"].items():
            assert hashlib.sha256((rel / p).read_bytes()).hexdigest() == h, p
        return rid

    def audit(self, host: str) -> list[dict]:
        p = self.roots[host] / "audit.jsonl"
        return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []

    def state(self, host: str) -> dict:
        return json.loads((self.roots[host] / "state.json").read_text())

    def stop_services(self) -> None:
        """Kill every stand-in started by the launcher in this world (by pid file)."""
        for r in self.roots.values():
            for pf in (r / "run").glob("*.pid") if (r / "run").exists() else []:
                try:
                    os.killpg(int(pf.read_text()), signal.SIGKILL)
                except (ProcessLookupError, ValueError, PermissionError):
                    pass


def http_status(url: str, timeout: float = 3) -> int:
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def wait_for(pred, timeout: float = 30, step: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return False


def gone_or_zombie(pid: int) -> bool:
    """True once process ``pid`` has exited (reaped, or a zombie waiting for its parent)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(") ", 1)[1].startswith("Z")
    except FileNotFoundError:
        return True


def kill_server(pidfile) -> int:
    """SIGKILL the process group a launcher pid file names and wait (at most 10 s) until its
    leader has exited: SIGKILL is delivered asynchronously, and on a loaded machine a probe sent
    right after ``killpg`` can still find the process running. Returns the pid."""
    pid = int(Path(pidfile).read_text())
    os.killpg(pid, signal.SIGKILL)
    assert wait_for(lambda: gone_or_zombie(pid), 10), f"process {pid} still runs 10 s after SIGKILL"
    return pid
