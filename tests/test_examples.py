"""Every example a newcomer reads runs with its documented exit code (issue 31, "First hour
without a wrong turn"): each ``dsv4ctl ...`` line of the README's code blocks and each ``--help``
example (:data:`dsv4ctl.commands.examples.EXAMPLES`).

An example exits 0 unless its comment says ``exit N`` (``exit 1 when ...`` names another outcome). It runs offline, as written, in a fresh
folder that holds ``profiles/my.yaml`` from ``dsv4ctl profile init profiles/my.yaml`` (HOME, the
cache and the state folder there too; ``~`` is that HOME; ``> FILE`` and ``&&`` as a shell does;
``[--opt]`` optional parts left out). The examples that act on hosts run in :data:`ON_SSHD`'s
order against real sshd hosts serving the stand-in (a PD deployment with groups prefill, decode
and a router; ``profiles/my.yaml`` is its profile, ``ID`` its release, ``h200-1`` the decode
host). An example that needs more (GPUs, an SGLang git tree, the network, load on servers, a
terminal) is not run: :data:`NOT_RUN` names it and why, and each rule must match an example;
the tests named there run those commands on real hosts and servers. Every example, run or not,
must parse (click, without running it)."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401

#: Host examples run on sshd hosts, in this order (each rule matches at least one example).
ON_SSHD: list[str] = [
    r"^dsv4ctl deploy profiles/my.yaml --dry-run",
    r"^dsv4ctl deploy profiles/my.yaml -m ",            # a second release (the serve configs changed)
    r"^dsv4ctl releases profiles/my.yaml$",
    r"^dsv4ctl status profiles/my.yaml$",
    r"^dsv4ctl verify profiles/my.yaml",
    r"^dsv4ctl hicache status profiles/my.yaml$",
    r"^dsv4ctl logs decode profiles/my.yaml -n 100 --grep",
    r"^dsv4ctl audit profiles/my.yaml --since",
    r"^dsv4ctl exec decode profiles/my.yaml --host",
    r"^dsv4ctl diagnose profiles/my.yaml",
    r"^dsv4ctl watch profiles/my.yaml --once --json$",
    r"^dsv4ctl runbook run toolcall-corruption profiles/my.yaml --dry-run",
    r"^dsv4ctl lock status profiles/my.yaml$",
    r"^dsv4ctl lock acquire profiles/my.yaml -m",
    r"^dsv4ctl lock release profiles/my.yaml",
    r"^dsv4ctl stop profiles/my.yaml -g decode",
    r"^dsv4ctl start profiles/my.yaml",
    r"^dsv4ctl restart profiles/my.yaml",
    r"^dsv4ctl rollback profiles/my.yaml --dry-run",
    r"^dsv4ctl rollback profiles/my.yaml \[--to ID\]",
    r"^dsv4ctl deploy profiles/my.yaml$",
]

#: Rules for examples that are not run, first match wins: (regex on the command, why).
NOT_RUN: list[tuple[str, str]] = [
    (r"^python3 -m venv", "the set-up line itself (tests/test_install.py builds and installs the wheel)"),
    (r"^dsv4ctl profile import srt-slurm\b", "an srt-slurm recipe file (tests/test_profile_import.py imports hand-written ones)"),
    (r"^dsv4ctl deploy profiles/my.yaml -g ", "a limited deploy on hosts (tests/test_exec_limited.py: prefill and decode on their own hosts)"),
    (r"^dsv4ctl exec \S+ profiles/my.yaml -- nvidia-smi", "nvidia-smi on the group's GPU hosts (tests/test_exec_limited.py runs exec on sshd hosts)"),
    (r"^dsv4ctl facts\b", "nvidia-smi over SSH on the profile's hosts (tests/test_facts_write.py on sshd hosts)"),
    (r"^dsv4ctl patch (status|apply|revert|export)\b.*~/src/sglang", "an SGLang git checkout (tests/test_patch_tree.py)"),
    (r"^dsv4ctl config lint --tree ~/src/sglang", "an SGLang git checkout (tests/test_treegate.py)"),
    (r"^dsv4ctl config lint profiles/my.yaml --tree ~/src/sglang", "an SGLang git checkout (tests/test_treegate.py)"),
    (r"^dsv4ctl patch check --base", "the pristine SGLang wheel from the package index (tests/test_patch_oracle.py)"),
    (r"--remote\b", "a release built and restarted on the profile's hosts (tests/test_hicache_remote.py)"),
    (r"--promote\b|^dsv4ctl promote\b", "check smoke and a corruption-gate load on the servers (tests/test_promote.py)"),
    (r"^dsv4ctl logs .* -f\b", "follows the log until Ctrl-C (tests/test_day2.py reads what -f reads)"),
    (r"^dsv4ctl hicache status$", "the running servers' /server_info (tests/test_hicache.py)"),
    (r"^dsv4ctl check (smoke|load)\b", "a running SGLang server or router (tests/test_check_*.py on the stand-in)"),
    (r"^dsv4ctl report plan.json sweep.json", "check results and a runbook run from running servers (tests/test_report.py)"),
    (r"^dsv4ctl runbook run \S+ --resume", "a run folder of an earlier run on hosts (tests/test_runbook_live.py)"),
    (r"^dsv4ctl runbook run \S+( profiles/my.yaml)?( --yes)?$",
     "changes the profile's hosts (tests/test_runbook_live.py, test_runbook_e2e.py)"),
    (r"^dsv4ctl watch profiles/my.yaml (--listen|--on-alert)",
     "probes until stopped (tests/test_watch*.py on the stand-in)"),
    (r"^dsv4ctl watch demo/p.yaml", "the README's demo files beside the stand-in it starts "
                                    "(tests/test_watch.py: test_the_readme_demo_runs_as_written)"),
]


def _comment_split(line: str) -> tuple[str, str]:
    """(command, comment) of an example line: the comment is what follows a ``#`` outside quotes."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=False)
    lex.whitespace_split = True
    lex.commenters = "#"
    try:
        words = list(lex)
    except ValueError:
        words = []
    cmd = line
    if "#" in line:
        # the comment starts at the first '#' that shlex treated as a comment
        for i in range(len(line)):
            if line[i] == "#" and (i == 0 or line[i - 1] in " \t"):
                head = line[:i]
                if head.count("'") % 2 == 0 and head.count('"') % 2 == 0:
                    cmd = head
                    return cmd.strip(), line[i + 1:].strip()
    return cmd.strip(), ""


def readme_examples() -> list[tuple[str, str, str]]:
    """(where, command, comment) of each ``dsv4ctl`` line in the README's code blocks."""
    out = []
    fence = False
    for i, ln in enumerate((REPO / "README.md").read_text().splitlines(), 1):
        if re.match(r"\s*```", ln):
            fence = not fence
            continue
        if fence and re.match(r"\s*(python3 -m venv .*)?(\.venv/bin/)?dsv4ctl\b|\s*python3 -m venv .*dsv4ctl", ln):
            cmd, comment = _comment_split(ln.strip())
            out.append((f"README.md:{i}", cmd, comment))
    return out


def help_examples() -> list[tuple[str, str, str]]:
    from dsv4ctl.commands.examples import EXAMPLES
    return [(f"--help of {path}", *_comment_split(ex)) for path, exs in EXAMPLES.items() for ex in exs]


ALL = readme_examples() + help_examples()


def expected_exit(comment: str) -> int:
    """The exit code an example's comment states (``fails (exit 1): ...``); 0 when it states none.
    ``exit 1 when a probe is not ok`` says what else can happen, not what this run does."""
    m = re.search(r"\bexit (\d+)\b(?!\s+(?:when|if|while|unless|on)\b)", comment)
    return int(m[1]) if m else 0


def not_offline(cmd: str):
    return next(((rx, why) for rx, why in NOT_RUN if re.search(rx, cmd)), None) or \
        next(((rx, "run on sshd hosts") for rx in ON_SSHD if re.search(rx, cmd)), None)


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A folder with ``profiles/my.yaml`` (and its serve configs) as ``profile init`` writes it."""
    d = tmp_path_factory.mktemp("examples-template")
    r = run_cli("profile", "init", "profiles/my.yaml", cwd=d, env=_env(d))
    assert r.code == 0, r.err
    return d


def _env(home: Path) -> dict:
    return {"HOME": str(home), "DSV4CTL_STATE_DIR": str(home / ".local/state/dsv4ctl"),
            "DSV4CTL_CACHE": str(home / ".cache/dsv4ctl"), "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_STATE_HOME": str(home / ".local/state"), "DSV4CTL_PROFILE": ""}


def run_example(cmd: str, cwd: Path):
    """Run ``cmd`` (``dsv4ctl ...``, ``A && B``, ``... > FILE``) as a shell would; the last result."""
    r = None
    for part in cmd.split(" && "):
        part = re.sub(r"\s*\[[^\]]*\]", "", part)           # optional parts: [--json], [--to ID]
        words = [str(cwd) + w[1:] if w.startswith("~/") else w for w in shlex.split(part)]
        out_file = None
        if ">" in words:
            i = words.index(">")
            out_file, words = words[i + 1], words[:i]
            out_file = cwd / out_file.lstrip("/")            # /etc/...: inside the test's folder
        assert words[0] == "dsv4ctl", cmd
        r = run_cli(*words[1:], cwd=cwd, env=_env(cwd), timeout=180)
        if out_file is not None:
            out_file.parent.mkdir(parents=True, exist_ok=True)
            out_file.write_text(r.out)
        if r.code != 0:
            return r
    return r


OFFLINE = [(w, c, m) for w, c, m in ALL if not not_offline(c)]


def test_the_examples_are_found_and_every_rule_is_used():
    assert len(readme_examples()) >= 60 and len(help_examples()) >= 50
    unused = [rx for rx, _ in NOT_RUN if not any(re.search(rx, c) for _, c, _ in ALL)]
    unused += [rx for rx in ON_SSHD if not any(re.search(rx, c) and not_offline(c)[1] == "run on sshd hosts"
                                               for _, c, _ in ALL)]
    assert unused == []
    assert len(OFFLINE) >= 30


@pytest.mark.parametrize("where,cmd,comment", OFFLINE, ids=[f"{w}: {c}" for w, c, _ in OFFLINE])
def test_example_runs_with_its_documented_exit_code(template, tmp_path, where, cmd, comment):
    cwd = tmp_path / "w"
    if re.match(r"dsv4ctl profile init profiles/my.yaml\b", cmd):
        cwd.mkdir()                                          # the example makes it
    else:
        shutil.copytree(template, cwd, symlinks=True)
    r = run_example(cmd, cwd)
    want = expected_exit(comment)
    assert r.code == want, f"{where}: {cmd}: exit {r.code}, documented {want}\n{r.err[-2000:]}"
    if want == 0:
        assert "Traceback" not in r.err


def _resolve(words: list[str]):
    """(command path, click command, remaining words) of ``dsv4ctl WORDS``."""
    import typer

    from dsv4ctl.cli import build_app
    cmd, path = typer.main.get_command(build_app()), []
    while hasattr(cmd, "commands") and words and words[0] in cmd.commands:
        path.append(words[0])
        cmd = cmd.commands[words.pop(0)]
    return " ".join(path), cmd, words


@pytest.mark.parametrize("where,cmd,comment", ALL, ids=[f"{w}: {c}" for w, c, _ in ALL])
def test_every_example_parses(where, cmd, comment):
    """Examples that are not run offline still name real commands and options with values they
    take (click parses each, without running it)."""
    if cmd.startswith("python3 -m venv"):
        cmd = cmd.split(" && ")[-1].replace(".venv/bin/", "")
    for part in cmd.split(" && "):
        part = re.sub(r"\s*\[[^\]]*\]", "", part).split(" > ")[0]
        words = shlex.split(part)
        assert words[0] == "dsv4ctl", (where, cmd)
        path, c, rest = _resolve(words[1:])
        assert not hasattr(c, "commands"), f"{where}: {cmd}: not a command"
        c.make_context(f"dsv4ctl {path}", rest)


@pytest.mark.sshd
def test_host_examples_on_sshd_hosts(live_cluster, tmp_path):
    """The examples that act on hosts, in :data:`ON_SSHD`'s order, on a PD deployment of the
    stand-in on real sshd hosts, each with its documented exit code (a command line that README
    and --help both show, with the same documented exit code, runs once; lock lines always run)."""
    from tests.sshd.promote_world import PromoteWorld
    w = PromoteWorld(live_cluster, tmp_path, pd=True)
    try:
        r = run_cli("deploy", str(w.profile), "--json", env=w.env(), timeout=300)
        assert r.code == 0, r.err
        ran, done = [], set()
        for rx in ON_SSHD:
            if rx.startswith(r"^dsv4ctl deploy profiles/my.yaml -m "):
                w.extra = {"log-level": "info"}                # changed serve configs: a new release
                w.hicache(False)
            for where, cmd, comment in ALL:
                if not re.search(rx, cmd):
                    continue
                rid = w.current(w.hosts[0].name)
                words = shlex.split(re.sub(r"\s*\[[^\]]*\]", "", cmd))
                words = [str(w.profile) if x == "profiles/my.yaml" else rid if x == "ID" else
                         w.hosts[1].name if x == "h200-1" else x for x in words]
                want = expected_exit(comment)
                if (tuple(words), want) in done and words[1] != "lock":
                    ran.append(cmd)         # the same command line, documented twice (README and --help): run once
                    continue
                if words[1:3] == ["lock", "acquire"]:      # README's and --help's: the earlier one gives it back
                    assert run_cli("lock", "release", str(w.profile), env=w.env(), timeout=120).code == 0
                r = run_cli(*words[1:], env=w.env(), timeout=300)
                assert r.code == want, f"{where}: {cmd}: exit {r.code}, documented {want}\n{r.err[-3000:]}"
                done.add((tuple(words), want))
                ran.append(cmd)
        assert len(ran) >= 30
    finally:
        w.stop_services()
