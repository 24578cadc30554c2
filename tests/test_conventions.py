"""Conventions operators expect (issue 18): completions and schemas from the tool, a starting
profile, examples in every --help, --json vs --markdown, --version --json, ASCII tables off a
terminal, NO_COLOR, 80-column tables, one cache and one state folder, the parsed-YAML cache
pruned, shipped files never edited, a serve config that is not a regular file."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
import typer.main

from tests.conftest import REPO, run_cli


def _commands():
    from dsv4ctl.cli import build_app
    out = []

    def walk(c, path=()):
        for n, sub in sorted(getattr(c, "commands", {}).items()):
            if getattr(sub, "commands", None):
                walk(sub, path + (n,))
            else:
                out.append(" ".join(path + (n,)))
    walk(typer.main.get_command(build_app()))
    return out


def test_every_command_has_examples_in_its_help():
    from dsv4ctl.commands.examples import EXAMPLES
    cmds = _commands()
    assert sorted(set(cmds) - set(EXAMPLES)) == []       # add the new command to dsv4ctl/commands/examples.py
    assert sorted(set(EXAMPLES) - set(cmds)) == []
    for path, ex in EXAMPLES.items():
        assert 1 <= len(ex) <= 2 and all(e.startswith("dsv4ctl ") for e in ex), path
    r = run_cli("patch", "check", "--help")
    assert r.code == 0
    assert r.out.rstrip().endswith("Examples:\n    dsv4ctl patch check --base sglang==0.5.23\n"
                                   "    dsv4ctl patch check --dry-run          # what it would fetch; no network")


def test_json_with_markdown_is_a_usage_error():
    for argv in (["plan", "--json", "--markdown"], ["config", "lint", "--markdown", "--json"]):
        r = run_cli(*argv)
        assert r.code == 2 and r.out == ""
        assert r.err == "dsv4ctl: error: --json and --markdown cannot be used together (pick one output format)\n"


def test_version_json():
    r = run_cli("--version", "--json")
    assert r.code == 0
    doc = json.loads(r.out)
    assert doc["schema"] == "dsv4ctl.version/1" and doc["dsv4ctl"] == "0.1.0" and doc["sglang"] == "0.5.23"
    assert doc["sglang_supported"] == ["0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"]
    assert Path(doc["shipped"]) == REPO          # a checkout reads its own folders
    assert run_cli("--version").out == "dsv4ctl 0.1.0 (SGLang 0.5.18, 0.5.19, 0.5.20, 0.5.21, 0.5.22, 0.5.23)\n"


@pytest.mark.parametrize("shell,name", [("bash", "dsv4ctl.bash"), ("zsh", "_dsv4ctl"), ("fish", "dsv4ctl.fish")])
def test_completion_prints_the_shipped_script(shell, name):
    r = run_cli("completion", shell)
    assert r.code == 0 and r.out == (REPO / "completions" / name).read_text()


def test_completion_unknown_shell():
    r = run_cli("completion", "tcsh")
    assert r.code == 2 and r.err == "dsv4ctl: error: completion: unknown shell 'tcsh' (bash, zsh or fish)\n"


def test_schema_command():
    r = run_cli("schema", "--json")
    assert [s["name"] for s in json.loads(r.out)["schemas"]] == ["check-load", "plan", "playbook", "profile", "watch"]
    r = run_cli("schema", "profile")
    assert r.code == 0 and json.loads(r.out)["title"] == "dsv4ctl profile"
    r = run_cli("schema", "profile", "--path")
    assert r.out.strip() == str(REPO / "dsv4ctl/data/schemas/profile.schema.json")
    r = run_cli("schema", "nope")
    assert r.code == 2 and r.err == ("dsv4ctl: error: schema: unknown schema 'nope' "
                                     "(one of: check-load, plan, playbook, profile, watch)\n")


def test_shipped_profile_names_its_schema():
    first = (REPO / "profiles/dsv4-flash-8xb200-pd.yaml").read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=../dsv4ctl/data/schemas/profile.schema.json"
    assert (REPO / "profiles" / first.split("=", 1)[1]).resolve() == REPO / "dsv4ctl/data/schemas/profile.schema.json"


def test_profile_list_and_show():
    r = run_cli("profile", "list", "--json")
    assert json.loads(r.out)["schema"] == "dsv4ctl.profiles/1"
    assert json.loads(r.out)["profiles"] == [
        {"name": "dsv4-flash-8xb200-pd", "path": str(REPO / "profiles/dsv4-flash-8xb200-pd.yaml")},
        {"name": "dsv4-pro-4xh200-pd", "path": str(REPO / "profiles/dsv4-pro-4xh200-pd.yaml")}]
    r = run_cli("profile", "show", "dsv4-flash-8xb200-pd")
    assert r.code == 0
    assert r.out.startswith((REPO / "profiles/dsv4-flash-8xb200-pd.yaml").read_text())
    assert r.out.endswith(f"# serve config of prefill: {REPO}/profiles/dsv4-flash-8xb200-pd/prefill.yaml\n"
                          f"# serve config of decode: {REPO}/profiles/dsv4-flash-8xb200-pd/decode.yaml\n")
    r = run_cli("profile", "show", "nope")
    assert r.code == 2 and r.err == "dsv4ctl: error: nope: no such profile (shipped: dsv4-flash-8xb200-pd, dsv4-pro-4xh200-pd)\n"


def test_profile_init_writes_a_commented_profile_and_its_serve_configs(tmp_path):
    r = run_cli("profile", "init", "prod", cwd=tmp_path)       # ".yaml" is added to a bare name
    assert r.code == 0, r.err
    assert r.out.splitlines() == [f"wrote prod.yaml", "wrote prod/prefill.yaml", "wrote prod/decode.yaml",
                                  "wrote prod/profile.schema.json",
                                  "next: edit hosts and sglang.tree, then: dsv4ctl plan prod.yaml"]
    text = (tmp_path / "prod.yaml").read_text()
    # portable: nothing of the installation's own path (a reinstall elsewhere must not break it)
    assert text.splitlines()[:2] == [
        "# yaml-language-server: $schema=prod/profile.schema.json",
        "# Written by `dsv4ctl profile init` (dsv4ctl 0.1.0) from dsv4-flash-8xb200-pd.yaml."]
    assert str(REPO) not in text
    assert (tmp_path / "prod/profile.schema.json").read_text() == \
        (REPO / "dsv4ctl/data/schemas/profile.schema.json").read_text()
    assert "\nname: prod\n" in text
    assert "    serve_config: prod/prefill.yaml\n" in text and "    serve_config: prod/decode.yaml\n" in text
    assert "  series: sglang-0.5.23  # the shipped series, by name;" in text
    from dsv4ctl.profile.deployment import load_deployment
    assert load_deployment(tmp_path / "prod.yaml").sglang.series == REPO / "patches/sglang-0.5.23"
    # a folder of that name beside the profile is taken first (a copy the operator made)
    (tmp_path / "sglang-0.5.23").mkdir()
    assert load_deployment(tmp_path / "prod.yaml").sglang.series == tmp_path / "sglang-0.5.23"
    (tmp_path / "sglang-0.5.23").rmdir()
    for g in ("prefill", "decode"):
        assert (tmp_path / "prod" / f"{g}.yaml").read_text() == \
            (REPO / "profiles/dsv4-flash-8xb200-pd" / f"{g}.yaml").read_text()
    plan = run_cli("plan", "prod.yaml", "--json", cwd=tmp_path)
    assert plan.code == 0 and plan.json()["profile"] == "prod"
    assert plan.json()["groups"] == run_cli("plan", "--json").json()["groups"]   # same deployment
    # again: refused, nothing overwritten
    (tmp_path / "prod/decode.yaml").write_text("mine\n")
    r = run_cli("profile", "init", "prod.yaml", cwd=tmp_path)
    assert r.code == 2 and r.err == "dsv4ctl: error: prod.yaml: already exists (--force overwrites)\n"
    assert (tmp_path / "prod/decode.yaml").read_text() == "mine\n"
    r = run_cli("profile", "init", "prod.txt", cwd=tmp_path)
    assert r.code == 2 and r.err == "dsv4ctl: error: prod.txt: a profile file ends in .yaml or .yml\n"
    # a name the profile schema would refuse (quotes, spaces, an ESC): exit 2 and nothing written
    before = sorted(p.name for p in tmp_path.iterdir())
    for bad in ("a b'q\".yaml", "esc\x1b[2J.yaml"):
        r = run_cli("profile", "init", bad, cwd=tmp_path)
        assert r.code == 2 and "the file name before .yaml becomes the profile's name" in r.err, r.err
        assert "\x1b" not in r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_profile_init_of_a_path_that_is_not_utf8_is_a_one_line_error(tmp_path):
    """A file or folder name with bytes that are not UTF-8 (``$'\\xff'.yaml``) cannot be written
    into the profile's UTF-8 text: exit 2, one line showing the bytes, nothing written (it was a
    UnicodeEncodeError traceback, leaving ``.\\xff.yaml.tmp`` behind)."""
    os.mkdir(os.fsencode(tmp_path) + b"/d\xfe")
    for path, shown in (("\udcff.yaml", "\\xff.yaml"), ("d\udcfe/prod.yaml", "d\\xfe/prod.yaml")):
        r = run_cli("profile", "init", path, cwd=tmp_path)
        assert r.code == 2 and "Traceback" not in r.err
        assert r.err == (f"dsv4ctl: error: {shown}: the path is not valid UTF-8; a profile names its file and "
                         "serve configs in UTF-8 text: choose a UTF-8 path\n")
    assert os.listdir(os.fsencode(tmp_path)) == [b"d\xfe"] and os.listdir(os.fsencode(tmp_path) + b"/d\xfe") == []
    # a UTF-8 name inside a folder whose own name is not UTF-8: the profile holds relative paths only
    r = run_cli("profile", "init", "prod.yaml", cwd=Path(os.fsdecode(os.fsencode(tmp_path) + b"/d\xfe")))
    assert r.code == 0, r.err
    assert sorted(os.listdir(os.fsencode(tmp_path) + b"/d\xfe")) == [b"prod", b"prod.yaml"]
    # --from a profile whose own name is not UTF-8: named in the header's comment as \xNN
    src = Path(os.fsdecode(os.fsencode(tmp_path) + b"/d\xfe/prod.yaml"))
    os.rename(src, os.fsdecode(os.fsencode(tmp_path) + b"/d\xfe/\xfc.yaml"))
    r = run_cli("profile", "init", "copy.yaml", "--from", "d\udcfe/\udcfc.yaml", cwd=tmp_path)
    assert r.code == 0 and "Traceback" not in r.err, r.err
    assert "from \\xfc.yaml.\n" in (tmp_path / "copy.yaml").read_text()
    # a relative series inside a folder that is not UTF-8 cannot be written as an absolute path
    (tmp_path / "ok").mkdir()
    text = (REPO / "profiles/dsv4-flash-8xb200-pd.yaml").read_text().replace(
        "series: ../patches/sglang-0.5.23", "series: ../d\udcfe")
    assert "series: ../d\udcfe" in text
    (tmp_path / "ok" / "p.yaml").write_text(text.replace("\udcfe", "-x"))
    os.symlink(REPO / "profiles/dsv4-flash-8xb200-pd", tmp_path / "ok" / "dsv4-flash-8xb200-pd")
    import shutil
    shutil.copytree(REPO / "patches/sglang-0.5.23", os.fsdecode(os.fsencode(tmp_path) + b"/d\xfe/series"))
    os.symlink(os.fsencode(tmp_path) + b"/d\xfe/series", tmp_path / "d-x")
    r = run_cli("profile", "init", "third.yaml", "--from", "ok/p.yaml", cwd=tmp_path)
    assert r.code == 2 and "Traceback" not in r.err, r.err
    assert r.err.startswith(f"dsv4ctl: error: {tmp_path}/d\\xfe/series: p.yaml's sglang.series: the path is not "
                            "valid UTF-8")
    assert not (tmp_path / "third.yaml").exists()


def test_profile_init_refuses_the_shipped_folder():
    target = REPO / "profiles/dsv4-flash-8xb200-pd.yaml"
    before = target.read_bytes()
    r = run_cli("profile", "init", str(target), "--force")
    assert r.code == 2
    assert r.err == f"dsv4ctl: error: {target}: inside dsv4ctl's shipped data; write your profile elsewhere\n"
    assert target.read_bytes() == before


def test_a_mutating_command_never_edits_the_shipped_profile(tmp_path):
    """From another folder, `hicache off` with the shipped profile (by name or DSV4CTL_PROFILE)
    is refused before anything is written."""
    cfg = REPO / "profiles/dsv4-flash-8xb200-pd/prefill.yaml"
    before = cfg.read_bytes()
    for argv, env in ((["hicache", "off", "dsv4-flash-8xb200-pd", "-g", "prefill"], {}),
                      (["hicache", "off", "-g", "prefill"], {"DSV4CTL_PROFILE": "dsv4-flash-8xb200-pd"})):
        r = run_cli(*argv, cwd=tmp_path, env=env)
        assert r.code == 2, r.err
        assert r.err == (f"dsv4ctl: error: {cfg}: shipped with dsv4ctl, not edited; start from your own copy: "
                         "dsv4ctl profile init my-profile.yaml\n")
        assert cfg.read_bytes() == before
    # --remote: refused before any host is contacted (it would rewrite the local copy afterwards)
    r = run_cli("hicache", "off", "dsv4-flash-8xb200-pd", "-g", "prefill", "--remote", cwd=tmp_path)
    assert r.code == 2 and "shipped with dsv4ctl, not edited" in r.err and cfg.read_bytes() == before
    r = run_cli("hicache", "off", "dsv4-flash-8xb200-pd", "-g", "prefill", "--dry-run", cwd=tmp_path)
    # the dry run is the run: it refuses the same way, before printing a diff it would never write
    assert r.code == 2 and "profile init" in r.err and "would write" not in r.out


def test_a_copy_that_points_at_shipped_serve_configs_is_refused_too(tmp_path):
    """`cp profiles/x.yaml profiles/my.yaml` keeps the relative serve_config paths: the serve
    configs edited would be the shipped ones."""
    mine = REPO / "profiles" / f"tmp-{os.getpid()}.yaml"
    mine.write_text((REPO / "profiles/dsv4-flash-8xb200-pd.yaml").read_text().replace(
        "name: dsv4-flash-8xb200-pd", "name: mine"))
    try:
        r = run_cli("hicache", "off", str(mine), "-g", "prefill")
        assert r.code == 2 and "shipped with dsv4ctl, not edited" in r.err
    finally:
        mine.unlink()


@pytest.mark.parametrize("kind", ["folder", "device"])
def test_a_serve_config_that_is_not_a_regular_file(tmp_path, kind):
    r = run_cli("profile", "init", "p.yaml", cwd=tmp_path)
    assert r.code == 0
    cfg = tmp_path / "p" / "decode.yaml"
    cfg.unlink()
    if kind == "folder":
        cfg.mkdir()
        target = cfg
    else:
        text = (tmp_path / "p.yaml").read_text().replace("serve_config: p/decode.yaml", "serve_config: /dev/null.yaml")
        (tmp_path / "p.yaml").write_text(text)
        os.symlink("/dev/zero", tmp_path / "zero.yaml")
        text = text.replace("serve_config: /dev/null.yaml", "serve_config: zero.yaml")
        (tmp_path / "p.yaml").write_text(text)
        target = tmp_path / "zero.yaml"
    r = run_cli("plan", "p.yaml", cwd=tmp_path)
    assert r.code == 2
    what = "a folder" if kind == "folder" else "a device, pipe or socket"
    rel = "p/decode.yaml" if kind == "folder" else "zero.yaml"
    assert r.err == f"dsv4ctl: error: p.yaml:53: groups[1].serve_config: not a regular file ({what}) {rel}\n"
    # the one YAML reader says the same for any caller
    from dsv4ctl.errors import InputError
    from dsv4ctl.profile.yamlpos import read_yaml_bytes
    with pytest.raises(InputError) as e:
        read_yaml_bytes(target)
    assert str(e.value) == f"{target}: not a regular file ({'a folder' if kind == 'folder' else 'a device'})"


# -- output ------------------------------------------------------------------------------------

class _Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self._tty = tty

    def isatty(self):
        return self._tty


def test_no_color_is_honoured(monkeypatch):
    from dsv4ctl import render
    out = _Stream(True)
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert render.styled("x", "bold red", out) == "\x1b[1;31mx\x1b[0m"
    monkeypatch.setenv("NO_COLOR", "1")
    assert render.styled("x", "bold red", out) == "x"
    monkeypatch.setattr("sys.stdout", _Stream(True))
    assert render.console().no_color is True
    monkeypatch.delenv("NO_COLOR")
    assert render.console().no_color is False
    assert render.styled("x", "bold", _Stream(False)) == "x"          # not a terminal: never


def test_no_color_through_the_cli_on_a_terminal():
    """The CLI on a pseudo-terminal: coloured without NO_COLOR, plain with it."""
    import pty
    import subprocess
    import sys

    def run(no_color: bool) -> bytes:
        master, slave = pty.openpty()
        env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
        env.update(COLUMNS="200", TERM="xterm-256color")
        if no_color:
            env["NO_COLOR"] = "1"
        p = subprocess.Popen([sys.executable, "-m", "dsv4ctl.cli", "plan"], stdout=slave, stderr=slave,
                             env=env, cwd=REPO)
        os.close(slave)
        chunks = []
        while True:
            try:
                b = os.read(master, 65536)
            except OSError:
                break
            if not b:
                break
            chunks.append(b)
        p.wait(timeout=60)
        os.close(master)
        return b"".join(chunks)
    assert b"\x1b[" in run(False)
    plain = run(True)
    assert b"\x1b[" not in plain and b"per rank" in plain


def test_tables_are_ascii_off_a_terminal():
    r = run_cli("plan")
    assert r.code == 0
    body = r.out.splitlines()
    assert body[1].startswith("+--") and body[2].startswith("| per rank ")
    assert all(ord(ch) < 128 or ch == "·" for line in body[:30] for ch in line if line.startswith(("+", "|")))
    r = run_cli("config", "lint")
    assert "+--" in r.out and "┃" not in r.out and "━" not in r.out


def test_tables_at_80_columns_wrap_the_message_not_the_path():
    from dsv4ctl.serve.lint import Finding  # noqa: F401  (the lint table is the widest one)
    r = run_cli("config", "lint", env={"COLUMNS": "80"})
    assert r.code == 0
    path = f"{REPO}/profiles/dsv4-flash-8xb200-pd/prefill.yaml:15"
    lines = r.out.splitlines()
    assert any(path in line for line in lines)                 # the path whole, on one line
    assert all(len(line.rstrip()) <= 80 for line in lines), lines
    msg = " ".join(line.strip() for line in lines if line.startswith("    "))
    assert msg == ("bf16 index-K with HiCache: cannot check that the index-K read waits for the HiCache "
                   "layer transfer (give sglang.tree or --tree)")


def test_the_progress_bar_writes_nothing_off_a_terminal(tmp_path):
    from tests.standin.harness import standin, write_config
    cfg = write_config(tmp_path / "s.yaml")
    with standin(cfg, "--ttft-ms", "1", "--itl-ms", "0.1") as url:
        r = run_cli("check", "load", url, "-c", "2", "--turns", "2", "--min-requests", "0", "--max-corruption", "0.6", "--json")
    assert r.code in (0, 1), r.err
    assert r.err == ""                       # no bar, no final bar line
    assert json.loads(r.out)["schema"] == "dsv4ctl.check.load/1"


# -- folders -----------------------------------------------------------------------------------

def test_cache_and_state_folders(monkeypatch, tmp_path):
    from dsv4ctl import resources
    for v in ("DSV4CTL_CACHE", "DSV4CTL_STATE_DIR", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resources.cache_root() == tmp_path / ".cache/dsv4ctl"
    assert resources.state_root() == tmp_path / ".local/state/dsv4ctl"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xc"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xs"))
    assert resources.cache_root() == tmp_path / "xc/dsv4ctl"
    assert resources.state_root() == tmp_path / "xs/dsv4ctl"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")          # the XDG spec: absolute only
    assert resources.cache_root() == tmp_path / ".cache/dsv4ctl"
    monkeypatch.setenv("DSV4CTL_CACHE", str(tmp_path / "c"))
    monkeypatch.setenv("DSV4CTL_STATE_DIR", str(tmp_path / "s"))
    assert resources.cache_root() == tmp_path / "c" and resources.state_root() == tmp_path / "s"


def test_promotion_evidence_is_state_not_cache(monkeypatch, tmp_path):
    from dsv4ctl.deploy.promote import evidence_dir
    monkeypatch.setenv("DSV4CTL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DSV4CTL_STATE_DIR", str(tmp_path / "state"))
    assert evidence_dir("r1", "20261201T000000Z") == tmp_path / "state/evidence/r1/20261201T000000Z"


def test_xdg_cache_home_is_where_plan_caches(tmp_path):
    r = run_cli("plan", "--json", env={"XDG_CACHE_HOME": str(tmp_path / "xc"), "DSV4CTL_CACHE": "",
                                       "HOME": str(tmp_path / "home")})
    assert r.code == 0
    assert list((tmp_path / "xc/dsv4ctl/yaml").glob("*.json"))
    assert not (tmp_path / "home").exists()


def test_parsed_yaml_cache_is_pruned(monkeypatch, tmp_path):
    from dsv4ctl.profile import yamlpos
    monkeypatch.setenv("DSV4CTL_CACHE", str(tmp_path))
    monkeypatch.setattr(yamlpos, "CACHE_MAX", 5)
    monkeypatch.setattr(yamlpos, "CACHE_KEEP", 3)
    (tmp_path / "valid-profiles").mkdir()
    (tmp_path / "valid-profiles" / "x").write_text("legacy")
    for i in range(6):
        f = tmp_path / f"doc{i}.yaml"
        f.write_text(f"a: {i}\n")
        yamlpos.load_yaml(f)
        os.utime(yamlpos._cache_file(f"a: {i}\n"), (1000 + i, 1000 + i))     # doc5 newest
    kept = sorted(p.name for p in (tmp_path / "yaml").iterdir())
    assert kept == sorted(yamlpos._cache_file(f"a: {i}\n").name for i in (3, 4, 5))
    assert not (tmp_path / "valid-profiles").exists()


def test_every_dsv4ctl_variable_is_in_the_readme_table():
    import re
    used = set()
    for p in list((REPO / "dsv4ctl").rglob("*.py")) + list((REPO / "scripts").glob("*")) + \
            list((REPO / "tests").rglob("*.py")) + list((REPO / "benchmarks").glob("*.py")):
        if p.is_file():
            used |= set(re.findall(r"\bDSV4CTL_[A-Z_]+[A-Z]\b", p.read_text(errors="replace")))
    readme = (REPO / "README.md").read_text()
    table = readme.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(DSV4CTL_[A-Z_]+)`", table, re.M))
    assert sorted(used - listed) == []
    assert sorted(listed - used) == []


def test_a_reader_that_goes_away_does_not_change_the_exit_code(tmp_path):
    """`dsv4ctl plan | head -1`: the verdict's exit code (0 fits, 1 does not), never a
    BrokenPipeError's 1 and nothing on stderr."""
    import subprocess
    import sys
    from tests.conftest import REPO
    py = f"PYTHONPATH={REPO} {sys.executable} -m dsv4ctl.cli"
    for args, code in (("plan", 0), ("plan --set mem_fraction_static=0.95 -g decode", 1)):
        p = subprocess.run(["bash", "-c", f"cd {REPO} && {py} {args} 2>{tmp_path}/err.txt | head -c 1 >/dev/null; "
                                          f"echo ${{PIPESTATUS[0]}}; cat {tmp_path}/err.txt"],
                           capture_output=True, text=True, timeout=60)
        status, *err = p.stdout.splitlines()
        assert int(status) == code and not [ln for ln in err if "Broken" in ln or "Traceback" in ln]


def test_profile_init_never_writes_inside_the_package(tmp_path):
    from tests.conftest import REPO
    r = run_cli("profile", "init", str(REPO / "dsv4ctl" / "data" / "x.yaml"), cwd=tmp_path)
    assert r.code == 2 and "inside dsv4ctl's shipped data" in r.err
    assert not (REPO / "dsv4ctl" / "data" / "x.yaml").exists()


@pytest.mark.parametrize("err,line,code", [
    ("gate", "dsv4ctl: gate failed: deploy of r1 rolled back to r0 on all hosts (h0): unhealthy", 1),
    ("gate3", "dsv4ctl: gate failed: rollback to r0 failed its health gate; hosts put back on r1: x", 3),
    ("verdict", "dsv4ctl: check failed: patch check: x", 1),
    ("failed", "dsv4ctl: failed: runbook r stopped at s", 1),
    ("plan", "dsv4ctl: plan fails: decode: the pools do not fit", 1),
])
def test_a_failed_gate_is_a_verdict_not_an_error(monkeypatch, capsys, err, line, code):
    # a failed health / promotion gate prints "gate failed", never "error"; exit codes unchanged
    from dsv4ctl import cli
    from dsv4ctl.errors import EXIT_REMOTE, GateFailed, PlanFails, VerdictError
    exc = {"gate": GateFailed("deploy of r1 rolled back to r0 on all hosts (h0): unhealthy"),
           "gate3": GateFailed("rollback to r0 failed its health gate; hosts put back on r1: x", EXIT_REMOTE),
           "verdict": VerdictError("patch check: x", label="check failed"),
           "failed": VerdictError("runbook r stopped at s"),
           "plan": PlanFails("decode: the pools do not fit")}[err]

    def app(*a, **k):
        raise exc
    monkeypatch.setattr(cli, "build_app", lambda *a, **k: app)
    assert cli.main(["plan"]) == code
    assert capsys.readouterr().err.strip() == line


def test_no_verdict_prints_error():
    """Exit 1 is a verdict: every raise of exit code 1 under dsv4ctl/ is a VerdictError (printed
    with its verdict word), never a DsvError with EXIT_FAILED (printed as ``error``)."""
    import ast
    from tests.conftest import REPO
    bad = []
    for path in (REPO / "dsv4ctl").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "DsvError":
                args = list(node.args[1:]) + [k.value for k in node.keywords if k.arg == "exit_code"]
                if any(isinstance(a, ast.Name) and a.id == "EXIT_FAILED" or isinstance(a, ast.Constant) and a.value == 1
                       for a in args):
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert bad == []
