"""Every hint dsv4ctl prints works as typed (issue 46.1): the commands its hint builders put in
messages, run as printed from the profile's folder, parse (no usage error, exit 2) and reach the
hosts (here a host that refuses connections: exit 3, the documented "host unreachable"). What they
do on real hosts is checked where they are printed: the first-hour test runs the undo hint of
``hicache off --remote`` and the lock's release hint as typed (tests/test_first_hour.py). Hints
that are not whole commands are applied as they say: exec's "put the command after --" line runs
as typed, plan's tight fixes edited into the serve config re-plan to fits, a limited deploy's
refusal's alternatives added to its options are accepted. The commands ``watch --print rules``
puts in its alerts' annotations run as typed (a runbook's --resume line too)."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from tests.conftest import run_cli
from tests.test_limit_core import dep  # noqa: F401  (the limited-deploy rules' profile: h0-h6, no host contacted)

#: A ``dsv4ctl ...`` command inside a message: up to the words that end it.
COMMAND = re.compile(r"dsv4ctl [^;()\n]*?(?= when | undoes| \(|[;)\n]|$)")


def commands_in(text: str) -> list[str]:
    """The ``dsv4ctl ...`` commands a message prints, as typed."""
    return [m.group(0).strip() for m in COMMAND.finditer(text)]


@pytest.fixture(scope="module")
def unreachable(tmp_path_factory):
    """A profile of one's own (profile init) whose host refuses SSH connections."""
    d = tmp_path_factory.mktemp("hints")
    r = run_cli("profile", "init", str(d / "prod.yaml"))
    assert r.code == 0, r.err
    text = (d / "prod.yaml").read_text()
    text = re.sub(r"ssh: \{user: sglang, port: 22, key: ~/.ssh/id_ed25519\}",
                  f"ssh: {{user: sglang, port: 9, key: {d}/nokey}}", text)
    assert "port: 9," in text
    (d / "prod.yaml").write_text(text)
    return d / "prod.yaml"


def hints(profile) -> list[str]:
    """Every message the hint builders print, for ``profile`` as the user gave it."""
    from dsv4ctl.commands.serve_change import undo_hint
    from dsv4ctl.hosts.lock import held_error, release_hint
    manual = json.dumps({"who": "ops@x", "what": "lock acquire: disk swap", "pid": 1, "since": "2026-12-01T00:00:00Z",
                         "manual": True, "message": "disk swap"})
    run = json.dumps({"who": "ops@x", "what": "deploy r0123456789ab", "pid": 999999, "since": "2026-12-01T00:00:00Z",
                      "host": {"hostname": "elsewhere", "machine": "m", "boot": "b", "pidns": "p"}})
    return [release_hint(str(profile)), release_hint(str(profile), dead_override=True),
            f"released r1 (from r0123456789ab): healthy; {undo_hint(profile, 'r0123456789ab')} undoes it",
            str(held_error("h0", "/srv/.lock", manual, can_break=False, profile=str(profile))),
            str(held_error("h0", "/srv/.lock", run, can_break=True, profile=str(profile)))]


def test_every_hint_names_its_profile_and_parses_as_typed(unreachable):
    cmds = [c for h in hints(unreachable.name) for c in commands_in(h)]
    assert len(cmds) >= 5 and all(shlex.split(c)[:2][0] == "dsv4ctl" for c in cmds), cmds
    for c in cmds:
        argv = shlex.split(c)[1:]
        assert unreachable.name in argv, c                # the profile in use, never a placeholder
        r = run_cli(*argv, cwd=unreachable.parent, env={"DSV4CTL_PROFILE": ""}, timeout=60)
        assert r.code == 3 and "cannot connect to 127.0.0.1:9" in r.err, (c, r.code, r.err)


def test_logs_with_the_profile_only_says_to_give_the_group_and_that_hint_parses(unreachable):
    r = run_cli("logs", unreachable.name, cwd=unreachable.parent, env={"DSV4CTL_PROFILE": ""})
    assert r.code == 2 and "give the profile" not in r.err
    assert r.err.strip() == (f"dsv4ctl: error: logs takes the group first, then the profile: dsv4ctl logs prefill "
                             f"{unreachable.name} (its groups: prefill, decode, router)")
    (cmd,) = commands_in(r.err.split(": ", 2)[2])
    r = run_cli(*shlex.split(cmd)[1:], cwd=unreachable.parent, env={"DSV4CTL_PROFILE": ""})
    assert r.code == 3 and "cannot connect to 127.0.0.1:9" in r.err, r.err


def test_exec_hints_are_the_command_as_given(unreachable):
    """exec's "put the command after --" hint is the line the user typed with ``--`` in its place
    (it printed ``dsv4ctl exec GROUP [PROFILE] -- ...``: placeholders for what was given), and it
    runs as typed; with no command it names the group and profile given."""
    import yaml
    host = yaml.safe_load(unreachable.read_text())["hosts"][0]["name"]
    env = {"DSV4CTL_PROFILE": ""}
    r = run_cli("exec", "decode", unreachable.name, "--host", host, "echo", "a b", cwd=unreachable.parent, env=env)
    assert r.code == 2 and r.err.strip() == (f"dsv4ctl: error: exec: put the command after --: dsv4ctl exec decode "
                                             f"{unreachable.name} --host {host} -- echo 'a b'"), r.err
    (cmd,) = commands_in(r.err.split("after --: ", 1)[1])
    r = run_cli(*shlex.split(cmd)[1:], cwd=unreachable.parent, env=env, timeout=60)
    assert r.code == 3 and "cannot connect to 127.0.0.1:9" in r.err, (cmd, r.code, r.err)
    r = run_cli("exec", "decode", unreachable.name, cwd=unreachable.parent, env=env)
    assert r.code == 2 and r.err.strip() == (f"dsv4ctl: error: exec: give the command after --: dsv4ctl exec decode "
                                             f"{unreachable.name} -- CMD..."), r.err


FIX = re.compile(r"(?m)^fix (\S+): (?:or )?set ([a-z-]+): (\S+) \(from (\S+)\) in the serve config")


def test_plans_fixes_applied_as_printed_re_plan_to_fits(unreachable, tmp_path):
    """Every ``fix GROUP: set KEY: VALUE (from OLD) in the serve config`` line plan prints for a
    tight group (issue 44.4's actionable tight), applied as it says (the serve config's line
    edited, one fix at a time), re-plans that group to ``fits``."""
    import shutil
    r = run_cli("plan", unreachable.name, cwd=unreachable.parent, env={"DSV4CTL_PROFILE": ""})
    fixes = FIX.findall(r.out)
    assert r.code == 0 and {g for g, *_ in fixes} == {"prefill", "decode"}, r.out
    for i, (group, key, new, old) in enumerate(fixes):
        d = tmp_path / str(i)
        shutil.copytree(unreachable.parent, d, ignore=shutil.ignore_patterns("nokey*"))
        cfg = d / unreachable.stem / f"{group}.yaml"
        text = cfg.read_text()
        assert len(re.findall(rf"(?m)^{key}: {re.escape(old)}\b", text)) == 1, (key, old)
        cfg.write_text(re.sub(rf"(?m)^{key}: {re.escape(old)}\b", f"{key}: {new}", text))
        r = run_cli("plan", unreachable.name, "-g", group, "--json", cwd=d, env={"DSV4CTL_PROFILE": ""})
        assert r.code == 0 and [g["verdict"]["level"] for g in r.json()["groups"]] == ["fits"], (group, key, new)


def _alternatives(message: str) -> list[tuple[list[str], list[str], bool]]:
    """The ways out a limited deploy's refusal offers (its last clause: ``add -g X, or name the
    host with --host H``, ``add --host H (or -g G)``, ``add those (-g P), or --allow-mixed-pd``):
    (groups, hosts, --allow-mixed-pd) to add, one per alternative."""
    part = re.split(r"; |: ", message)[-1]
    return [(re.findall(r"-g ([\w.#-]+)", a), re.findall(r"--host ([\w.-]+)", a), "--allow-mixed-pd" in a)
            for a in re.split(r",? or |\(or ", part)]


@pytest.mark.parametrize("groups, hosts", [(["decode"], []), ([], ["h2"]), ([], ["h6"]), (["prefill"], [])])
def test_a_limited_deploys_refusal_offers_options_that_are_accepted(dep, groups, hosts):
    """deploy -g/--host refusals (issue 46.9) say what to add: each alternative, added to the
    options given, is accepted by the same rules (nothing the message offers is refused)."""
    from dsv4ctl.deploy.limit import limit_deploy
    from dsv4ctl.errors import InputError
    with pytest.raises(InputError) as e:
        limit_deploy(dep, groups, hosts)
    alts = _alternatives(str(e.value))
    assert len(alts) == 2 and all(g or h or allow for g, h, allow in alts), (str(e.value), alts)
    for g, h, allow in alts:
        lim = limit_deploy(dep, groups + g, hosts + h, allow)
        assert set(hosts + h) <= set(lim.hosts), (str(e.value), g, h, allow)


def _rule_commands(rules: str, profile: str) -> list[list[str]]:
    """The ``dsv4ctl`` commands in a printed rule file's annotations that name ``profile`` (argv
    after ``dsv4ctl``: the words up to the profile and the options that follow it)."""
    out = []
    for ln in (x for x in rules.splitlines() if not x.lstrip().startswith("#")):
        for m in re.finditer(r"dsv4ctl ((?:(?!dsv4ctl ).)*)", ln):
            words = [w.rstrip(").'") for w in m.group(1).split()]
            if profile not in words:
                continue
            argv = words[:words.index(profile) + 1]
            rest = words[len(argv):]
            while rest and rest[0].startswith("--"):
                argv.append(rest.pop(0))
                if rest and not rest[0].startswith("--") and argv[-1] != "--print" or argv[-1] == "--print":
                    argv.append(rest.pop(0))
            out.append(argv)
    return out


def test_watchs_printed_rules_name_commands_that_run_as_typed(unreachable, tmp_path):
    """``watch PROFILE --print rules``: every command its alerts' annotations name (runbooks,
    diagnose, rollback, promote of the alert's release, plan, the rules' own command) parses as
    typed in the profile's folder and acts on the profile's hosts (exit 3 on this refusing host; a
    runbook: its steps that read the host fail, exit 1, and the --resume line it prints runs as
    typed too) or prints what it says (plan, the rule file: exit 0)."""
    env = {"DSV4CTL_PROFILE": "", "DSV4CTL_STATE_DIR": str(tmp_path / "state")}
    r = run_cli("watch", unreachable.name, "--print", "rules", cwd=unreachable.parent, env=env)
    assert r.code == 0, r.err
    # the rules name the profile by the path it was read from (watch may run elsewhere)
    cmds = {tuple(c) for c in _rule_commands(r.out.replace("{{ $labels.release }}", "r0123456789ab"),
                                             str(unreachable.resolve()))}
    verbs = {c[0] if c[0] != "runbook" else f"runbook {c[2]}" for c in cmds}
    assert {"diagnose", "rollback", "promote", "plan", "watch", "runbook toolcall-corruption", "runbook bad-release",
            "runbook scheduler-stall", "runbook transfer-wedge"} <= verbs, cmds
    resumed = 0
    for argv in sorted(cmds):
        r = run_cli(*argv, cwd=unreachable.parent, env=env, timeout=60)
        if argv[0] in ("plan", "watch"):
            assert r.code == 0 and r.out, (argv, r.err)
        elif argv[0] == "runbook":
            assert r.code in (1, 3) and "cannot connect to 127.0.0.1:9" in r.out + r.err, (argv, r.code, r.err)
            resume = [c for c in commands_in(r.out + r.err) if "--resume" in c]
            assert all(shlex.split(c)[1:5] == list(argv) for c in resume), (argv, r.out, r.err)
            for c in resume[:1] if not resumed else ():          # one resume line run: they are alike
                resumed += 1
                r = run_cli(*shlex.split(c)[1:], cwd=unreachable.parent, env=env, timeout=60)
                assert r.code in (1, 3) and "cannot connect to 127.0.0.1:9" in r.out + r.err, (c, r.code, r.err)
        else:
            assert r.code == 3 and "cannot connect to 127.0.0.1:9" in r.err, (argv, r.code, r.err)
    assert resumed >= 1


def test_profile_inits_next_line_runs_as_typed(tmp_path):
    """``profile init``'s "next:" line names the profile as a shell reads it (a folder with a
    space in its name: it printed the path bare, and the plan it names then read two words)."""
    d = tmp_path / "my ops"
    d.mkdir()
    r = run_cli("profile", "init", str(d / "prod.yaml"))
    (nxt,) = [ln for ln in r.out.splitlines() if ln.startswith("next: ")]
    cmd = nxt.split("then: ", 1)[1]
    argv = shlex.split(cmd)
    assert r.code == 0 and argv == ["dsv4ctl", "plan", str(d / "prod.yaml")], nxt
    r = run_cli(*argv[1:], "--json")
    assert r.code == 0 and r.json()["ok"] is True and len(r.json()["groups"]) == 2, r.err
