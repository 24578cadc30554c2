"""``dsv4ctl config set``: KEY=VALUE parsing and checks (pure, against SGLang 0.5.23's table),
round-trip edits of the profile's serve configs, lint before write, exit codes. The ``--remote``
path (a release) is the one ``hicache --remote`` uses (tests/test_hicache_remote.py) and runs
live in the hicache-crash runbook test (tests/test_runbook_live.py)."""

from __future__ import annotations

import pytest

from dsv4ctl.errors import InputError
from dsv4ctl.serve.argtable import load_table
from dsv4ctl.serve.edit import REMOVE, apply_changes
from dsv4ctl.serve.setargs import changes_for_set, parse_assignment
from tests.conftest import REPO, run_cli
from tests.test_config_cli import prof  # noqa: F401 - the profile copy fixture (series: null)

PREFILL = (REPO / "profiles" / "dsv4-flash-8xb200-pd" / "prefill.yaml").read_text()


@pytest.mark.parametrize("text,want", [
    ("kv-canary=log", ("kv-canary", "log")),
    ("--max-running-requests=64", ("max-running-requests", 64)),
    ("enable-metrics=true", ("enable-metrics", True)),
    ("cuda-graph-bs=[1, 2, 4]", ("cuda-graph-bs", [1, 2, 4])),
    ("mem-fraction-static=0.85", ("mem-fraction-static", 0.85)),
    ('kv-canary="raise"', ("kv-canary", "raise")),
])
def test_parse_assignment_reads_the_value_as_yaml(text, want):
    assert parse_assignment(text) == want


@pytest.mark.parametrize("text,msg", [
    ("kv-canary", "'kv-canary': expected KEY=VALUE (e.g. kv-canary=log)"),
    ("=log", "'=log': expected KEY=VALUE (e.g. kv-canary=log)"),
    ("kv-canary=[log", "kv-canary: the value is not YAML (expected ',' or ']', but got '<stream end>')"),
    ("api-key=@SECRETPW1", "api-key: the value is not YAML (found character '@' that cannot start any token)"),
])
def test_parse_assignment_errors(text, msg):
    with pytest.raises(InputError) as e:
        parse_assignment(text)
    assert str(e.value).startswith(msg)


def _set(sets, unsets=(), data=None):
    import yaml
    data = yaml.safe_load(PREFILL) if data is None else data
    return changes_for_set(data, sets, list(unsets), load_table(), "prefill.yaml")


def test_set_kv_canary_appends_one_line_and_keeps_the_rest():
    ch = _set([("kv-canary", "log")])
    assert [(c.key, c.value) for c in ch] == [("kv-canary", "log")]
    new = apply_changes(PREFILL, ch, "prefill.yaml")
    assert new == PREFILL + "kv-canary: log\n"
    # again: nothing to do
    import yaml
    assert _set([("kv-canary", "log")], data=yaml.safe_load(new)) == []


def test_existing_key_edited_in_place_and_unset_removes_it():
    assert "mem-fraction-static: 0.865" in PREFILL
    new = apply_changes(PREFILL, _set([("mem-fraction-static", 0.86)], ["enable-cache-report"]), "prefill.yaml")
    # the value changes, its trailing comment stays in its column
    assert "mem-fraction-static: 0.86      # leaves room for the bf16 index-K overshoot" in new   # column kept
    assert "0.865" not in new and "enable-cache-report" not in new
    assert len(new.splitlines()) == len(PREFILL.splitlines()) - 1
    assert _set([], ["kv-canary"]) == []            # not there: nothing to remove
    assert _set([], ["enable-cache-report"])[0].value is REMOVE


@pytest.mark.parametrize("sets,unsets,msg", [
    ([("kv-canary", "bogus")], [], "prefill.yaml: kv-canary: invalid choice: 'bogus' (choose from 'none', 'log', 'raise')"),
    ([("kv-canry", "log")], [], "kv-canry: not an SGLang 0.5.23 server argument"),
    ([("tp", 4)], [], "tp: not an SGLang 0.5.23 server argument (did you mean "),
    ([("mem_fraction_static", 0.8)], [], "mem_fraction_static: not an SGLang 0.5.23 server argument (serve-config keys "
                                         "are dashed, as SGLang's --config reads them: mem-fraction-static)"),
    ([("max-running-requests", "abc")], [], "prefill.yaml: max-running-requests: invalid int value: 'abc'"),
    ([("enable-metrics", "yes")], [], "prefill.yaml: enable-metrics: is a flag: use true (or leave it out), not 'yes'"),
    ([("enable-hierarchical-cache", False)], [], "enable-hierarchical-cache: set it with dsv4ctl hicache on|off"),
    ([("enable-hicache", True)], [], "enable-hicache: set it with dsv4ctl hicache on|off"),
    ([("kv-canary", "log")], ["kv-canary"], "kv-canary: given twice (also as kv-canary)"),
])
def test_bad_keys_and_values_are_one_line_errors(sets, unsets, msg):
    with pytest.raises(InputError) as e:
        _set(sets, unsets)
    assert str(e.value).startswith(msg), str(e.value)


def test_cli_dry_run_writes_nothing_then_writes_one_group(prof):
    f = prof.parent / "dsv4-flash-8xb200-pd" / "prefill.yaml"
    d = prof.parent / "dsv4-flash-8xb200-pd" / "decode.yaml"
    before, dbefore = f.read_text(), d.read_text()
    r = run_cli("config", "set", str(prof), "kv-canary=log", "-g", "prefill", "--dry-run")
    assert r.code == 0, r.err
    assert "+kv-canary: log" in r.out and "dry run: would write 1 file(s)" in r.out
    assert f.read_text() == before
    r = run_cli("config", "set", str(prof), "kv-canary=log", "-g", "prefill", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["schema"] == "dsv4ctl.config-set/1" and doc["set"] == {"kv-canary": "log"} and doc["unset"] == []
    assert [(g["group"], g["changed"], g["written"]) for g in doc["groups"]] == [("prefill", True, True)]
    assert f.read_text() == before + "kv-canary: log\n" and d.read_text() == dbefore
    r = run_cli("config", "set", str(prof), "kv-canary=log", "-g", "prefill")
    assert r.code == 0 and r.out.strip().endswith("already kv-canary=log, unchanged")


def test_cli_lint_error_writes_nothing(prof):
    f = prof.parent / "dsv4-flash-8xb200-pd" / "prefill.yaml"
    before = f.read_text()
    # a page size SGLang's DSV4 path rejects: the whole profile is linted before the write
    r = run_cli("config", "set", str(prof), "page-size=1", "-g", "prefill")
    assert r.code == 2 and r.err.startswith("dsv4ctl: error: config set: not written:"), r.err
    assert r.err.count("\n") == 1 and f.read_text() == before


@pytest.mark.parametrize("argv,msg", [
    (["kv-canary=log"], "config set: name the groups to edit (--group/-g)"),
    (["-g", "prefill"], "config set: nothing to set (give KEY=VALUE or --unset KEY)"),
    (["kv-canary=bogus", "-g", "prefill"], "config set: kv-canary: invalid choice: 'bogus'"),
    (["kv-canary=log", "-g", "router"], "group 'router' is the router: it has no serve config"),
    (["kv-canary=log", "-g", "nope"], "no group 'nope'"),
])
def test_cli_bad_input_exit_2(prof, argv, msg):
    r = run_cli("config", "set", str(prof), *argv)
    assert r.code == 2 and msg in r.err and r.err.count("\n") == 1 and "Traceback" not in r.err, r.err


def test_cli_refuses_the_shipped_profile():
    r = run_cli("config", "set", "dsv4-flash-8xb200-pd", "kv-canary=log", "-g", "prefill")
    assert r.code == 2 and "shipped with dsv4ctl, not edited" in r.err, r.err


def test_an_error_the_config_already_has_does_not_block_a_change(prof, tmp_path):
    """The incident case: bf16 index-K with HiCache on a tree without the gating (DSV111, an
    error lint already reports for the unedited file, about behaviour under load). Adding
    kv-canary does not cause it, so it is written (the finding is still printed); a change that
    brings a new error is refused, and so is any edit of a file SGLang would not start with."""
    empty = tmp_path / "empty-tree"
    empty.mkdir()
    f = prof.parent / "dsv4-flash-8xb200-pd" / "prefill.yaml"
    before = f.read_text()
    lint = run_cli("config", "lint", str(prof), "--tree", str(empty), "--json")
    assert lint.code == 2 and "DSV111" in [x["rule"] for x in lint.json()["findings"]]
    r = run_cli("config", "set", str(prof), "kv-canary=log", "-g", "prefill", "--tree", str(empty))
    assert r.code == 0, r.err
    assert "error DSV111 index-k-ungated" in r.out and f.read_text() == before + "kv-canary: log\n"
    r = run_cli("config", "set", str(prof), "page-size=1", "-g", "prefill", "--tree", str(empty))
    assert r.code == 2 and "not written" in r.err and "DSV111" not in r.err, r.err
    # an error SGLang refuses to start with blocks every edit, also one the file already had
    f.write_text(before + "page-size: 1\n")
    r = run_cli("config", "set", str(prof), "kv-canary=raise", "-g", "prefill", "--tree", str(empty))
    assert r.code == 2 and "DSV107 pd-mismatch: page-size" in r.err and f.read_text() == before + "page-size: 1\n", r.err


def test_canary_sweep_needs_the_canary_on(prof):
    """SGLang 0.5.23 refuses kv-canary-sweep-interval > 0 with kv-canary none
    (srt/arg_groups/validation_hook.py:374): lint SGL008, so config set writes nothing."""
    f = prof.parent / "dsv4-flash-8xb200-pd" / "prefill.yaml"
    before = f.read_text()
    r = run_cli("config", "set", str(prof), "kv-canary-sweep-interval=100", "-g", "prefill")
    assert r.code == 2 and "SGL008 kv-canary-sweep-alone" in r.err and f.read_text() == before, r.err
    r = run_cli("config", "set", str(prof), "kv-canary-sweep-interval=100", "kv-canary=log", "-g", "prefill")
    assert r.code == 0, r.err
    assert f.read_text() == before + "kv-canary-sweep-interval: 100\nkv-canary: log\n"


@pytest.mark.parametrize("setting", ["tp-size=2", "tensor-parallel-size=8", "dp-size=2", "pp-size=2", "port=30001",
                                     "base-gpu-id=4", "model-path=x", "model=x", "disaggregation-mode=decode"])
def test_topology_keys_belong_to_the_profile(prof, setting):
    r = run_cli("config", "set", str(prof), setting, "-g", "prefill")
    assert r.code == 2 and "part of the group's topology in the profile" in r.err and r.err.count("\n") == 1, r.err


def _allow_longer_context(prof):
    """The prefill group's server runs with SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1: a context
    past the model's 1M is then planned (SGLang refuses it at start-up without the switch)."""
    text = prof.read_text()
    anchor = "    serve_config: dsv4-flash-8xb200-pd/prefill.yaml\n"
    assert anchor in text
    prof.write_text(text.replace(anchor, anchor + "    env: {SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN: '1'}\n", 1))


@pytest.mark.parametrize("setting,deciding", [("max-total-tokens=1", "no_kv_memory"), ("mem-fraction-static=0.99", "pools"),
                                              ("context-length=20000000", "pools")])
def test_an_edit_that_makes_the_plan_fail_is_refused(prof, setting, deciding):
    _allow_longer_context(prof)
    f = prof.parent / "dsv4-flash-8xb200-pd" / "prefill.yaml"
    before = f.read_text()
    r = run_cli("config", "set", str(prof), setting, "-g", "prefill")
    assert r.code == 2 and f"config set: not written: prefill would fail its plan ({deciding}):" in r.err, r.err
    assert f.read_text() == before


def test_an_edit_under_sglangs_activation_heuristic_is_written(prof):
    """Headroom under 90 % of SGLang's activation estimate is tight (a heuristic, not a proven
    failure): the edit is written, exit 0."""
    f = prof.parent / "dsv4-flash-8xb200-pd" / "prefill.yaml"
    r = run_cli("config", "set", str(prof), "context-length=5000000", "-g", "prefill")
    assert r.code == 2 and "SGLang refuses it at start-up unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in r.err
    _allow_longer_context(prof)
    r = run_cli("config", "set", str(prof), "context-length=5000000", "-g", "prefill")
    assert r.code == 0, r.err
    assert "context-length: 5000000" in f.read_text()


def test_new_secret_values_are_never_printed(prof):
    for extra in ([], ["--json"], ["--dry-run", "--json"]):
        r = run_cli("config", "set", str(prof), "api-key=SUPERSECRET123", "-g", "prefill", *extra)
        assert r.code == 0 and "SUPERSECRET123" not in r.out + r.err, (extra, r.out)
    f = prof.parent / "dsv4-flash-8xb200-pd" / "prefill.yaml"
    assert "api-key: SUPERSECRET123\n" in f.read_text()
    assert run_cli("config", "set", str(prof), "api-key=SUPERSECRET123", "-g", "prefill", "--json").json()["set"] == {"api-key": "***"}


def test_unset_repairs_an_unknown_key_and_groups_count_once(prof):
    f = prof.parent / "dsv4-flash-8xb200-pd" / "prefill.yaml"
    before = f.read_text()
    f.write_text(before + "kv-canry: log\n")
    assert run_cli("config", "lint", str(prof)).code == 2                 # SGL001: SGLang would not start
    r = run_cli("config", "set", str(prof), "-g", "prefill", "-g", "prefill", "--unset", "kv-canry")
    assert r.code == 0 and f.read_text() == before and r.out.count("wrote 1 file(s)") == 1, r.out + r.err


def test_a_signal_during_a_multi_file_write_waits_for_all_files(tmp_path, monkeypatch):
    """SIGTERM (or SIGINT) while write_all renames: held until every file is written, then
    delivered; no half-written set, no temp file left."""
    import os
    import signal
    from dsv4ctl.serve import hicache_local
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("x: 1\n")
    b.write_text("y: 1\n")

    class Stopped(Exception):
        pass

    def handler(signum, frame):
        raise Stopped()
    old = signal.signal(signal.SIGTERM, handler)
    real = os.replace
    calls = []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)      # arrives between the two renames
        return real(src, dst)
    monkeypatch.setattr(hicache_local.os, "replace", replace)
    try:
        with pytest.raises(Stopped):
            hicache_local.write_all([(a, "x: 2\n"), (b, "y: 2\n")])
    finally:
        signal.signal(signal.SIGTERM, old)
    assert (a.read_text(), b.read_text()) == ("x: 2\n", "y: 2\n") and len(calls) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.yaml", "b.yaml"]


def test_concurrent_editors_never_lose_an_edit(prof):
    """Two ``config set`` and a ``hicache off`` on one serve config at once (issue 32: the HiCache-off
    edit was lost in 2 of 3 trials, all exiting 0): every editor that exits 0 finds its edit in the
    file; a loser exits 3 naming the file, and runs cleanly when tried again."""
    import subprocess
    import sys
    import os
    f = prof.parent / "dsv4-flash-8xb200-pd" / "prefill.yaml"
    original = f.read_text()
    argvs = {"canary": ["config", "set", str(prof), "kv-canary=log", "-g", "prefill"],
             "log": ["config", "set", str(prof), "log-level=debug", "-g", "prefill"],
             "hicache": ["hicache", "off", str(prof), "-g", "prefill"]}
    landed = {"canary": "kv-canary: log", "log": "log-level: debug", "hicache": "enable-hierarchical-cache: false"}
    env = dict(os.environ, COLUMNS="200", NO_COLOR="1")
    losers = 0
    for trial in range(3):
        f.write_text(original)
        procs = {k: subprocess.Popen([sys.executable, "-m", "dsv4ctl.cli", *a], cwd=REPO, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE) for k, a in argvs.items()}
        res = {k: (p.wait(timeout=120), p.communicate()[1]) for k, p in procs.items()}
        text = f.read_text()
        for k, (code, err) in res.items():
            if code == 0:
                assert landed[k] in text, (trial, k, text)
            else:
                losers += 1
                assert code == 3 and "changed at" in err and "nothing written: run the command again" in err, (k, err)
                again = run_cli(*argvs[k])
                assert again.code == 0, again.err
                assert landed[k] in f.read_text()
        assert all(v in f.read_text() for v in landed.values()), (trial, res)
