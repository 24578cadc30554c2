"""Running git on a tree: the one I/O seam of :mod:`dsv4ctl.patches`.

:class:`Git` runs ``git -C TREE ARGS`` through a *runner* — ``runner(argv, input) -> (code, out,
err)`` with bytes in and out. :func:`local_runner` uses ``subprocess``; :func:`transport_runner`
runs the same argv on a host through ``dsv4ctl.remote`` (a :class:`Transport`), so status, apply
and revert work on a host's tree unchanged: patches travel on stdin, never as remote files."""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass
from typing import Callable, Optional

from ..errors import DsvError, InputError

Runner = Callable[[list[str], Optional[bytes]], tuple[int, bytes, bytes]]

# Deterministic, locale-free git output; never open an editor or a pager.
GIT_ENV = {"LC_ALL": "C", "LANG": "C", "GIT_PAGER": "cat", "GIT_EDITOR": "true",
           "GIT_TERMINAL_PROMPT": "0", "GIT_MERGE_AUTOEDIT": "no"}


STOP_GRACE_S = 10.0
"""Seconds a git child gets to end after SIGTERM (git removes its lock files on SIGTERM) before
SIGKILL."""


def local_runner(argv: list[str], input: Optional[bytes] = None) -> tuple[int, bytes, bytes]:
    """Run ``argv`` on this machine with :data:`GIT_ENV`, in its own process group: a Ctrl-C in
    the terminal reaches dsv4ctl only, and when dsv4ctl is interrupted (any exception while it
    waits, e.g. KeyboardInterrupt from SIGINT/SIGTERM) the child's whole group is stopped before
    the exception goes on, so no git keeps changing the tree after dsv4ctl has given up on it."""
    try:
        p = subprocess.Popen(argv, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **GIT_ENV},
                             process_group=0)
    except FileNotFoundError:
        raise DsvError(f"{argv[0]}: not found on PATH") from None
    try:
        out, err = p.communicate(input)
    except BaseException:
        stop_group(p)
        raise
    return p.returncode, out, err


def stop_group(p: subprocess.Popen, grace: float = STOP_GRACE_S) -> None:
    """SIGTERM the process group of ``p`` (its own, :func:`local_runner`), wait up to ``grace``
    seconds, then SIGKILL it; reaps ``p`` and closes its pipes
    (:func:`dsv4ctl.remote.transport.stop_process_group`, the one group stop)."""
    from ..remote.transport import stop_process_group
    stop_process_group(p, grace)


def transport_runner(transport) -> Runner:
    """A runner over a ``dsv4ctl.remote`` Transport (``run(cmd, input=, check=False)``)."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in GIT_ENV.items())

    def run(argv: list[str], input: Optional[bytes] = None) -> tuple[int, bytes, bytes]:
        r = transport.run(f"env {env} " + " ".join(shlex.quote(a) for a in argv), input=input, check=False)
        return r.code, r.stdout, r.stderr
    return run


@dataclass
class GitResult:
    code: int
    out: str
    err: str

    @property
    def ok(self) -> bool:
        return self.code == 0


class Git:
    """git on one tree. ``where`` names the tree in messages (``host:path`` for remote trees)."""

    def __init__(self, tree: str, runner: Runner = local_runner, where: Optional[str] = None):
        self.tree = tree
        self.runner = runner
        self.where = where or tree

    def run(self, *args: str, input: Optional[bytes | str] = None, check: bool = True,
            config: tuple[str, ...] = ()) -> GitResult:
        """``git -C TREE [-c k=v...] ARGS``. With ``check`` a failure raises DsvError naming the
        tree and git's last error line."""
        argv = ["git", "-C", self.tree]
        for c in config:
            argv += ["-c", c]
        argv += list(args)
        data = input.encode() if isinstance(input, str) else input
        code, out, err = self.runner(argv, data)
        res = GitResult(code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))
        if check and code != 0:
            raise DsvError(f"{self.where}: git {args[0]} failed: {last_line(res.err or res.out)}")
        return res

    def out(self, *args: str, **kw) -> str:
        """stdout of a git command that must succeed, right-stripped."""
        return self.run(*args, **kw).out.rstrip("\n")

    def identity_config(self) -> tuple[str, ...]:
        """``-c`` options giving a committer identity when the tree's git config has none."""
        have = self.run("config", "user.email", check=False).out.strip()
        return () if have else ("user.name=dsv4ctl", "user.email=dsv4ctl@localhost")


def last_line(text: str) -> str:
    """The last non-empty line of ``text`` (git's own error), or 'no output'."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"
