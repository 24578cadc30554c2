"""Release images, the parts that need no podman: the base's local OCI layout is checked before
anything is built or pushed (follower's finding: a missing base was found after the push, exit 3)."""

from __future__ import annotations

import os
import shutil
from types import SimpleNamespace

import pytest

from dsv4ctl.deploy.image import check_base, split_pin
from dsv4ctl.errors import InputError


def test_a_missing_local_base_is_exit_2_before_anything(tmp_path):
    with pytest.raises(InputError, match=r"no OCI image layout at /nonexistent \(its index.json is missing\): "
                                         r"nothing was built or pushed"):
        check_base(SimpleNamespace(base="oci:/nonexistent"))
    layout = tmp_path / "base"
    layout.mkdir()
    with pytest.raises(InputError, match="index.json is missing"):
        check_base(SimpleNamespace(base=f"oci:{layout}:latest@sha256:" + "a" * 64))
    (layout / "index.json").write_text("{}")
    check_base(SimpleNamespace(base=f"oci:{layout}@sha256:" + "a" * 64))      # there: the pull judges the rest
    check_base(SimpleNamespace(base="lmsysorg/sglang:v0.5.23"))                # a registry name: checked at pull


def test_split_pin():
    assert split_pin("oci:/x@sha256:" + "b" * 64) == ("oci:/x", "sha256:" + "b" * 64)
    assert split_pin("oci:/x") == ("oci:/x", None)


# -- docker on the hosts: the command builders (no docker daemon can run here: the live tests are podman's) ----

def _img(**kw):
    from dsv4ctl.profile.deployment import ImageSettings
    return ImageSettings(**{"base": "oci:/b", "store": "{root}/containers", **kw})


def _sh_ok(cmd: str) -> None:
    import subprocess
    r = subprocess.run(["sh", "-n", "-c", cmd], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_docker_command_builders():
    """runtime: docker: no per-store arguments (the daemon has one store), GPUs by --gpus,
    image presence by inspect, the pool loaded by docker load of its OCI archive, the verify run
    in a container of the image (docker has no image mount), the registry pull with a
    DOCKER_CONFIG folder holding the credentials read from stdin; podman's forms unchanged."""
    from dsv4ctl.hosts.container import (load_cmd, prepare_cmd, registry_load_cmd, run_command, runtime_argv,
                                         verify_image_cmd)
    d, p = _img(runtime="docker", runtime_args=("--host", "unix:///run/d.sock")), _img(runtime="podman")
    assert runtime_argv(d, "/r") == ["docker", "--host", "unix:///run/d.sock"]
    assert runtime_argv(p, "/r")[:3] == ["podman", "--root", "/r/containers/storage"]
    c = {"shm_size": "16g", "mounts": ["/models"]}
    run_d = run_command(d, "/r", "r1", "decode", 0, c, ["nvidia.com/gpu=2", "nvidia.com/gpu=3"], ["HF_TOKEN"], "serve")
    assert "--gpus device=2,3" in run_d and "--device" not in run_d and "--root" not in run_d
    assert "run --init --rm --network host --name dsv4ctl-decode-n0-r1" in run_d and "-e HF_TOKEN" in run_d
    run_p = run_command(p, "/r", "r1", "decode", 0, c, ["nvidia.com/gpu=2"], [], "serve")
    assert "--device nvidia.com/gpu=2" in run_p and "--gpus" not in run_p
    for run in (run_d, run_p):     # the shared memory SGLang needs; the model path read-only (both runtimes)
        assert "--shm-size 16g -v /models:/models:ro" in run, run
    pre = prepare_cmd(d, "/r", ["nvidia.com/gpu=2"], "abc")
    assert "docker --host unix:///run/d.sock image inspect abc >/dev/null 2>&1" in pre and "nvidia-container-toolkit" in pre and "/etc/cdi" not in pre
    ld = load_cmd(d, "/r", "r1", "abc")
    assert "tar -C /r/images/pool -cf - oci-layout index.json blobs | docker --host unix:///run/d.sock load -q" in ld
    assert "pull" not in ld and "docker --host unix:///run/d.sock tag abc localhost/dsv4ctl:r1" in ld
    ver = verify_image_cmd(d, "/r", "r1", "/usr/bin/python3", "print(1)", "abc")
    assert "run --rm -i --network none --entrypoint '' \"$id\" python3 -S -c" in ver and "image mount" not in ver
    assert '{"verify": ["/opt/dsv4ctl/releases/r1"], "image": true}' in ver
    reg = registry_load_cmd(d, "/r", "r1", "abc", "reg.example:5000/ml@sha256:" + "f" * 64)
    assert 'cat > "$A/config.json"' in reg and 'DOCKER_CONFIG="$A"' in reg and "umask 077" in reg
    reg_p = registry_load_cmd(_img(registry_tls_verify=False), "/r", "r1", "abc", "reg:5000/ml@sha256:" + "f" * 64)
    assert "--tls-verify=false" in reg_p and '--authfile $A' in reg_p
    for cmd in (run_d, run_p, pre, ld, ver, reg, reg_p, load_cmd(p, "/r", "r1", "abc"),
                verify_image_cmd(p, "/r", "r1", "/usr/bin/python3", "print(1)", None)):
        _sh_ok(cmd)


def test_registry_auth_file_is_checked_and_never_shown(tmp_path):
    from dsv4ctl.deploy.image import auth_bytes
    f = tmp_path / "auth.json"
    with pytest.raises(InputError, match=r"registry.auth_file .*auth.json: cannot read"):
        auth_bytes(_img(registry_auth_file=f))
    f.touch(0o600)               # others may not read it (tests/test_image_more.py)
    f.write_text("user:Hunter2Secret")
    with pytest.raises(InputError, match="not a containers auth.json") as e:
        auth_bytes(_img(registry_auth_file=f))
    assert "Hunter2Secret" not in str(e.value)
    f.write_text('{"auths": {}}')
    assert auth_bytes(_img(registry_auth_file=f)) == b'{"auths": {}}' and auth_bytes(_img()) == b""


def test_status_reads_a_docker_container(tmp_path):
    """status on a docker host: the group's container found by its labels, then ``inspect`` for
    its image id and start (a stand-in docker client answers as docker does)."""
    import subprocess
    from dsv4ctl.hosts.day2 import container_command, parse_status
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\ncase \"$1\" in\n  ps) echo " + "c" * 64 + ";;\n"
                    "  inspect) echo " + "c" * 64 + " sha256:" + "e" * 64 + " 2026-12-07T20:00:00.5Z;;\nesac\n")
    fake.chmod(0o755)
    out = subprocess.run(["sh", "-c", "echo '@proc decode 42 - 0 - -'; " + container_command(str(fake), "/r", "decode")],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}).stdout
    import re
    assert re.fullmatch(r"@proc decode 42 - 0 - -\n@ctr decode c{64} sha256:e{64} \d+\n", out), out
    st = parse_status("h1", "/r", out)
    assert (st.procs["decode"].container, st.procs["decode"].image) == ("c" * 64, "e" * 64)
    assert st.procs["decode"].uptime_s > 0


# -- progress of the build and of the transfer (issue 47 audit: a build printed nothing until it ended) --------

def test_a_build_shows_its_steps_and_elapsed_lines_while_it_runs(monkeypatch):
    """``_run(..., log=)`` (what build_image and env_image use, ``podman build`` without ``-q``):
    each ``STEP n/m`` line is shown as it comes, a silent step gets an elapsed line every
    ``DSV4CTL_PROGRESS_S`` s, and the result is still the last stdout line (the image id)."""
    import time
    from dsv4ctl.deploy.image import _run
    monkeypatch.setenv("DSV4CTL_PROGRESS_S", "0.3")
    seen: list[tuple[float, str]] = []
    t0 = time.monotonic()
    script = ("echo 'STEP 1/3: FROM base'; echo 'STEP 2/3: RUN [\"/bin/sh\"]'; echo uv output; sleep 1.1; "
              "echo 'STEP 3/3: COPY tree /opt/x'; echo 'COMMIT x'; echo " + "f" * 64)
    out = _run(["sh", "-c", script], "building the image of r1", log=lambda s: seen.append((time.monotonic() - t0, s)))
    assert out.splitlines()[-1] == "f" * 64
    lines = [s for _t, s in seen]
    assert lines[:2] == ["building the image of r1: STEP 1/3: FROM base (0 s)",
                         'building the image of r1: STEP 2/3: RUN ["/bin/sh"] (0 s)']
    ticks = [s for s in lines if s.startswith("building the image of r1: STEP 2/3, ")]
    assert 2 <= len(ticks) <= 4, lines                            # about 1.1 s / 0.3 s while step 2 ran
    assert lines[-1] == "building the image of r1: STEP 3/3: COPY tree /opt/x (1 s)"
    assert seen[0][0] < 0.9                                        # shown while the build ran, not at its end


def test_a_failed_build_with_progress_is_exit_2_with_its_last_stderr_line():
    from dsv4ctl.deploy.image import _run
    with pytest.raises(InputError, match=r"^building the image of r1: Error: no such base$"):
        _run(["sh", "-c", "echo 'STEP 1/2: FROM x'; echo 'Error: no such base' >&2; exit 125"],
             "building the image of r1", log=lambda s: None)


def test_the_image_transfer_has_its_own_progress_key(tmp_path):
    """The blobs' rsync reports under ``HOST image``, not the tree push's ``HOST`` (which has
    already ended: off a terminal its line was printed and nothing more prints under it)."""
    from types import SimpleNamespace as NS
    from dsv4ctl.deploy.image import transfer_key
    from dsv4ctl.deploy.push import _run_rsync
    src = tmp_path / "blobs"
    src.mkdir()
    (src / "sha256-a").write_bytes(b"x" * 200_000)
    calls = []
    site = NS(opts=NS(progress=lambda k, d, t: calls.append((k, d, t))))
    stats = _run_rsync(NS(name="h0"), site, NS(id="r1"), ["rsync", "-a", "--stats", "--info=progress2",
                                                          f"{src}/", str(tmp_path / "dst")], key=transfer_key("h0"))
    assert transfer_key("h0") == "h0 image"
    assert calls and {k for k, _d, _t in calls} == {"h0 image"} and calls[-1] == ("h0 image", 100, 100)
    assert int(stats["bytes_sent"]) > 200_000


# -- the GPUs a host must give its containers: a preflight check, before anything is built or shipped ----------

def _gpu_site(runtime: str):
    from types import SimpleNamespace as NS
    from dsv4ctl.remote.transport import LocalTransport
    hosts = ["h0", "h1", "h2"]
    return NS(profile=NS(sglang=NS(image=_img(runtime=runtime))), hosts=hosts,
              transports={h: LocalTransport(h) for h in hosts}, opts=NS(connect_timeout=10))


GPU_SPEC = {"decode": {"container": {"devices": {"h0": ["nvidia.com/gpu=0", "nvidia.com/gpu=1"],
                                                 "h1": ["nvidia.com/gpu=0"]}}},
            "router": {"container": {"devices": {}}}}


@pytest.mark.skipif(any(os.path.exists(d) for d in ("/etc/cdi", "/var/run/cdi")), reason="this machine has CDI specs")
def test_a_host_without_the_gpus_is_a_preflight_error():
    """This machine as the hosts (LocalTransport): podman is here, no CDI spec is. Every host the
    plan places GPUs on is named with the ship step's own words, exit 3; a host without GPUs
    (h2) is not checked; docker missing is named; a dry run lists the check per host."""
    from dsv4ctl.deploy.image import gpu_preflight, gpu_preflight_lines
    from dsv4ctl.errors import RemoteError
    if not shutil.which("podman"):
        pytest.skip("podman is not installed")
    with pytest.raises(RemoteError) as e:
        gpu_preflight(_gpu_site("podman"), GPU_SPEC)
    why = "no CDI spec names nvidia.com/gpu (/etc/cdi, /var/run/cdi) for {}: nvidia-ctk cdi generate makes one; " \
          "sglang.image.gpus: none for CPU-only hosts"
    assert str(e.value) == (f"preflight: h0: {why.format('nvidia.com/gpu=0 nvidia.com/gpu=1')}; "
                            f"h1: {why.format('nvidia.com/gpu=0')}: nothing was built or shipped")
    assert e.value.exit_code == 3
    gpu_preflight(_gpu_site("podman"), {"decode": {"container": {"devices": {}}}})       # no GPUs: nothing to check
    gpu_preflight(_gpu_site("podman"), {"decode": {"host": "h0"}})                       # no containers
    if not shutil.which("docker"):
        with pytest.raises(RemoteError, match=r"^preflight: h0: docker not found on this host \(sglang.image.runtime\); "
                                              r"h1: docker not found"):
            gpu_preflight(_gpu_site("docker"), GPU_SPEC)
    assert gpu_preflight_lines(_gpu_site("podman"), GPU_SPEC) == [
        "preflight: h0: podman and a CDI spec naming nvidia.com/gpu (/etc/cdi, /var/run/cdi) for nvidia.com/gpu=0, "
        "nvidia.com/gpu=1, before anything is built or shipped",
        "preflight: h1: podman and a CDI spec naming nvidia.com/gpu (/etc/cdi, /var/run/cdi) for nvidia.com/gpu=0, "
        "before anything is built or shipped"]
    assert gpu_preflight_lines(_gpu_site("docker"), GPU_SPEC)[1] == (
        "preflight: h1: docker and the NVIDIA container toolkit (docker --gpus) for nvidia.com/gpu=0, before anything "
        "is built or shipped")
