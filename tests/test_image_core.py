"""Release images, the parts that need no podman: the base's local OCI layout is checked before
anything is built or pushed (follower's finding: a missing base was found after the push, exit 3)."""

from __future__ import annotations

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
