"""Issue 32 (review): a deploy whose output goes through ``| tee`` (or any pipe) when the terminal's
Ctrl-C or hangup hits the whole foreground process group: tee dies first, so every later write
to stderr — the "rolling back" line of the clean-up itself — meets a broken pipe. The clean-up
must still put every host back and audit it (it stopped at the first line, leaving every host on
the ungated release with no audit record)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.sshd.fixtures import live_cluster, sshd_cluster  # noqa: F401
from tests.sshd.world import wait_for
from tests.test_release_immutable import cli, world  # noqa: F401

pytestmark = pytest.mark.sshd


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_interrupt_through_tee_still_puts_every_host_back(world, tmp_path, sig):
    w = world
    r = cli(w, "deploy", "--json")
    assert r.code == 0, r.err
    r1 = r.json()["release"]
    before = {h: len(w.audit(h)) for h in w.roots}
    w.extra["decode"] = {"chunked-prefill-size": 4096}
    w.write()
    env = dict(os.environ, COLUMNS="200", NO_COLOR="1", **w.env())
    cmd = f"{sys.executable} -m dsv4ctl.cli deploy {w.profile} 2>&1 | tee {tmp_path}/deploy.log"
    p = subprocess.Popen(["bash", "-c", cmd], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert wait_for(lambda: any(w.current(h) not in (None, r1) for h in w.roots), 90), "no host switched"
        os.killpg(p.pid, sig)              # the terminal's Ctrl-C / hangup: the whole process group
        p.wait(timeout=120)
        gone = wait_for(lambda: subprocess.run(["pgrep", "-f", f"dsv4ctl.cli deploy {w.profile}"],
                                               capture_output=True).returncode != 0, 120)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert gone, "dsv4ctl still runs"
    assert w.currents() == {h: r1 for h in w.roots}
    for h in w.roots:
        new = w.audit(h)[before[h]:]
        assert [(x["action"], x["result"]) for x in new] == [("deploy", "interrupted")], new
        assert not (w.roots[h] / ".lock").exists()
