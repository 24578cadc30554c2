"""The Python environment belongs to the release (issue 26 item 1): real uv builds each host's
environment from the release's hashed lock (real wheels from a local folder: no network), the
servers run its interpreter, a rollback brings the old environment back with the tree, verify
catches a package upgraded by hand, a build that fails leaves nothing half-built and no host
switched, and the preflight refuses a lock that contradicts SGLang 0.5.23's own pins (read from
the real wheel's METADATA)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, run_cli
from tests.envkit import lock_text, make_wheel
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401
from tests.sshd.world import World, git, http_status, wait_for

pytestmark = pytest.mark.sshd

UV = str(Path(sys.executable).parent / "uv")
STANDIN = f"env PYTHONPATH={REPO} {sys.executable} -m tests.sshd.standin_sglang"
# the server's launch runs the release's own interpreter first ({python}: ROOT/envs/<digest>/bin/python),
# which prints the version of the locked package it imports, then the stand-in
PROBE = "{python} -c 'import dsv4probe; print(\"dsv4probe\", dsv4probe.__version__, flush=True)' && "


class EnvWorld(World):
    """World (prefill h0, decode h1, router h2) whose profile has ``sglang.environment``."""

    def __init__(self, cluster, tmp: Path):
        self.wheels = tmp / "wheels"
        self.locks = {}
        for v in ("1.0", "1.1"):
            w = make_wheel(self.wheels, "dsv4probe", v, ("dsv4dep==2.0",))
            self.locks[v] = lock_text([w, make_wheel(self.wheels, "dsv4dep", "2.0")], f"dsv4probe {v}")
        self.lock = tmp / "profile" / "env.lock"
        self.uv_cache = tmp / "uv-cache"
        super().__init__(cluster, tmp, nhosts=3, keep=5)
        self.use("1.0")

    def use(self, version: str, text: str | None = None) -> None:
        self.lock.write_text(text if text is not None else self.locks[version])
        self.write()

    def write(self) -> None:
        super().write()
        if not hasattr(self, "lock"):
            return
        prof = yaml.safe_load(self.profile.read_text())
        prof["sglang"]["environment"] = {"lock": "env.lock", "uv": UV,
                                         "uv_args": ["--no-index", "--find-links", str(self.wheels),
                                                     "--cache-dir", str(self.uv_cache)]}
        launch = prof["deploy"]["launch"]
        launch["server"] = PROBE + STANDIN + " --config {config} --host {address} --port {port}"
        launch["router"] = launch["router"].replace("{python}", sys.executable)   # the router's own Python
        self.profile.write_text(yaml.safe_dump(prof, sort_keys=False))

    def envs(self, host: str) -> list[str]:
        d = self.roots[host] / "envs"
        return sorted(x.name for x in d.iterdir()) if d.exists() else []

    def last_start(self, host: str, group: str) -> str:
        log = (self.roots[host] / "logs" / f"{group}.log").read_text()
        return log.rsplit("=== dsv4ctl start", 1)[-1]

    def deploy_first(self) -> tuple[list[str], str, str]:
        """Deploy the profile as it is: (host names, release id, its environment digest)."""
        h = [x.name for x in self.hosts]
        r = cli(self, "deploy", "--json", "--no-preflight")
        assert r.code == 0, r.err
        rid = r.json()["release"]
        return h, rid, json.loads((self.roots[h[0]] / "releases" / rid / "RELEASE.json").read_text())["environment"]

    def hand_upgrade(self, env: Path, spec: str = "dsv4probe==1.1") -> None:
        """What an operator's ``pip install -U`` inside an environment does (real uv)."""
        p = subprocess.run([UV, "pip", "install", "--quiet", "--python", str(env / "bin" / "python"), "--no-index",
                            "--find-links", str(self.wheels), "--cache-dir", str(self.uv_cache), spec],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr


@pytest.fixture
def world(live_cluster, tmp_path):
    w = EnvWorld(live_cluster, tmp_path)
    yield w
    w.stop_services()


def cli(w, *args, timeout=240):
    return run_cli(*args, str(w.profile), env=w.env(), timeout=timeout)


def test_environment_built_per_lock_rolled_back_with_the_tree_and_verified(world):
    w = world
    h = [x.name for x in w.hosts]
    r = cli(w, "deploy", "--json", "--no-preflight")
    assert r.code == 0, r.err
    rid1 = r.json()["release"]
    meta = json.loads((w.roots[h[0]] / "releases" / rid1 / "RELEASE.json").read_text())
    d1 = meta["environment"]
    assert d1.startswith("e") and len(d1) == 13
    assert (w.roots[h[0]] / "releases" / rid1 / "environment.lock").read_text() == w.locks["1.0"]
    for x in h:                              # every host of the release has it, complete, nothing staged
        assert w.envs(x) == [d1], x
        env = w.roots[x] / "envs" / d1
        assert json.loads((env / "ENV.json").read_text())["digest"] == d1
        assert not os.access(env / "ENV.json", os.W_OK) or os.geteuid() == 0
        assert not (env.stat().st_mode & 0o222)                  # read-only
    assert "dsv4probe 1.0" in w.last_start(h[0], "prefill") and "dsv4probe 1.0" in w.last_start(h[1], "decode")
    assert f"{h[0]}: built environment {d1}" in r.err
    env_steps = [s for s in r.json()["steps"] if s["phase"] == "env"]
    assert sorted(s["host"] for s in env_steps) == sorted(h)
    r = cli(w, "verify", "--json")
    assert r.code == 0, r.out + r.err

    # a new lock is a new release with its own environment; the old one stays for a rollback
    built1 = (w.roots[h[0]] / "envs" / d1 / "ENV.json").stat().st_mtime_ns
    w.use("1.1")
    dry = cli(w, "deploy", "--json", "--no-preflight", "--dry-run")
    assert dry.code == 0, dry.err
    planned = [(s["host"], s["summary"]) for s in dry.json()["steps"] if s["phase"] in ("push", "env", "verify", "switch")]
    r = cli(w, "deploy", "--json", "--no-preflight")
    assert r.code == 0, r.err
    rid2 = r.json()["release"]
    ran = [(s["host"], s["summary"]) for s in r.json()["steps"] if s["phase"] in ("push", "env", "verify", "switch")]
    assert sorted(ran) == sorted(planned)                    # the dry run is the run
    assert sum(1 for _, s in planned if s.startswith("build environment e")) == 3
    assert rid2 != rid1
    d2 = json.loads((w.roots[h[0]] / "releases" / rid2 / "RELEASE.json").read_text())["environment"]
    assert d2 != d1 and w.envs(h[0]) == sorted([d1, d2])
    assert "dsv4probe 1.1" in w.last_start(h[0], "prefill") and "dsv4probe 1.1" in w.last_start(h[1], "decode")

    # rollback: the tree and its environment together, the environment not rebuilt
    r = cli(w, "rollback", "--json")
    assert r.code == 0, r.err
    assert w.currents() == {x: rid1 for x in h}
    assert "dsv4probe 1.0" in w.last_start(h[0], "prefill") and "dsv4probe 1.0" in w.last_start(h[1], "decode")
    assert (w.roots[h[0]] / "envs" / d1 / "ENV.json").stat().st_mtime_ns == built1
    assert f"built environment" not in r.err

    # a package upgraded by hand inside the active release's environment: verify and status say so
    env = w.roots[h[1]] / "envs" / d1
    w.hand_upgrade(env)
    r = cli(w, "verify", "--json")
    assert r.code == 1, r.out + r.err
    drift = r.json()["drift"]
    assert any(line.startswith(f"{h[1]}: {rid1} (current): ") and "env version dsv4probe 1.1 (lock 1.0)" in line
               for line in drift), drift
    assert not any(line.startswith(f"{h[0]}:") for line in drift), drift
    r = cli(w, "status", "--json")
    assert r.code == 1
    doc = r.json()["hosts"]
    assert doc[h[1]]["environment"] == {"digest": d1, "ok": False, "problems": ["env version dsv4probe 1.1 (lock 1.0)"]}
    assert doc[h[0]]["environment"] == {"digest": d1, "ok": True, "problems": []}
    # the next deploy of that release refuses to switch onto it
    w.use("1.0")
    r = cli(w, "deploy", "--no-preflight")
    assert r.code == 3, r.err
    assert "env version dsv4probe 1.1 (lock 1.0)" in r.err


def test_an_environment_that_cannot_be_built_switches_no_host_and_leaves_nothing(world):
    w = world
    h, rid1, d1 = w.deploy_first()
    # a lock whose pin the index does not have (a typo, a yanked version)
    w.use("x", w.locks["1.0"].replace("dsv4probe==1.0", "dsv4probe==9.9"))
    r = cli(w, "deploy", "--no-preflight")
    assert r.code == 3, r.err
    assert "stopped before any host was switched" in r.err and "building environment e" in r.err
    assert "dsv4probe" in r.err                                  # uv's own words say which
    assert w.currents() == {x: rid1 for x in h}
    for x in h:
        assert w.envs(x) == [d1], x                           # no half-built environment, no staging folder
        assert w.audit(x)[-1]["result"] == "failed" and w.audit(x)[-1]["detail"].startswith("environment: ")
    # uv missing on the hosts: a clear error, exit 3
    prof = yaml.safe_load(w.profile.read_text())
    prof["sglang"]["environment"]["uv"] = "/nonexistent/uv"
    w.profile.write_text(yaml.safe_dump(prof, sort_keys=False))
    r = cli(w, "deploy", "--no-preflight")
    assert r.code == 3 and "uv not found: /nonexistent/uv" in r.err, r.err


def test_bad_locks_are_refused_before_anything(world):
    w = world
    for text, why in [("dsv4probe>=1.0\n", "is not an exact pin"),
                      ("dsv4probe==1.0\n", "has no --hash"),
                      ("--index-url https://example.invalid/simple\n", "options are not part of a lock"),
                      ("# nothing\n", "pins no distribution")]:
        w.use("x", text)
        r = cli(w, "deploy", "--dry-run", "--no-preflight")
        assert r.code == 2 and why in r.err and "env.lock" in r.err, (text, r.err)
        assert len(r.err.strip().splitlines()) == 1
    # not a lock at all: a file past the cap (SGLang's own universal hashed lock is 0.42 MB), a
    # FIFO (hung the read), a folder, /dev/zero (grew deploy --dry-run to 22.6 GB): exit 2 at once
    big = w.tmp / "big.lock"
    big.write_bytes(w.locks["1.0"].encode() + b"# " + b"x" * (9 << 20) + b"\n")
    fifo = w.tmp / "fifo.lock"
    os.mkfifo(fifo)
    text = ", not a regular file: a lock is a text file"
    for target, why in [(big, "larger than 8 MiB: not an environment lock (SGLang's are under 1 MB)"),
                        (fifo, "a pipe" + text), (w.tmp, "a folder" + text), ("/dev/zero", "a device" + text)]:
        w.lock.unlink()
        w.lock.symlink_to(target)
        t0 = time.monotonic()
        r = cli(w, "deploy", "--dry-run", "--no-preflight", timeout=60)
        assert r.code == 2 and r.err.strip() == f"dsv4ctl: error: {w.lock}: sglang.environment.lock: {why}", r.err
        assert time.monotonic() - t0 < 30
    assert not any((w.roots[x.name] / "envs").exists() for x in w.hosts)


def _oracle_requires() -> list[str]:
    import glob
    meta = glob.glob(str(REPO / ".venv-oracle" / "lib" / "python*" / "site-packages" / "sglang-0.5.23.dist-info" / "METADATA"))
    if not meta:
        pytest.skip("the SGLang 0.5.23 wheel (.venv-oracle) is not installed")
    return [ln.split(":", 1)[1].strip() for ln in Path(meta[0]).read_text().splitlines() if ln.startswith("Requires-Dist:")]


def test_preflight_refuses_a_lock_that_contradicts_sglangs_own_pins(world):
    """SGLang 0.5.23's real Requires-Dist (the wheel's METADATA) as the tree's pyproject: a lock
    with another torch is refused naming both versions; a lock with its pins passes."""
    w = world
    reqs = _oracle_requires()
    (w.tree / "python" / "pyproject.toml").write_text(
        "[project]\nname = \"sglang\"\nversion = \"0.5.23\"\ndependencies = [\n"
        + "".join(f"  {json.dumps(x)},\n" for x in reqs) + "]\n")
    git(w.tree, "add", "-A")
    git(w.tree, "commit", "-q", "-m", "pyproject")
    git(w.tree, "tag", "-f", "v0.5.23")
    from dsv4ctl.deploy.environment import requirement_pins
    pins = requirement_pins(reqs)
    assert pins["torch"] == "2.14.1" and pins["sglang-kernel"] == "0.4.10" and pins["deepseek-recipe"] == "0.2.0"
    wheels = w.tmp / "pinned"
    good = [make_wheel(wheels, n, v) for n, v in sorted(pins.items())]
    w.use("x", lock_text(good))
    r = cli(w, "deploy", "--dry-run")
    assert r.code == 0, r.err
    assert f"SGLang 0.5.23's {len(pins)} pins kept" in r.out + r.err
    bad = [make_wheel(wheels, n, "2.9.0" if n == "torch" else v) for n, v in sorted(pins.items()) if n != "sgl-flash-mla"]
    w.use("x", lock_text(bad))
    r = cli(w, "deploy", "--dry-run")
    assert r.code == 2, r.err
    assert "contradicts SGLang 0.5.23's own pins (2)" in r.err
    assert "sgl-flash-mla: not in the lock, SGLang 0.5.23 pins ==1.0.0" in r.err
    assert "torch: the lock has 2.9.0, SGLang 0.5.23 pins ==2.14.1" in r.err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_during_the_environment_build_switches_no_host(world, sig):
    """SIGINT / SIGTERM while uv hangs on the hosts (deaf to SIGTERM, as a uv stuck in a
    download can be): ONE signal stops the deploy within seconds (was: it waited for uv; a second
    signal was needed, and its SIGKILL left ``envs/.tmp-*``), exit 130, the old release runs on
    every host, no uv is left running, no staging folder is left and an environment folder is
    only ever complete. A staging folder an earlier build could not remove is swept by the next
    deploy, under the lock, also when its environment is there already."""
    w = world
    h, rid1, d1 = w.deploy_first()
    hang, mark = w.tmp / "hanging-uv", f"0.{os.getpid() % 1000:03d}{time.time_ns() % 1000:03d}"
    hang.write_text(f"#!/bin/sh\nif [ \"$1\" = pip ]; then trap '' TERM HUP; exec sleep 3600 {mark}; fi\n"
                    f"exec {UV} \"$@\"\n")
    hang.chmod(0o755)
    w.use("1.1")
    prof = yaml.safe_load(w.profile.read_text())
    prof["sglang"]["environment"]["uv"] = str(hang)
    w.profile.write_text(yaml.safe_dump(prof, sort_keys=False))
    p = subprocess.Popen([sys.executable, "-m", "dsv4ctl.cli", "deploy", str(w.profile), "-v", "--no-preflight"],
                         cwd=REPO, env=dict(os.environ, **w.env(), COLUMNS="200", NO_COLOR="1"), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines = []
    try:
        while True:
            line = p.stderr.readline()
            assert line, "deploy ended before its environment step: " + "".join(lines)
            lines.append(line)
            if "build environment e" in line:
                break
        assert wait_for(lambda: len(_hung_uvs(mark)) == len(h), 30), "uv does not hang on every host"
        t0 = time.monotonic()
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
    err = "".join(lines) + err
    assert p.returncode == 130, err
    assert took < 20, f"one {sig.name} took {took:.1f} s to stop the deploy"
    assert _hung_uvs(mark) == [], "uv still runs on a host"
    assert w.currents() == {x: rid1 for x in h}
    for x in h:
        envs = w.envs(x)
        assert not [e for e in envs if e.startswith(".tmp-")], (x, envs)
        for e in envs:                              # whatever is there is complete
            assert (w.roots[x] / "envs" / e / "ENV.json").is_file(), (x, e)
        assert d1 in envs
        assert w.audit(x)[-1]["result"] == "interrupted", w.audit(x)[-1]
        assert w.audit(x)[-1]["detail"] == "interrupted during environment build; no host switched"
    assert wait_for(lambda: http_status(f"http://{w.hosts[0].address}:{w.ports['prefill']}/health") == 200, 10)
    if sig != signal.SIGTERM:
        return
    # a build killed outright (SIGKILL: no trap runs) leaves its staging folder, read-only inside
    stale = w.roots[h[0]] / "envs" / f".tmp-{d1}-4242"
    (stale / "lib").mkdir(parents=True)
    (stale / "lib" / "half.py").write_text("x = 1\n")
    subprocess.run(["chmod", "-R", "a-w", str(stale)], check=True)
    w.use("1.0")                                    # d1 is built on every host: nothing to build
    w.extra["decode"] = {"max-running-requests": 64}
    w.write()
    r = cli(w, "deploy", "--json", "--no-preflight")
    assert r.code == 0, r.err
    assert w.envs(h[0]) == [d1] and "built environment" not in r.err


def _hung_uvs(mark: str) -> list[str]:
    """Pids of processes the hanging uv stand-in left (its ``sleep 3600 MARK``, unique to this test)."""
    time.sleep(0.3)
    return subprocess.run(["pgrep", "-f", f"^sleep 3600 {mark}$"], capture_output=True, text=True).stdout.split()


def test_a_new_release_on_a_drifted_shared_environment_is_refused(world):
    """Releases of one lock share its environment: a new release (another serve config) pushed
    onto an environment upgraded by hand is checked before the switch, refused (exit 3) with how
    to rebuild it, and deployed once the environment is removed (rebuilt from the lock)."""
    w = world
    h, rid1, d1 = w.deploy_first()
    env = w.roots[h[0]] / "envs" / d1
    w.hand_upgrade(env)
    w.extra["decode"] = {"max-running-requests": 64}
    w.write()
    r = cli(w, "deploy", "--json", "--no-preflight")
    assert r.code == 3, r.err
    assert "env version dsv4probe 1.1 (lock 1.0)" in r.err and "rm -rf ROOT/envs/DIGEST" in r.err
    assert w.currents() == {x: rid1 for x in h}
    subprocess.run(["chmod", "-R", "u+w", str(env)], check=True)
    subprocess.run(["rm", "-rf", str(env)], check=True)
    r = cli(w, "deploy", "--json", "--no-preflight")
    assert r.code == 0, r.err
    assert f"{h[0]}: built environment {d1}" in r.err
    assert "dsv4probe 1.0" in w.last_start(h[0], "prefill")


def test_files_dropped_into_an_environment_are_drift(world):
    w = world
    h, rid, d = w.deploy_first()
    sp = next((w.roots[h[2]] / "envs" / d / "lib").glob("python*/site-packages"))
    (sp / "sitecustomize.py").write_text("print('PWNED')\n")
    (sp / "zzz-evil.pth").write_text("import os\n")
    cfg = w.roots[h[2]] / "envs" / d / "pyvenv.cfg"
    cfg.write_text(cfg.read_text().replace("include-system-site-packages = false", "include-system-site-packages = true"))
    r = cli(w, "verify", "--json")
    assert r.code == 1, r.out
    line = next(x for x in r.json()["drift"] if x.startswith(f"{h[2]}: {rid}"))
    for what in ("env pyvenv.cfg", "env unclaimed lib/python", "sitecustomize.py", "zzz-evil.pth"):
        assert what in line or what in json.dumps(r.json()), (what, line)


def test_uv_args_passwords_never_show(world):
    w = world
    prof = yaml.safe_load(w.profile.read_text())
    prof["sglang"]["environment"]["uv_args"] += ["--extra-index-url", "https://alice:Hunter2Secret@127.0.0.1:9/simple"]
    w.profile.write_text(yaml.safe_dump(prof, sort_keys=False))
    r = cli(w, "deploy", "--dry-run", "-v", "--no-preflight")
    assert r.code == 0, r.err
    assert "Hunter2Secret" not in r.out + r.err and "https://alice:***@127.0.0.1:9/simple" in r.out


def test_status_reads_environment_sizes_verify_hashes(world):
    """status stays fast on a multi-GB environment: files by RECORD size; verify (and every
    switch) hashes them. A same-size edit is seen by verify, a size change by both."""
    w = world
    h, rid, d = w.deploy_first()
    mod = next((w.roots[h[1]] / "envs" / d / "lib").glob("python*/site-packages")) / "dsv4probe" / "__init__.py"
    text = mod.read_text()
    mod.write_text(text.replace('"1.0"', '"1.9"'))            # same size
    r = cli(w, "status", "--json")
    assert r.json()["hosts"][h[1]]["environment"]["ok"] is True, r.out
    r = cli(w, "verify", "--json")
    assert r.code == 1 and any("env hash lib/python" in x and "dsv4probe/__init__.py" in x for x in r.json()["drift"])
    mod.write_text(text + "# grown\n")
    r = cli(w, "status", "--json")
    env = r.json()["hosts"][h[1]]["environment"]
    assert env["ok"] is False and any("dsv4probe/__init__.py" in p for p in env["problems"]), env
