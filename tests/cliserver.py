"""A fork server for the suite's ``run_cli``: one pre-imported ``dsv4ctl`` per pytest process,
forked once per CLI run, so a test pays the command's work but not Python's start-up and
dsv4ctl's imports again (measured: ``benchmarks/cli_fork.py``).

A test-only stand-in for ``python -m dsv4ctl.cli``; what a user runs is the real entry point, and
``DSV4CTL_TEST_FORK=0`` makes ``run_cli`` start a new process per run as before. The forked child
is given exactly what a new process would get: argv (``sys.argv[0]`` is ``dsv4ctl/cli.py`` and
``__main__`` is ``dsv4ctl.cli``, so usage lines read ``python -m dsv4ctl.cli``), the environment,
the working directory, its own stdin/stdout/stderr pipes (passed over the socket with
SCM_RIGHTS), the signal dispositions of a new Python process (defaults; SIGPIPE and SIGXFSZ ignored)
and Python's exit (non-daemon threads joined, atexit handlers, stdio flushed; the modules are not torn down). The server reports the
child's wait status, so a signal death reads as ``-SIG`` like ``subprocess``.

Protocol (one connection per run, unix stream socket): the client sends a 4-byte big-endian
length, the JSON request ``{"argv", "env", "cwd"}`` and three file descriptors (stdin, stdout,
stderr); the server answers ``pid <N>\\n`` at once and ``status <S>\\n`` when the child has been
reaped (S: exit code, or -signal). The server is single-threaded (fork-safe): one selector over
the listening socket, the connections and a SIGCHLD self-pipe."""

from __future__ import annotations

import array
import json
import os
import selectors
import signal
import socket
import struct
import sys


def preload() -> None:
    """Import what nearly every CLI run imports (the command modules register on import)."""
    import dsv4ctl.cli as cli
    for name in cli.COMMAND_MODULES:
        __import__(f"dsv4ctl.commands.{name}")
    import yaml  # noqa: F401
    import rich.console  # noqa: F401
    import rich.table  # noqa: F401
    import dsv4ctl.profile.deployment  # noqa: F401
    import dsv4ctl.plan.plan  # noqa: F401


_SRC_AT_PRELOAD: list = []


def preload_standin() -> None:
    """The stand-in server's imports and its SGLang served path (the DeepSeek-V4 tokenizer and
    recipe: about 1.2 of the 1.6 CPU-s a stand-in start costs, tests/standin/served.py)."""
    import tests.standin.server  # noqa: F401
    from tests.standin.served import ServedPathUnavailable, served_path
    _SRC_AT_PRELOAD.append(os.environ.get("DSV4CTL_SGLANG_SRC"))
    try:
        served_path()
    except ServedPathUnavailable:
        pass            # each stand-in reports it as it would without the fork server


def _main_cli(argv: list[str]):
    import dsv4ctl.cli as cli
    sys.argv = [cli.__file__, *argv]
    sys.modules["__main__"] = cli
    return cli.main()          # what ``if __name__ == "__main__": sys.exit(main())`` does


def _fresh_stdio() -> None:
    """``sys.stdout`` / ``sys.stderr`` as a new process would make them over fds 1 and 2:
    unbuffered with ``PYTHONUNBUFFERED`` (``python -u``), else block-buffered stdout on a pipe;
    stderr line-buffered with backslashreplace (the server's own are a log file's)."""
    import io
    unbuf = bool(os.environ.get("PYTHONUNBUFFERED"))

    def stream(fd: int, err: bool):
        raw = io.FileIO(fd, "w", closefd=False)
        return io.TextIOWrapper(raw if unbuf else io.BufferedWriter(raw), encoding="utf-8",
                                errors="backslashreplace" if err else "strict",
                                line_buffering=err or os.isatty(fd), write_through=unbuf)
    sys.stdout, sys.stderr = stream(1, False), stream(2, True)


def _main_standin(argv: list[str]):
    import tests.standin.server as server
    from tests.standin import served
    _fresh_stdio()
    if os.environ.get("DSV4CTL_SGLANG_SRC") != _SRC_AT_PRELOAD[0]:
        # another SGLang source than the one preloaded: load it as a new process would
        served.served_path.cache_clear()
        served.sglang_parser_modules.cache_clear()
        for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
            del sys.modules[name]
    sys.argv = [server.__file__, *argv]
    sys.modules["__main__"] = server
    return server.main(argv)


KINDS = {"cli": (preload, _main_cli), "standin": (preload_standin, _main_standin)}
"""What a server of each kind pre-imports, and the ``python -m MODULE`` its children become."""


def _child(req: dict, fds: list[int], closing: list, main) -> None:
    """In the forked child: become ``python -m MODULE ARGV`` (``main``) and exit as it would."""
    for x in closing:
        try:
            x.close()
        except OSError:
            pass
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    # as Python's start-up sets them: a write to a closed pipe or socket raises BrokenPipeError
    # instead of killing the process (a stand-in whose client went away died of SIGPIPE)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
        os.close(fd)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    try:
        code = main(req["argv"])
    except SystemExit as e:
        code = e.code
    except BaseException:
        import traceback
        traceback.print_exc()
        code = 1
    # Python's own exit, minus tearing down every module (measured: half the child's CPU):
    # non-daemon threads joined, atexit handlers, stdio flushed, the exit code as sys.exit gives it
    import atexit
    import threading
    threading._shutdown()
    atexit._run_exitfuncs()
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError):
            pass
    os._exit(code & 0xFF)


def serve(path: str, kind: str = "cli") -> None:
    """Listen on the unix socket ``path`` until the parent closes our stdin (or SIGTERM); children
    become what :data:`KINDS` says for ``kind``."""
    load, main = KINDS[kind]
    load()
    import gc
    gc.collect()
    gc.freeze()       # the preloaded objects are never collected: children do not copy their pages
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(path)
    lsock.listen(64)
    rpipe, wpipe = os.pipe()
    os.set_blocking(wpipe, False)
    signal.set_wakeup_fd(wpipe)
    signal.signal(signal.SIGCHLD, lambda *a: None)
    sel = selectors.DefaultSelector()
    sel.register(lsock, selectors.EVENT_READ, "listen")
    sel.register(rpipe, selectors.EVENT_READ, "sigchld")
    sel.register(0, selectors.EVENT_READ, "parent")
    conns: dict[int, socket.socket] = {}          # child pid -> its client connection
    while True:
        for key, _ in sel.select():
            if key.data == "parent":
                if not os.read(0, 4096):
                    for c in conns.values():
                        c.close()
                    return
            elif key.data == "sigchld":
                os.read(rpipe, 4096)
                while True:
                    try:
                        pid, st = os.waitpid(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        break
                    c = conns.pop(pid, None)
                    if c is not None:
                        code = os.waitstatus_to_exitcode(st)
                        try:
                            c.sendall(f"status {code}\n".encode())
                        except OSError:
                            pass
                        c.close()
            else:
                conn, _ = lsock.accept()
                conn.setblocking(True)
                head = conn.recv(4, socket.MSG_WAITALL)
                (n,) = struct.unpack(">I", head)
                fds = array.array("i")
                msg, anc, _, _ = conn.recvmsg(n, socket.CMSG_LEN(3 * fds.itemsize), socket.MSG_WAITALL)
                for level, kind, data in anc:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
                req = json.loads(msg)
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    sel.close()
                    os.close(rpipe)
                    os.close(wpipe)
                    _child(req, list(fds), [lsock, conn, *conns.values()], main)
                for fd in fds:
                    os.close(fd)
                conns[pid] = conn
                conn.sendall(f"pid {pid}\n".encode())


class Server:
    """The client side: start ``python -m tests.cliserver [--kind K] SOCKET`` once, then
    :meth:`run` (a CLI run to its end) or :meth:`spawn` (a long-running child, e.g. a stand-in)."""

    def __init__(self, path: str, cwd: str, log: str, kind: str = "cli"):
        import subprocess
        self.path = path
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.cliserver", "--kind", kind, path], cwd=cwd,
                                     stdin=subprocess.PIPE, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def _connect(self, timeout: float = 30) -> socket.socket:
        import time
        end = time.monotonic() + timeout
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(self.path)
                return s
            except (FileNotFoundError, ConnectionRefusedError):
                s.close()
                if self.proc.poll() is not None or time.monotonic() > end:
                    raise RuntimeError(f"tests.cliserver did not start (exit {self.proc.poll()})")
                time.sleep(0.02)

    def run(self, argv: list[str], env: dict, cwd: str, input: str | None, timeout: float):
        """(exit code, stdout, stderr) of ``dsv4ctl ARGV``; subprocess.TimeoutExpired after
        killing the child when it runs longer than ``timeout`` seconds."""
        import subprocess
        import threading
        s = self._connect()
        r_in, w_in = os.pipe()
        r_out, w_out = os.pipe()
        r_err, w_err = os.pipe()
        if input is None:
            os.close(w_in)
            os.close(r_in)
            r_in = os.open(os.devnull, os.O_RDONLY)
            w_in = None
        body = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()
        s.sendall(struct.pack(">I", len(body)))
        s.sendmsg([body], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r_in, w_out, w_err]))])
        for fd in (r_in, w_out, w_err):
            os.close(fd)
        out, err = [], []

        def drain(fd, into):
            with os.fdopen(fd, "rb") as f:
                into.append(f.read())
        ts = [threading.Thread(target=drain, args=(r_out, out), daemon=True),
              threading.Thread(target=drain, args=(r_err, err), daemon=True)]
        for t in ts:
            t.start()
        if w_in is not None:
            def feed():
                with os.fdopen(w_in, "wb") as f:
                    try:
                        f.write(input.encode())
                    except BrokenPipeError:
                        pass
            ts.append(threading.Thread(target=feed, daemon=True))
            ts[-1].start()
        s.settimeout(timeout)
        f = s.makefile("rb")
        pid = None
        try:
            pid = int(f.readline().split()[1])
            line = f.readline()
            if not line:
                raise RuntimeError("tests.cliserver went away")
            code = int(line.split()[1])
        except (socket.timeout, TimeoutError):
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            s.close()
            raise subprocess.TimeoutExpired(["dsv4ctl", *argv], timeout) from None
        for t in ts:
            t.join(timeout)
        s.close()
        dec = lambda b: b.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")  # noqa: E731
        return code, dec(b"".join(out)), dec(b"".join(err))

    def spawn(self, argv: list[str], env: dict, cwd: str, stdin: int, stdout: int, stderr: int) -> "Forked":
        """Fork a child running ``argv`` with the given stdio descriptors (the caller keeps and
        closes its copies); a :class:`Forked` handle to it."""
        s = self._connect()
        body = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()
        s.sendall(struct.pack(">I", len(body)))
        s.sendmsg([body], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [stdin, stdout, stderr]))])
        f = s.makefile("rb")
        line = f.readline()
        if not line.startswith(b"pid "):
            s.close()
            raise RuntimeError("tests.cliserver went away")
        return Forked(int(line.split()[1]), s, f)

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(10)
        except Exception:
            self.proc.kill()
        import shutil
        shutil.rmtree(os.path.dirname(self.path), ignore_errors=True)


class Forked:
    """A child of the fork server, with the part of ``subprocess.Popen``'s interface the harness
    uses: ``pid``, ``returncode``, :meth:`poll`, :meth:`wait`, :meth:`terminate`, :meth:`kill`.
    The exit status comes from the server (which reaps it), as ``-SIG`` for a signal death."""

    def __init__(self, pid: int, sock: socket.socket, f):
        self.pid = pid
        self.returncode = None
        self._sock, self._f = sock, f

    def _read(self, timeout) -> None:
        """Take the server's ``status S`` line when it arrives within ``timeout`` seconds (None:
        wait for it). A connection the server dropped counts as SIGKILL."""
        import select
        if self.returncode is not None:
            return
        if not select.select([self._sock], [], [], timeout)[0]:
            return
        try:
            line = self._f.readline()
        except OSError:
            line = b""
        self.returncode = int(line.split()[1]) if line.startswith(b"status ") else -9
        self._sock.close()

    def poll(self):
        self._read(0)
        return self.returncode

    def wait(self, timeout=None):
        import subprocess
        self._read(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"forked pid {self.pid}", timeout)
        return self.returncode

    def send_signal(self, sig) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    if sys.argv[1] == "--kind":
        serve(sys.argv[3], sys.argv[2])
    else:
        serve(sys.argv[1])
