"""Releases as OCI images (issue 47), the items after tests/test_image_deploy.py: a registry auth
file others can read is refused (dry runs too), the control machine's OCI copies of the images
are pruned with the releases, and the ``systemd`` service backend runs the containers. Real
parts: rootful podman with runc, real sshd hosts (tests/test_image_deploy.py's world), systemd
as PID 1 of a private namespace (tests/test_systemd.py's)."""

from __future__ import annotations

import json
import re
import subprocess
import os

import pytest
import yaml

from tests.conftest import run_cli
from tests.sshd.fixtures import sshd_cluster  # noqa: F401
from tests.test_image_deploy import ImageWorld
from tests.test_systemd import sysd  # noqa: F401  (one booted systemd namespace for the module)

pytestmark = pytest.mark.sshd


# -- 1. the registry auth file ---------------------------------------------------------------------

def test_a_registry_auth_file_others_can_read_is_refused(sshd_cluster, tmp_path):
    """``sglang.image.registry.auth_file`` readable by others (0644, the default umask's) or
    writable by its group (0660) is exit 2 with one line naming the file and its mode, before
    anything is built, shipped or connected to, ``--dry-run`` included; the credentials are
    never shown. 0600 and 0640 (a team's group may read it) pass that check (the test's base,
    an OCI layout that is not there, then stops the run: no host was needed)."""
    secret = "QWxpY2U6SHVudGVyMlNlY3JldA=="
    w = ImageWorld(sshd_cluster, tmp_path, "oci:" + str(tmp_path / "no-base"), nhosts=3)
    auth = w.cfgdir / "registry-auth.json"
    auth.write_text(json.dumps({"auths": {"registry.example:5000": {"auth": secret}}}))
    prof = yaml.safe_load(w.profile.read_text())
    prof["sglang"]["image"]["registry"] = {"repository": "registry.example:5000/dsv4ctl",
                                           "auth_file": "registry-auth.json"}
    w.profile.write_text(yaml.safe_dump(prof, sort_keys=False))
    run = lambda *a: run_cli("deploy", str(w.profile), "--accept-new-host-keys", "--no-preflight", *a, env=w.env(),
                             timeout=120)
    for mode, what in ((0o644, "others read"), (0o604, "others read"), (0o660, "its group write")):
        auth.chmod(mode)
        for args in (("--dry-run",), ()):
            r = run(*args)
            assert r.code == 2, (mode, args, r.err)
            assert r.err.strip().splitlines() == [
                f"dsv4ctl: error: sglang.image.registry.auth_file {auth}: mode {mode:04o} lets {what} the registry "
                f"credentials: chmod 600 {auth}"], r.err
            assert secret not in r.out + r.err
    assert not any((w.roots[h] / "releases").exists() for h in w.roots)       # no host was touched
    for mode in (0o600, 0o640):
        auth.chmod(mode)
        r = run("--dry-run")
        assert r.code == 2 and "no OCI image layout at" in r.err and "registry.auth_file" not in r.err, r.err



def test_release_layouts_share_their_common_blobs(tmp_path):
    """share_blobs: a blob another release's layout holds (same sha256 name and size) becomes a
    hard link to it; one of another size, or only in this layout, stays its own file."""
    from dsv4ctl.deploy.image import share_blobs
    oci = tmp_path / "oci"
    for rid, blobs in (("r1", {"a" * 64: b"base" * 1000, "b" * 64: b"tree1", "c" * 64: b"x"}),
                       (".r2-1", {"a" * 64: b"base" * 1000, "d" * 64: b"tree2", "c" * 64: b"xy"})):
        d = oci / rid / "blobs" / "sha256"
        d.mkdir(parents=True)
        for n, data in blobs.items():
            (d / n).write_bytes(data)
    new = oci / ".r2-1" / "blobs" / "sha256"
    assert share_blobs(oci / ".r2-1", oci) == 4000
    assert os.path.samefile(new / ("a" * 64), oci / "r1" / "blobs" / "sha256" / ("a" * 64))
    assert not os.path.samefile(new / ("c" * 64), oci / "r1" / "blobs" / "sha256" / ("c" * 64))
    assert (new / ("c" * 64)).read_bytes() == b"xy" and (new / ("d" * 64)).read_bytes() == b"tree2"
    assert sorted(p.name for p in new.iterdir()) == ["a" * 64, "c" * 64, "d" * 64]      # no temporary left
    assert share_blobs(oci / ".r2-1", oci) == 0                                         # once is enough


# -- 4. the Slurm backend with images: refused ----------------------------------------------------

def test_images_on_the_slurm_backend_are_refused(sshd_cluster, tmp_path):
    """``sglang.image`` with ``deploy.backend: slurm`` is exit 2 with one line naming the profile
    line and why, before anything is built or a host reached (``config lint``, ``deploy
    --dry-run``, ``deploy``). Before, a deploy built and shipped the image, the servers came up
    in their containers, and the gate failed on 'the server answering on ... is pid N (no Slurm
    job), not Slurm job J' (conmon runs the container outside the job's processes): a
    misleading rollback after the whole build and ship."""
    w = ImageWorld(sshd_cluster, tmp_path, "oci:" + str(tmp_path / "no-base"), nhosts=3)
    prof = yaml.safe_load(w.profile.read_text())
    prof["deploy"].update(backend="slurm", slurm={"partition": "gpu"})
    w.profile.write_text(yaml.safe_dump(prof, sort_keys=False))
    line = next(i for i, ln in enumerate(w.profile.read_text().splitlines(), 1) if ln.strip() == "image:")
    for args in (("config", "lint", str(w.profile)), ("deploy", str(w.profile), "--dry-run", "--no-preflight"),
                 ("deploy", str(w.profile), "--no-preflight")):
        r = run_cli(*args, env=w.env(), timeout=120)
        assert r.code == 2, (args, r.out, r.err)
        assert r.err.strip().splitlines() == [
            f"dsv4ctl: error: {w.profile}:{line}: sglang.image with deploy.backend: slurm is not supported yet: a "
            "container runs under conmon, outside its Slurm job (the gate cannot tie the server to the job, and a "
            "cancelled job may leave it running); use the ssh backend for image releases, or srun the image by "
            "hand (docs/images.md, Slurm and Kubernetes)"], (args, r.err)
    assert not any((w.roots[h] / "releases").exists() for h in w.roots)


# -- 3. the systemd service backend with images -------------------------------------------------

@pytest.fixture(scope="session")
def image_base(tmp_path_factory):
    """``oci:DIR@sha256:HEX``: tests/test_image_deploy.py's base image, reused when its session
    fixture built it in this process already (building it costs seconds of CPU), else built."""
    from tests.images import base as images
    why = images.available()
    if why:
        pytest.skip(why)
    for d in sorted(tmp_path_factory.getbasetemp().glob("base-image*")):
        if (d / "base-oci" / "index.json").is_file():
            yield images.base_reference(d)
            return
    d = tmp_path_factory.mktemp("base-image")
    yield images.base_reference(d)
    images.clean_store(d / "store")


def _sys_image_world(sysd, name: str, base: str):
    """tests/test_systemd.py's world (host ``s0`` under the namespace's systemd, ``deploy.service:
    systemd``) with ``sglang.image``: prefill and decode run in containers of the release's image
    (the image's python3 runs the stand-in; the repository mounted read-only)."""
    from tests.images import base as images
    from tests.sshd.world import REPO, STANDIN
    from tests.test_systemd import SysWorld

    class SysImageWorld(SysWorld):
        def write(self) -> None:
            super().write()
            prof = yaml.safe_load(self.profile.read_text())
            prof["sglang"]["image"] = {"base": base, "gpus": "none", "shm_size": "64m", "store": "{root}/containers",
                                       "runtime_args": images.RUNTIME_ARGS, "mounts": [str(REPO)],
                                       # the namespace's cgroup2 has no controllers (this machine's are
                                       # cgroup v1's): no pids.max to write (docs/images.md, traps)
                                       "run_args": [*images.RUN_ARGS, "--pids-limit=-1"]}
            prof["deploy"]["health_timeout_s"] = 90
            launch = prof["deploy"]["launch"]
            launch["server"] = launch["server"].replace(STANDIN, STANDIN.replace("{python}", "python3"))
            self.profile.write_text(yaml.safe_dump(prof, sort_keys=False))

        def podman(self, *args) -> str:
            return self.b.run("podman", *images.podman_argv(self.root / "containers")[1:], *args).stdout

        def containers(self) -> dict[str, str]:
            """{name: image id} of the running containers (read inside the namespace: its /run)."""
            return {c["Names"][0]: c["ImageID"] for c in json.loads(self.podman("ps", "--format", "json") or "[]")}

    w = SysImageWorld(sysd, sysd.cluster.base / name)
    w.groups = ("prefill", "decode")
    w.write()
    return w


@pytest.mark.systemd
def test_systemd_units_run_the_release_image(sysd, image_base):
    """``deploy.service: systemd`` with ``sglang.image`` under a real systemd: each group's unit
    runs its container (``podman run --init`` in the foreground, a process of the unit's
    cgroup), status names the container and its image; a release
    whose decode container exits at start fails its gate and the units run the first image
    again."""
    w = _sys_image_world(sysd, "systemd-image", image_base)
    try:
        r1 = w.deploy_ok("--no-preflight")
        iid = lambda rid: json.loads((w.base / "cache" / "images" / "records" / f"{rid}.json").read_text())["image"]
        assert w.containers() == {f"dsv4ctl-{g}-n0-{r1}": iid(r1) for g in w.groups}
        for g in w.groups:
            assert w.unit(g, "ActiveState") == "active", w.systemctl("status", f"dsv4ctl-{g}.service")
            procs = w.b.run("cat", f"/sys/fs/cgroup/system.slice/dsv4ctl-{g}.service/cgroup.procs").stdout.split()
            cmds = [w.b.path(f"/proc/{p}/cmdline").read_bytes().split(b"\0") for p in procs]
            assert any(c[0].endswith(b"podman") and b"run" in c and b"--init" in c for c in cmds), cmds
        assert w.serving()
        st = w.cli("status", "--json")
        assert st.code == 0, st.err
        groups = st.json()["hosts"]["s0"]["groups"]
        assert {g: (d["alive"], d["health"], d["image"]) for g, d in groups.items()} == {
            g: (True, "ok", iid(r1)) for g in w.groups}, groups
        # decode's container exits at start: the switch stops r1's containers, the gate fails,
        # the units run r1's image again
        w.extra["decode"] = {"standin-crash": "CUDA error: out of memory"}
        w.write()
        r = w.cli("deploy", "--no-preflight")
        assert r.code == 1 and f"rolled back to {r1} on all hosts" in r.err, r.err + w.console()
        assert w.current() == r1 and w.containers() == {f"dsv4ctl-{g}-n0-{r1}": iid(r1) for g in w.groups}
        assert all(w.unit(g, "ActiveState") == "active" for g in w.groups)
        assert "CUDA error: out of memory" in (w.root / "logs" / "decode.log").read_text()
        assert w.serving()
        # the two releases' OCI layouts on the control machine hold their common blobs (the
        # 60 MB base) once: hard links
        oci = w.base / "cache" / "images" / "oci"
        bad = r.err.split("deploy of ")[1].split()[0]
        ino = lambda rid: {b.name: (b.stat().st_ino, b.stat().st_size) for b in (oci / rid / "blobs" / "sha256").iterdir()}
        one, two = ino(r1), ino(bad)
        common = set(one) & set(two)
        assert sum(one[n][1] for n in common) > 10 << 20 and all(one[n] == two[n] for n in common), (one, two)
    finally:
        w.stop_all()
        w.podman("rm", "-f", "-a", "-t", "1")


# -- 2. a named build host (issue 47 item 2) --------------------------------------------------------

def test_a_build_host_without_podman_is_a_preflight_error(monkeypatch, tmp_path):
    """``build_host_preflight`` on a host whose PATH has no podman (a real shell, here with a
    PATH folder holding bash alone): exit 3, one line naming the build host and what to install, before
    anything is built or shipped."""
    from types import SimpleNamespace
    from dsv4ctl.deploy.image import build_host_preflight
    from dsv4ctl.errors import RemoteError
    from dsv4ctl.profile.deployment import ImageSettings
    from dsv4ctl.remote import LocalTransport
    empty = tmp_path / "bin"              # a PATH with bash (the transport's shell) and no podman
    empty.mkdir()
    (empty / "bash").symlink_to("/bin/bash")
    site = SimpleNamespace(profile=SimpleNamespace(sglang=SimpleNamespace(image=ImageSettings(base="x",
                                                                                              build_host="b0"))),
                           transports={"b0": LocalTransport("b0")})
    build_host_preflight(site)                       # podman is on this machine's PATH
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(RemoteError) as e:
        build_host_preflight(site)
    assert e.value.exit_code == 3
    assert str(e.value) == ("preflight: build host b0: podman not found on the build host (sglang.image.build_host "
                            "builds the images with it: apt install podman): nothing was built or shipped")


def test_a_build_host_that_is_no_host_of_the_profile_is_refused(sshd_cluster, tmp_path):
    """``sglang.image.build_host`` must name a host of ``hosts:``: exit 2, one line at its profile
    line, ``config lint`` and ``deploy --dry-run`` alike."""
    w = ImageWorld(sshd_cluster, tmp_path, "oci:" + str(tmp_path / "no-base"), nhosts=3)
    w.image_extra = {"build_host": "builder9"}
    w.write()
    line = next(i for i, ln in enumerate(w.profile.read_text().splitlines(), 1) if "build_host:" in ln)
    for args in (("config", "lint", str(w.profile)), ("deploy", str(w.profile), "--dry-run", "--no-preflight")):
        r = run_cli(*args, env=w.env(), timeout=120)
        assert r.code == 2 and r.err.strip().splitlines() == [
            f"dsv4ctl: error: {w.profile}:{line}: sglang.image.build_host: builder9 is not a host of hosts: "
            "(h0, h1, h2)"], (args, r.err)


def test_images_built_on_a_build_host(sshd_cluster, tmp_path, image_base, monkeypatch):
    """``sglang.image.build_host: h0`` (one of the world's sshd hosts, rootful podman): the
    deploy sends the build
    context there, builds with h0's podman (its store ``ROOT/images/build``; this machine's
    store holds no image), shows the build's STEP lines, brings the OCI layout back and ships
    it; every host runs the image. A one-file change then brings back and ships only its own
    small layers (its dry run lists the build on h0, the build host's preflight and the very
    steps the run executes: tests/test_steps_equal.py's check),
    and the same release built on this machine gives the same image id (the environment layer
    too: it is reproducible)."""
    from dsv4ctl.deploy import engine
    from dsv4ctl.deploy.image import build_image
    from dsv4ctl.deploy.release import cached_release
    from dsv4ctl.deploy.site import Options
    from dsv4ctl.deploy.steps import DRY_RUN_TOKEN
    from dsv4ctl.profile.deployment import load_deployment
    from tests.images import base as images
    from tests.sshd.world import git, http_status, wait_for
    from tests.test_image_deploy import deploy
    w = ImageWorld(sshd_cluster, tmp_path, image_base, nhosts=3)
    w.image_extra = {"build_host": "h0"}
    w.write()
    bstore = w.roots["h0"] / "images" / "build"
    local_cache = tmp_path / "local-build"
    try:
        r = deploy(w)
        assert r.code == 0, r.err + r.out
        r1 = w.current("h1")
        rec1 = json.loads((w.cache / "images" / "records" / f"{r1}.json").read_text())
        assert rec1["build_host"] == "h0"
        assert f"building the image of {r1} on h0: STEP 1/4: FROM " in r.err and \
            f"built image {rec1['image'][:12]} of {r1} on h0" in r.err, r.err
        assert f"brought the image layout of {r1} from h0: " in r.err, r.err
        exists = lambda store, iid: subprocess.run([*images.podman_argv(store), "image", "exists", iid]).returncode == 0
        assert exists(bstore, rec1["image"])                               # built in h0's build store
        assert not (w.cache / "images" / "storage").exists()               # not on this machine
        assert (w.cache / "images" / "oci" / r1 / "index.json").is_file()
        for h in ("h0", "h1", "h2"):
            assert (w.roots[h] / "images" / "ids" / r1).read_text().strip() == rec1["image"]
        # a one-file change, built on h0
        f = w.tree / "python" / "sglang" / "srt" / "mod001.py"
        f.write_text(f.read_text() + "y = 2\n")
        git(w.tree, "commit", "-q", "-am", "one file")
        git(w.tree, "tag", "-f", "v0.5.23")
        # in this process: its dry run lists exactly the steps the run executes
        lines, planned, executed = [], [], []
        opts = lambda **kw: Options(cache=w.cache / "releases", accept_new_host_keys=True, preflight=False,
                                    log=lines.append, **kw)
        monkeypatch.setenv("DSV4CTL_STATE_DIR", str(w.state_dir))
        dry = engine.deploy(load_deployment(w.profile), opts(dry_run=True))
        rep = engine.deploy(load_deployment(w.profile), opts(steps=planned.append, trace=executed.append))
        err = "\n".join(lines)
        assert rep["result"] == "ok", err
        assert "preflight: build host h0: podman (sglang.image.build_host), before anything is built or shipped" \
            in dry["actions"], dry["actions"]
        [step] = [x["summary"] for x in dry["steps"] if x["phase"] == "image" and x["host"] == "local"]
        assert f"on build host h0 (the build context sent with rsync to {w.roots['h0']}/images/build)" in step \
            and "bring its OCI layout back from h0" in step, step
        r2 = rep["release"]
        assert r2 != r1 and w.current("h1") == r2
        key = lambda d: (d["phase"], d["host"], d["stage"], d["summary"], d["cmd"])
        token = next(x for x in planned[0].steps if x.phase == "lock").cmd.split('"token":"')[1].split('"')[0]
        assert [key(x) for x in dry["steps"]] == [tuple(v.replace(token, DRY_RUN_TOKEN) if isinstance(v, str) else v
                                                        for v in key(x.to_dict())) for x in planned[0].steps]
        assert sorted(key(x.to_dict()) for x in executed) == sorted(key(x.to_dict()) for x in planned[0].steps)
        # both verify steps of each host ran (before, the release folder's was dropped on image sites)
        assert sorted(x.host for x in executed if x.phase == "verify") == ["h0", "h0", "h1", "h1", "h2", "h2"]
        assert [s.summary for s in executed if s.phase == "image" and s.host == "local"] == [
            next(s["summary"] for s in dry["steps"] if s["phase"] == "image" and s["host"] == "local")]
        rec2 = json.loads((w.cache / "images" / "records" / f"{r2}.json").read_text())
        got = int(re.search(rf"brought the image layout of {r2} from h0: ([\d,]+) bytes", err)[1].replace(",", ""))
        sent = [int(x.replace(",", "")) for x in re.findall(r"loaded, ([\d,]+) bytes sent", err)]
        assert got < 300_000 and sent and max(sent) < 200_000, err      # the 60 MB base stays where it is
        assert "built environment layer" not in err
        assert f"building the image of {r2} on h0: STEP 4/4: " in err, err
        cs = {c["Names"][0]: c["ImageID"] for h in ("h0", "h1", "h2") for c in w.containers(h)}
        assert cs == {f"dsv4ctl-{g}-n0-{r2}": rec2["image"] for g in ("prefill", "decode", "router")}, cs
        assert wait_for(lambda: http_status(f"http://{w.hosts[2].address}:{w.ports['router']}/health") == 200, 20)
        # the same release built on this machine: the same image id
        dep = load_deployment(w.profile)
        rel = cached_release(w.cache / "releases", r2)
        local = build_image(dep.sglang.image, rel, local_cache / "releases", env=dep.sglang.environment)
        assert (local.image, local.base_id, local.env_image, local.build_host) == (
            rec2["image"], rec2["base_id"], rec2["env_image"], ""), (local, rec2)
    finally:
        w.cleanup()
        images.clean_store(bstore)
        images.clean_store(local_cache / "images")


def test_an_interrupt_during_a_remote_build_records_nothing(sshd_cluster, tmp_path, image_base):
    """SIGINT while the build host builds (the environment layer's RUN hangs there, in uv):
    the deploy stops (130), the build's processes on the build host end with it, no image is
    recorded here (the next deploy builds again) and none is in the build host's store, no host
    records or runs anything of it. Then, on the base the build pulled there, a push from the
    build host to a registry (:func:`_push_from_the_build_host`)."""
    import signal
    import time
    from tests.images import base as images
    from tests.sshd.world import wait_for
    from tests.test_image_deploy import _deploy_bg, _interrupt
    w = ImageWorld(sshd_cluster, tmp_path, image_base, nhosts=3)
    w.image_extra = {"build_host": "h0"}
    w.write()
    mark = f"0.{os.getpid() % 1000:03d}{time.time_ns() % 1000:03d}"
    hang = tmp_path / "hanging-uv"
    hang.write_text(f"#!/bin/sh\nexec sleep 3600 {mark}\n")          # sent to h0, runs in the build's RUN step
    hang.chmod(0o755)
    prof = yaml.safe_load(w.profile.read_text())
    prof["sglang"]["environment"]["uv"] = str(hang)
    w.profile.write_text(yaml.safe_dump(prof, sort_keys=False))
    hung = lambda: subprocess.run(["pgrep", "-f", f"^sleep 3600 {mark}$"], capture_output=True).returncode == 0
    bstore = w.roots["h0"] / "images" / "build"
    try:
        p, err = _deploy_bg(w)
        text = _interrupt(p, err, signal.SIGINT, hung, "hanging remote build")
        assert wait_for(lambda: not hung(), 15), "the build still runs on h0 after SIGINT"
        assert "building the environment image" in text and " on h0" in text, text
        recs = w.cache / "images" / "records"
        assert not recs.exists() or not list(recs.glob("*.json")), list(recs.iterdir())
        out = subprocess.run([*images.podman_argv(bstore), "images", "-q", "--filter", "reference=localhost/dsv4ctl*"],
                             capture_output=True, text=True).stdout
        assert out.strip() == "", out
        for h in ("h0", "h1", "h2"):
            assert not (w.roots[h] / "images" / "ids").exists() or not list((w.roots[h] / "images" / "ids").iterdir())
            assert w.current(h) is None and w.containers(h) == []
        _push_from_the_build_host(w, bstore)
    finally:
        w.cleanup()
        images.clean_store(bstore)


def _push_from_the_build_host(w, bstore) -> None:
    """``push_remote``: an image of the build host's store (the base, pulled there by the build
    above) pushed from h0 to a real registry (Debian's docker-registry, htpasswd, plain HTTP):
    the manifest digest returned is the registry's, the credentials reach h0 on stdin only (no
    file of them is left there, none is in the log), wrong ones are exit 3 naming the registry."""
    import base64
    import shutil
    import urllib.request
    import bcrypt
    from dsv4ctl.deploy.image import ImageRecord, RemoteBuilder, push_remote
    from dsv4ctl.errors import RemoteError
    from dsv4ctl.profile.deployment import load_deployment
    from dsv4ctl.remote import connect
    from tests.images import base as images
    from tests.sshd.world import http_status, wait_for
    if shutil.which("docker-registry") is None:
        pytest.skip("docker-registry not installed (scripts/test.sh installs it)")
    addr = f"{w.hosts[0].address.rsplit('.', 1)[0]}.9:{6000 + os.getpid() % 1000}"
    reg = w.tmp / "registry"
    reg.mkdir()
    (reg / "htpasswd").write_bytes(b"alice:" + bcrypt.hashpw(b"Hunter2Secret", bcrypt.gensalt(5)) + b"\n")
    (reg / "config.yml").write_text(yaml.safe_dump({
        "version": 0.1, "log": {"level": "error"}, "storage": {"filesystem": {"rootdirectory": str(reg / "data")}},
        "http": {"addr": addr}, "auth": {"htpasswd": {"realm": "test", "path": str(reg / "htpasswd")}}}))
    good = base64.b64encode(b"alice:Hunter2Secret").decode()
    auth = w.cfgdir / "registry-auth.json"
    auth.touch(0o600)
    prof = yaml.safe_load(w.profile.read_text())
    prof["sglang"]["image"]["registry"] = {"repository": f"{addr}/dsv4ctl", "auth_file": "registry-auth.json",
                                           "tls_verify": False}
    w.profile.write_text(yaml.safe_dump(prof, sort_keys=False))
    dep = load_deployment(w.profile)
    base_id = subprocess.run([*images.podman_argv(bstore), "images", "-q", "--no-trunc"], capture_output=True,
                             text=True).stdout.split()[0].removeprefix("sha256:")
    rec = ImageRecord("rpush0001", base_id, dep.sglang.image.base, "", base_id)
    t = connect(dep.hosts["h0"], hosts=dep.hosts)
    proc = subprocess.Popen(["docker-registry", "serve", str(reg / "config.yml")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: http_status(f"http://{addr}/v2/") == 401, 20), "the registry does not answer"
        b = RemoteBuilder(dep.sglang.image, w.cache / "releases", t, str(w.roots["h0"]), None)
        logs: list[str] = []
        auth.write_text(json.dumps({"auths": {addr: {"auth": base64.b64encode(b"alice:WrongSecret").decode()}}}))
        with pytest.raises(RemoteError) as e:
            push_remote(b, dep.sglang.image, rec, logs.append)
        assert e.value.exit_code == 3 and str(e.value).startswith(
            f"h0: pushing the image of rpush0001 to {addr}/dsv4ctl: ") and "nauthorized" in str(e.value), str(e.value)
        auth.write_text(json.dumps({"auths": {addr: {"auth": good}}}))
        ref = push_remote(b, dep.sglang.image, rec, logs.append)
        req = urllib.request.Request(f"http://{addr}/v2/dsv4ctl/manifests/rpush0001", method="HEAD", headers={
            "Authorization": f"Basic {good}", "Accept": "application/vnd.oci.image.manifest.v1+json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert ref == f"{addr}/dsv4ctl@{resp.headers['Docker-Content-Digest']}", (ref, dict(resp.headers))
        assert logs == [ln for ln in logs if "Hunter2Secret" not in ln and good not in ln]
        assert f"pushed image {base_id[:12]} of rpush0001 to {addr}/dsv4ctl from h0 (" in logs[-1], logs
        import glob                     # h0's mktemp files (its TMPDIR is /tmp) are gone with their content
        left = [f for f in glob.glob("/tmp/tmp.*") if os.path.isfile(f) and good.encode() in open(f, "rb").read()]
        assert left == [], left
    finally:
        proc.terminate()
        proc.wait(10)
        t.close()
