"""The transport interface and the local implementation."""

from __future__ import annotations

import shlex
import subprocess
from abc import ABC, abstractmethod
from dataclasses import dataclass

from ..errors import RemoteError


def q(s) -> str:
    """Shell-quote one word for a remote ``sh`` command line."""
    return shlex.quote(str(s))


@dataclass
class CmdResult:
    """Outcome of one command: exit ``code``, ``stdout``/``stderr`` as bytes."""

    host: str
    cmd: str
    code: int
    stdout: bytes
    stderr: bytes

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", "replace")

    def error_text(self) -> str:
        """The last non-empty stderr (else stdout) line, for one-line errors."""
        for text in (self.err, self.out):
            lines = [ln for ln in text.strip().splitlines() if ln.strip()]
            if lines:
                return lines[-1].strip()
        return f"exit {self.code}"


class Transport(ABC):
    """Runs shell commands on one host. ``name`` is the profile host name (used in every error)."""

    name: str
    #: True when files can be reached directly on this machine (no network hop).
    is_local: bool = False

    @abstractmethod
    def run(self, cmd: str, *, input: bytes | None = None, timeout: float | None = None,
            check: bool = True) -> CmdResult:
        """Run ``cmd`` with ``sh -c`` semantics on the host; ``input`` is fed to stdin.

        ``timeout`` (s) bounds the whole command. With ``check`` a non-zero exit raises
        RemoteError ``host: message``; a lost connection or timeout always raises RemoteError."""

    @abstractmethod
    def rsync_dest(self, path: str, bulk: bool = False) -> tuple[list[str], str]:
        """``(extra rsync args, destination)`` to push into ``path`` on the host with rsync:
        for SSH ``["-e", BRIDGE]`` and ``host:path`` (rsync's remote side runs over this
        transport's connection, :mod:`dsv4ctl.remote.rsync_bridge`), or with ``bulk`` an
        OpenSSH connection of its own; locally ``[]`` and ``path``."""

    def close(self) -> None:
        """Drop the connection (safe to call twice)."""

    def fail(self, res: CmdResult, what: str) -> RemoteError:
        """A RemoteError ``host: what: <last stderr line>``."""
        return RemoteError(f"{self.name}: {what}: {res.error_text()}")


class LocalTransport(Transport):
    """This machine, through ``bash -c``: the same operations as over SSH, for ``local: true``."""

    is_local = True

    def __init__(self, name: str = "local"):
        self.name = name

    def run(self, cmd, *, input=None, timeout=None, check=True):
        try:
            p = subprocess.run(["bash", "-c", cmd], input=input, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RemoteError(f"{self.name}: timed out after {timeout:g} s: {cmd.splitlines()[0][:80]}")
        res = CmdResult(self.name, cmd, p.returncode, p.stdout, p.stderr)
        if check and res.code != 0:
            raise self.fail(res, cmd.splitlines()[0][:80])
        return res

    def rsync_dest(self, path, bulk=False):
        return [], path
