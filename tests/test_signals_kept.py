"""An interrupt is never lost (dsv4ctl.signals.keep_interrupts). Python runs a signal handler
between any two bytecodes, also inside a weakref callback of the garbage collector, where the
KeyboardInterrupt it raises cannot propagate ("Exception ignored in: <function WeakSet...>"):
CI saw a SIGHUP during hicache --remote's health gate swallowed so, the change finished and the
command exited 0. The handler's KeyboardInterrupt raised inside a weakref callback must reach
the main program shortly after, for dsv4ctl's SIGTERM/SIGHUP handler and for Ctrl-C's default."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO

PROGRAM = textwrap.dedent("""
    import signal, sys, time, weakref
    from dsv4ctl import signals
    signals.terminate_as_interrupt()
    signals.keep_interrupts()
    how = sys.argv[1]

    def in_a_weakref_callback(ref):
        if how == "handler":
            signals.raise_interrupt(signal.SIGHUP, None)     # what the SIGHUP handler does
        else:
            raise KeyboardInterrupt                           # Ctrl-C's default handler

    class A: pass
    a = A(); r = weakref.ref(a, in_a_weakref_callback); del a     # the callback's exception is "ignored"
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5:
            time.sleep(0.01)
        print("swallowed"); sys.exit(0)
    except KeyboardInterrupt:
        print("interrupted after", round(time.monotonic() - t0, 3)); sys.exit(130)
""")


@pytest.mark.parametrize("how", ["handler", "default"])
def test_an_interrupt_raised_in_a_weakref_callback_reaches_the_program(how):
    p = subprocess.run([sys.executable, "-c", PROGRAM, how], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert p.returncode == 130, (p.stdout, p.stderr)
    assert p.stdout.startswith("interrupted after ") and float(p.stdout.split()[-1]) < 1.0, p.stdout
    assert "Traceback" not in p.stderr and "Exception ignored" not in p.stderr, p.stderr
