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
_pending = None
_previous_unraisable = None


def keep_interrupts() -> None:
    """Never lose an interrupt (idempotent; main thread). Python runs a signal handler between any
    two bytecodes, also inside a garbage collector's weakref callback or a ``__del__``, where an
    exception cannot propagate: it is printed as "Exception ignored" and the command went on as if
    no signal had come (seen: a SIGHUP during a deploy's health gate finished the change and exited
    0). With this, such a KeyboardInterrupt comes again 10 ms later from SIGALRM (a real signal,
    handled in the main thread at its next bytecode): the hook that sees the lost one only arms the
    timer, so it cannot itself be interrupted half-way, and a redelivery that lands inside the hook
    or is lost again re-arms it. SIGALRM is dsv4ctl's own for this unless something else holds it
    (then nothing is installed)."""
    import sys
    import threading
    global _previous_unraisable
    if _previous_unraisable is not None or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, None):
        return
    signal.signal(signal.SIGALRM, _redeliver)
    _previous_unraisable = sys.unraisablehook
    sys.unraisablehook = _unraisable


def _unraisable(args) -> None:
    """sys.unraisablehook: a lost KeyboardInterrupt arms its redelivery; anything else goes on to
    the previous hook."""
    global _pending
    if args.exc_type is KeyboardInterrupt:
        _pending = _last_signal or signal.SIGINT
        signal.setitimer(signal.ITIMER_REAL, 0.01)
        return
    _previous_unraisable(args)


def _redeliver(signum, frame) -> None:
    """SIGALRM handler: raise the lost interrupt again, as its own handler would (KeyboardInterrupt;
    SIGHUP detaches the terminal first); inside :func:`_unraisable` it waits another 10 ms."""
    global _pending
    if _pending is None:
        return
    f = frame
    while f is not None:
        if f.f_code is _unraisable.__code__:
            signal.setitimer(signal.ITIMER_REAL, 0.01)
            return
        f = f.f_back
    sig, _pending = _pending, None
    if sig == signal.SIGHUP:
        detach_terminal()
    raise KeyboardInterrupt


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
