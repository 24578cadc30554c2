"""Release-image benchmark (issue 47): a one-file change shipped as an image release against the
usual way of moving an image without a registry, in one run on this machine.

Three real OpenSSH sshd hosts (tests/sshd/harness.py; each its own podman store under its deploy
root, rootful podman with runc), the test base image (tests/images/base.py: this machine's Python
FROM scratch, ~65 MB) with a locked environment layer, the stand-in servers in containers
(prefill, decode, router). After a first deploy (not timed) one tree file changes, then, back to
back:

1. ``dsv4ctl deploy``: build the new image (its tree and records layers on the shared base and
   environment layers), ship only the blobs each host lacks (rsync), load, verify, switch every
   group and pass the health gate: the wall time of the whole command;
2. the baseline: ``podman save IMAGE | ssh HOST podman load`` of the same new image to the same
   three hosts in parallel (the whole image, as without dsv4ctl), timed to the last load. It
   neither builds, verifies nor restarts anything.

Printed: the deploy's wall time and, from its report's steps, build + ship + switch (the local
image step, the slowest host's image step, the slowest host's switch); the baseline's wall time;
the bytes each sends per host; the ratios (build + ship + switch) / baseline and whole deploy /
baseline.

    .venv/bin/python benchmarks/image.py [--keep]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _deploy(w) -> tuple[float, str, dict]:
    """(wall seconds, stderr, the --json report) of one ``dsv4ctl deploy``."""
    from tests.conftest import run_cli
    t0 = time.monotonic()
    r = run_cli("deploy", str(w.profile), "--accept-new-host-keys", "--no-preflight", "--json", env=w.env(),
                timeout=900)
    took = time.monotonic() - t0
    if r.code != 0:
        raise SystemExit(f"deploy failed (exit {r.code}): {r.err[-2000:]}")
    return took, r.err, json.loads(r.out)


def _phases(rep: dict) -> dict[str, float]:
    """Seconds of the image build (the ``local`` image step), the ship (the slowest host's image
    step: check, rsync of the blobs it lacks, load) and the switch (the slowest host's), from the
    report's per-step ``duration_s``."""
    steps = rep["steps"]

    def slowest(phase, local=False):
        return max((s["duration_s"] for s in steps if s["phase"] == phase and (s["host"] == "local") == local),
                   default=0.0)
    return {"build": slowest("image", True), "ship": slowest("image"), "switch": slowest("switch")}


def _baseline(w, image: str) -> tuple[float, int]:
    """``podman save IMAGE | ssh HOST podman --root ... load`` to every host in parallel:
    (seconds to the last load, bytes of the saved image)."""
    from tests.images import base as images
    local = images.podman_argv(w.cache / "images")
    procs = []
    t0 = time.monotonic()
    for h in w.hosts:
        store = w.tmp / "baseline" / h.name
        store.mkdir(parents=True, exist_ok=True)
        remote = " ".join(images.podman_argv(store)) + " load -q"
        ssh = ["ssh", "-p", str(h.port), "-i", str(w.c.user_key), "-o", f"UserKnownHostsFile={w.c.known_hosts}",
               "-o", "BatchMode=yes", f"{w.c.user}@{h.address}", remote]
        save = subprocess.Popen([*local, "save", image], stdout=subprocess.PIPE)
        load = subprocess.Popen(ssh, stdin=save.stdout, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        save.stdout.close()
        procs.append((save, load))
    for save, load in procs:
        err = load.communicate()[1]
        if save.wait() != 0 or load.returncode != 0:
            raise SystemExit(f"baseline failed: {err.decode()[-500:]}")
    took = time.monotonic() - t0
    size = len(subprocess.run([*local, "save", image], capture_output=True, check=True).stdout)
    for h in w.hosts:
        images.clean_store(w.tmp / "baseline" / h.name)
    return took, size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", action="store_true", help="Keep the work folder.")
    args = ap.parse_args()
    from tests.images import base as images
    from tests.sshd import harness
    from tests.sshd.world import git
    from tests.test_image_deploy import ImageWorld
    why = harness.available() or images.available()
    if why:
        raise SystemExit(f"cannot run here: {why}")
    work = Path(tempfile.mkdtemp(prefix="dsv4ctl-image-bench-"))
    c = harness.start_cluster(work / "sshd", 3)
    w = None
    try:
        base = images.base_reference(work / "base")
        w = ImageWorld(c, work / "w", base, nhosts=3)
        _deploy(w)                                                   # the first release: not timed
        f = w.tree / "python" / "sglang" / "srt" / "mod001.py"
        f.write_text(f.read_text() + "y = 2\n")
        git(w.tree, "commit", "-q", "-am", "one file")
        git(w.tree, "tag", "-f", "v0.5.23")
        took, err, rep = _deploy(w)
        ph = _phases(rep)
        bss = ph["build"] + ph["ship"] + ph["switch"]
        rid = w.current("h0")
        rec = json.loads((w.cache / "images" / "records" / f"{rid}.json").read_text())
        sent = [int(x.replace(",", "")) for x in re.findall(r"loaded, ([\d,]+) bytes sent", err)]
        base_s, size = _baseline(w, rec["image"])
        print(f"one-file change, 3 hosts, image {rec['image'][:12]} ({size / 1e6:.1f} MB saved)")
        print(f"  dsv4ctl deploy, whole command (push, build, ship, verify, switch, health gate): {took:6.2f} s, "
              f"{max(sent or [0]):,} image bytes sent per host")
        print(f"  of it build + ship + switch: {bss:6.2f} s (build {ph['build']:.2f}, ship {ph['ship']:.2f}, "
              f"switch {ph['switch']:.2f})")
        print(f"  podman save | ssh podman load (whole image, no switch):        {base_s:6.2f} s, "
              f"{size:,} bytes per host")
        print(f"  ratio build + ship + switch / baseline: {bss / base_s:.2f}; whole deploy / baseline: "
              f"{took / base_s:.2f}; bytes per host: {max(sent or [0]) / size:.5f}")
    finally:
        if w is not None:
            w.cleanup()
        c.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
