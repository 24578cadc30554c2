"""SSH transport on fabric/paramiko: ~/.ssh/config and ssh-agent honoured, jump host, host keys
verified against known_hosts (unknown refused unless accept-new, changed always refused)."""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
import threading
import time
from pathlib import Path

from ..errors import RemoteError
from .transport import STOP_GRACE_S, CmdResult, Transport, cancelled, q, signals_held, stop_group_cmd

# Every command first prints its process group (sshd starts each command in a session of its
# own: the login shell's pid is the group) on stderr, so an interrupt can stop the whole group
# over a second channel; the line is taken out of stderr again.
_PGID_PRINT = r"""printf '\036dsv4ctl-pgid %s\036\n' "$$" >&2"""
_PGID_RE = re.compile(rb"\x1edsv4ctl-pgid (\d+)\x1e\n")

_KH_LOCK = threading.Lock()

# paramiko logs failures (a bad banner, a reset) with tracebacks through the logging module; with
# no handler configured Python would print them to stderr ahead of our one-line RemoteError.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


def fingerprint(key) -> str:
    """OpenSSH-style ``SHA256:…`` fingerprint of a paramiko PKey."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


def connect_reason(e: BaseException, timeout: float | None = None) -> str:
    """Why an SSH connection failed, in the operator's words ("connection refused", "timed out
    after 10 s", "cannot resolve HOST: ..."), never a library class name or ``[Errno None]``."""
    import errno
    import socket

    errs = getattr(e, "errors", None)          # paramiko NoValidConnectionsError: {(addr, port): OSError}
    if isinstance(errs, dict) and errs:
        reasons = list(dict.fromkeys(connect_reason(x, timeout) for x in errs.values()))
        return "; ".join(reasons)
    if isinstance(e, socket.gaierror):
        return f"cannot resolve the name: {(e.strerror or str(e)).lower()}"
    if isinstance(e, (socket.timeout, TimeoutError)):
        return f"timed out after {timeout:g} s" if timeout else "timed out"
    code = getattr(e, "errno", None)
    if isinstance(code, int) and code in errno.errorcode:
        return os.strerror(code).lower()
    text = " ".join(str(e).split())
    if not text:
        return type(e).__name__
    low = text.lower()
    if "protocol banner" in low:
        return f"not an SSH server? ({text[:120]})"
    return text[:160]


#: An SSH private key is a few KB; a known_hosts file of 100,000 hosts is ~10 MB.
MAX_KEY_BYTES = 1 << 20
MAX_KNOWN_HOSTS_BYTES = 64 << 20


def _check_file(path, label: str, limit: int) -> None:
    """Refuse, before paramiko opens it, a key or known_hosts file that is no regular file (a
    FIFO would hang the connection, ``/dev/zero`` would be read without end) or is too large:
    InputError (exit 2) from :func:`dsv4ctl.resources.read_file_capped`. A missing file is left to
    the SSH layer (its own message); ``/dev/null`` (OpenSSH's ``UserKnownHostsFile=/dev/null``
    idiom: no known hosts) reads as empty and is allowed."""
    from ..resources import read_file_capped
    full = os.path.expanduser(str(path))
    if os.path.lexists(full) and os.path.realpath(full) != os.devnull:
        read_file_capped(full, limit, f"{label} {path}")


def known_hosts_name(address: str, port: int) -> str:
    """The known_hosts host field OpenSSH and paramiko use: ``addr`` or ``[addr]:port``."""
    return address if port == 22 else f"[{address}]:{port}"


def _policy(name: str, known_hosts: Path, accept_new: bool, record: bool = True):
    import paramiko

    class Policy(paramiko.MissingHostKeyPolicy):
        """Unknown key: refuse, or with accept-new append it to known_hosts (OpenSSH accept-new);
        with ``record`` False (a dry run) the key is trusted for this connection only and
        known_hosts is not written."""

        def missing_host_key(self, client, hostname, key):
            if not accept_new:
                raise RemoteError(
                    f"{name}: unknown host key {key.get_name()} {fingerprint(key)} for {hostname} "
                    f"(not in {known_hosts}); verify it and add it, or pass --accept-new-host-keys")
            if not record:
                client.get_host_keys().add(hostname, key.get_name(), key)
                return
            line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
            with _KH_LOCK:
                known_hosts.parent.mkdir(parents=True, exist_ok=True)
                with open(known_hosts, "a") as f:
                    f.write(line)
            client.get_host_keys().add(hostname, key.get_name(), key)

    return Policy()


#: seconds to wait for the rest of a command's output (and EOF) after its exit status arrived
EOF_GRACE_S = 2.0

class SSHTransport(Transport):
    """One SSH host. The connection opens on first use; commands run over exec channels.

    ``known_hosts`` defaults to ``~/.ssh/known_hosts``. ``jump`` is another SSHTransport (its
    connection is the ProxyJump hop) or None. ``user``/``port``/``key`` None → ~/.ssh/config,
    then OpenSSH defaults; keys from ssh-agent are tried too."""

    def __init__(self, name: str, address: str, *, user: str | None = None, port: int | None = None,
                 key: str | None = None, jump: "SSHTransport | None" = None,
                 known_hosts: str | None = None, accept_new_host_keys: bool = False,
                 connect_timeout: float = 10.0, record_host_keys: bool = True):
        self.name = name
        self.address = address
        self.user = user
        self.port = port
        self.key = os.path.expanduser(key) if key else None
        self.jump = jump
        self.known_hosts = Path(os.path.expanduser(known_hosts or "~/.ssh/known_hosts"))
        self.accept_new = accept_new_host_keys
        self.record_host_keys = record_host_keys     # False: accept-new keys are not written (--dry-run)
        self.connect_timeout = connect_timeout
        self._conn = None
        self._lock = threading.Lock()
        self._closes = 0                   # close() calls so far: a connect that raced one is dropped
        self._active: dict[int, dict] = {}  # running commands: {id: {"pgid": int | None}}
        self._alock = threading.Lock()
        self._rsync: dict | None = None    # the listener rsync's bridge talks to (rsync_dest)

    @classmethod
    def from_host(cls, host, *, accept_new_host_keys=False, connect_timeout=10.0, hosts=None,
                  record_host_keys=True):
        """From a profile Host; ``ssh.jump`` is a profile host name or ``[user@]addr[:port]``.
        ``record_host_keys`` False (a dry run): keys accepted with accept-new are not written."""
        jump = None
        if host.jump:
            if hosts and host.jump in hosts:
                jump = cls.from_host(hosts[host.jump], accept_new_host_keys=accept_new_host_keys,
                                     connect_timeout=connect_timeout, hosts=None, record_host_keys=record_host_keys)
            else:
                spec = host.jump
                user, _, rest = spec.rpartition("@")
                addr, _, port = rest.partition(":")
                jump = cls(f"{host.name}-jump", addr, user=user or host.user, port=int(port) if port else None,
                           key=host.key, known_hosts=host.known_hosts,
                           accept_new_host_keys=accept_new_host_keys, connect_timeout=connect_timeout,
                           record_host_keys=record_host_keys)
        return cls(host.name, host.address, user=host.user, port=host.port, key=host.key, jump=jump,
                   known_hosts=host.known_hosts, accept_new_host_keys=accept_new_host_keys,
                   connect_timeout=connect_timeout, record_host_keys=record_host_keys)

    # -- connection -------------------------------------------------------------------------
    def _connection(self):
        """The fabric Connection, host-key policy installed (not yet opened)."""
        from fabric import Connection
        kw = {}
        if self.key:
            _check_file(self.key, f"{self.name}: ssh.key", MAX_KEY_BYTES)
            kw["key_filename"] = [self.key]
        gw = self.jump._connection() if self.jump else None
        c = Connection(self.address, user=self.user, port=self.port, connect_kwargs=kw,
                       gateway=gw, connect_timeout=int(self.connect_timeout))
        if self.known_hosts.exists():
            _check_file(self.known_hosts, f"{self.name}: known_hosts", MAX_KNOWN_HOSTS_BYTES)
            c.client.load_host_keys(str(self.known_hosts))
        c.client.set_missing_host_key_policy(_policy(self.name, self.known_hosts, self.accept_new,
                                                     self.record_host_keys))
        return c

    def open(self):
        """Connect (idempotent). RemoteError naming the host on any failure."""
        import paramiko
        if cancelled():
            raise RemoteError(f"{self.name}: interrupted")
        closes = self._closes
        with self._lock:
            if self._conn is not None and self._conn.is_connected:
                return self._conn
            c = self._connection()
            try:
                c.open()
            except RemoteError:
                raise
            except paramiko.BadHostKeyException as e:
                raise RemoteError(
                    f"{self.name}: host key for {e.hostname} CHANGED (got {fingerprint(e.key)}, "
                    f"known_hosts {self.known_hosts} has {fingerprint(e.expected_key)}): refusing to "
                    f"connect; if the change is expected, remove the old entry from known_hosts")
            except paramiko.AuthenticationException as e:
                raise RemoteError(f"{self.name}: SSH authentication failed for {c.user}@{self.address}:{c.port}: {e}")
            except Exception as e:  # socket errors, timeouts, gateway failures
                hp = f"[{self.address}]:{c.port}" if ":" in self.address else f"{self.address}:{c.port}"
                raise RemoteError(f"{self.name}: cannot connect to {hp} ({connect_reason(e, self.connect_timeout)})")
            if closes != self._closes or cancelled():     # closed (interrupted) while connecting
                try:
                    c.close()
                except Exception:
                    pass
                raise RemoteError(f"{self.name}: interrupted")
            self._conn = c
            return c

    def close(self):
        """Stop every command still running over this connection (its process group on the
        host: SIGTERM, then SIGKILL, :func:`.transport.stop_group_cmd`), then drop the
        connection. Safe to call from another thread and twice; a connect in progress in
        another thread is dropped when it completes. The transport can be opened again."""
        self._closes += 1
        self._close_rsync()
        self._stop_active()
        conn = self._conn
        if self._lock.acquire(timeout=1.0):
            try:
                conn, self._conn = self._conn, None
            finally:
                self._lock.release()
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass
        if self.jump:
            self.jump.close()

    # -- stopping a command on the host -----------------------------------------------------
    def _stop_active(self, wait: float = 2.0) -> None:
        """Stop the host process groups of the commands running now (other threads' ``run``)."""
        deadline = time.monotonic() + wait
        with self._alock:
            entries = list(self._active.values())
        for e in entries:
            while e["pgid"] is None and not e["done"] and time.monotonic() < deadline:
                time.sleep(0.02)          # its thread reads the group from stderr within 0.2 s
            if e["pgid"] is not None and not e["done"]:
                self.stop_group(e["pgid"])

    def stop_group(self, pgid: int, grace: float = STOP_GRACE_S) -> bool:
        """Stop process group ``pgid`` on the host over a new channel of the open connection
        (SIGTERM, ``grace`` s, SIGKILL); True once it is gone. Never raises."""
        conn = self._conn
        try:
            tr = conn.client.get_transport() if conn is not None else None
            if tr is None or not tr.is_active():
                return False
            chan = tr.open_session(timeout=5)
            chan.settimeout(grace + 15)
            chan.exec_command(stop_group_cmd(pgid, grace))
            chan.shutdown_write()
            code = chan.recv_exit_status()
            chan.close()
            return code == 0
        except Exception:
            return False

    # -- commands ---------------------------------------------------------------------------
    def run(self, cmd, *, input=None, timeout=None, check=True, on_out=None):
        """As :meth:`Transport.run`. The command runs in its own process group on the host; an
        interrupt (KeyboardInterrupt while this waits), this thread's
        :func:`~.transport.cancel_event`, a timeout or :meth:`close` stop that group before the
        error goes on, so no command keeps running on the host after dsv4ctl has given up on it.
        ``on_out`` (bytes -> None) is given each piece of stdout as it comes (a remote image
        build's progress, :mod:`dsv4ctl.deploy.image`); the result still holds all of it."""
        conn = self.open()
        entry = {"pgid": None, "done": False}
        with self._alock:
            self._active[id(entry)] = entry
        try:
            return self._run(conn, cmd, entry, input=input, timeout=timeout, check=check, on_out=on_out)
        except BaseException as e:
            if entry["pgid"] is not None and not entry["done"] and not isinstance(e, Exception):
                with signals_held():     # KeyboardInterrupt (SIGINT, or SIGTERM made one)
                    self.stop_group(entry["pgid"])
            raise
        finally:
            entry["done"] = True
            with self._alock:
                self._active.pop(id(entry), None)

    def _run(self, conn, cmd, entry, *, input=None, timeout=None, check=True, on_out=None):
        """:meth:`run`'s work on connection ``conn``: open an exec channel, run ``cmd`` (after the
        line that prints its process group, recorded in ``entry["pgid"]``), send ``input``, read
        to the end (:meth:`_pump`) and turn a lost connection, an interrupt or a timeout into
        RemoteError; a non-zero exit with ``check`` too (:meth:`fail`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        out, err = bytearray(), bytearray()
        chan = None
        try:
            chan = conn.client.get_transport().open_session(timeout=self.connect_timeout)
            chan.settimeout(0.2)
            chan.exec_command(f"{_PGID_PRINT}\n{cmd}")
            entry["chan"] = chan
            if input:
                chan.settimeout(timeout)
                chan.sendall(input)
                chan.settimeout(0.2)
            chan.shutdown_write()
            self._pump(conn, chan, cmd, entry, out, err, deadline, timeout, on_out)
            code = chan.recv_exit_status()
            chan.close()
        except RemoteError:
            raise
        except BaseException as e:
            if not isinstance(e, Exception):    # KeyboardInterrupt: make sure the group is known
                if chan is not None and entry["pgid"] is None:
                    with signals_held():
                        self._stop_command(chan, entry, err, stop=False)
                raise
            if cancelled():
                raise RemoteError(f"{self.name}: interrupted: {cmd.splitlines()[0][:80]}") from None
            self._conn = None
            raise RemoteError(f"{self.name}: SSH connection lost while running "
                              f"{cmd.splitlines()[0][:60]!r}: {type(e).__name__}: {e}".rstrip(": "))
        if code == -1:
            self._conn = None
            raise RemoteError(f"{self.name}: SSH connection lost while running {cmd.splitlines()[0][:60]!r}")
        entry["done"] = True
        res = CmdResult(self.name, cmd, code, bytes(out), _PGID_RE.sub(b"", bytes(err), count=1))
        if check and code != 0:
            raise self.fail(res, cmd.splitlines()[0][:80])
        return res

    def _pump(self, conn, chan, cmd: str, entry: dict, out: bytearray, err: bytearray,
              deadline: float | None, timeout: float | None, on_out=None) -> None:
        """Read ``chan``'s stdout into ``out`` and stderr into ``err`` (noting the process group in
        ``entry``; each piece of stdout also to ``on_out``) until the command has ended; on
        :func:`~.transport.cancel_event` or past ``deadline`` (monotonic s) stop its process
        group and raise RemoteError."""
        exited_at = None
        while True:
            got = False
            while chan.recv_ready():
                piece = chan.recv(65536); out += piece; got = True
                if on_out is not None:
                    on_out(piece)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536); got = True
            if entry["pgid"] is None:
                m = _PGID_RE.search(err, 0, 4096)
                if m:
                    entry["pgid"] = int(m.group(1))
            # OpenSSH sends exit-status when the command exits, which may be before the last of
            # its output (still in the pipe) is forwarded: the end is EOF after exit-status. A
            # command that leaves a child holding its stdout never sends EOF: then at most
            # EOF_GRACE_S after the exit (seen under load: a `cat` read back empty).
            if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                exited_at = exited_at or time.monotonic()
                if chan.eof_received or time.monotonic() - exited_at > EOF_GRACE_S:
                    return
            if chan.closed and not got and chan.eof_received:
                return
            if cancelled():
                self._stop_command(chan, entry, err)
                raise RemoteError(f"{self.name}: interrupted: {cmd.splitlines()[0][:80]}")
            if deadline is not None and time.monotonic() > deadline:
                self._stop_command(chan, entry, err)
                chan.close()
                raise RemoteError(f"{self.name}: timed out after {timeout:g} s: {cmd.splitlines()[0][:80]}")
            if not got:
                _wait_for_output(conn, chan, out, on_out)

    def _stop_command(self, chan, entry: dict, err: bytearray, stop: bool = True, wait: float = 2.0) -> None:
        """Read ``chan``'s stderr until the command's process group is known (at most ``wait``
        s, unless the command ended), then (``stop``) stop that group on the host."""
        deadline = time.monotonic() + wait
        while entry["pgid"] is None and time.monotonic() < deadline and not chan.exit_status_ready():
            try:
                if chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                elif chan.recv_ready():
                    chan.recv(65536)           # output nobody will read: keep the window open
                else:
                    time.sleep(0.02)
            except Exception:
                break
            m = _PGID_RE.search(err, 0, 4096)
            if m:
                entry["pgid"] = int(m.group(1))
        if stop and entry["pgid"] is not None and not chan.exit_status_ready():
            self.stop_group(entry["pgid"])

    # -- rsync ------------------------------------------------------------------------------
    def rsync_dest(self, path, bulk=False):
        """rsync's remote side over this transport's own SSH connection: ``-e`` is
        :mod:`dsv4ctl.remote.rsync_bridge`, which hands the remote command to a listener in
        this process (a Unix socket in a private 0700 folder) that runs it on an exec channel
        and relays the bytes. No second login (no handshake), the same host-key check and jump
        host. ``bulk``: a large transfer, which paramiko's pure-Python packet layer would slow
        (about 150 MB/s for the whole process here): rsync gets its own OpenSSH connection
        instead (:meth:`ssh_argv`)."""
        if not bulk:
            import sys
            from . import rsync_bridge
            try:
                sock = self._rsync_listener()
                prog = " ".join(_rsync_quote(a) for a in (sys.executable, "-S", "-I", rsync_bridge.__file__, sock))
                return ["-e", prog], f"dsv4ctl:{path}"   # the host word is ignored by the bridge
            except (OSError, ValueError):
                pass          # no usable socket path (or unquotable interpreter path): OpenSSH then
        return ["-e", " ".join(q(a) for a in self.ssh_argv())], f"{self.login()}:{path}"

    def ssh_argv(self) -> list[str]:
        """The OpenSSH client command line (for bulk rsync) with the same identity, port, jump
        and strict known_hosts checking: a host key paramiko does not know yet is refused here
        too (with ``--accept-new-host-keys`` paramiko adds it on its first connection)."""
        c = self._conn or self._connection()       # port/user from ~/.ssh/config; no connection needed
        argv = ["ssh", "-p", str(c.port), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", f"ConnectTimeout={int(self.connect_timeout)}",
                "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
                # bulk transfers: AES-GCM (AES-NI) first, then OpenSSH's default chacha20
                "-o", "Ciphers=aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com",
                "-o", "Compression=no", "-x"]
        if self.key:
            argv += ["-i", self.key]
        if self.jump:
            j = " ".join(q(a) for a in self.jump.ssh_argv())
            argv += ["-o", f"ProxyCommand={j} -W %h:%p {self.jump.login()}"]
        return argv

    def login(self) -> str:
        c = self._conn or self._connection()
        return f"{c.user}@{c.host}" if c.user else c.host

    def _rsync_listener(self) -> str:
        import socket
        import tempfile
        import shutil
        with self._lock:
            if self._rsync is None:
                # a Unix socket path has at most 107 bytes: a long TMPDIR falls back to /tmp
                parent = tempfile.gettempdir()
                d = tempfile.mkdtemp(prefix="dsv4ctl-rsync-", dir=parent if len(parent) < 64 else "/tmp")
                path = os.path.join(d, "s")
                srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    srv.bind(path)
                    srv.listen(16)
                except OSError:
                    srv.close()
                    shutil.rmtree(d, ignore_errors=True)
                    raise
                th = threading.Thread(target=self._rsync_accept, args=(srv,), daemon=True,
                                      name=f"rsync-bridge-{self.name}")
                th.start()
                self._rsync = {"dir": d, "path": path, "server": srv, "thread": th}
            return self._rsync["path"]

    def _rsync_accept(self, srv) -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return                      # closed by close()
            threading.Thread(target=self._rsync_serve, args=(conn,), daemon=True).start()

    def _rsync_serve(self, conn) -> None:
        """Run one bridged command (wire format: :mod:`dsv4ctl.remote.rsync_bridge`)."""
        import socket
        import struct
        from .rsync_bridge import EXIT, HEADER, STDERR, STDOUT, _recv_exact
        wlock = threading.Lock()

        def send(kind: int, data: bytes) -> None:
            with wlock:
                conn.sendall(HEADER.pack(kind, len(data)) + data)
        chan = None
        try:
            n = _recv_exact(conn, 4)
            cmd = _recv_exact(conn, struct.unpack("!I", n)[0]) if n else None
            if not cmd:
                return
            try:
                tr = self.open().client.get_transport()
                chan = tr.open_session(timeout=self.connect_timeout)
                chan.exec_command(cmd.decode())
            except Exception as e:
                send(STDERR, f"dsv4ctl: {self.name}: cannot start rsync over SSH: {e}\n".encode())
                send(EXIT, struct.pack("!i", 255))
                return

            threading.Thread(target=_bridge_upstream, args=(conn, chan), daemon=True).start()
            _bridge_downstream(chan, tr, send, STDOUT, STDERR)
            status = _bridge_exit_status(chan, tr)
            chan.settimeout(5)                 # stderr the server sent after stdout's EOF, until close
            try:
                while True:
                    b = chan.recv_stderr(1 << 16)
                    if not b:
                        break
                    send(STDERR, b)
            except (socket.timeout, TimeoutError):
                pass
            if status >= 0:
                send(EXIT, struct.pack("!i", status))
        except (OSError, EOFError):
            pass                             # the bridge went away (rsync killed): drop the channel
        finally:
            if chan is not None:
                chan.close()
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def _close_rsync(self) -> None:
        import shutil
        import socket
        r, self._rsync = self._rsync, None
        if r:
            try:
                r["server"].shutdown(socket.SHUT_RDWR)     # wakes the blocked accept() (close alone does not)
            except OSError:
                pass
            r["server"].close()
            r["thread"].join(5)
            shutil.rmtree(r["dir"], ignore_errors=True)


def _rsync_quote(word: str) -> str:
    """One word of rsync's ``-e`` string (rsync splits on spaces and honours quotes)."""
    if word and all(ch.isalnum() or ch in "/._-+=:@%" for ch in word):
        return word
    if "'" not in word:
        return f"'{word}'"
    if '"' not in word:
        return f'"{word}"'
    raise ValueError(f"cannot pass {word!r} to rsync -e")


def _wait_for_output(conn, chan, out: bytearray, on_out=None) -> None:
    """Nothing was ready: wait up to the channel's timeout (0.2 s) for stdout (appended to
    ``out``, and given to ``on_out``); EOFError when the SSH connection itself is gone."""
    try:
        data = chan.recv(65536)
    except TimeoutError:
        return
    except Exception as e:
        if "timed out" in str(e).lower() or type(e).__name__ == "timeout":
            return
        raise
    if data:
        out += data
        if on_out is not None:
            on_out(data)
    elif chan.exit_status_ready():
        return
    elif not conn.client.get_transport().is_active():
        raise EOFError("connection closed")


def _bridge_upstream(conn, chan) -> None:
    """rsync bridge, rsync -> host: copy the bridge socket ``conn``'s bytes to ``chan``'s stdin
    until its end, then close the channel's write side (errors end it quietly)."""
    try:
        while True:
            b = conn.recv(1 << 16)
            if not b:
                break
            chan.sendall(b)
        chan.shutdown_write()
    except Exception:
        pass


def _bridge_downstream(chan, tr, send, stdout_kind: int, stderr_kind: int) -> None:
    """rsync bridge, host -> rsync: relay ``chan``'s stderr and stdout with ``send(kind, bytes)``
    until both ended or the SSH transport ``tr`` is gone. One loop, in arrival order, stderr before
    stdout: rsync stops reading (and kills the bridge) once its protocol ends on stdout, so an error
    message must come first."""
    import select
    ready = chan.fileno()          # readable when either stream has data
    while True:
        moved = False
        while chan.recv_stderr_ready():
            send(stderr_kind, chan.recv_stderr(1 << 16))
            moved = True
        if chan.recv_ready():
            b = chan.recv(1 << 16)
            if b:
                send(stdout_kind, b)
                moved = True
        if (chan.eof_received or chan.closed) and not chan.recv_ready() and not chan.recv_stderr_ready():
            break
        if not tr.is_active():
            break
        if not moved:
            select.select([ready], [], [], 0.5)


def _bridge_exit_status(chan, tr) -> int:
    """The bridged command's exit status, waited for while the transport ``tr`` lives; 255 when
    the connection went first."""
    while tr.is_active() or chan.exit_status_ready():
        if chan.exit_status_ready():
            return chan.recv_exit_status()
        time.sleep(0.02)
    return 255
