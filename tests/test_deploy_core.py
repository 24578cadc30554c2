"""Pure cores of releases and deploys: ids, manifests, facts parsing, pruning, rollback choice,
launch rendering, rsync stats; plus the local build and the launcher on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from dsv4ctl.deploy.push import parse_rsync_stats
from dsv4ctl.deploy.release import launch_spec
from dsv4ctl.deploy.steps import switch_cmd
from dsv4ctl.hosts.layout import (HostFacts, Paths, choose_rollback_target, facts_command, parse_facts,
                                   render_launch, select_prune)
from dsv4ctl.hosts.service import GROUP_RUNNING_FN, Launcher, Systemd, backend, log_tail_cmd
from dsv4ctl.errors import InputError
from dsv4ctl.deploy.release import (MTIME_BASE, RELEASE_SCHEMA, build_release, content_mtime, input_key,
                                    manifest_diff, patch_paths, release_id, seal_problems, series_patches)
from dsv4ctl.remote import LocalTransport
from tests.sshd.world import gone_or_zombie, git, make_patch, make_tree


def test_input_key_is_deterministic_and_input_sensitive():
    a = input_key("c1", [("p1", "h1")], {"decode": "x", "prefill": "y"})
    assert a == input_key("c1", [("p1", "h1")], {"prefill": "y", "decode": "x"})  # config order irrelevant
    assert a.startswith("k") and len(a) == 25
    others = {input_key("c2", [("p1", "h1")], {"decode": "x", "prefill": "y"}),
              input_key("c1", [("p1", "h2")], {"decode": "x", "prefill": "y"}),
              input_key("c1", [], {"decode": "x", "prefill": "y"}),
              input_key("c1", [("p1", "h1")], {"decode": "z", "prefill": "y"}),
              input_key("c1", [("p1", "h1")], {"decode": "x", "prefill": "y"}, {"decode": {"port": 1}})}
    assert a not in others and len(others) == 5


META = {"schema": RELEASE_SCHEMA, "base_commit": "c1", "patches": [{"name": "p1", "sha256": "h1"}],
        "series_identity": None, "configs": {"decode": "x", "prefill": "y"}}


def test_release_id_covers_the_record_and_the_manifest():
    a = release_id(META, "m" * 64)
    assert a.startswith("r") and len(a) == 13 and all(c in "0123456789abcdef" for c in a[1:])
    assert a == release_id({**META, "configs": {"prefill": "y", "decode": "x"}, "built_by": "x"}, "m" * 64)
    others = {release_id(META, "n" * 64), release_id({**META, "base_commit": "c2"}, "m" * 64),
              release_id({**META, "patches": []}, "m" * 64),
              release_id({**META, "series_identity": "s"}, "m" * 64),
              release_id({**META, "configs": {"decode": "z", "prefill": "y"}}, "m" * 64)}
    assert a not in others and len(others) == 5


def test_seal_problems():
    rid = release_id(META, "m" * 64)
    assert seal_problems(rid, {**META, "id": rid}, "m" * 64) == []
    assert seal_problems(rid, {**META, "id": rid}, "n" * 64) == ["seal MANIFEST.json"]      # manifest edited
    assert seal_problems(rid, {**META, "id": rid, "configs": {"decode": "q"}}, "m" * 64) == ["seal MANIFEST.json"]
    assert seal_problems(rid, {**META, "id": "r000000000000"}, "m" * 64) == ["id RELEASE.json"]
    assert seal_problems(rid, None, "m" * 64) == ["id RELEASE.json"]
    assert seal_problems(rid, {**META, "id": rid, "schema": "dsv4ctl.release/1"}, "m" * 64) == ["unsealed RELEASE.json"]
    assert seal_problems(rid, {"id": rid, "schema": RELEASE_SCHEMA}, "m" * 64) == ["seal MANIFEST.json"]
    assert seal_problems(rid, {**META, "id": rid}, None) == ["seal MANIFEST.json"]


def test_content_mtime():
    assert content_mtime("00000000ff") == MTIME_BASE
    assert content_mtime("ffffffff") == MTIME_BASE + 0xFFFFFFFF % (1 << 30)
    assert content_mtime("abc12345" + "0" * 56) == content_mtime("abc12345" + "f" * 56)


def test_patch_paths():
    text = ("diff --git a/x/y.py b/x/y.py\n--- a/x/y.py\n+++ b/x/y.py\n@@ -1 +1 @@\n-a\n+b\n"
            "diff --git a/new.py b/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/new.py\n"
            "diff --git a/o.py b/n.py\nsimilarity index 100%\nrename from o.py\nrename to n.py\n")
    assert patch_paths(text) == {"x/y.py", "new.py", "o.py", "n.py"}


def test_series_patches(tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "b.patch").write_text("")
    (tmp_path / "s" / "a.patch").write_text("")
    assert [p.name for p in series_patches(tmp_path / "s")[0]] == ["a.patch", "b.patch"]
    (tmp_path / "s" / "series").write_text("base sglang==0.5.23\nc.patch\n")
    with pytest.raises(InputError, match=r"series:2: c.patch: no such file in"):
        series_patches(tmp_path / "s")
    with pytest.raises(InputError, match="patch file not found"):
        series_patches(None, [tmp_path / "nope.patch"])
    with pytest.raises(InputError, match="patch series folder not found"):
        series_patches(tmp_path / "nope")
    assert series_patches(None) == ([], None)


def test_manifest_diff():
    old = {"a": ["1", 1, False], "b": ["2", 1, False], "c": ["3", 1, False]}
    new = {"a": ["1", 1, False], "b": ["9", 1, False], "d": ["4", 1, False]}
    assert manifest_diff(old, new) == {"added": ["d"], "changed": ["b"], "removed": ["c"], "same": ["a"]}


def test_build_release_local(tmp_path):
    tree = make_tree(tmp_path / "t", files=5)
    patch = make_patch(tree, tmp_path / "0001.patch")
    cache = tmp_path / "cache"
    cfg = {"decode": b"port: 1\n"}
    r0 = build_release(tree, "v0.5.23", [], cfg, {"decode": {"cmd": "x"}}, cache=cache, who="me")
    r1 = build_release(tree, "v0.5.23", [patch], cfg, {"decode": {"cmd": "x"}}, cache=cache, who="me")
    assert r0.id != r1.id
    assert (r1.path / "tree/python/sglang/srt/mem_cache.py").read_text() == "INDEX_K_BYTES = 256\n"
    assert (r0.path / "tree/python/sglang/srt/mem_cache.py").read_text() == "INDEX_K_BYTES = 132\n"
    # the patched file got its own inode (the base export is untouched); the others are shared
    st0 = (r0.path / "tree/python/sglang/srt/mod001.py").stat()
    st1 = (r1.path / "tree/python/sglang/srt/mod001.py").stat()
    assert st0.st_ino == st1.st_ino
    assert (r0.path / "tree/python/sglang/srt/mem_cache.py").stat().st_ino != \
           (r1.path / "tree/python/sglang/srt/mem_cache.py").stat().st_ino
    d = manifest_diff(r0.files, r1.files)
    assert d["changed"] == ["tree/python/sglang/srt/mem_cache.py"] and not d["added"] and not d["removed"]
    assert r1.links == {"tree/python/sglang/srt/alias.py": "mod000.py"}
    assert r1.meta["patches"][0]["name"] == "0001.patch" and r1.meta["base_ref"] == "v0.5.23"
    assert r1.meta["base_commit"] == git(tree, "rev-parse", "HEAD").strip()
    assert (r1.path / "configs/decode.yaml").read_bytes() == b"port: 1\n"
    m = (r1.path / "tree/python/sglang/srt/mem_cache.py").stat().st_mtime
    assert int(m) == content_mtime(r1.files["tree/python/sglang/srt/mem_cache.py"][0])
    # same inputs: same id, cached
    assert build_release(tree, "v0.5.23", [patch], cfg, {"decode": {"cmd": "x"}}, cache=cache).path == r1.path
    bad = tmp_path / "bad.patch"
    bad.write_text(patch.read_text().replace("INDEX_K_BYTES = 132", "NOPE = 0"))
    with pytest.raises(InputError, match=r"bad.patch: patch does not apply to v0.5.23"):
        build_release(tree, "v0.5.23", [bad], cfg, {}, cache=cache)
    assert not [p for p in cache.iterdir() if p.name.startswith(".build")]
    with pytest.raises(InputError, match="base ref 'v9' is not a commit"):
        build_release(tree, "v9", [], cfg, {}, cache=cache)
    with pytest.raises(InputError, match="not a git checkout"):
        build_release(tmp_path, "HEAD", [], cfg, {}, cache=cache)


def _facts_text(current="r1", previous="r0", state=None, lock=None, releases=("r0", "r1")):
    out = ["@current", f"releases/{current}" if current else "", "@previous", f"releases/{previous}" if previous else "",
           "@state", json.dumps(state or {"releases": {}}), "@lock"]
    if lock:
        out.append(json.dumps(lock))
    out += ["@rsync", "yes", "@systemd", "", "@launch", json.dumps({"decode": {"port": 1}}), "@incoming", ".incoming-r9"]
    for r in releases:
        out += ["@release", json.dumps({"id": r, "built_at": "2026-01-01T00:00:0%sZ" % r[-1]}, indent=2)]
    out.append("@end")
    return "\n".join(out) + "\n"


def test_parse_facts():
    f = parse_facts("h", "/r", _facts_text(lock={"who": "a@b", "what": "deploy r1", "pid": 3, "since": "t"}))
    assert (f.current, f.previous, f.rsync, f.systemd) == ("r1", "r0", True, False)
    assert set(f.releases) == {"r0", "r1"} and f.incoming == ["r9"]
    assert f.lock["who"] == "a@b" and f.current_launch == {"decode": {"port": 1}}
    assert f.release_state("r1") == "active" and f.release_state("r0") == "previous"
    empty = parse_facts("h", "/r", "@current\n@previous\n@state\n@lock\n@rsync\n@systemd\n@launch\n@incoming\n@end\n")
    assert (empty.current, empty.lock, empty.releases, empty.rsync) == (None, None, {}, False)


def test_facts_command_runs_locally(tmp_path):
    root = tmp_path / "root"
    (root / "releases" / "rA").mkdir(parents=True)
    (root / "releases" / "rA" / "RELEASE.json").write_text(json.dumps({"id": "rA"}))
    (root / "releases" / "rA" / "MANIFEST.json").write_text("{}")
    (root / "releases" / "rB").mkdir()
    (root / "releases" / "rB" / "RELEASE.json").write_text(json.dumps({"id": "rB"}))  # no manifest: incomplete
    (root / "releases" / ".incoming-rC").mkdir()
    os.symlink("releases/rA", root / "current")
    f = parse_facts("l", str(root), LocalTransport("l").run(facts_command(str(root))).out)
    assert f.current == "rA" and f.previous is None and list(f.releases) == ["rA"] and f.incoming == ["rC"]


def _hf(ids, current=None, previous=None, states=None, when=None):
    f = HostFacts("h", "/r", releases={i: {"id": i} for i in ids}, current=current, previous=previous)
    f.state = {"releases": {i: {"state": (states or {}).get(i, "good"), "activated_at": (when or {}).get(i, f"2026-01-0{n + 1}")}
                            for n, i in enumerate(ids)}}
    return f


def test_select_prune():
    f = _hf(["r1", "r2", "r3", "r4", "r5"], current="r5", previous="r1")
    assert select_prune(f, 3) == ["r2", "r3"]   # keeps current, previous (old but protected) and r4
    assert select_prune(f, 10) == []
    assert select_prune(f, 1) == ["r2", "r3"]  # never current, previous or the newest good one (r4)


def test_select_prune_keeps_the_newest_good_release_and_drops_failed_ones_first():
    # the field case: keep_releases 5, one promoted release and three failed ones after it
    ids = ["r1", "r2", "r3", "r4", "r5", "r6", "r7"]
    states = {"r1": "pushed", "r2": "pushed", "r3": "good", "r4": "failed", "r5": "failed", "r6": "failed",
              "r7": "active"}
    f = _hf(ids, current="r7", previous="r6", states=states)
    assert select_prune(f, 5) == ["r4", "r5"]        # r3 (good) stays; the failed go before the pushed
    assert select_prune(f, 3) == ["r1", "r2", "r4", "r5"]
    assert select_prune(f, 1) == ["r1", "r2", "r4", "r5"]  # current, previous and the good one are kept
    f = _hf(ids, current="r3", previous="r2", states={**states, "r7": "failed"})
    assert select_prune(f, 2) == ["r1", "r4", "r5", "r6", "r7"]   # current r3 is the only good one


def test_choose_rollback_target():
    a = _hf(["r1", "r2", "r3"], current="r3", previous="r2", states={"r2": "failed"})
    b = _hf(["r1", "r2", "r3"], current="r3", previous="r2")
    assert choose_rollback_target({"a": a, "b": b})[0] == "r1"   # r2 failed on a
    b2 = _hf(["r2", "r3"], current="r3")
    a2 = _hf(["r1", "r2", "r3"], current="r3")
    assert choose_rollback_target({"a": a2, "b": b2})[0] == "r2"  # r1 not on b
    with pytest.raises(InputError, match="release r1 is not present on b"):
        choose_rollback_target({"a": a2, "b": b2}, "r1")
    assert choose_rollback_target({"a": a2, "b": b2}, "r3") == ("r3", "given with --to")
    with pytest.raises(InputError, match="no release built before the active r3 passed its health gate on every host"):
        choose_rollback_target({"a": _hf(["r3"], current="r3")})


def test_bare_rollback_takes_the_newest_earlier_release_that_passed_its_gate():
    """Ordinary deploys count (recorded ``active``: the health gate passed); a release only pushed,
    marked failed (forced in or not) or built after the active one does not."""
    when = {"r1": "2026-01-01", "r2": "2026-01-02", "r3": "2026-01-03", "r4": "2026-01-04", "r5": "2026-01-05"}
    f = _hf(["r1", "r2", "r3", "r4", "r5"], current="r3", previous="r4", when=when,
            states={"r1": "active", "r2": "pushed", "r3": "active", "r4": "active"})
    target, why = choose_rollback_target({"h": f})
    assert target == "r1"         # r2 never ran; r4 and r5 were built after the active r3
    assert why == ("the newest release built before the active r3 that passed its health gate on every host and is "
                   "not marked failed (recorded active)")
    f.state["releases"]["r2"]["state"] = "good"
    assert choose_rollback_target({"h": f})[0] == "r2"
    f.state["releases"]["r2"].update(state="active", failed_at="2026-01-06")     # forced in after failing
    assert choose_rollback_target({"h": f})[0] == "r1"
    # built_at (RELEASE.json) decides "earlier", not when a release was last activated
    f.releases = {r: {"id": r, "built_at": f"2025-12-0{i}"} for i, r in enumerate(["r1", "r2", "r3", "r4", "r5"], 1)}
    f.state["releases"]["r1"]["activated_at"] = "2026-02-01"
    assert choose_rollback_target({"h": f})[0] == "r1"


def test_no_rollback_target_hint_is_a_complete_command():
    f = _hf(["r1", "r2"], current="r2", previous="r1", states={"r1": "failed"})
    f.state["releases"]["r1"]["failed_at"] = "2026-01-03"
    with pytest.raises(InputError) as e:
        choose_rollback_target({"h": f}, command="dsv4ctl rollback profiles/my.yaml")
    assert str(e.value) == ("no release built before the active r2 passed its health gate on every host without being "
                            "marked failed (see dsv4ctl releases); the previous release is r1 (marked failed): "
                            "dsv4ctl rollback profiles/my.yaml --to r1 --force-failed")


def test_render_launch():
    v = {"python": "/usr/bin/python3", "config": "/r/a b.yaml", "port": 30000, "router_args": "--decode 'http://x:1'"}
    assert render_launch("{python} -m sglang.launch_server --config {config} --port {port}", v) == \
        "/usr/bin/python3 -m sglang.launch_server --config '/r/a b.yaml' --port 30000"
    assert render_launch("r {router_args}", v) == "r --decode 'http://x:1'"
    with pytest.raises(InputError, match="unknown placeholder 'nope'"):
        render_launch("{nope}", v)


def test_parse_rsync_stats():
    text = ("Number of files: 10,500 (reg: 10,000, dir: 500)\nNumber of regular files transferred: 1\n"
            "Total file size: 232,000,000 bytes\nTotal bytes sent: 123,456\nTotal bytes received: 2,048\n")
    assert parse_rsync_stats(text) == {"bytes_sent": 123456, "bytes_received": 2048, "files_transferred": 1,
                                       "total_size": 232000000}


def test_launch_spec_defaults_from_the_shipped_profile():
    from dsv4ctl.profile.model import load_profile
    from dsv4ctl.resources import default_profile_path
    spec = launch_spec(load_profile(default_profile_path()))
    assert spec["prefill"]["port"] == 30000 and spec["decode"]["port"] == 30001 and spec["router"]["port"] == 8000
    assert spec["prefill"]["cmd"].startswith("env PYTHONPATH={tree}/python {python} -m sglang.launch_server --config {config}")
    assert spec["router"]["router_args"] == ["--pd-disaggregation", "--prefill", "http://127.0.0.1:30000", "8998",
                                             "--decode", "http://127.0.0.1:30001",
                                             "--prometheus-host", "0.0.0.0", "--prometheus-port", "29000"]
    assert spec["decode"]["model"] == "deepseek-v4-flash" and spec["router"]["model"] == "deepseek-v4-flash"


def test_switch_cmd_is_atomic_rename(tmp_path):
    t = LocalTransport("l")
    p = Paths(str(tmp_path))
    for r in ("r1", "r2"):
        (tmp_path / "releases" / r).mkdir(parents=True)
    t.run(switch_cmd(p, "r1", None))
    assert os.readlink(tmp_path / "current") == "releases/r1" and not (tmp_path / "previous").exists()
    t.run(switch_cmd(p, "r2", "r1"))
    assert os.readlink(tmp_path / "current") == "releases/r2" and os.readlink(tmp_path / "previous") == "releases/r1"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["current", "previous", "releases"]  # no temp links left
    t.run(switch_cmd(p, None, None))
    assert not (tmp_path / "current").is_symlink()


def test_launcher_start_stop_and_log_tail(tmp_path):
    t = LocalTransport("l")
    p = Paths(str(tmp_path))
    (tmp_path / "releases" / "r1").mkdir(parents=True)
    L = Launcher(stop_timeout=2)
    t.run(L.start_cmd(p, "g", "r1", "echo started $FOO; pwd; sleep 30", {"FOO": "bar"}))
    pid = int((tmp_path / "run" / "g.pid").read_text())
    assert t.run(L.alive_cmd(p, "g"), check=False).code == 0
    time.sleep(0.3)
    tail = t.run(log_tail_cmd(p, "g", 5)).out.splitlines()
    assert tail[0].startswith("=== dsv4ctl start g release r1 at ") and tail[1:] == ["started bar", str(tmp_path / "releases" / "r1")]
    t.run(L.stop_cmd(p, "g"))
    assert not (tmp_path / "run" / "g.pid").exists()
    assert gone_or_zombie(pid)
    assert t.run(L.alive_cmd(p, "g"), check=False).code != 0
    # a second start appends; the tail only shows the last start
    t.run(L.start_cmd(p, "g", "r1", "echo second; exit 3", {}))
    time.sleep(0.3)
    assert t.run(log_tail_cmd(p, "g", 5)).out.splitlines()[1:] == ["second", "=== dsv4ctl: g exited with status 3"]
    assert t.run(L.alive_cmd(p, "g"), check=False).code != 0


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_group_running_ignores_zombies(shell):
    """A process group whose only member is a zombie (exited, not yet reaped: what PID 1 in a
    container leaves behind) is not running; a live member is; no group at all is not."""
    check = lambda pgid: subprocess.run([shell, "-c", GROUP_RUNNING_FN + f" group_running {pgid}"]).returncode  # noqa: E731
    live = subprocess.Popen(["sleep", "30"], process_group=0)
    dead = subprocess.Popen(["true"], process_group=0)
    try:
        for _ in range(100):            # wait until `true` has exited (a zombie: nobody reaped it yet)
            if gone_or_zombie(dead.pid):
                break
            time.sleep(0.02)
        os.kill(dead.pid, 0)            # still exists as a zombie ...
        assert check(dead.pid) == 1     # ... but does not count as running
        assert check(live.pid) == 0
    finally:
        live.kill()
        live.wait()
        dead.wait()
    assert check(dead.pid) == 1 and check(live.pid) == 1


def test_launcher_stop_does_not_wait_for_zombies(tmp_path):
    """The stand-in's wrapper shell and its server die together on SIGTERM; the server's zombie
    waits for PID 1 to reap it. Stop returns without waiting out stop_timeout."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_CHILD_SUBREAPER = 36
    # this test process adopts the orphans and does not reap them: a container's PID 1 that never does
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    members: list[int] = []
    try:
        t = LocalTransport("l")
        p = Paths(str(tmp_path))
        (tmp_path / "releases" / "r1").mkdir(parents=True)
        L = Launcher(stop_timeout=20)
        t.run(L.start_cmd(p, "g", "r1", "sleep 60 & sleep 60", {}))
        pid = int((tmp_path / "run" / "g.pid").read_text())
        time.sleep(0.2)
        members = [int(d) for d in os.listdir("/proc") if d.isdigit() and _pgid(int(d)) == pid]
        assert len(members) >= 3             # the wrapper shell, its subshell and the two sleeps
        t0 = time.monotonic()
        t.run(L.stop_cmd(p, "g"))
        assert time.monotonic() - t0 < 10    # counting zombies would wait the full 20 s, then KILL
        assert not (tmp_path / "run" / "g.pid").exists()
        assert all(gone_or_zombie(m) for m in members)
        assert any(gone_or_zombie(m) and os.path.exists(f"/proc/{m}") for m in members)  # zombies were there
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        for m in members:
            try:
                os.waitpid(m, os.WNOHANG)
            except ChildProcessError:
                pass


def _pgid(pid: int) -> int | None:
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(") ", 1)[1].split()[2])
    except (OSError, IndexError):
        return None


def test_systemd_unit_and_backend_choice():
    u = Systemd().unit_text(Paths("/srv/d"), "decode", "r1", "python3 -m x --config /srv/d/c.yaml", {"A": "1"})
    assert "WorkingDirectory=/srv/d/releases/r1" in u
    assert ('ExecStart=/bin/sh -c "(\\npython3 -m x --config /srv/d/c.yaml\\n)\\nrc=$$?; '
            'echo \\"=== dsv4ctl: decode exited with status $$rc\\"; exit $$rc"') in u
    assert "StandardOutput=append:/srv/d/logs/decode.log" in u and 'Environment="A=1"' in u
    assert backend("auto", True).name == "systemd" and backend("auto", False).name == "launcher"
    assert backend("launcher", True).name == "launcher" and backend("systemd", False).name == "systemd"


def test_series_folder_identity_goes_into_the_release(tmp_path):
    """A series folder with a ``series`` file (dsv4ctl.patches format) gives the patch order and
    the series identity; changing only a fact of the series changes the release id."""
    import yaml
    from dsv4ctl.deploy.release import release_inputs
    from dsv4ctl.profile.model import load_profile
    tree = make_tree(tmp_path / "t", files=3)
    sdir = tmp_path / "series" / "sglang-0.5.23"
    sdir.mkdir(parents=True)
    make_patch(tree, sdir / "0001-index-k.patch")
    (sdir / "series").write_text("base sglang==0.5.23\n0001-index-k.patch  index_k_dtype=bf16  # why\n")
    (tmp_path / "decode.yaml").write_text("port: 30001\n")
    prof = {"name": "p", "model": "deepseek-v4-flash",
            "sglang": {"tree": str(tree), "base_ref": "v0.5.23", "series": str(sdir)},
            "hosts": [{"name": "l", "address": "127.0.0.1", "local": True, "root": str(tmp_path / "root"),
                       "gpus": {"count": 1, "memory_mib": 1000}}],
            "groups": [{"name": "decode", "role": "decode", "host": "l", "gpus": [0], "serve_config": "decode.yaml"}]}
    pf = tmp_path / "p.yaml"
    pf.write_text(yaml.safe_dump(prof))
    tree_p, base, pl, configs, spec, ident = release_inputs(load_profile(pf), None, None, None)
    assert [p.name for p in pl] == ["0001-index-k.patch"] and ident.startswith("sha256:")
    assert configs == {"decode": b"port: 30001\n"} and spec["decode"]["port"] == 30001
    r = build_release(tree_p, base, pl, configs, spec, cache=tmp_path / "c", series_identity=ident)
    assert r.meta["series_identity"] == ident
    assert (r.path / "tree/python/sglang/srt/mem_cache.py").read_text() == "INDEX_K_BYTES = 256\n"
    (sdir / "series").write_text("base sglang==0.5.23\n0001-index-k.patch  index_k_dtype=fp8\n")
    ident2 = release_inputs(load_profile(pf), None, None, None)[5]
    assert ident2 != ident
    assert build_release(tree_p, base, pl, configs, spec, cache=tmp_path / "c", series_identity=ident2).id != r.id
    (sdir / "series").write_text("base sglang==0.5.23\n0009-missing.patch\n")
    with pytest.raises(InputError, match="0009-missing.patch: no such file"):
        release_inputs(load_profile(pf), None, None, None)


def test_push_progress_off_a_terminal_is_a_plain_periodic_line(capsys, monkeypatch):
    """Not a terminal: a push that lasts longer than the progress interval prints where it is,
    then its end; a quick push prints nothing (a CI log of a 4-host deploy stays short)."""
    import time as _t
    from dsv4ctl.commands.deploy import _Progress
    monkeypatch.setenv("DSV4CTL_PROGRESS_S", "0.05")
    with _Progress() as prog:
        assert prog.p is None                      # pytest's stderr is no terminal
        prog("h0", 10, 100)
        prog("h1", 3, 100)
        prog("h1", 100, 100)                       # quick: no line
        _t.sleep(0.06)
        prog("h0", 42, 100)
        prog("h0", 43, 100)                        # within the interval: no line
        prog("h0", 100, 100)
        prog("h0", 100, 100)                       # the end once
    lines = capsys.readouterr().err.splitlines()
    assert [ln.rsplit(",", 1)[0] for ln in lines] == ["dsv4ctl: push h0: 42 %", "dsv4ctl: push h0: 100 %"]
    assert all(ln.endswith(" s") for ln in lines)


def test_alive_cmd_counts_a_vanished_proc_entry_as_not_running(tmp_path):
    """The race that made a converging deploy say "nothing to do" over a killed server: ``kill -0``
    finds the zombie, then PID 1 reaps it before its ``/proc/PID/stat`` is read. The state read
    comes back empty (simulated by a ``sed`` on PATH that prints nothing): not running. A live
    process with a readable state still is."""
    p = Paths(str(tmp_path))
    (tmp_path / "run").mkdir()
    live = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "run" / "g.pid").write_text(f"{live.pid}\n")
        t = LocalTransport("l")
        assert t.run(Launcher().alive_cmd(p, "g"), check=False).code == 0
        shadow = tmp_path / "bin"
        shadow.mkdir()
        (shadow / "sed").write_text("#!/bin/sh\nexit 1\n")
        (shadow / "sed").chmod(0o755)
        r = subprocess.run(["sh", "-c", Launcher().alive_cmd(p, "g")],
                           env={**os.environ, "PATH": f"{shadow}:{os.environ['PATH']}"})
        assert r.returncode != 0
    finally:
        live.kill()
        live.wait()
