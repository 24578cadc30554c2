"""``hicache on|off --remote`` is a release (issue 13, one write path): real sshd hosts, the
stand-in SGLang servers under the launcher, deployed by ``dsv4ctl deploy``. The change builds a
release from the running one with the edited serve config, pushes only that, switches under the
deploy lock, restarts only the changed group, runs the deploy's gate; a failed gate rolls back
like a deploy; ``rollback`` undoes it; no file of any release is ever written."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401
from tests.sshd.world import World

pytestmark = pytest.mark.sshd


@pytest.fixture
def world(live_cluster, tmp_path):
    w = World(live_cluster, tmp_path, keep=5)
    # HiCache on prefill needs an explicit ratio and host RAM to hold it (lint)
    import yaml
    prof = yaml.safe_load(w.profile.read_text())
    for h in prof["hosts"]:
        h["ram_gib"] = 2048
    w.profile.write_text(yaml.safe_dump(prof, sort_keys=False))
    yield w
    w.stop_services()


def cli(w: World, *args, timeout=300):
    return run_cli(*args, str(w.profile), env=w.env(), timeout=timeout)


def info(w: World, group: str) -> dict:
    """What the group's running server was started with: the serve config on its command line
    (the sshd stand-in has no /server_info), parsed."""
    import yaml
    host = {"prefill": "h0", "decode": "h1"}[group]
    found = []
    for d in Path("/proc").iterdir():
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"tests.sshd.standin_sglang" in argv and b"--config" in argv:
            cfg = argv[argv.index(b"--config") + 1].decode()
            if cfg.startswith(str(w.roots[host])) and cfg.endswith(f"/{group}.yaml"):
                found.append(cfg)
    assert len(found) == 1, found
    data = yaml.safe_load(Path(found[0]).read_text())
    return {"config": found[0], "enable_hierarchical_cache": bool(data.get("enable-hierarchical-cache"))}


def pid(w: World, host: str, group: str) -> int:
    return int((w.roots[host] / "run" / f"{group}.pid").read_text())


def hicache(w: World, verb: str, *extra):
    r = run_cli("hicache", verb, str(w.profile), "-g", "prefill", "--remote", *extra, env=w.env(), timeout=300)
    return r


def test_hicache_remote_is_a_release_only_the_changed_group_restarts_rollback_undoes_it(world):
    w = world
    r = cli(w, "deploy", "--json")
    assert r.code == 0, r.err
    r1 = r.json()["release"]
    assert info(w, "prefill")["enable_hierarchical_cache"] is False
    pids = {("h0", "prefill"): pid(w, "h0", "prefill"), ("h1", "decode"): pid(w, "h1", "decode"),
            ("h2", "router"): pid(w, "h2", "router")}
    local0 = (w.cfgdir / "prefill.yaml").read_bytes()
    r1cfg = w.roots["h0"] / "releases" / r1 / "configs" / "prefill.yaml"
    r1bytes, r1ino = r1cfg.read_bytes(), r1cfg.stat().st_ino

    # dry run: the diff and the deploy steps; nothing changes
    d = hicache(w, "on", "--dry-run")
    assert d.code == 0, d.err
    assert "+enable-hierarchical-cache: true" in d.out and f"dry run: release r" in d.out
    assert "h0: switch" in d.out and "start prefill (launcher)" in d.out and "no group restarted" in d.out
    assert w.currents() == {h: r1 for h in w.roots} and (w.cfgdir / "prefill.yaml").read_bytes() == local0

    r = hicache(w, "on", "--json")
    assert r.code == 0, (r.out, r.err)
    doc = json.loads(r.out)
    r2 = doc["release"]
    assert r2 != r1 and doc["previous"] == r1 and doc["groups"][0]["written"] is True
    # TAB offers the release the change made, newest first (the run log names it; issue 46.6)
    r = run_cli("__complete", "releases", str(w.profile), env=w.env())
    assert r.out.split()[:2] == [r2, r1], r.out
    assert w.currents() == {h: r2 for h in w.roots}
    for h in w.roots:
        assert os.readlink(w.roots[h] / "previous") == f"releases/{r1}"
        w.assert_complete(h)
        rec = w.audit(h)[-1]
        assert (rec["action"], rec["result"], rec["release"], rec["from"], rec["groups"]) == \
            ("hicache-on", "ok", r2, r1, ["prefill"])
        assert w.state(h)["releases"][r2]["state"] == "active"
    assert info(w, "prefill")["enable_hierarchical_cache"] is True
    # only prefill restarted; decode and router kept running
    assert pid(w, "h0", "prefill") != pids[("h0", "prefill")]
    assert pid(w, "h1", "decode") == pids[("h1", "decode")] and pid(w, "h2", "router") == pids[("h2", "router")]
    # the old release was never written: same inode, same bytes; the new config is a new, read-only file
    assert r1cfg.read_bytes() == r1bytes and r1cfg.stat().st_ino == r1ino
    new = w.roots["h0"] / "releases" / r2 / "configs" / "prefill.yaml"
    assert b"enable-hierarchical-cache: true" in new.read_bytes() and new.stat().st_mode & 0o222 == 0
    assert (w.roots["h0"] / "releases" / r2 / "tree/python/sglang/srt/mod007.py").stat().st_ino == \
        (w.roots["h0"] / "releases" / r1 / "tree/python/sglang/srt/mod007.py").stat().st_ino
    # the profile's copy follows, so a deploy of the profile is the same release: "already active"
    assert (w.cfgdir / "prefill.yaml").read_bytes() == new.read_bytes()
    r = cli(w, "deploy", "--json")
    assert r.code == 0 and r.json()["release"] == r2 and r.json().get("unchanged") is True, r.err

    # the same again: nothing to do, no new release
    r = hicache(w, "on", "--json")
    assert r.code == 0 and json.loads(r.out)["groups"][0]["changed"] is False
    assert w.currents() == {h: r2 for h in w.roots}

    # rollback undoes it
    r = cli(w, "rollback", "--to", r1)
    assert r.code == 0, r.err
    assert w.currents() == {h: r1 for h in w.roots} and info(w, "prefill")["enable_hierarchical_cache"] is False
    r = cli(w, "verify", "--json")
    assert r.code == 0 and r.json()["ok"], r.out


def test_hicache_remote_failed_gate_rolls_back_like_a_deploy(world):
    w = world
    r = cli(w, "deploy", "--json")
    assert r.code == 0, r.err
    r1 = r.json()["release"]
    import yaml
    prof = yaml.safe_load(w.profile.read_text())
    prof["groups"][0]["env"] = {"STANDIN_CRASH_ON_HICACHE": "CUDA out of memory allocating the host pool"}
    w.profile.write_text(yaml.safe_dump(prof, sort_keys=False))
    r = cli(w, "deploy", "--json")
    assert r.code == 0, r.err
    r1 = r.json()["release"]
    local0 = (w.cfgdir / "prefill.yaml").read_bytes()
    r = hicache(w, "on")
    assert r.code == 1, (r.out, r.err)
    assert "CUDA out of memory allocating the host pool" in r.err
    assert "hicache-on of r" in r.err and f"rolled back to {r1} on all hosts" in r.err
    assert w.currents() == {h: r1 for h in w.roots}
    rec = w.audit("h0")[-1]
    assert rec["action"] == "hicache-on" and rec["result"] == "rolled-back"
    r2 = rec["release"]
    assert w.state("h0")["releases"][r2]["state"] == "failed"
    assert (w.cfgdir / "prefill.yaml").read_bytes() == local0          # local copy untouched
    for h in w.roots:
        w.assert_complete(h)
        assert not (w.roots[h] / ".lock").exists()


def test_hicache_remote_takes_the_deploy_lock(world):
    """Issue 13: it checked the lock but did not take it. A held lock refuses it (exit 3), nothing
    changed; the holder is named."""
    w = world
    r = cli(w, "deploy", "--json")
    assert r.code == 0, r.err
    r1 = r.json()["release"]
    lock = w.roots["h1"] / ".lock"
    lock.mkdir()
    (lock / "holder.json").write_text(json.dumps({"who": "ops@box", "what": "deploy rX", "pid": 7, "since": "t"}))
    r = hicache(w, "on")
    assert r.code == 3 and "held by ops@box" in r.err, (r.out, r.err)
    assert w.currents() == {h: r1 for h in w.roots}
    assert [p.name for p in (w.roots["h0"] / "releases").iterdir() if not p.name.startswith(".")] == [r1]
    assert info(w, "prefill")["enable_hierarchical_cache"] is False


def test_hicache_remote_secret_config_stays_private_and_masked(world):
    """A 0600 serve config with api-key: the derived release keeps it 0400 on every host; the gate
    authenticates with it; the key is never printed."""
    w = world
    w.extra["prefill"] = {"api-key": "sk-verysecret-123"}
    w.extra["decode"] = {"api-key": "sk-verysecret-123"}
    w.write()
    import yaml
    prof = yaml.safe_load(w.profile.read_text())
    for h in prof["hosts"]:
        h["ram_gib"] = 2048
    w.profile.write_text(yaml.safe_dump(prof, sort_keys=False))
    for g in ("prefill", "decode"):
        (w.cfgdir / f"{g}.yaml").chmod(0o600)
    r = cli(w, "deploy", "--json", "-v")
    assert r.code == 0, r.err
    assert "sk-verysecret-123" not in r.out + r.err
    r = hicache(w, "on")
    assert r.code == 0, (r.out, r.err)
    assert "sk-verysecret-123" not in r.out + r.err
    rid = w.current("h0")
    for h in w.roots:
        m = stat.S_IMODE((w.roots[h] / "releases" / rid / "configs" / "prefill.yaml").stat().st_mode)
        assert m == 0o400, (h, oct(m))
    assert stat.S_IMODE((w.cfgdir / "prefill.yaml").stat().st_mode) == 0o600
    # DSV4CTL_API_KEY wins; a wrong one: 401, and the server's echo of the header is masked
    r = run_cli("hicache", "off", str(w.profile), "-g", "prefill", "--remote",
                env={**w.env(), "DSV4CTL_API_KEY": "wrongkey-4567"}, timeout=300)
    assert r.code == 1, (r.out, r.err)
    assert "chat completion answered 401" in r.err and "Bearer ***" in r.err
    assert "wrongkey-4567" not in r.out + r.err and "sk-verysecret-123" not in r.out + r.err
    assert w.current("h0") == rid
    for h in w.roots:         # the audit detail quotes the server's answer: masked there too
        text = (w.roots[h] / "audit.jsonl").read_text()
        assert "Bearer ***" in text and "wrongkey-4567" not in text and "sk-verysecret-123" not in text
