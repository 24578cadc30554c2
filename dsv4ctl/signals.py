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


def raise_interrupt(signum, frame):
    """A signal handler: raise KeyboardInterrupt (handled exactly like Ctrl-C)."""
    raise KeyboardInterrupt
