"""The signals that stop a dsv4ctl command, in one place.

SIGINT is Ctrl-C. SIGTERM is ``kill``, systemd or a runbook stopping a child. SIGHUP is the
terminal or the SSH session to the control machine going away. All three are handled the same way
by every command that changes something: the change is completed or undone, audited, locks are
released, children stopped, exit 130. A command that turns the non-Ctrl-C ones into
KeyboardInterrupt installs its handler on :data:`TERMINATING`; a block that must not be cut in
two holds :data:`STOPPING`."""

from __future__ import annotations

import signal

TERMINATING: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGHUP)
"""Signals that end a process unless handled: treated like Ctrl-C (KeyboardInterrupt)."""

STOPPING: tuple[signal.Signals, ...] = (signal.SIGINT, *TERMINATING)
"""Every signal that stops a command: what a critical section holds back."""


def terminate_as_interrupt() -> None:
    """For the rest of the process: SIGTERM and SIGHUP raise KeyboardInterrupt (handled like
    Ctrl-C: the command's own clean-up runs, exit 130). Main thread only (Python's rule)."""
    for sig in TERMINATING:
        signal.signal(sig, raise_interrupt)


class terminate_as_interrupt_while:
    """A block during which SIGTERM and SIGHUP raise KeyboardInterrupt like Ctrl-C — each unless a
    handler is installed already (a command that handles it itself); restored on exit. Outside
    the main thread it does nothing."""

    def __enter__(self):
        import threading
        self.mine = []
        if threading.current_thread() is threading.main_thread():
            self.mine = [s for s in TERMINATING if signal.getsignal(s) == signal.SIG_DFL]
            for s in self.mine:
                signal.signal(s, raise_interrupt)
        return self

    def __exit__(self, *exc):
        for s in self.mine:
            signal.signal(s, signal.SIG_DFL)
        return False


def raise_interrupt(signum, frame):
    """A signal handler: raise KeyboardInterrupt (handled exactly like Ctrl-C). On SIGHUP the
    terminal is gone: stdout/stderr that are terminals are pointed at /dev/null first, so the
    clean-up's messages cannot fail with EIO and cut the clean-up short."""
    global _last_signal
    _last_signal = signum
    keep_interrupts()
    if signum == signal.SIGHUP:
        detach_terminal()
    raise KeyboardInterrupt


_last_signal = None
_previous_unraisable = None


def keep_interrupts() -> None:
    """Never lose an interrupt (idempotent). Python runs a signal handler between any two bytecodes,
    also inside a garbage collector's weakref callback or a ``__del__``, where an exception cannot
    propagate: it is printed as "Exception ignored" and the command went on as if no signal had
    come (seen: a SIGHUP during a deploy's health gate finished the change and exited 0). With
    this, such a KeyboardInterrupt is delivered to the main thread again 10 ms later, from a
    daemon thread (``_thread.interrupt_main``), by when the callback has returned."""
    import sys
    global _previous_unraisable
    if _previous_unraisable is not None:
        return
    _previous_unraisable = sys.unraisablehook

    def hook(args):
        if args.exc_type is KeyboardInterrupt:
            import _thread
            import threading
            again = threading.Timer(0.01, _thread.interrupt_main, args=(_last_signal or signal.SIGINT,))
            again.daemon = True
            again.start()
            return
        _previous_unraisable(args)
    sys.unraisablehook = hook


def detach_terminal() -> None:
    """Point file descriptors 1 and 2 at /dev/null where they are terminals (character devices
    other than /dev/null itself); pipes and files are kept (a reader may still be there)."""
    import os
    import stat
    import sys
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        dev_null = os.fstat(null).st_rdev
        for fd, stream in ((1, sys.stdout), (2, sys.stderr)):
            try:
                st = os.fstat(fd)
                if stat.S_ISCHR(st.st_mode) and st.st_rdev != dev_null:
                    try:
                        stream.flush()
                    except (OSError, ValueError):
                        pass
                    os.dup2(null, fd)
            except OSError:
                continue
    finally:
        os.close(null)
