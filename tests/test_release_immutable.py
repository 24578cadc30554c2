"""Issue 13, immutable releases, end to end on real sshd hosts: release files are read-only; an
in-place edit of a hard-linked inode (shared by several releases) is caught before every switch —
a redeploy of the active release ("already active"), a rollback, a delta push whose base holds
the edited inode — and ``verify`` / ``status`` report it per host and file."""

from __future__ import annotations

import json
import stat

import pytest

from tests.conftest import run_cli
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401
from tests.sshd.world import World

pytestmark = pytest.mark.sshd

SHARED = "tree/python/sglang/srt/mod007.py"      # unchanged by the patch: one inode in both releases


@pytest.fixture
def world(live_cluster, tmp_path):
    w = World(live_cluster, tmp_path, keep=5)
    yield w
    w.stop_services()


def cli(w: World, *args, timeout=180):
    return run_cli(*args, str(w.profile), env=w.env(), timeout=timeout)


def deploy_ok(w: World, *extra) -> str:
    r = cli(w, "deploy", "--json", *extra)
    assert r.code == 0, r.err
    return r.json()["release"]


def edit_in_place(path, data: bytes = b"X") -> None:
    """What ``>`` / ``dd conv=notrunc`` / some editors do: same inode, same size, new content."""
    ino, size = path.stat().st_ino, path.stat().st_size
    with open(path, "r+b") as f:
        f.write(data)
    assert path.stat().st_ino == ino and path.stat().st_size == size


def test_in_place_edit_of_a_shared_inode_is_caught_before_every_switch(world):
    w = world
    r1 = deploy_ok(w)
    r2 = deploy_ok(w, "--patch", str(w.patch))
    root = w.roots["h1"]
    a, b = root / "releases" / r1 / SHARED, root / "releases" / r2 / SHARED
    assert a.stat().st_ino == b.stat().st_ino
    # read-only on the hosts and in the local cache (the owner's other bits kept)
    for h in w.roots:
        for f in (w.roots[h] / "current").rglob("*"):
            if f.is_file() and not f.is_symlink():
                assert f.stat().st_mode & 0o222 == 0, f
    for f in (w.cache / "releases" / r2).rglob("*"):
        if f.is_file() and not f.is_symlink():
            assert f.stat().st_mode & 0o222 == 0, f
    r = cli(w, "verify", "--json")
    assert r.code == 0, r.err
    assert r.json()["ok"] and set(r.json()["hosts"]["h0"]["releases"]) == {r1, r2}

    edit_in_place(a)                      # root ignores the read-only mode: the hash must catch it
    before = {h: (w.audit(h), w.currents()) for h in w.roots}

    # verify: per host, release and file; the shared inode shows in both releases
    r = cli(w, "verify", "--json")
    assert r.code == 1, r.err
    doc = r.json()
    assert doc["hosts"]["h1"]["releases"][r1]["problems"] == [f"hash {SHARED}"]
    assert doc["hosts"]["h1"]["releases"][r2]["problems"] == [f"hash {SHARED}"]
    assert all(v["ok"] for h in ("h0", "h2", "h3") for v in doc["hosts"][h]["releases"].values())
    assert sorted(doc["drift"]) == sorted([f"h1: {r1} (previous): hash {SHARED}", f"h1: {r2} (current): hash {SHARED}"])
    assert "2 release(s) differ from their manifest: h1: r" in r.err
    r = cli(w, "verify")
    assert r.code == 1 and f"drift: h1: {r2} (current): hash {SHARED}" in r.out

    # status shows it
    r = cli(w, "status", "--json")
    assert r.code == 1
    st = r.json()
    assert st["hosts"]["h1"]["drift"] == [f"hash {SHARED}"] and st["hosts"]["h1"]["verified"] is False
    assert st["hosts"]["h0"]["verified"] is True and st["hosts"]["h0"]["drift"] == []
    assert any("differs from its manifest" in u for u in st["unhealthy"])

    # "already active": a redeploy of r2 no longer keeps the drift silently
    r = cli(w, "deploy", "--patch", str(w.patch))
    assert r.code == 3, r.err
    assert f"release {r2} differs from its manifest" in r.err and f"hash {SHARED}" in r.err
    assert w.currents() == {h: r2 for h in w.roots}
    assert w.audit("h1")[-1]["result"] == "failed" and "verify" in w.audit("h1")[-1]["detail"]

    # rollback to the drifted r1: refused before any switch
    r = cli(w, "rollback", "--to", r1)
    assert r.code == 3, r.err
    assert f"release {r1} differs from its manifest" in r.err and w.currents() == {h: r2 for h in w.roots}
    assert w.audit("h1")[-1]["action"] == "rollback" and w.audit("h1")[-1]["result"] == "failed"

    # a delta push whose base (r2) holds the edited inode: its verification catches it, and h1 gets
    # the whole release again (rsync --checksum): the new release has a fresh, correct copy
    w.extra["prefill"] = {"chunked-prefill-size": 4096}
    w.write()
    r = cli(w, "deploy", "--patch", str(w.patch), "--no-preflight", "--json")
    assert r.code == 0, r.err
    r3 = r.json()["release"]
    assert "h1: release " + r3 + " failed manifest verification" in r.err and f"hash {SHARED}" in r.err
    assert "pushing the whole release again (rsync --checksum)" in r.err
    assert r.json()["hosts"]["h1"]["push"]["repaired"] is True and "repaired" not in r.json()["hosts"]["h0"]["push"]
    assert w.currents() == {h: r3 for h in w.roots}
    c = root / "releases" / r3 / SHARED
    assert c.stat().st_ino != a.stat().st_ino and c.read_bytes() == (w.roots["h0"] / "releases" / r3 / SHARED).read_bytes()
    for h in w.roots:
        w.assert_complete(h)
        assert not any(p.name.startswith(".incoming") for p in (w.roots[h] / "releases").iterdir())
        assert not (w.roots[h] / ".lock").exists()
    r = cli(w, "verify", "--json")
    assert r.code == 1 and sorted(r.json()["drift"]) == sorted([f"h1: {r1}: hash {SHARED}", f"h1: {r2} (previous): hash {SHARED}"])
    del before

    # a deleted and a modified file in r1 on h0 too: rollback names both
    (w.roots["h0"] / "releases" / r1 / "tree/python/sglang/srt/mod001.py").unlink()
    r = cli(w, "rollback", "--to", r1)
    assert r.code == 3 and "missing tree/python/sglang/srt/mod001.py" in r.err and f"hash {SHARED}" in r.err


def test_secret_serve_config_stays_private_in_cache_and_on_hosts(world):
    """A 0600 serve config holding api-key is 0400 in the local cache and on every host (never
    0644), and so is launch.json when an env value is secret."""
    w = world
    import yaml
    prof = yaml.safe_load(w.profile.read_text())
    prof["groups"][0].setdefault("env", {})["HF_TOKEN"] = "hf_secretvalue123"
    w.profile.write_text(yaml.safe_dump(prof, sort_keys=False))
    cfg = w.cfgdir / "decode.yaml"
    cfg.chmod(0o600)
    rid = deploy_ok(w, "--no-preflight")
    for base in [w.cache / "releases" / rid] + [w.roots[h] / "releases" / rid for h in w.roots]:
        assert stat.S_IMODE((base / "configs" / "decode.yaml").stat().st_mode) == 0o400, base
        assert stat.S_IMODE((base / "launch.json").stat().st_mode) == 0o400, base
        assert stat.S_IMODE((base / "configs" / "prefill.yaml").stat().st_mode) == 0o444, base
    assert json.loads((w.roots["h0"] / "current" / "launch.json").read_text())["prefill"]["env"]["HF_TOKEN"]
