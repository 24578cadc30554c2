"""Resolve once (issue 42 item 1): every command reads the profile once, each serve config once
and resolves the SGLang release at most once; nothing below ``commands/`` reads them again.

The rule, per command run in one process:

- the profile file: one load (``profile/model.py load_profile``, counted at its YAML read);
- each serve config the command touches: one read (``profile/serveconfig.py read_serve_config``,
  the one reader, counting in ``serveconfig.READS``);
- the SGLang release: at most one resolution (``plan/sglang_version.py RESOLUTIONS``), exactly
  one for a command that builds, judges or sizes a release (deploy, a serve-config change, plan).
  A serve-config change judges its edit on ``Deployment.with_serve_texts(texts)``: the changed
  text is parsed from memory (no second read), every other config is the one already read and the
  release resolved for the command is kept, so the change's one resolution is the command's one.
- a runbook step runs inside the runbook's command: the run resolves the profile once
  (``RunContext.deployment``) and its in-process steps (service.restart here) ask that
  Deployment; steps that run a dsv4ctl child are a command of their own (counted as above).
- the patch series (``sglang.series``) and the tree: one series load (``patches/ops.py
  load_series``), one tree read (``patches/tree.py read_tree``) and one version read
  (``tree_version``, at ``sglang.base_ref``; ``read_tree`` is given it) per command that builds,
  judges or sizes a release: the release inputs, the lint input (DSV123) and the plan's index-K
  facts ask the Deployment (``Deployment.once``; ``patches/resolved.py``), and a serve-config
  change's ``with_serve_texts`` keeps them (they do not depend on serve configs).
- the lint input (``serve/lintinput.py build_input``): one per serve texts linted; a command that
  lints the same texts twice (``hicache on --remote``: the profile's files, then the running
  release's) asks the Deployment for the one it built.

One LocalWorld (three ``local: true`` hosts, stand-in servers) whose profile ships a one-patch
series: a real deploy so that the lifecycle, rollback and serve-change dry runs have a release to
act on (about 8 s)."""

from __future__ import annotations

import shutil
import sys

import pytest
import yaml

from dsv4ctl.patches import ops, tree
from dsv4ctl.plan import sglang_version
from dsv4ctl.profile import model, serveconfig
from dsv4ctl.serve import lintinput
from tests.test_golden import LocalWorld, needs_rsync, run

PLAYBOOK = {"name": "restart-once", "description": "one in-process step: restart decode in place",
            "steps": [{"id": "restart", "action": "service.restart", "args": {"groups": ["decode"]}}]}


def count_calls(monkeypatch, func, log: list) -> None:
    """Count every call of ``func`` in ``log``, wherever a ``dsv4ctl`` module holds it by name
    (``from .ops import load_series`` at import time included)."""
    def counting(*a, **k):
        log.append(a[:1])
        return func(*a, **k)
    for name, mod in list(sys.modules.items()):
        if (name == "dsv4ctl" or name.startswith("dsv4ctl.")) and getattr(mod, func.__name__, None) is func:
            monkeypatch.setattr(mod, func.__name__, counting)


@pytest.fixture
def counted(monkeypatch):
    """``count(*argv, env=...) -> (exit code, profile loads, {serve config: reads}, resolutions)``
    of one command run in this process (tests/test_golden.py ``run``)."""
    loads: list[str] = []
    read_yaml = model.load_yaml

    def counting(path, *a, **k):
        loads.append(str(path))
        return read_yaml(path, *a, **k)
    monkeypatch.setattr(model, "load_yaml", counting)

    def count(*argv: str, env=None):
        loads.clear()
        serveconfig.READS.clear()
        sglang_version.RESOLUTIONS.clear()
        r = run(*argv, env=env)
        assert r.code == 0, (argv, r.err[-400:])
        return loads.copy(), dict(serveconfig.READS), len(sglang_version.RESOLUTIONS)
    return count


@needs_rsync
def test_each_command_reads_the_profile_and_its_serve_configs_once(tmp_path, monkeypatch, counted):
    import dsv4ctl.patches.planfacts  # noqa: F401 -- loaded, so its names are counted too
    w = LocalWorld(tmp_path)
    series = tmp_path / "series-dir"            # a one-patch series cut against the world's tree
    series.mkdir()
    shutil.copy2(w.patch1, series / w.patch1.name)
    (series / "series").write_text(f"base sglang==0.5.23\n{w.patch1.name}\n")
    prof = w.prof
    prof["sglang"]["series"] = str(series)
    loaded, trees, versions_read = [], [], []
    count_calls(monkeypatch, ops.load_series, loaded)
    count_calls(monkeypatch, tree.read_tree, trees)
    count_calls(monkeypatch, tree.tree_version, versions_read)
    built = []                                  # lint inputs assembled (serve/lintinput.py build_input)
    count_calls(monkeypatch, lintinput.LintInput, built)
    for h in prof["hosts"]:
        h["ram_gib"] = 4096                 # room for prefill's HiCache host pool (DSV109)
    p = str(w.write_profile("profile.yaml", prof))
    cfgs = {str(w.cfgdir / "prefill.yaml"): 1, str(w.cfgdir / "decode.yaml"): 1}
    book = tmp_path / "restart-once.yaml"
    book.write_text(yaml.safe_dump(PLAYBOOK, sort_keys=False))
    # (argv, resolutions, lint inputs): one resolution for what builds, judges or sizes a release,
    # none for the rest; one lint input per serve texts linted (a change lints the edited and the
    # unedited texts; hicache --remote the profile's files and the running release's, the same texts)
    commands = [(("deploy", p), 1, 1),
                (("deploy", p, "--dry-run", "--json"), 1, 1),
                (("config", "set", p, "-g", "decode", "kv-canary=log", "--remote"), 1, 2),
                (("hicache", "on", p, "-g", "prefill", "--remote", "--dry-run"), 1, 2),
                (("config", "set", p, "-g", "decode", "kv-canary=none", "--remote", "--dry-run"), 1, 2),
                (("plan", p, "--json"), 1, 0),
                (("restart", p, "--dry-run"), 0, 0),
                (("rollback", p, "--dry-run"), 0, 0),
                (("status", p), 0, 0),
                (("runbook", "run", str(book), p, "--yes", "-q"), 0, 0)]
    touched = {"runbook": {str(w.cfgdir / "decode.yaml"): 1}}     # the step restarts decode only
    try:
        for argv, versions, lint_inputs in commands:
            loaded.clear(), trees.clear(), versions_read.clear(), built.clear()
            loads, reads, resolved = counted(*argv, env=w.env)
            assert loads.count(p) == 1, (argv, loads)
            assert reads == touched.get(argv[0], cfgs), (argv, reads)
            assert resolved == versions, (argv, resolved)
            # the series and the tree: once for what builds, judges or sizes a release, never again
            assert (len(loaded), len(trees), len(versions_read), len(built)) == (versions,) * 3 + (lint_inputs,), \
                (argv, len(loaded), len(trees), len(versions_read), len(built))
    finally:
        run("stop", p, env=w.env)


def test_a_deploy_reads_its_environment_lock_and_derives_its_launch_spec_once(tmp_path, monkeypatch, counted):
    """The launch spec (each group's command, ports, each server's nodes, ``python_env``) and the
    environment lock's bytes and digest are derived once per Deployment and asked of it after
    (``Deployment.once``): a deploy's preflight, launch spec, trial build and build read the lock
    file once and digest it once (before: the lock read by the preflight, the launch spec and the
    build, and digested by the preflight and once per group); a dry run (no host is changed)."""
    from dsv4ctl.deploy import environment, release
    reads, digests, specs = [], [], []

    def counting(orig, log):
        def f(*a, **k):
            log.append(a[:1])
            return orig(*a, **k)
        return f
    monkeypatch.setattr(environment, "read_lock_file", counting(environment.read_lock_file, reads))
    monkeypatch.setattr(environment, "env_digest", counting(environment.env_digest, digests))
    monkeypatch.setattr(release, "_launch_spec", counting(release._launch_spec, specs))
    w = LocalWorld(tmp_path)
    (w.cfgdir / "env.lock").write_text("dsv4probe==1.0 --hash=sha256:" + "a" * 64 + "\n")
    w.prof["sglang"]["environment"] = {"lock": "env.lock"}
    p = str(w.write_profile("profile.yaml", w.prof))
    for argv in (("deploy", p, "--dry-run", "--json"), ("deploy", p, "--dry-run", "--no-preflight")):
        reads.clear(), digests.clear(), specs.clear()
        loads, _, _ = counted(*argv, env=w.env)
        assert loads.count(p) == 1, (argv, loads)
        assert (len(reads), len(digests), len(specs)) == (1, 1, 1), (argv, reads, digests, specs)
