"""A base image for the image-release tests, built FROM scratch from this machine's own files (no
registry is reachable here): Debian's python3.11 with its standard library and the shared
libraries ``ldd`` names, ``/bin/sh`` and ``env`` (a launch command runs under ``sh -c``), the
coreutils the environment layer's build step runs and the libraries uv needs, and the
packages the stand-in server imports (aiohttp, yaml and their dependencies) copied from the test
venv. About 60 MB; ``podman build`` takes a few seconds. The repository itself (``tests``) is
mounted read-only by the test profiles (``sglang.image.mounts``), not baked in."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

PY = "/usr/bin/python3.11"
STDLIB = "/usr/lib/python3.11"
BINARIES = [PY, "/bin/sh", "/usr/bin/env", "/bin/sleep",
            # what the environment layer's build step runs (dsv4ctl.deploy.environment.build_command)
            *[f"/usr/bin/{b}" for b in ("cat", "sha256sum", "cut", "date", "chmod", "mv", "mkdir", "rm", "basename")]]
#: uv (the test venv's) runs inside the build of the environment layer: its shared libraries
UV = str(Path(sys.executable).parent / "uv")
#: top-level packages the stand-in (tests/sshd/standin_sglang.py) imports, with their dependencies
PACKAGES = ["aiohappyeyeballs", "aiohttp", "aiosignal", "attr", "frozenlist", "idna", "multidict", "propcache",
            "typing_extensions.py", "yaml", "yarl"]
SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "config-3.11-x86_64-linux-gnu"}


def _libs(binary: str) -> set[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    libs = set()
    for ln in out.splitlines():
        parts = ln.split()
        for p in parts:
            if p.startswith("/"):
                libs.add(p)
    return libs


def _copy(src: str, root: Path) -> None:
    dst = root / src.lstrip("/")
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not dst.exists():
        shutil.copy2(os.path.realpath(src), dst)     # links followed: /bin is a link on merged-/usr hosts


def rootfs(dest: Path) -> Path:
    """The root filesystem folder of the base image under ``dest`` (made once)."""
    root = dest / "ctx" / "rootfs"
    if (root / ".done").exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    libs = set()
    for b in BINARIES:
        _copy(b, root)
        libs |= _libs(b)
    libs |= _libs(UV)
    shutil.copytree(STDLIB, root / STDLIB.lstrip("/"), symlinks=True,
                    ignore=lambda d, names: [n for n in names if d == STDLIB and n in SKIP])
    for so in Path(STDLIB, "lib-dynload").glob("*.so"):
        libs |= _libs(str(so))
    for lib in sorted(libs):
        _copy(lib, root)
    site = Path(sys.prefix) / "lib" / "python3.11" / "site-packages"
    dist = root / "usr/lib/python3/dist-packages"
    dist.mkdir(parents=True, exist_ok=True)
    for name in PACKAGES:
        src = site / name
        (shutil.copytree(src, dist / name, ignore=shutil.ignore_patterns("__pycache__")) if src.is_dir()
         else shutil.copy2(src, dist / name))
    for d in ("tmp", "dev", "proc", "sys", "etc"):
        (root / d).mkdir(exist_ok=True)
    (root / "tmp").chmod(0o1777)
    (root / "usr/bin/python3").symlink_to("python3.11")
    (root / ".done").write_text("")
    return root


CONTAINERFILE = "FROM scratch\nCOPY rootfs/ /\nCMD [\"/usr/bin/python3\"]\n"


def build_base(dest: Path, podman: list[str], tag: str = "localhost/dsv4ctl-test-base:1") -> str:
    """Build the base image into the podman store ``podman`` (argv prefix) and save it as an OCI
    layout ``dest/base-oci``; returns ``oci:DIR`` with the image's manifest digest appended
    (``oci:DIR@sha256:...``)."""
    root = rootfs(dest)
    (root.parent / "Containerfile").write_text(CONTAINERFILE)
    (root.parent / ".containerignore").write_text("rootfs/.done\n")
    subprocess.run([*podman, "build", "-q", "--timestamp", "0", "--isolation", "chroot", "-t", tag,
                    "-f", str(root.parent / "Containerfile"), str(root.parent)], check=True, capture_output=True)
    oci = dest / "base-oci"
    shutil.rmtree(oci, ignore_errors=True)
    subprocess.run([*podman, "save", "--format", "oci-dir", "-o", str(oci), tag], check=True, capture_output=True)
    return f"oci:{oci}"


#: How podman runs on this machine kind (docs/images.md; crun refuses here, the sandbox drops
#: CAP_SYS_RESOURCE): runc with explicit limits, cgroupfs, file events.
RUNTIME_ARGS = ["--runtime", "runc", "--cgroup-manager", "cgroupfs", "--events-backend", "file"]
RUN_ARGS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768"]


def podman_argv(store: Path) -> list[str]:
    """podman on a store of its own under ``store``."""
    from dsv4ctl.hosts.container import store_args
    return ["podman", *store_args(str(store)), *RUNTIME_ARGS]


def base_reference(dest: Path) -> str:
    """``oci:DIR@sha256:HEX``: the base image built (once per ``dest``) and pinned by its
    manifest digest."""
    import json
    oci = dest / "base-oci"
    if not (oci / "index.json").is_file():
        build_base(dest, podman_argv(dest / "store"))
    digest = json.loads((oci / "index.json").read_text())["manifests"][0]["digest"]
    return f"oci:{oci}@{digest}"


def clean_store(store: Path) -> None:
    """Remove every container of a host store (the build's working containers too: an
    interrupted ``podman build`` leaves its own, which ``ps -a`` does not list) and unmount
    everything under it (a test's tmp folder can then be deleted: overlay and shm mounts would
    keep it busy, and pytest warns at each later run that it cannot remove them)."""
    if (store / "storage").exists():
        pod = podman_argv(store)
        ids = subprocess.run([*pod, "ps", "-aq", "--external"], capture_output=True, text=True).stdout.split()
        if ids:
            subprocess.run([*pod, "rm", "-f", "-t", "0", *ids], capture_output=True)
        subprocess.run([*pod, "image", "unmount", "-a", "-f"], capture_output=True)
    unmount_under(store)


def mounts_under(folder: Path) -> list[str]:
    """The mount points at or under ``folder`` (this process's mount table), deepest first."""
    top = os.path.realpath(folder)
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            p = line.split()[4].replace("\\040", " ")
            if p == top or p.startswith(top + "/"):
                points.append(p)
    return sorted(set(points), key=lambda p: -p.count("/"))


def unmount_under(folder: Path) -> None:
    """Unmount (lazily, deepest first) every mount under ``folder`` but ``folder`` itself."""
    top = os.path.realpath(folder)
    for p in mounts_under(folder):
        if p != top:
            subprocess.run(["umount", "-l", p], capture_output=True)


def available() -> str | None:
    """Why the image tests cannot run here (None: they can): podman and runc, root."""
    for b in ("podman", "runc", "catatonit"):
        if shutil.which(b) is None:
            return f"{b} not installed (scripts/test.sh installs podman, runc, catatonit)"
    if os.geteuid() != 0:
        return "rootful podman needs root"
    return None
