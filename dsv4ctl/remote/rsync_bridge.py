"""rsync's "remote shell" over dsv4ctl's own SSH connection (standard library only).

rsync runs its remote side through a remote-shell program (``-e``): ``PROG [-l USER] HOST
rsync --server ...``. dsv4ctl gives it this file, run as ``python -S -I rsync_bridge.py
SOCKET``: it sends the remote command line over the Unix socket ``SOCKET`` to the dsv4ctl
process, which runs it on an exec channel of the paramiko connection it already holds
(:meth:`dsv4ctl.remote.ssh.SSHTransport.rsync_dest`), and relays bytes both ways. So rsync
needs no second SSH login (no handshake, no second host-key check, the same jump host), and
transfers still use rsync's delta algorithm.

Wire format on the socket:

* bridge → dsv4ctl: ``u32 length`` + the command line (UTF-8), then rsync's stdin bytes raw;
  end of stdin is a half-close (``SHUT_WR``);
* dsv4ctl → bridge: frames ``u8 kind`` + ``u32 length`` + payload; kind 0 = remote stdout,
  1 = remote stderr, 2 = exit status (``i32``). The bridge exits with that status, or 255 when
  the socket closes without one (the connection was lost), as ``ssh`` does."""

from __future__ import annotations

import os
import socket
import struct
import sys
import threading

STDOUT, STDERR, EXIT = 0, 1, 2
HEADER = struct.Struct("!BI")


def remote_command(argv: list[str]) -> str:
    """The command rsync asked for: drop ``-l USER`` and the host, join the rest with spaces
    (what ``ssh`` sends to the remote shell). ``argv`` as rsync passes it (without SOCKET)."""
    if argv[:1] == ["-l"]:
        argv = argv[2:]
    return " ".join(argv[1:])


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _recv_exact(s: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        b = s.recv(n - len(buf))
        if not b:
            return None
        buf += b
    return bytes(buf)


def main(argv: list[str]) -> int:
    # rsync sends its remote shell SIGUSR1 as soon as its own side is done, which can be before
    # the remote side's error messages (stderr) have come through: finish relaying them, for at
    # most 5 s more (then SIGALRM ends the bridge)
    import signal
    signal.signal(signal.SIGUSR1, lambda *_: signal.alarm(5))
    if len(argv) < 3:
        print("rsync_bridge: usage: rsync_bridge.py SOCKET HOST COMMAND...", file=sys.stderr)
        return 255
    cmd = remote_command(argv[1:]).encode()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(argv[0])
    except OSError as e:
        print(f"rsync_bridge: cannot reach dsv4ctl at {argv[0]}: {e}", file=sys.stderr)
        return 255
    s.sendall(struct.pack("!I", len(cmd)) + cmd)

    def pump_stdin() -> None:
        try:
            while True:
                b = os.read(0, 1 << 16)
                if not b:
                    break
                s.sendall(b)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    threading.Thread(target=pump_stdin, daemon=True).start()
    stdout_open = True
    while True:
        h = _recv_exact(s, HEADER.size)
        if h is None:
            print("rsync_bridge: connection to the host lost", file=sys.stderr)
            return 255
        kind, n = HEADER.unpack(h)
        data = _recv_exact(s, n) if n else b""
        if data is None:
            print("rsync_bridge: connection to the host lost", file=sys.stderr)
            return 255
        if kind == STDOUT:
            if stdout_open:
                try:
                    _write_all(1, data)
                except OSError:         # rsync stopped reading: keep passing on stderr
                    stdout_open = False
        elif kind == STDERR:
            try:
                _write_all(2, data)
            except OSError:
                pass
        else:
            return struct.unpack("!i", data)[0] & 0xFF


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
