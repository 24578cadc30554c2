"""Issue 32 item 7: a release id binds its content. The id covers MANIFEST.json, so a file edited
inside a release *together with* its manifest entry is caught by every verify (host and local
cache) and before any switch; a file missing from the running release, a mode change and a
``current`` that points outside ``releases/`` are drift that the next deploy repairs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat

import pytest

from dsv4ctl.deploy.release import build_release, check_release, load_release, release_id
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401
from tests.sshd.world import make_patch, make_tree
from tests.test_release_immutable import cli, world  # noqa: F401  (the same four-host world)

MOD = "tree/python/sglang/srt/mod003.py"


def forge(rel_dir, path: str, data: bytes, *, manifest: bool = True) -> None:
    """Replace ``path`` inside the release folder by a new file holding ``data`` (a new inode, so
    no other release changes) and, with ``manifest``, update MANIFEST.json to match: what a
    careful hand edit does to make ``verify`` pass."""
    f = rel_dir / path
    mode = stat.S_IMODE(f.stat().st_mode)
    f.unlink()
    f.write_bytes(data)
    os.chmod(f, mode)
    if manifest:
        m = rel_dir / "MANIFEST.json"
        man = json.loads(m.read_text())
        man["files"][path] = [hashlib.sha256(data).hexdigest(), len(data), man["files"][path][2]]
        mm = stat.S_IMODE(m.stat().st_mode)
        m.unlink()
        m.write_text(json.dumps(man, sort_keys=True))
        os.chmod(m, mm)


# -- the local cache ---------------------------------------------------------------------------

@pytest.fixture
def built(tmp_path):
    tree = make_tree(tmp_path / "t", files=5)
    patch = make_patch(tree, tmp_path / "0001.patch")
    cache = tmp_path / "cache"
    args = (tree, "v0.5.23", [patch], {"decode": b"enable-hierarchical-cache: false\n"}, {"decode": {"cmd": "x"}})
    return args, cache, build_release(*args, cache=cache, who="me")


def test_the_id_is_the_record_and_the_manifest(built):
    args, cache, rel = built
    meta = json.loads((rel.path / "RELEASE.json").read_text())
    assert meta["schema"] == "dsv4ctl.release/2" and meta["id"] == rel.id == rel.path.name
    assert release_id(meta, hashlib.sha256((rel.path / "MANIFEST.json").read_bytes()).hexdigest()) == rel.id
    assert check_release(rel.path) == []
    # deterministic: a second build of the same inputs in another cache gives the same id
    assert build_release(*args, cache=cache.parent / "other").id == rel.id


@pytest.mark.parametrize("how, problems", [
    ("config+manifest", ["seal MANIFEST.json"]),
    ("config only", ["hash configs/decode.yaml"]),
    ("setuid", ["mode " + MOD]),
    ("writable", ["mode " + MOD]),
    ("exec bit", ["mode " + MOD]),
    ("missing", ["missing " + MOD]),
    ("extra", ["extra tree/evil.py"]),
    ("record", ["seal MANIFEST.json"]),
])
def test_a_tampered_cached_release_is_never_shipped(built, how, problems, capsys):
    args, cache, rel = built
    good = (rel.path / "configs/decode.yaml").read_bytes()
    if how == "config+manifest":
        forge(rel.path, "configs/decode.yaml", b"enable-hierarchical-cache: true\n")
    elif how == "config only":
        forge(rel.path, "configs/decode.yaml", b"enable-hierarchical-cache: true \n", manifest=False)
    elif how == "setuid":
        os.chmod(rel.path / MOD, 0o4555)
    elif how == "writable":
        os.chmod(rel.path / MOD, 0o666)
    elif how == "exec bit":
        os.chmod(rel.path / MOD, 0o555)
    elif how == "missing":
        (rel.path / MOD).unlink()
    elif how == "extra":
        (rel.path / "tree/evil.py").write_text("import os\n")
    elif how == "record":                     # RELEASE.json says another base commit, same id
        f = rel.path / "RELEASE.json"
        meta = json.loads(f.read_text())
        meta["base_commit"] = "0" * 40
        f.chmod(0o644)
        f.write_text(json.dumps(meta))
    assert check_release(rel.path) == problems
    again = build_release(*args, cache=cache)
    err = capsys.readouterr().err
    assert f"release {rel.id} in the local cache differs from its manifest or id ({problems[0]}" in err
    assert "not shipped" in err and err.count("\n") == 1
    aside = [p for p in cache.iterdir() if p.name.startswith(f".tampered-{rel.id}-")]
    assert len(aside) == 1
    # rebuilt from its inputs: the same id, the original content, and it checks clean
    assert again.id == rel.id and check_release(again.path) == []
    assert (again.path / "configs/decode.yaml").read_bytes() == good
    assert load_release(again.path).files == rel.files


# -- hosts -------------------------------------------------------------------------------------

@pytest.mark.sshd
def test_tampered_releases_on_hosts_are_drift_and_the_next_deploy_repairs(world):
    w = world
    r = cli(w, "deploy", "--json")
    assert r.code == 0, r.err
    r1 = r.json()["release"]
    r = cli(w, "deploy", "--patch", str(w.patch), "--json")
    assert r.code == 0, r.err
    r2 = r.json()["release"]

    # h1 (decode): r1's serve config turned HiCache on, its manifest updated to match
    rel1 = w.roots["h1"] / "releases" / r1
    cfg = (rel1 / "configs/decode.yaml").read_bytes()
    forge(rel1, "configs/decode.yaml", cfg + b"enable-hierarchical-cache: true\n")
    # h2: a set-uid bit on a file r1 and r2 share; h3: a file deleted from the running r2
    os.chmod(w.roots["h2"] / "releases" / r2 / MOD, 0o4555)
    (w.roots["h3"] / "releases" / r2 / MOD).unlink()
    # h0: current points at a copy of r2 outside releases/
    foreign = w.tmp / "elsewhere" / r2
    shutil.copytree(w.roots["h0"] / "releases" / r2, foreign, symlinks=True)
    (w.roots["h0"] / "current").unlink()
    os.symlink(str(foreign), w.roots["h0"] / "current")

    r = cli(w, "verify", "--json")
    assert r.code == 1, r.err
    doc = r.json()
    assert doc["hosts"]["h1"]["releases"][r1]["problems"] == ["seal MANIFEST.json"]
    assert doc["hosts"]["h1"]["releases"][r2]["problems"] == []
    assert doc["hosts"]["h2"]["releases"][r1]["problems"] == ["mode " + MOD]
    assert doc["hosts"]["h2"]["releases"][r2]["problems"] == ["mode " + MOD]
    assert doc["hosts"]["h3"]["releases"][r2]["problems"] == ["missing " + MOD]
    assert doc["hosts"]["h0"]["current"] is None and doc["hosts"]["h0"]["foreign"] == {"current": str(foreign)}
    assert f"h0: {w.roots['h0']}/current -> {foreign}: outside {w.roots['h0']}/releases " \
           "(the next deploy or rollback replaces it)" in doc["drift"]

    r = cli(w, "status", "--json")
    assert r.code == 1
    st = r.json()
    assert st["hosts"]["h0"]["drift"] == [f"current -> {foreign}: outside {w.roots['h0']}/releases"]
    assert st["hosts"]["h3"]["drift"] == ["missing " + MOD]
    assert any("points outside its releases" in u for u in st["unhealthy"])

    # a rollback to the forged r1 is refused before any host is switched
    before = w.currents()
    r = cli(w, "rollback", "--to", r1)
    assert r.code == 3, r.err
    assert f"release {r1} differs from its manifest" in r.err and "seal MANIFEST.json" in r.err
    assert w.currents() == before

    # the next deploy gets every host onto a clean, complete release: h3's push (staged from r2,
    # which lacks a file) and h2's (a set-uid inode) are repaired; h0's foreign current replaced
    w.extra["prefill"] = {"chunked-prefill-size": 4096}
    w.write()
    r = cli(w, "deploy", "--patch", str(w.patch), "--no-preflight", "--json")
    assert r.code == 0, r.err
    r3 = r.json()["release"]
    assert w.currents() == {h: r3 for h in w.roots}
    hosts = r.json()["hosts"]
    assert hosts["h3"]["push"]["repaired"] is True and hosts["h2"]["push"]["repaired"] is True
    for h in w.roots:
        w.assert_complete(h)
    assert not (w.roots["h2"] / "releases" / r3 / MOD).stat().st_mode & 0o7000
    r = cli(w, "verify", "--json")
    assert r.code == 1
    doc = r.json()
    assert all(doc["hosts"][h]["releases"][r3]["ok"] for h in w.roots)
    assert doc["hosts"]["h0"]["foreign"] == {} and doc["hosts"]["h0"]["current"] == r3
    assert sorted(d.split(": ", 1)[0] for d in doc["drift"]) == ["h1", "h2", "h2", "h3"]


def test_an_index_entry_naming_another_release_is_not_followed(built, tmp_path, capsys):
    """The cache index (``.inputs/<key>``) is a hint: a release it names is used only when the
    release's own record and launch.json give that key (it was the older release, deployed silently)."""
    from dsv4ctl.deploy.release import input_key, release_key
    args, cache, rel = built
    other = build_release(args[0], "v0.5.23", [], args[3], args[4], cache=cache)      # the unpatched one
    assert other.id != rel.id and release_key(other) != release_key(rel)
    key = release_key(rel)
    assert key == input_key(rel.meta["base_commit"], [(p["name"], p["sha256"]) for p in rel.meta["patches"]],
                            rel.meta["configs"], args[4], None)
    (cache / ".inputs" / key).write_text(other.id + "\n")       # the index points at the wrong release
    capsys.readouterr()
    again = build_release(*args, cache=cache)
    assert again.id == rel.id
    assert "names release " + other.id + " for inputs it was not built from" in capsys.readouterr().err
    assert (cache / ".inputs" / key).read_text().strip() == rel.id


def test_a_release_cache_others_can_write_is_refused(built):
    from dsv4ctl.errors import InputError
    args, cache, rel = built
    os.chmod(cache, 0o777)
    with pytest.raises(InputError, match=r"release cache folder .*/cache is not yours alone "
                                         r"\(owner uid \d+, mode 777\)"):
        build_release(*args, cache=cache)
    os.chmod(cache, 0o755)
    os.chmod(cache.parent, 0o770)
    with pytest.raises(InputError, match="is not yours alone"):
        build_release(*args, cache=cache)
    os.chmod(cache.parent, 0o700)
    assert build_release(*args, cache=cache).id == rel.id


@pytest.mark.sshd
def test_a_running_release_without_its_manifest_is_drift_and_redeployed(world):
    """Review of issue 32: with MANIFEST.json deleted from the running release, any edit there was
    invisible (verify exit 0, the release no longer listed) and a deploy said "nothing to do"."""
    w = world
    r = cli(w, "deploy", "--json")
    assert r.code == 0, r.err
    rid = r.json()["release"]
    rel = w.roots["h1"] / "releases" / rid
    (rel / "MANIFEST.json").unlink()
    cfg = rel / "configs/decode.yaml"
    data = cfg.read_bytes()
    cfg.unlink()
    cfg.write_bytes(data + b"enable-hierarchical-cache: true\n")
    os.chmod(w.roots["h2"] / "releases" / rid / "configs", 0o777)        # a folder anyone can write
    r = cli(w, "verify", "--json")
    assert r.code == 1
    doc = r.json()
    assert doc["hosts"]["h1"]["releases"][rid]["problems"] == ["missing MANIFEST.json or RELEASE.json"]
    assert f"h1: {rid} (current): missing MANIFEST.json or RELEASE.json" in doc["drift"][0] or \
        any(d.startswith(f"h1: {rid} (current): missing MANIFEST.json") for d in doc["drift"])
    assert doc["hosts"]["h2"]["releases"][rid]["problems"] == ["mode configs/"]
    r = cli(w, "deploy", "--json")            # the same profile: not "nothing to do" on h1
    assert r.code in (0, 3), r.err
    assert "nothing to do" not in r.err
    if r.code == 0:
        assert (w.roots["h1"] / "releases" / rid / "MANIFEST.json").is_file()
        assert b"enable-hierarchical-cache" not in (w.roots["h1"] / "current/configs/decode.yaml").read_bytes()
