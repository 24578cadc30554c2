"""``dsv4ctl exec``'s host command (a builder: pure, the exact text a run sends and ``--dry-run``
prints) and the reading of its result.

On the host the command runs in the active release's folder (``<root>/current``, resolved: the
release the host's servers were started from), with the group's environment as that release
launched it (``env`` of the group's entry in ``current/launch.json``: the values stay on the host,
no secret is in the command text) plus ``DSV4CTL_GROUP``, ``DSV4CTL_RELEASE``,
``DSV4CTL_REPLICA`` and ``DSV4CTL_NODE_RANK``, and with the release's own Python environment's
``bin`` first on ``PATH`` when it has one (``python_env``: the interpreter its servers run). The
operator's words are joined with spaces and run by the host's ``sh -c`` (as ``ssh HOST CMD``
does), stdin closed. One audit line (``action: exec``, the command, its exit status) is appended
after it, whatever it returned."""

from __future__ import annotations

from dataclasses import dataclass

from ..remote import q
from .audit import append_cmd, record_fields
from .layout import Paths

#: Exit status of the host command when the command could not start there (no active release,
#: the group not in it): with :data:`NOT_RUN` as the last stderr line.
NOT_RUN_STATUS = 125
NOT_RUN = "dsv4ctl-exec: not run: "
#: The first stderr line of a command that starts: the release it runs in.
IN_RELEASE = "dsv4ctl-exec: release "

#: Reads the group's entry of ``launch.json`` (argv: group, deploy root) and prints ``export``
#: lines for its env and its Python environment's bin folder; exit 3 when the group is not there.
_ENV_PY = ('import json,shlex,sys;s=json.load(open("launch.json")).get(sys.argv[1]);'
           'isinstance(s,dict) or sys.exit(3);e=s.get("env") or {};pe=s.get("python_env");'
           'print("\\n".join(["export "+shlex.quote("%s=%s"%(k,e[k])) for k in sorted(e)]+'
           '(["export PATH="+shlex.quote(sys.argv[2]+"/envs/"+pe+"/bin")+":\\"$PATH\\""] if pe else [])))')


def command_text(words: list[str] | tuple[str, ...]) -> str:
    """The operator's words as the host's shell gets them: joined with spaces, as ``ssh`` does
    (``-- 'nvidia-smi | head -3'`` keeps its pipe; ``-- nvidia-smi -L`` is two words)."""
    return " ".join(words)


def exec_command(p: Paths, python: str, group: str, replica: int, rank: int, words, message: str | None,
                 host: str) -> str:
    """The one shell command ``exec`` runs on ``host`` for ``group``'s node ``rank`` of replica
    ``replica``: cd into the active release, export the group's launch env, run the words with
    ``sh -c`` (stdin /dev/null), append the audit line, exit with the command's status. When the
    command cannot start (no ``current``, the group not in the release, ``python`` missing) it
    prints :data:`NOT_RUN` + why on stderr and exits :data:`NOT_RUN_STATUS` without an audit line."""
    cmd = command_text(words)
    fields = {"group": group, **({"message": message} if message else {})}
    ok = append_cmd(p.audit, record_fields(host, "exec", "ok", cmd[:500], **fields))
    bad = append_cmd(p.audit, record_fields(host, "exec", "failed", cmd[:500], **fields))

    def not_run(why: str) -> str:
        return f"{{ echo {q(NOT_RUN + why)} >&2; exit {NOT_RUN_STATUS}; }}"
    return (f"cd {q(p.current)} 2>/dev/null && cd -P . || {not_run(f'no active release ({p.current})')}; "
            f"rel=$(basename \"$PWD\"); echo \"{IN_RELEASE}$rel\" >&2; "
            f"envs=$({q(python)} -c {q(_ENV_PY)} {q(group)} {q(p.root)}) || "
            f"{not_run(f'group {group} is not in the active release here (or {python} cannot read its launch.json)')}; "
            f"eval \"$envs\"; export DSV4CTL_GROUP={q(group)} DSV4CTL_RELEASE=\"$rel\" "
            f"DSV4CTL_REPLICA={replica} DSV4CTL_NODE_RANK={rank}; "
            f"sh -c {q(cmd)} </dev/null; rc=$?; "
            f"if [ $rc -eq 0 ]; then {ok}; else {bad}; fi "
            f"|| echo 'dsv4ctl-exec: the audit line could not be written' >&2; exit $rc")


@dataclass(frozen=True)
class ExecResult:
    """One host's outcome: ``status`` (the command's exit status; None when it did not run),
    ``stdout``/``stderr`` as text, ``release`` it ran in (None when not run), ``not_run`` (why)."""

    status: int | None
    stdout: str
    stderr: str
    release: str | None = None
    not_run: str | None = None


def parse_exec(code: int, stdout: str, stderr: str) -> ExecResult:
    """An :class:`ExecResult` from the host command's exit ``code`` and output (pure): the
    :data:`IN_RELEASE` line is taken off stderr, a :data:`NOT_RUN` last line makes it not run."""
    lines = stderr.splitlines(keepends=True)
    release = None
    if lines and lines[0].startswith(IN_RELEASE):
        release, lines = lines[0][len(IN_RELEASE):].strip(), lines[1:]
    if code == NOT_RUN_STATUS and lines and lines[-1].startswith(NOT_RUN):
        return ExecResult(None, stdout, "".join(lines[:-1]), release, lines[-1][len(NOT_RUN):].strip())
    return ExecResult(code, stdout, "".join(lines), release)
