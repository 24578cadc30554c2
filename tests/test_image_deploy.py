"""Releases as OCI images (issue 47) end to end on real parts: rootful podman (runc) on this
machine, a base image built FROM scratch from this machine's Python (tests/images/base.py), and
the real sshd hosts, each with its own podman store under its deploy root. Servers are the
stand-in, run in containers of the release's image by the launcher."""

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

from tests.conftest import run_cli
from tests.envkit import lock_text, make_wheel
from tests.images import base as images
from tests.sshd.fixtures import sshd_cluster  # noqa: F401
from tests.sshd.world import REPO, STANDIN, World, git, http_status, wait_for

UV = str(Path(sys.executable).parent / "uv")
#: the server's launch first runs the release's own environment's interpreter inside the container
#: ({python}: /opt/dsv4ctl/envs/<digest>/bin/python, the image's environment layer), then the
#: stand-in on the image's own python3 (which has its dependencies)
PROBE = "{python} -c 'import dsv4probe; print(\"dsv4probe\", dsv4probe.__version__, flush=True)' && "

pytestmark = pytest.mark.sshd


@pytest.fixture(scope="session")
def base_image(tmp_path_factory):
    why = images.available()
    if why:
        pytest.skip(why)
    d = tmp_path_factory.mktemp("base-image")
    yield images.base_reference(d)
    images.clean_store(d / "store")


def test_an_unpinned_base_is_resolved_to_its_digest(base_image, tmp_path):
    """``sglang.image.base`` without ``@sha256``: the control machine pulls it and the manifest
    digest it resolved to (what build_image records as ``base_digest``); a pin that is
    not the image's digest is exit 2."""
    from dsv4ctl.deploy.image import resolve_base
    from dsv4ctl.errors import InputError
    from dsv4ctl.profile.deployment import ImageSettings
    ref, pin = base_image.rsplit("@", 1)
    cache = tmp_path / "cache"
    try:
        iid, digest = resolve_base(ImageSettings(base=ref, runtime_args=tuple(images.RUNTIME_ARGS)), cache)
        assert digest == pin and len(iid) == 64
        wrong = "sha256:" + "0" * 64
        with pytest.raises(InputError, match=f"the image is {pin}, not the pinned {wrong}") as e:
            resolve_base(ImageSettings(base=f"{ref}@{wrong}", runtime_args=tuple(images.RUNTIME_ARGS)), cache)
        assert e.value.exit_code == 2
    finally:
        images.clean_store(tmp_path / "images")


class ImageWorld(World):
    """The deploy test world with ``sglang.image``: per-host stores ``ROOT/containers``, CPU-only
    hosts (``gpus: none``), the repository mounted read-only (the stand-in's code), and a locked
    environment (``sglang.environment``: a real wheel, real uv) that becomes the image's
    environment layer."""

    def __init__(self, cluster, tmp, base: str, **kw):
        self.base = base
        self.image_extra = {}
        self.wheels = tmp / "wheels"
        super().__init__(cluster, tmp, **kw)

    def write(self) -> None:
        super().write()
        prof = yaml.safe_load(self.profile.read_text())
        prof["sglang"]["image"] = {"base": self.base, "gpus": "none", "shm_size": "64m", "store": "{root}/containers",
                                   "runtime_args": images.RUNTIME_ARGS, "run_args": images.RUN_ARGS,
                                   "mounts": [str(REPO)], **self.image_extra}
        if not (self.cfgdir / "env.lock").exists():
            (self.cfgdir / "env.lock").write_text(lock_text([make_wheel(self.wheels, "dsv4probe", "1.0")]))
        prof["deploy"]["health_timeout_s"] = 90       # containers on a loaded 2-core machine (a crash is seen at once)
        prof["sglang"]["environment"] = {"lock": "env.lock", "uv": UV, "uv_args": [
            "--no-index", "--find-links", str(self.wheels), "--cache-dir", str(self.tmp / "uv-cache")]}
        stand = STANDIN.replace("{python}", "python3")         # the image's own interpreter
        launch = prof["deploy"]["launch"]
        launch["server"] = PROBE + stand + " --config {config} --host {address} --port {port}"
        launch["router"] = launch["router"].replace(STANDIN, stand)
        self.profile.write_text(yaml.safe_dump(prof, sort_keys=False))

    def podman(self, host: str) -> list[str]:
        return images.podman_argv(self.roots[host] / "containers")

    def containers(self, host: str) -> list[dict]:
        out = subprocess.run([*self.podman(host), "ps", "--format", "json"], capture_output=True, text=True).stdout
        return json.loads(out or "[]")

    def cleanup(self) -> None:
        self.stop_services()
        for h in self.roots:
            images.clean_store(self.roots[h] / "containers")
        images.clean_store(self.cache / "images")


def deploy(w, *args):
    return run_cli("deploy", str(w.profile), "--accept-new-host-keys", "--no-preflight", *args, env=w.env(),
                   timeout=300)


# -- one world for the module: its first release deployed once --------------------------------------

@pytest.fixture(scope="module")
def fault_world(sshd_cluster, tmp_path_factory, base_image):
    """Release r1 serving on three hosts (``w.first``: its deploy's result); h1's image store on a
    tmpfs of its own (sized after r1 to leave about 1 MB: the full-disk test). The tests below
    run in the file's order on it, each leaving r1's world serving (the first release's deploy,
    its environment layer and the 60 MB base shipped to each host are made once for all)."""
    tmp = tmp_path_factory.mktemp("image-faults")
    w = ImageWorld(sshd_cluster, tmp, base_image, nhosts=3)
    store = w.roots["h1"] / "containers"
    store.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(store)], check=True)
    try:
        w.first = deploy(w)
        assert w.first.code == 0, w.first.err + w.first.out
        w.r1 = w.current("h0")
        yield w
    finally:
        w.cleanup()
        subprocess.run(["umount", "-l", str(store)], capture_output=True)
        images.unmount_under(tmp)


def test_deploy_runs_each_server_in_its_release_image(fault_world):
    w = fault_world
    r, rid = w.first, w.r1
    rec = json.loads((w.cache / "images" / "records" / f"{rid}.json").read_text())
    # the build shows its steps as they come (podman build's STEP lines), then its end
    assert f"building the image of {rid}: STEP 1/4: FROM " in r.err and f"building the image of {rid}: STEP 4/4: " \
        in r.err and f"built image {rec['image'][:12]} of {rid}" in r.err, r.err
    for h in ("h0", "h1", "h2"):
        assert (w.roots[h] / "images" / "ids" / rid).read_text().strip() == rec["image"]
    cs = {c["Names"][0]: c for h in ("h0", "h1", "h2") for c in w.containers(h)}
    assert sorted(cs) == sorted([f"dsv4ctl-prefill-n0-{rid}", f"dsv4ctl-decode-n0-{rid}", f"dsv4ctl-router-n0-{rid}"])
    assert {c["ImageID"] for c in cs.values()} == {rec["image"]}
    assert http_status(f"http://{w.hosts[2].address}:{w.ports['router']}/health") == 200
    # status: each group's running container and its image; logs: what the container printed
    r = run_cli("status", str(w.profile), "--json", env=w.env(), timeout=120)
    assert r.code == 0, r.err
    groups = {g: d for h in json.loads(r.out)["hosts"].values() for g, d in h["groups"].items()}
    assert {g: (d["container"], d["image"]) for g, d in groups.items()} == {
        c["Labels"]["dsv4ctl.group"]: (c["Id"], rec["image"]) for c in cs.values()}
    assert all(d["uptime_s"] is not None and d["uptime_s"] < 600 and d["restarts"] == 0 for d in groups.values())
    r = run_cli("status", str(w.profile), env={**w.env(), "COLUMNS": "400"}, timeout=120)
    cid = cs[f"dsv4ctl-decode-n0-{rid}"]["Id"]
    assert f"(container {cid[:12]}, image {rec['image'][:12]})" in r.out, r.out
    r = run_cli("logs", "decode", str(w.profile), "-n", "50", env=w.env(), timeout=120)
    assert r.code == 0 and "h1: dsv4probe 1.0" in r.out, r.out + r.err     # printed inside the container


def test_switch_rollback_crash_and_tamper_with_images(fault_world):
    """Two releases: the second ships only its own layers (the base's blobs are on the hosts),
    a rollback runs the first image again without building, a release whose container exits at
    start fails its gate and the previous image serves again, and an image edited in a host's
    store is found by verify (the file is put back after: r1 serves the tests below)."""
    w = fault_world
    r1 = w.r1
    rec1 = json.loads((w.cache / "images" / "records" / f"{r1}.json").read_text())
    # the second release differs from the first in one tree file only
    f = w.tree / "python" / "sglang" / "srt" / "mod001.py"
    f.write_text(f.read_text() + "y = 2\n")
    git(w.tree, "commit", "-q", "-am", "one file")
    git(w.tree, "tag", "-f", "v0.5.23")
    r = deploy(w)
    assert r.code == 0, r.err
    r2 = w.current("h1")
    assert r2 != r1
    sent = [int(x.replace(",", "")) for x in __import__("re").findall(r"loaded, ([\d,]+) bytes sent", r.err)]
    assert sent and max(sent) < 200_000, r.err          # the 60 MB base and the environment are there already
    # the environment layer is one layer both images share (same digest), under their own layers
    rec2 = json.loads((w.cache / "images" / "records" / f"{r2}.json").read_text())
    layers = {rec["release"]: json.loads(subprocess.run(
        [*images.podman_argv(w.cache / "images"), "image", "inspect", "--format", "{{json .RootFS.Layers}}",
         rec["image"]], capture_output=True, text=True, check=True).stdout) for rec in (rec1, rec2)}
    assert rec1["env"] == rec2["env"] and rec1["env_image"] == rec2["env_image"] != ""
    assert len(layers[r1]) == len(layers[r2]) == 4, layers           # base, environment, tree, records
    assert layers[r1][:2] == layers[r2][:2] and layers[r1][2] != layers[r2][2], layers
    assert "built environment layer" not in r.err                   # made once, for the first release
    assert "dsv4probe 1.0" in (w.roots["h1"] / "logs" / "decode.log").read_text()   # the layer's python ran
    assert [c["Names"][0] for c in w.containers("h1")] == [f"dsv4ctl-decode-n0-{r2}"]
    # rollback: the first image again, nothing built (the control machine's record is untouched)
    before = (w.cache / "images" / "records" / f"{r1}.json").stat().st_mtime_ns
    r = run_cli("rollback", str(w.profile), "--to", r1, env=w.env(), timeout=300)
    assert r.code == 0, r.err
    assert (w.cache / "images" / "records" / f"{r1}.json").stat().st_mtime_ns == before
    assert [(c["Names"][0], c["ImageID"]) for c in w.containers("h1")] == [(f"dsv4ctl-decode-n0-{r1}", rec1["image"])]
    # a release whose decode container exits at start: the gate fails, r1's image serves again
    w.extra["decode"] = {"standin-crash": "CUDA error: out of memory"}
    w.write()
    r = deploy(w)
    assert r.code == 1, r.err
    assert w.current("h1") == r1
    assert [c["Names"][0] for c in w.containers("h1")] == [f"dsv4ctl-decode-n0-{r1}"]
    assert wait_for(lambda: http_status(f"http://{w.hosts[2].address}:{w.ports['router']}/health") == 200, 20)
    assert "CUDA error: out of memory" in (w.roots["h1"] / "logs" / "decode.log").read_text()
    w.extra["decode"] = {}
    w.write()
    # verify finds an image edited in a host's store
    assert run_cli("verify", str(w.profile), env=w.env(), timeout=300).code == 0
    rel = f"opt/dsv4ctl/releases/{r1}/tree/python/sglang/srt/mem_cache.py"
    [f] = (w.roots["h1"] / "containers" / "storage" / "overlay").glob(f"*/diff/{rel}")   # the tree layer's file
    good = f.read_bytes()
    f.chmod(0o644)
    f.write_text("INDEX_K_BYTES = 999\n")
    f.chmod(0o444)
    try:
        r = run_cli("verify", str(w.profile), "--json", env=w.env(), timeout=300)
        assert r.code != 0
        assert f"h1: {r1} (current): image: hash tree/python/sglang/srt/mem_cache.py" in json.loads(r.out)["drift"]
    finally:
        f.chmod(0o644)
        f.write_bytes(good)
        f.chmod(0o444)


def _deploy_bg(w, extra_env: dict | None = None) -> tuple[subprocess.Popen, Path]:
    err = w.tmp / f"deploy-{time.time_ns()}.err"
    p = subprocess.Popen([sys.executable, "-m", "dsv4ctl.cli", "deploy", str(w.profile), "--no-preflight"],
                         cwd=REPO, env=dict(os.environ, **w.env(), **(extra_env or {}), COLUMNS="200", NO_COLOR="1"),
                         stdout=subprocess.DEVNULL, stderr=err.open("w"))
    return p, err


def _interrupt(p: subprocess.Popen, err: Path, sig, ready, what: str) -> str:
    """Send ``sig`` to the deploy ``p`` once ``ready()``; its stderr after it ended (130 asserted)."""
    try:
        assert wait_for(lambda: ready() or p.poll() is not None, 240), f"no {what}: " + err.read_text()
        assert p.poll() is None, f"the deploy ended before the {what}: " + err.read_text()
        p.send_signal(sig)
        p.wait(60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, (sig, err.read_text())
    return err.read_text()


def _nothing_of(w, rid: str) -> None:
    """No host records or holds ``rid``'s image; r1 serves on every host."""
    rec = w.cache / "images" / "records" / f"{rid}.json"
    iid = json.loads(rec.read_text())["image"] if rec.exists() else None
    for h in ("h0", "h1", "h2"):
        assert not (w.roots[h] / "images" / "ids" / rid).exists(), h
        if iid:
            assert subprocess.run([*w.podman(h), "image", "exists", iid]).returncode == 1, h
        assert w.current(h) == w.r1
    assert wait_for(lambda: http_status(f"http://{w.hosts[2].address}:{w.ports['router']}/health") == 200, 20)


def _release2(w, comment: str) -> None:
    """The next release: another environment lock (so its image has a new environment layer)."""
    (w.cfgdir / "env.lock").write_text(lock_text([make_wheel(w.wheels, "dsv4probe", "1.0")], comment))
    w.write()


def test_an_interrupt_during_the_image_build_loads_nothing(fault_world):
    """SIGINT, SIGTERM, SIGHUP while the environment layer's build step runs (uv hangs): the
    deploy stops (130) at once, the build's processes end with it, no image is recorded, nothing
    is shipped, r1 serves."""
    w = fault_world
    _release2(w, "r2")
    mark = f"0.{os.getpid() % 1000:03d}{time.time_ns() % 1000:03d}"
    hang = w.tmp / "hanging-uv"
    hang.write_text(f"#!/bin/sh\nexec sleep 3600 {mark}\n")          # runs inside the build's RUN step
    hang.chmod(0o755)
    prof = yaml.safe_load(w.profile.read_text())
    prof["sglang"]["environment"]["uv"] = str(hang)
    w.profile.write_text(yaml.safe_dump(prof, sort_keys=False))
    hung = lambda: subprocess.run(["pgrep", "-f", f"^sleep 3600 {mark}$"], capture_output=True).returncode == 0
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        p, err = _deploy_bg(w)
        _interrupt(p, err, sig, hung, "hanging build")
        assert wait_for(lambda: not hung(), 10), f"the build still runs after {sig.name}"
        rid = json.loads(subprocess.run(["tail", "-n", "1", str(w.roots["h0"] / "audit.jsonl")], capture_output=True,
                                        text=True).stdout)["release"]
        assert rid != w.r1 and not (w.cache / "images" / "records" / f"{rid}.json").exists()
        _nothing_of(w, rid)
        assert w.audit("h0")[-1]["detail"] == "interrupted during image; no host switched", w.audit("h0")[-1]
    w.write()                                          # the real uv again


def test_an_interrupt_during_the_image_transfer_loads_nothing(fault_world):
    """SIGINT, SIGTERM, SIGHUP while the image's blobs go to the hosts (rsync at 1 kB/s): the
    deploy stops (130), no host has loaded or recorded the image (a blob cut short is never
    taken for one), r1 serves; the next ship sweeps the cut blobs' temporary files."""
    w = fault_world
    _release2(w, "r2")
    pools = [w.roots[h] / "images" / "pool" / "blobs" / "sha256" for h in ("h0", "h1", "h2")]
    temps = lambda: {f.name for d in pools if d.is_dir() for f in d.iterdir() if f.name.startswith(".")}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        old = temps()
        p, err = _deploy_bg(w, {"DSV4CTL_RSYNC_ARGS": "--bwlimit=1"})
        _interrupt(p, err, sig, lambda: bool(temps() - old), "blob transfer")
        rid = json.loads(subprocess.run(["tail", "-n", "1", str(w.roots["h0"] / "audit.jsonl")], capture_output=True,
                                        text=True).stdout)["release"]
        _nothing_of(w, rid)
        assert w.audit("h0")[-1]["detail"] == "interrupted during image; no host switched", w.audit("h0")[-1]
        assert subprocess.run(["pgrep", "-f", "rsync.*images/pool/blobs"], capture_output=True).returncode == 1


def test_a_full_disk_during_the_load_switches_no_host(fault_world):
    """h1's image store fills up while it loads the next release's image (a 4 MB layer, 1 MB
    free): the deploy stops before any switch (exit 3) naming h1 and the full disk; h1's store
    holds no image of it and no half-written layer (whole layers that came in before the disk
    was full stay, content-addressed, for the next load), r1 serves everywhere."""
    w = fault_world
    store = w.roots["h1"] / "containers"
    used = int(subprocess.run(["df", "--output=used", "-B1", str(store)], capture_output=True, text=True).stdout.split()[-1])
    subprocess.run(["mount", "-o", f"remount,size={used + (1 << 20)}", str(store)], check=True)
    layers = lambda: {x["id"]: x for x in json.loads((store / "storage" / "overlay-layers" / "layers.json").read_text())}
    before = layers()
    (w.tree / "python" / "sglang" / "srt" / "weights.bin").write_bytes(os.urandom(4 << 20))
    git(w.tree, "add", "-A")
    git(w.tree, "commit", "-q", "-m", "a 4 MB file")
    git(w.tree, "tag", "-f", "v0.5.23")
    r = deploy(w)
    assert r.code == 3, r.err
    assert "h1: loading the image of" in r.err and "no space left on device" in r.err, r.err
    assert "stopped before any host was switched" in r.err
    rid = json.loads(subprocess.run(["tail", "-n", "1", str(w.roots["h0"] / "audit.jsonl")], capture_output=True,
                                    text=True).stdout)["release"]
    # h1 holds no image of it and no half layer: at most whole layers of the new image that came
    # in before the disk was full (content-addressed: the next load reuses them)
    rec = json.loads((w.cache / "images" / "records" / f"{rid}.json").read_text())
    assert subprocess.run([*w.podman("h1"), "image", "exists", rec["image"]]).returncode == 1
    new_layers = json.loads(subprocess.run([*images.podman_argv(w.cache / "images"), "image", "inspect", "--format",
                                            "{{json .RootFS.Layers}}", rec["image"]], capture_output=True, text=True,
                                           check=True).stdout)
    after = layers()
    assert not [x for x in after.values() if (x.get("flags") or {}).get("incomplete")], after
    added = [x.get("diff-digest") for i, x in after.items() if i not in before]
    assert set(added) <= set(new_layers[:-2]), (added, new_layers)     # never the tree or records layer
    assert not (w.roots["h1"] / "images" / "ids" / rid).exists()
    assert {h: w.current(h) for h in ("h0", "h1", "h2")} == {h: w.r1 for h in ("h0", "h1", "h2")}
    assert wait_for(lambda: http_status(f"http://{w.hosts[2].address}:{w.ports['router']}/health") == 200, 20)


def test_a_registry_the_profile_names(fault_world):
    """``sglang.image.registry``: the image is pushed to a real registry (Debian's docker-registry,
    htpasswd auth, plain HTTP on this test's loopback network) and each host pulls the pushed
    manifest; the credentials come from the auth file and are never printed (-v included) nor
    written to the hosts' records; wrong credentials are exit 3 naming the registry, before any
    host is switched. Runs after the full-disk test: h1's store gets room again, and that release deploys."""
    import base64
    import shutil
    import bcrypt
    w = fault_world
    if shutil.which("docker-registry") is None:
        pytest.skip("docker-registry not installed (scripts/test.sh installs it)")
    store = w.roots["h1"] / "containers"
    subprocess.run(["mount", "-o", "remount,size=256m", str(store)], check=True)
    addr = f"{w.hosts[0].address.rsplit('.', 1)[0]}.9:{5000 + os.getpid() % 1000}"
    reg = w.tmp / "registry"
    reg.mkdir(exist_ok=True)
    (reg / "htpasswd").write_bytes(b"alice:" + bcrypt.hashpw(b"Hunter2Secret", bcrypt.gensalt(5)) + b"\n")
    (reg / "config.yml").write_text(yaml.safe_dump({
        "version": 0.1, "log": {"level": "error"}, "storage": {"filesystem": {"rootdirectory": str(reg / "data")}},
        "http": {"addr": addr}, "auth": {"htpasswd": {"realm": "test", "path": str(reg / "htpasswd")}}}))
    auth = w.cfgdir / "registry-auth.json"
    auth.touch(0o600)                # others may not read it (tests/test_image_more.py)
    proc = subprocess.Popen(["docker-registry", "serve", str(reg / "config.yml")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: http_status(f"http://{addr}/v2/") == 401, 20), "the registry does not answer"
        prof = yaml.safe_load(w.profile.read_text())
        prof["sglang"]["image"]["registry"] = {"repository": f"{addr}/dsv4ctl", "auth_file": "registry-auth.json",
                                               "tls_verify": False}
        w.profile.write_text(yaml.safe_dump(prof, sort_keys=False))
        secrets = ["Hunter2Secret", "WrongSecret", base64.b64encode(b"alice:Hunter2Secret").decode(),
                   base64.b64encode(b"alice:WrongSecret").decode()]
        auth.touch(mode=0o600)                     # only its owner reads it (image.auth_bytes refuses looser)
        auth.write_text(json.dumps({"auths": {addr: {"auth": secrets[3]}}}))
        r = deploy(w, "-v")
        assert r.code == 3 and "stopped before any host was switched" in r.err, r.err
        assert f"pushing the image of" in r.err and f"to {addr}/dsv4ctl" in r.err and "nauthorized" in r.err, r.err
        auth.write_text(json.dumps({"auths": {addr: {"auth": secrets[2]}}}))
        r = deploy(w, "-v")
        assert r.code == 0, r.err
        rid = w.current("h1")
        rec = json.loads((w.cache / "images" / "records" / f"{rid}.json").read_text())
        assert rec["pushed"].startswith(f"{addr}/dsv4ctl@sha256:"), rec
        # h1 pulls (its store was full before); h0 and h2 have that image from the full-disk test
        assert f"h1: image {rec['image'][:12]} pulled from {addr}/dsv4ctl" in r.err, r.err
        for h in ("h0", "h1", "h2"):
            assert (w.roots[h] / "images" / "ids" / rid).read_text().strip() == rec["image"]
        assert wait_for(lambda: http_status(f"http://{w.hosts[2].address}:{w.ports['router']}/health") == 200, 30)
        seen = r.out + r.err + "".join((w.roots[h] / "audit.jsonl").read_text() for h in ("h0", "h1", "h2"))
        seen += "".join(p.read_text(errors="replace") for p in w.state_dir.rglob("*") if p.is_file())
        assert not [s for s in secrets if s in seen]
    finally:
        proc.terminate()
        proc.wait(10)


def test_day2_and_pruning_on_image_releases(fault_world):
    """On the image site (after the faults above): ``diagnose`` reads the containers' logs and
    finds every group healthy; ``stop`` removes the group's container, ``diagnose`` says stopped,
    ``start`` runs the current image again, ``restart`` a new container of the same image; a
    deploy with ``keep_releases: 1`` prunes the first release and, with it, its image from every
    host's store (the kept releases' images stay)."""
    w = fault_world
    store = w.roots["h1"] / "containers"
    subprocess.run(["mount", "-o", "remount,size=256m", str(store)], check=True)   # the full-disk test's tmpfs
    w.keep = 1
    w.write()                               # no registry (the registry test's profile), keep_releases: 1
    f = w.tree / "python" / "sglang" / "srt" / "mod002.py"
    if w.current("h1") == w.r1:             # run alone: a second release first (r1 is then prunable)
        f.write_text(f.read_text() + "z0 = 3\n")
        git(w.tree, "commit", "-q", "-am", "second")
        git(w.tree, "tag", "-f", "v0.5.23")
        assert deploy(w).code == 0
    f.write_text(f.read_text() + "z = 3\n")
    git(w.tree, "commit", "-q", "-am", "prune")
    git(w.tree, "tag", "-f", "v0.5.23")
    prev = w.current("h1")
    recs = {p.stem: json.loads(p.read_text())["image"] for p in (w.cache / "images" / "records").glob("*.json")}
    r = deploy(w, "--dry-run")          # the control machine's copies of r1 are pruned too
    assert r.code == 0 and [ln for ln in r.out.splitlines() if w.r1 in ln and ln.strip().startswith(
        "local: prune this machine's copies of ")], r.out
    r = deploy(w)
    assert r.code == 0, r.err
    rid = w.current("h1")
    assert rid not in (prev, w.r1)
    local = w.cache / "images"        # its OCI layout, image and record; the kept releases' stay
    assert [ln for ln in r.err.splitlines() if w.r1 in ln and "local: pruned the image copies of " in ln], r.err
    assert not (local / "oci" / w.r1).exists() and not (local / "records" / f"{w.r1}.json").exists()
    assert subprocess.run([*images.podman_argv(local), "image", "exists", f"localhost/dsv4ctl:{w.r1}"]).returncode == 1
    assert (local / "oci" / rid / "index.json").is_file() and (local / "records" / f"{prev}.json").is_file()
    recs[rid] = json.loads((w.cache / "images" / "records" / f"{rid}.json").read_text())["image"]
    for h in ("h0", "h1", "h2"):
        kept = {x.name for x in (w.roots[h] / "releases").iterdir() if not x.name.startswith(".")}
        assert w.r1 not in kept and {rid, prev} <= kept, (h, kept)
        assert sorted(x.name for x in (w.roots[h] / "images" / "ids").iterdir()) == sorted({rid, prev}), h
        exists = lambda i: subprocess.run([*w.podman(h), "image", "exists", i]).returncode == 0
        assert not exists(recs[w.r1]), f"{h}: the pruned release's image is still in the store"
        assert exists(recs[rid]) and exists(recs[prev]), h
    # diagnose: the container's log and process, every group healthy
    r = run_cli("diagnose", str(w.profile), "--json", "--window", "0", env=w.env(), timeout=120)
    assert r.code == 0, r.out + r.err
    doc = json.loads(r.out)
    assert doc["ok"] and {g: d["release"] for g, d in doc["groups"].items()} == dict.fromkeys(
        ("prefill", "decode"), rid), doc["groups"]            # the servers (a router is no server)
    assert "dsv4probe 1.0" in (w.roots["h1"] / "logs" / "decode.log").read_text()
    # stop / start / restart act on the group's container
    r = run_cli("stop", str(w.profile), "-g", "decode", env=w.env(), timeout=120)
    assert r.code == 0, r.err
    assert w.containers("h1") == []
    r = run_cli("diagnose", str(w.profile), "--json", "--window", "0", "-g", "decode", env=w.env(), timeout=120)
    assert r.code == 0 and [x["rule"] for x in json.loads(r.out)["groups"]["decode"]["findings"]] == ["stopped"], r.out
    r = run_cli("start", str(w.profile), "-g", "decode", env=w.env(), timeout=180)
    assert r.code == 0, r.err
    [c1] = w.containers("h1")
    assert (c1["Names"][0], c1["ImageID"]) == (f"dsv4ctl-decode-n0-{rid}", recs[rid])
    r = run_cli("restart", str(w.profile), "-g", "decode", env=w.env(), timeout=180)
    assert r.code == 0, r.err
    [c2] = w.containers("h1")
    assert (c2["Names"][0], c2["ImageID"]) == (f"dsv4ctl-decode-n0-{rid}", recs[rid]) and c2["Id"] != c1["Id"]
    assert wait_for(lambda: http_status(f"http://{w.hosts[2].address}:{w.ports['router']}/health") == 200, 20)


def test_a_two_node_server_in_containers(fault_world):
    """decode as one server over h1 (node 0) and h2 (node 1), SGLang's ``--nnodes 2``: each node
    runs in a container of the release's image named for its rank; node 0 serves once node 1
    joined over the hosts' network; ``stop`` removes both nodes' containers."""
    from tests.sshd.harness import free_port
    w = fault_world
    before = w.currents()
    # first: GPUs by CDI on hosts without a CDI spec: a preflight error naming each host, before
    # anything is built or shipped (its dry run too: it runs the same check)
    w.image_extra = {"gpus": "cdi"}
    w.write()
    images_before = sorted(p.name for p in (w.cache / "images" / "records").glob("*.json"))
    for args in (("--dry-run",), ()):
        r = deploy(w, *args)
        assert r.code == 3 and "preflight: h" in r.err and "nothing was built or shipped" in r.err, r.err
        assert "no CDI spec names nvidia.com/gpu (/etc/cdi, /var/run/cdi) for nvidia.com/gpu=0" in r.err, r.err
        assert "building the image" not in r.err and "pushed" not in r.err, r.err
    assert w.currents() == before
    assert sorted(p.name for p in (w.cache / "images" / "records").glob("*.json")) == images_before
    w.image_extra = {}
    w.write()
    # deploy --promote of an image release builds, ships and verifies the image before the canary
    # switches (its dry run: the pipeline's steps; a promotion's checks are tests/test_promote's)
    t0 = time.monotonic()
    r = run_cli("deploy", str(w.profile), "--accept-new-host-keys", "--promote", "--dry-run", env=w.env(), timeout=120)
    acts = r.out.splitlines()
    assert r.code == 0, r.err
    at = lambda word: next(i for i, a in enumerate(acts) if word in a)
    assert at("local: build image localhost/dsv4ctl:") < at("h1: ship image of ") < at("h1: verify the image of ") \
        < at("h1: [canary] switch "), r.out
    print(f"deploy --promote --dry-run: {time.monotonic() - t0:.1f} s")
    h = w.hosts
    f = w.cfgdir / "decode.yaml"
    f.write_text(yaml.safe_dump({**yaml.safe_load(f.read_text()), "tp-size": 2, "nnodes": 2}, sort_keys=False))
    prof = yaml.safe_load(w.profile.read_text())
    dist = free_port(h[1].address)
    for grp in prof["groups"]:
        if grp["name"] == "decode":
            del grp["host"], grp["tp"]
            grp.update(nodes=[h[1].name, h[2].name], dist_init_port=dist)
    w.profile.write_text(yaml.safe_dump(prof, sort_keys=False))
    r = deploy(w)
    assert r.code == 0, r.err
    rid = w.current("h2")
    iid = json.loads((w.cache / "images" / "records" / f"{rid}.json").read_text())["image"]
    names = lambda host: {c["Names"][0]: c["ImageID"] for c in w.containers(host)}
    assert names("h1") == {f"dsv4ctl-decode-n0-{rid}": iid}
    assert names("h2") == {f"dsv4ctl-decode-n1-{rid}": iid, f"dsv4ctl-router-n0-{rid}": iid}
    assert "all 2 nodes joined" in (w.roots["h1"] / "logs" / "decode.log").read_text()
    assert f"joined node 0 at {h[1].address}:{dist}" in (w.roots["h2"] / "logs" / "decode.log").read_text()
    assert wait_for(lambda: http_status(f"http://{h[2].address}:{w.ports['router']}/health") == 200, 20)
    r = run_cli("stop", str(w.profile), "-g", "decode", env=w.env(), timeout=120)
    assert r.code == 0, r.err
    assert names("h1") == {} and names("h2") == {f"dsv4ctl-router-n0-{rid}": iid}
