"""One small transport interface under everything dsv4ctl does on hosts (see docs/remote.md).

* :class:`Transport` — ``run(cmd, input=, timeout=, check=)`` a shell command on one host,
  ``rsync_dest(path)`` for delta pushes (over the same connection), ``close()``. Implementations: :class:`LocalTransport`
  (this machine, ``bash -c``) and :class:`~dsv4ctl.remote.ssh.SSHTransport` (paramiko via fabric;
  ``~/.ssh/config``, ssh-agent, jump host, known_hosts verification).
* :func:`connect` — a transport for a profile :class:`~dsv4ctl.profile.Host`.
* :func:`run_parallel` — a function on every host at once, per-host timeout, per-host
  :class:`HostResult` (value or error), never raising for one host's failure.
* Facts vs operations: read state with plain functions returning data; change state with
  :class:`Action` lists (``describe()`` for ``--dry-run``, :func:`run_actions` for the real run).
* :func:`atomic_write` (temp file + rename on the host) and :func:`append_jsonl` (append-only
  JSON-lines audit log) — the only two ways dsv4ctl writes files on hosts.

Nothing here imports paramiko/fabric at import time (CLI start-up stays fast)."""

from __future__ import annotations

from .transport import CmdResult, LocalTransport, Transport, q
from .parallel import HostResult, run_parallel
from .ops import (Action, append_jsonl, append_jsonl_cmd, atomic_write, atomic_write_cmd, describe_actions,
                  read_text, run_actions, who)


def connect(host, *, accept_new_host_keys: bool = False, connect_timeout: float = 10.0,
            hosts: dict | None = None, record_host_keys: bool = True) -> Transport:
    """A :class:`Transport` for a profile ``Host``: local when ``host.local``, else SSH.
    ``record_host_keys`` False (``--dry-run``): a key accepted with ``accept_new_host_keys`` is
    trusted for the run but known_hosts is not written.

    ``hosts`` (name → Host) lets ``ssh.jump`` name another profile host. The SSH connection is
    opened lazily on the first ``run``; errors are :class:`~dsv4ctl.errors.RemoteError`
    naming the host."""
    if getattr(host, "local", False):
        return LocalTransport(host.name)
    from .ssh import SSHTransport
    return SSHTransport.from_host(host, accept_new_host_keys=accept_new_host_keys,
                                  connect_timeout=connect_timeout, hosts=hosts, record_host_keys=record_host_keys)


__all__ = ["Transport", "CmdResult", "LocalTransport", "connect", "q", "HostResult", "run_parallel",
           "Action", "run_actions", "describe_actions", "atomic_write", "append_jsonl",
           "atomic_write_cmd", "append_jsonl_cmd", "read_text", "who"]
