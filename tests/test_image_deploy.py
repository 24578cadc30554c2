"""Releases as OCI images (issue 47) end to end on real parts: rootful podman (runc) on this
machine, a base image built FROM scratch from this machine's Python (tests/images/base.py), and
the real sshd hosts, each with its own podman store under its deploy root. Servers are the
stand-in, run in containers of the release's image by the launcher."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from tests.conftest import run_cli
from tests.images import base as images
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401
from tests.sshd.world import REPO, World, http_status, wait_for

pytestmark = pytest.mark.sshd


@pytest.fixture(scope="session")
def base_image(tmp_path_factory):
    why = images.available()
    if why:
        pytest.skip(why)
    d = tmp_path_factory.mktemp("base-image")
    yield images.base_reference(d)
    images.clean_store(d / "store")


class ImageWorld(World):
    """The deploy test world with ``sglang.image``: per-host stores ``ROOT/containers``, CPU-only
    hosts (``gpus: none``), the repository mounted read-only (the stand-in's code)."""

    def __init__(self, cluster, tmp, base: str, **kw):
        self.base = base
        self.image_extra = {}
        super().__init__(cluster, tmp, **kw)

    def write(self) -> None:
        super().write()
        prof = yaml.safe_load(self.profile.read_text())
        prof["sglang"]["image"] = {"base": self.base, "gpus": "none", "shm_size": "64m", "store": "{root}/containers",
                                   "runtime_args": images.RUNTIME_ARGS, "run_args": images.RUN_ARGS,
                                   "mounts": [str(REPO)], **self.image_extra}
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


@pytest.fixture
def world(live_cluster, tmp_path, base_image):
    w = ImageWorld(live_cluster, tmp_path, base_image, nhosts=3)
    yield w
    w.cleanup()


def deploy(w, *args):
    return run_cli("deploy", str(w.profile), "--accept-new-host-keys", "--no-preflight", *args, env=w.env(),
                   timeout=300)


def test_deploy_runs_each_server_in_its_release_image(world):
    w = world
    r = deploy(w)
    assert r.code == 0, r.err + r.out
    rid = w.current("h0")
    rec = json.loads((w.cache / "images" / "records" / f"{rid}.json").read_text())
    for h in ("h0", "h1", "h2"):
        assert (w.roots[h] / "images" / "ids" / rid).read_text().strip() == rec["image"]
    cs = {c["Names"][0]: c for h in ("h0", "h1", "h2") for c in w.containers(h)}
    assert sorted(cs) == sorted([f"dsv4ctl-prefill-n0-{rid}", f"dsv4ctl-decode-n0-{rid}", f"dsv4ctl-router-n0-{rid}"])
    assert {c["ImageID"] for c in cs.values()} == {rec["image"]}
    assert http_status(f"http://{w.hosts[2].address}:{w.ports['router']}/health") == 200


def test_switch_rollback_crash_and_tamper_with_images(world):
    """Two releases: the second ships only its own layers (the base's blobs are on the hosts),
    a rollback runs the first image again without building, a release whose container exits at
    start fails its gate and the previous image serves again, and an image edited in a host's
    store is found by verify."""
    w = world
    assert deploy(w).code == 0
    r1 = w.current("h0")
    rec1 = json.loads((w.cache / "images" / "records" / f"{r1}.json").read_text())
    w.extra["decode"] = {"max-running-requests": 64}
    w.write()
    r = deploy(w)
    assert r.code == 0, r.err
    r2 = w.current("h1")
    assert r2 != r1
    sent = [int(x.replace(",", "")) for x in __import__("re").findall(r"loaded, ([\d,]+) bytes sent", r.err)]
    assert sent and max(sent) < 200_000, r.err          # the 60 MB base is on the hosts already
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
    # verify finds an image edited in a host's store
    assert run_cli("verify", str(w.profile), env=w.env(), timeout=300).code == 0
    rel = f"opt/dsv4ctl/releases/{r1}/tree/python/sglang/srt/mem_cache.py"
    [f] = (w.roots["h1"] / "containers" / "storage" / "overlay").glob(f"*/diff/{rel}")   # the tree layer's file
    f.chmod(0o644)
    f.write_text("INDEX_K_BYTES = 999\n")
    f.chmod(0o444)
    r = run_cli("verify", str(w.profile), "--json", env=w.env(), timeout=300)
    assert r.code != 0
    assert f"h1: {r1} (current): image: hash tree/python/sglang/srt/mem_cache.py" in json.loads(r.out)["drift"]
