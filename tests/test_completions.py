"""Shell completions (completions/): generated from the CLI, in sync with it, valid in the real
shells, and completing what a user types.

The drift test fails whenever a command, option or shipped profile/playbook changes without
regenerating: run ``python scripts/gen_completions.py`` and commit completions/."""

from __future__ import annotations

import difflib
import enum
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
import typer

from tests.conftest import REPO, run_cli

COMPLETIONS = REPO / "completions"
HERE = Path(__file__).resolve().parent / "completion"
REGEN = "python scripts/gen_completions.py"


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_completions", REPO / "scripts" / "gen_completions.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gen = _load_generator()


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return gen.generate()


@pytest.fixture(scope="module")
def fresh(generated, tmp_path_factory) -> Path:
    """A folder with the scripts generated from the CLI as it is now (the behaviour tests use
    these, so a stale completions/ only fails the drift test)."""
    d = tmp_path_factory.mktemp("completions")
    for name, text in generated.items():
        (d / name).write_text(text)
    return d


@pytest.mark.parametrize("name", ["dsv4ctl.bash", "_dsv4ctl", "dsv4ctl.fish"])
def test_committed_completions_match_the_cli(generated, name):
    path = COMPLETIONS / name
    assert path.is_file(), f"completions/{name} is missing: run `{REGEN}` and commit completions/"
    committed = path.read_text()
    if committed != generated[name]:
        diff = "".join(list(difflib.unified_diff(committed.splitlines(True), generated[name].splitlines(True),
                                                 f"completions/{name} (committed)", "generated from the CLI"))[:60])
        pytest.fail(f"completions/{name} is stale (the CLI changed): run `{REGEN}` and commit completions/\n{diff}")


def test_check_mode_names_stale_files(tmp_path):
    for name, text in gen.generate().items():
        (tmp_path / name).write_text(text)
    assert gen.main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "_dsv4ctl").write_text("#compdef dsv4ctl\n")
    assert gen.stale(tmp_path) == ["_dsv4ctl"]
    assert gen.main(["--check", "--out", str(tmp_path)]) == 1


def _node(model: dict, *path: str) -> dict:
    for n in gen._walk(model):
        if tuple(n["path"]) == path:
            return n
    raise AssertionError(f"no command {' '.join(path)!r} in the model")


def _option(node: dict, name: str) -> dict:
    return next(o for o in node["options"] if name in o["names"])


def test_model_covers_every_command_of_the_cli():
    from dsv4ctl.cli import app
    from dsv4ctl.plan.plan import SET_KEYS

    cmd = typer.main.get_command(app)
    model = gen.build_model(cmd)

    def paths(c, p=()):
        yield p
        for name, sub in (getattr(c, "commands", None) or {}).items():
            if not sub.hidden:
                yield from paths(sub, p + (name,))

    assert [tuple(n["path"]) for n in gen._walk(model)] == list(paths(cmd))
    plan = _node(model, "plan")
    assert _option(plan, "--set") == {"names": ["-s", "--set"], "help": _option(plan, "-s")["help"],
                                      "value": {"kind": "words", "words": sorted(SET_KEYS), "suffix": "="},
                                      "multiple": True}
    assert _option(plan, "--json")["value"] == {"kind": "none"}
    assert _option(plan, "--help")["names"] == ["-h", "--help"]
    assert plan["args"] == [{"name": "profile", "nargs": 1, "required": False,
                             "value": {"kind": "profile", "words": ["dsv4-flash-8xb200-pd", "dsv4-pro-4xh200-pd"]}}]
    assert _option(plan, "--profile")["value"] == plan["args"][0]["value"]   # -p/--profile (grammar.py)
    assert _option(plan, "--group")["value"] == {"kind": "dyn", "what": "servers"}   # never the router


def test_every_profile_value_is_completed_from_a_profile_the_line_can_give():
    """Every parameter named (or with the metavar) group, host or release completes from the
    profile (``dsv4ctl __complete``), and every command that has one takes the profile."""
    model = gen.build_model()
    params = {}
    for n in gen._walk(model):
        for o in n["options"]:
            params[(" ".join(n["path"]), o["names"][-1])] = o["value"]
        for a in n["args"]:
            params[(" ".join(n["path"]), a["name"].upper())] = a["value"]
    dyn = {k: v["what"] for k, v in params.items() if v["kind"] == "dyn"}
    for (path, name), what in dyn.items():
        assert params.get((path, "--profile"), {}).get("kind") == "profile", (path, name)
    assert {k for k, v in dyn.items() if v == "groups"} >= {("logs", "GROUP"), ("restart", "--group")}
    # plan, facts, config and hicache refuse the router: they offer the server groups
    assert {k for k, v in dyn.items() if v == "servers"} == {(c, "--group") for c in (
        "plan", "facts", "config lint", "config set", "hicache on", "hicache off", "hicache status")}
    assert {k for k, v in dyn.items() if v == "hosts"} >= {("restart", "--host"), ("logs", "--host"),
                                                            ("audit", "--host"), ("patch apply", "--host")}
    assert {k for k, v in dyn.items() if v == "releases"} == {("promote", "RELEASE"), ("rollback", "--to"),
                                                               ("verify", "--release"), ("runbook run", "--release")}
    assert params[("runbook run", "PROFILE_ARG")]["kind"] == "profile"
    assert params[("watch", "--on-alert")] == {"kind": "keyed", "keys": ["corruption", "stuck"],
                                               "words": params[("runbook show", "NAME")]["words"]}


class Colour(str, enum.Enum):
    red = "red"
    green = "green"


def _toy_app() -> typer.Typer:
    """A CLI with what the real one may grow: choices, nested groups, nargs=-1, hidden commands."""
    app = typer.Typer()
    grp = typer.Typer()

    @app.command()
    def paint(colour: Colour = typer.Option(Colour.red, "--colour", "-c", help="Colour [sic]: it's red."),
              out: Optional[Path] = typer.Option(None, "--out", help="Output file."),
              dry_run: bool = typer.Option(False, "--dry-run/--for-real")) -> None:
        """Paint things."""

    @grp.command("revert")
    def revert(tree: str = typer.Argument(..., help="Tree."), commits: list[str] = typer.Argument(None)) -> None:
        """Revert commits."""

    @app.command(hidden=True)
    def secret() -> None:
        """Hidden."""

    app.add_typer(grp, name="patch", help="Patches.")
    return app


def test_model_of_a_toy_cli_has_choices_paths_nested_groups_and_no_hidden_commands():
    model = gen.build_model(typer.main.get_command(_toy_app()))
    assert [s["path"] for s in model["subs"]] == [["paint"], ["patch"]]
    paint = _node(model, "paint")
    assert _option(paint, "--colour")["value"] == {"kind": "words", "words": ["red", "green"]}
    assert _option(paint, "--out")["value"] == {"kind": "file"}
    assert _option(paint, "--for-real")["names"] == ["--dry-run", "--for-real"]
    revert = _node(model, "patch", "revert")
    assert [(a["name"], a["nargs"], a["value"]["kind"]) for a in revert["args"]] == [
        ("tree", 1, "dir"), ("commits", -1, "any")]


# ------------------------------------------------------------------------- the real shells
def _need(shell: str) -> str:
    exe = shutil.which(shell)
    if exe is None:
        pytest.skip(f"{shell} is not installed (scripts/test.sh installs it with apt-get)")
    return exe


@pytest.mark.parametrize("which", ["committed", "generated"])
@pytest.mark.parametrize("shell,name,argv", [
    ("bash", "dsv4ctl.bash", ["-n"]),
    ("zsh", "_dsv4ctl", ["-n"]),
    ("fish", "dsv4ctl.fish", ["--no-execute"]),
])
def test_script_syntax_is_valid_in_the_real_shell(shell, name, argv, which, fresh):
    exe = _need(shell)
    path = (COMPLETIONS if which == "committed" else fresh) / name
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `{REGEN}`")
    p = subprocess.run([exe, *argv, str(path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def bash_complete(line: str, script: Path, cwd: Path = REPO, env: dict | None = None) -> list[str]:
    _need("bash")
    p = subprocess.run(["bash", str(HERE / "drive.bash"), str(script), line], capture_output=True, text=True,
                       cwd=cwd, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stderr == "", p.stderr          # nothing is ever written into the user's prompt
    return [x for x in p.stdout.splitlines() if x]


def fish_complete(line: str, script: Path, cwd: Path = REPO, env: dict | None = None) -> list[str]:
    exe = _need("fish")
    p = subprocess.run([exe, "-N", "-c", f"source {script}; complete -C {line!r}"],
                       capture_output=True, text=True, cwd=cwd, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stderr == "", p.stderr
    return [x.split("\t")[0] for x in p.stdout.splitlines() if x]


def zsh_complete_lines(lines: list[str], script: Path, cwd: Path = REPO, env: dict | None = None) -> list[list[str]]:
    """The candidates of each of ``lines``, typed one after the other in one interactive zsh."""
    exe = _need("zsh")
    p = subprocess.run([exe, "-f", str(HERE / "zcap.zsh"), str(script), *lines],
                       capture_output=True, text=True, cwd=cwd, env=env, timeout=60 + 10 * len(lines))
    assert p.returncode == 0, p.stderr
    # each candidate once, in the order offered: on a loaded machine the capture has seen one
    # candidate twice (fresh-clone run 3 of 2026-12-04: ['mem_fraction_static', 'mem_fraction_static'];
    # the other runs print it once): the assertions are about which candidates are offered
    out = [list(dict.fromkeys(x for x in part.splitlines() if x))
           for part in ("\n" + p.stdout).split("\n<NEXT>\n")]
    assert len(out) == len(lines), p.stdout
    return out


def zsh_complete(line: str, script: Path, cwd: Path = REPO, env: dict | None = None) -> list[str]:
    return zsh_complete_lines([line], script, cwd, env)[0]


def test_bash_completes_commands_options_keys_and_profiles(fresh):
    script = fresh / "dsv4ctl.bash"
    top = [s["path"][-1] for s in gen.build_model()["subs"]]
    assert bash_complete("dsv4ctl ", script) == top
    assert bash_complete("dsv4ctl pl", script) == ["plan"]
    longs = [x for o in _node(gen.build_model(), "plan")["options"] for x in o["names"] if x.startswith("--")]
    assert longs[:4] == ["--set", "--group", "--json", "--markdown"] and longs[-1] == "--help"
    assert bash_complete("dsv4ctl plan --", script) == longs
    assert bash_complete("dsv4ctl plan --set mem_", script) == ["mem_fraction_static="]
    assert bash_complete("dsv4ctl plan -s index_k_", script) == ["index_k_accounting=", "index_k_dtype="]
    assert bash_complete("dsv4ctl plan --set index_k_dtype=", script) == []
    # the value of --group is skipped: the next word is the profile argument again
    assert bash_complete("dsv4ctl plan --group decode --set x=1 profiles/dsv4-f", script) == [
        "profiles/dsv4-flash-8xb200-pd", "profiles/dsv4-flash-8xb200-pd.yaml"]
    assert bash_complete("dsv4ctl plan dsv4-", script) == ["dsv4-flash-8xb200-pd", "dsv4-pro-4xh200-pd"]
    assert bash_complete("dsv4ctl plan profiles/dsv4-flash-8xb200-pd.yaml ", script) == []
    assert bash_complete("dsv4ctl plan x --j", script) == ["--json"]


def test_bash_completes_nested_groups_and_dir_values(fresh):
    script = fresh / "dsv4ctl.bash"
    model = gen.build_model()
    if not any(s["path"] == ["patch"] for s in model["subs"]):
        pytest.skip("no patch group in this CLI")
    assert bash_complete("dsv4ctl patch ", script) == [s["path"][-1] for s in _node(model, "patch")["subs"]]
    assert bash_complete("dsv4ctl patch status --series scr", script) == ["scripts"]
    assert bash_complete("dsv4ctl patch status --profile=dsv4-f", script) == ["dsv4-flash-8xb200-pd"]


def test_bash_toy_cli_choices_and_rest_arguments(tmp_path):
    script = tmp_path / "toy.bash"
    script.write_text(gen.render_bash(gen.build_model(typer.main.get_command(_toy_app()))))
    assert bash_complete("dsv4ctl ", script) == ["paint", "patch"]
    assert bash_complete("dsv4ctl paint --colour ", script) == ["red", "green"]
    assert bash_complete("dsv4ctl paint -c g", script) == ["green"]
    assert bash_complete("dsv4ctl paint --colour=r", script) == ["red"]
    assert bash_complete("dsv4ctl patch revert scr", script) == ["scripts"]       # tree: folders
    assert bash_complete("dsv4ctl patch revert scripts abc", script) == []        # commits: free text
    assert bash_complete("dsv4ctl paint --", script) == ["--colour", "--out", "--dry-run", "--for-real", "--help"]


def test_fish_completes_commands_options_keys_and_profiles(fresh):
    script = fresh / "dsv4ctl.fish"
    top = sorted(s["path"][-1] for s in gen.build_model()["subs"])
    assert sorted(fish_complete("dsv4ctl ", script)) == top
    assert fish_complete("dsv4ctl pl", script) == ["plan"]
    longs = [x for o in _node(gen.build_model(), "plan")["options"] for x in o["names"] if x.startswith("--")]
    assert sorted(fish_complete("dsv4ctl plan --", script)) == sorted(longs)
    assert fish_complete("dsv4ctl plan --set mem_", script) == ["mem_fraction_static="]
    assert fish_complete("dsv4ctl plan --set index_k_dtype=", script) == []
    assert sorted(fish_complete("dsv4ctl plan --group decode profiles/dsv4-f", script)) == [
        "profiles/dsv4-flash-8xb200-pd.yaml", "profiles/dsv4-flash-8xb200-pd/"]
    assert fish_complete("dsv4ctl plan dsv4-", script) == ["dsv4-flash-8xb200-pd", "dsv4-pro-4xh200-pd"]
    assert fish_complete("dsv4ctl plan profiles/dsv4-flash-8xb200-pd.yaml ", script) == []


def test_zsh_completes_commands_options_keys_and_profiles(fresh):
    script = fresh / "_dsv4ctl"
    top = sorted(s["path"][-1] for s in gen.build_model()["subs"])
    assert sorted(set(zsh_complete("dsv4ctl ", script))) == top
    longs = [x for o in _node(gen.build_model(), "plan")["options"] for x in o["names"] if x.startswith("--")]
    assert sorted(set(zsh_complete("dsv4ctl plan --", script))) == sorted(longs)
    assert zsh_complete("dsv4ctl plan --set mem_", script) == ["mem_fraction_static"]  # "=" is compadd's suffix
    assert sorted(set(zsh_complete("dsv4ctl plan dsv4-", script))) == ["dsv4-flash-8xb200-pd", "dsv4-pro-4xh200-pd"]


@pytest.mark.parametrize("shell,render,argv", [
    ("bash", "render_bash", ["-n"]), ("zsh", "render_zsh", ["-n"]), ("fish", "render_fish", ["--no-execute"])])
def test_help_with_quotes_brackets_and_colons_stays_valid(tmp_path, shell, render, argv):
    """The toy CLI's help text has ' [ ] : characters that each shell's quoting must survive."""
    exe = _need(shell)
    script = tmp_path / f"toy.{shell}"
    script.write_text(getattr(gen, render)(gen.build_model(typer.main.get_command(_toy_app()))))
    p = subprocess.run([exe, *argv, str(script)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    if shell != "bash":  # the bash script carries no help text
        assert "Colour" in script.read_text() and "sic" in script.read_text()


# ----------------------------------------------------- values from the profile: dsv4ctl __complete
PROFILE_YAML = """\
version: 1
name: {name}
model: deepseek-v4-flash
hosts:
{hosts}
groups:
{groups}
"""
GROUPS = ["prefill", "decode", "router"]
SERVERS = ["prefill", "decode"]     # what plan, facts, config and hicache take: never the router (issue 46.6)
HOSTS = ["h0", "h1"]
# newest last in the run log: offered newest first, each once, only those of the profile
RUNS = [("r000000000001", "prof.yaml"), ("r000000000002", "other.yaml"), ("r000000000003", "{abs}"),
        ("r000000000001", "{abs}"), (None, "{abs}"), ("not-an-id", "{abs}")]
RELEASES = ["r000000000001", "r000000000003"]


def _write_profile(path: Path, groups: list[str], hosts: list[str]) -> Path:
    path.write_text(PROFILE_YAML.format(
        name=path.stem,
        hosts="\n".join(f"  - {{name: {h}, address: 10.0.0.{i + 1}}}" for i, h in enumerate(hosts)),
        groups="\n".join(f"  - {{name: {g}, role: {g if g != 'router' else 'router'}, host: {hosts[0]}}}"
                         for g in groups)))
    return path


@pytest.fixture
def site(tmp_path) -> tuple[Path, dict]:
    """A working folder with prof.yaml (groups prefill, decode, router; hosts h0, h1), other.yaml
    (group solo, host x9), broken.yaml (a YAML syntax error), a run log naming releases, and the
    environment a user's shell would have: ``dsv4ctl`` on PATH, the cache and state folders here."""
    work = tmp_path / "work"
    work.mkdir()
    prof = _write_profile(work / "prof.yaml", GROUPS, HOSTS)
    _write_profile(work / "other.yaml", ["solo"], ["x9"])
    (work / "broken.yaml").write_text("version: 1\ngroups: [prefill, decode\nhosts: {\n")
    state = tmp_path / "state"
    state.mkdir()
    with open(state / "runs.jsonl", "w") as f:
        for rid, profile in RUNS:
            f.write(json.dumps({"command": "deploy", "profile": profile.format(abs=prof), "release": rid}) + "\n")
        f.write('{"torn": \n')
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = Path(sys.executable).parent / "dsv4ctl"
    if script.is_file() and os.access(script, os.X_OK):
        (bindir / "dsv4ctl").symlink_to(script)       # the console script, as installed
    else:
        (bindir / "dsv4ctl").write_text(f"#!/bin/sh\nexec {sys.executable} -m dsv4ctl \"$@\"\n")
        (bindir / "dsv4ctl").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSV4CTL_")}
    env.update(PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}", DSV4CTL_CACHE=str(tmp_path / "cache"),
               DSV4CTL_STATE_DIR=str(state), HOME=str(tmp_path))
    return work, env


def test_complete_helper_prints_the_profile_values_and_nothing_on_failure(site):
    work, env = site
    for args, want in [(("groups", "prof.yaml"), GROUPS), (("hosts", "prof.yaml"), HOSTS),
                       (("servers", "prof.yaml"), SERVERS),
                       (("groups", str(work / "other.yaml")), ["solo"]),
                       (("releases", "prof.yaml"), RELEASES), (("releases", "other.yaml"), ["r000000000002"]),
                       (("runbooks",), gen._shipped_stems("playbooks")),
                       (("profiles",), ["dsv4-flash-8xb200-pd", "dsv4-pro-4xh200-pd"])]:
        r = run_cli("__complete", *args, cwd=work, env=env)
        assert (r.code, r.out.splitlines(), r.err) == (0, want, ""), args
    # no PROFILE: DSV4CTL_PROFILE, else the embedded default (as the commands resolve it)
    r = run_cli("__complete", "hosts", cwd=work, env=dict(env, DSV4CTL_PROFILE="prof.yaml"))
    assert (r.code, r.out.splitlines(), r.err) == (0, HOSTS, "")
    r = run_cli("__complete", "hosts", "", cwd=work, env=dict(env, DSV4CTL_PROFILE="other.yaml"))
    assert (r.code, r.out.splitlines(), r.err) == (0, ["x9"], "")
    r = run_cli("__complete", "hosts", cwd=work, env=env)
    assert (r.code, r.out.splitlines(), r.err) == (0, ["b200-0"], "")
    for args in [("groups", "broken.yaml"), ("hosts", "missing.yaml"), ("groups", "."), ("groups", "x" * 300),
                 ("nonsense", "prof.yaml"), (), ("groups", "prof.yaml", "extra"), ("releases", "broken.yaml")]:
        r = run_cli("__complete", *args, cwd=work, env=env)
        assert (r.code, r.out, r.err) == (0, "", ""), args


def test_complete_helper_is_silent_when_the_cache_warns(site):
    """A cache folder others can write makes a profile read warn on stderr: not into a prompt."""
    work, env = site
    cache = Path(env["DSV4CTL_CACHE"])
    (cache / "yaml").mkdir(parents=True)
    cache.chmod(0o777)
    r = run_cli("__complete", "groups", "prof.yaml", cwd=work, env=env)
    assert (r.code, r.out.splitlines(), r.err) == (0, GROUPS, "")
    r = run_cli("plan", "prof.yaml", cwd=work, env=env)
    assert "not yours alone" in r.err          # the same read in a command does warn


def test_complete_helper_imports_neither_typer_nor_yaml(site):
    """The helper runs on every TAB: no typer, and (for a profile read before) no PyYAML."""
    from tests.test_startup_imports import PROBE
    work, env = site

    def modules() -> set[str]:
        p = subprocess.run([sys.executable, "-c", PROBE, json.dumps(["__complete", "groups", "prof.yaml"])],
                           capture_output=True, text=True, cwd=work, env=env, timeout=120)
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout.strip().splitlines()[-1])
        assert doc["rc"] == 0
        return set(doc["modules"])

    first, second = modules(), modules()
    assert not {m for m in first if m.split(".")[0] in ("typer", "click", "rich")}
    assert "yaml" in first and "yaml" not in second


def _profile_value_cases(runbooks: list[str], shell: str) -> list[tuple[str, list[str], str | None]]:
    """(line, candidates, DSV4CTL_PROFILE) for the profile-value tests."""
    other = "other.yaml"        # -p / the positional win over the variable
    conditions = ["corruption", "stuck"] if shell == "zsh" else ["corruption=", "stuck="]  # zsh: "=" is compadd's suffix
    return [
        ("dsv4ctl logs -p prof.yaml ", GROUPS, other),                        # logs GROUP, -p
        ("dsv4ctl logs --profile=prof.yaml ", GROUPS, other),
        ("dsv4ctl logs ", GROUPS, "prof.yaml"),                               # DSV4CTL_PROFILE
        ("dsv4ctl logs ", ["solo"], other),
        ("dsv4ctl plan prof.yaml -g ", SERVERS, other),                       # positional PROFILE; no router
        ("dsv4ctl plan prof.yaml --group d", ["decode"], other),
        ("dsv4ctl config set prof.yaml -g ", SERVERS, other),                 # a sub-command
        ("dsv4ctl restart prof.yaml -g ", GROUPS, other),                     # a router restarts
        ("dsv4ctl restart prof.yaml --host ", HOSTS, other),
        ("dsv4ctl logs decode prof.yaml --host ", HOSTS, other),              # PROFILE second
        ("dsv4ctl audit -p prof.yaml --host h", HOSTS, other),
        ("dsv4ctl promote -p prof.yaml ", RELEASES, other),                   # promote RELEASE PROFILE
        ("dsv4ctl rollback prof.yaml --to ", RELEASES, other),
        ("dsv4ctl verify prof.yaml -r ", RELEASES, other),
        ("dsv4ctl plan broken.yaml -g ", [], other),                          # broken: nothing, no error
        ("dsv4ctl restart missing.yaml --host ", [], other),
        ("dsv4ctl watch prof.yaml --on-alert ", runbooks + conditions, None),  # [CONDITION=]RUNBOOK
        ("dsv4ctl watch --on-alert bad", ["bad-release"], None),
        # fish completes the whole word
        ("dsv4ctl watch --on-alert stuck=", [f"stuck={r}" for r in runbooks] if shell == "fish" else runbooks, None),
        ("dsv4ctl runbook run bad", ["bad-release"], None),
    ]


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_the_shells_complete_groups_hosts_releases_and_runbooks_from_the_profile(shell, site, fresh):
    work, env = site
    cases = _profile_value_cases(gen._shipped_stems("playbooks"), shell)
    envs = {var: dict(env, DSV4CTL_PROFILE=var) if var else env for var in {c[2] for c in cases}}
    if shell == "zsh":          # one interactive zsh per environment, every line typed in it
        got = {}
        for var, e in envs.items():
            lines = [c[0] for c in cases if c[2] == var]
            got.update({(line, var): cands for line, cands in zip(lines, zsh_complete_lines(lines, fresh / "_dsv4ctl", work, e))})
    else:
        run, name = (bash_complete, "dsv4ctl.bash") if shell == "bash" else (fish_complete, "dsv4ctl.fish")
        got = {(line, var): run(line, fresh / name, work, envs[var]) for line, _, var in cases}
    for line, want, var in cases:
        # bash keeps the helper's order (releases newest first); fish and zsh sort what they show
        have = got[(line, var)]
        assert (have if shell == "bash" else sorted(have)) == (want if shell == "bash" else sorted(want)), (line, var)


def test_each_install_hint_works_as_typed_on_a_fresh_home(tmp_path):
    # the hint `completion` prints on stderr, run by bash in a home without the folders (issue 46: hints work as typed)
    from dsv4ctl.commands.completion import FILES, INSTALL
    env = {**os.environ, "HOME": str(tmp_path), "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}"}
    for shell, line in INSTALL.items():
        r = subprocess.run(["bash", "-c", line.split("   #", 1)[0]], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (shell, r.stderr)
        target = Path(line.split(" > ", 1)[1].split()[0].replace("~", str(tmp_path), 1))
        assert target.read_text() == (REPO / "completions" / FILES[shell]).read_text(), shell
