"""Releases as OCI images (``sglang.image``; docs/images.md): built on the control machine (or a
named build host) with podman, shipped to hosts without a registry, verified on every host.

**Build** (:func:`build_image`): the base image is pulled into the control machine's own store
(``CACHE/images/storage``; a pinned ``REF@sha256:HEX`` must give that manifest digest, a tag is
resolved and its digest recorded), then ``podman build --timestamp 0`` adds two layers: the
release's ``tree/`` (the content-addressed tree the release folder holds) and its serve
configs, ``launch.json``, ``MANIFEST.json`` and ``RELEASE.json``, both at
``/opt/dsv4ctl/releases/<release>/``. ``--timestamp 0`` makes the build reproducible: the same
release on the same base gives the same image id. The record ``CACHE/images/<release>.json``
holds the image id, the base as written, its digest and id; a later run reuses it when the
image is still in the store.

**A build host** (``sglang.image.build_host``; :class:`RemoteBuilder`): the same build runs
there over SSH (the context sent with rsync, podman on ``ROOT/images/build``), then the OCI
layout comes back (:func:`fetched_layout`, only the blobs the cache lacks) or the image is
pushed from there (:func:`push_remote`). The environment layer is reproducible too
(:func:`env_image`), so the image id does not depend on where it was built.

**Ship** (:func:`ship_host`): ``podman save --format oci-dir`` once per release; per host the
runtime and the CDI GPUs are checked, then only the blobs the host's pool lacks are sent
(``rsync --ignore-existing``: blobs are named by their sha256) and ``podman pull
oci:ROOT/images/pool`` loads the image; its id must be the one built, then it is recorded
(``ROOT/images/ids/<release>``) and verified.

**Verify** (:func:`verify_image_host`): the recorded id is the built one, the image is in the
store, and the release folder inside it, mounted read-only, hashes as its manifest says (the
drift verify of :mod:`dsv4ctl.deploy.verify`, unchanged)."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, RemoteError
from ..hosts.container import IMAGE_NAME, image_dir, load_cmd, pool_dir, prepare_cmd, store_args, verify_image_cmd
from ..hosts.layout import Paths
from ..remote import Transport, q

#: podman's storage options on the control machine (its own store under the cache).
LOCAL_STORE_ARGS = ("--storage-driver", "overlay", "--cgroup-manager", "cgroupfs", "--events-backend", "file")


@dataclass(frozen=True)
class ImageRecord:
    """The image of one release: ``image`` (its id, 64 hex), ``base`` (as the profile wrote it),
    ``base_digest`` (the manifest digest the base resolved to), ``base_id``; ``build_host`` the
    host that built it ("" for this machine)."""

    release: str
    image: str
    base: str
    base_digest: str
    base_id: str
    env: str = ""
    env_image: str = ""
    pushed: str = ""
    build_host: str = ""

    def to_dict(self) -> dict:
        return {"release": self.release, "image": self.image, "base": self.base, "base_digest": self.base_digest,
                "base_id": self.base_id, "env": self.env, "env_image": self.env_image, "pushed": self.pushed,
                "build_host": self.build_host}


# -- what a release's launch spec says about its container --------------------------------------

def spec_image(spec: dict | None) -> bool:
    """True when a launch spec's groups run in containers."""
    return any("container" in s for s in (spec or {}).values())


# -- the control machine's store ---------------------------------------------------------------

def local_store(cache: Path) -> Path:
    """The control machine's podman store: ``CACHE/../images`` (beside the release cache)."""
    return Path(cache).parent / "images"


def local_podman(image, cache: Path) -> list[str]:
    """argv prefix of podman on the control machine, on its own store (podman builds also for
    docker hosts; their ``runtime_args`` are docker's, not used here)."""
    from ..hosts.container import is_docker
    return ["podman" if is_docker(image) else image.runtime, *store_args(str(local_store(cache))),
            *LOCAL_STORE_ARGS[2:], *([] if is_docker(image) else [a for a in image.runtime_args
                                                                  if a not in LOCAL_STORE_ARGS])]


#: a step line of ``podman build``'s output (buildah's ``STEP n/m: INSTRUCTION``).
STEP_LINE = re.compile(r"^STEP (\d+)/(\d+): (.*)$")


class _Progress:
    """The progress of a ``podman build`` shown through ``log``: each ``STEP n/m: ...`` line as it
    comes (``WHAT: STEP n/m: ... (S s)``, :meth:`line`, or :meth:`feed` with pieces of output),
    and, while no line comes, one ``WHAT: STEP n/m, S s`` line per interval (:meth:`tick`), so a
    long RUN step shows it is alive. The same lines for a build here and on a build host."""

    def __init__(self, what: str, log):
        self.what, self.log = what, log
        self.t0 = self.at = time.monotonic()
        self.step, self.buf = "starting", ""

    def line(self, line: str) -> None:
        m = STEP_LINE.match(line.rstrip("\n"))
        if m:
            self.step, self.at = f"STEP {m.group(1)}/{m.group(2)}", time.monotonic()
            self.log(f"{self.what}: {m.group(0)[:160]} ({self.at - self.t0:.0f} s)")

    def feed(self, data: bytes) -> None:
        *lines, self.buf = (self.buf + data.decode("utf-8", "replace")).split("\n")
        for ln in lines:
            self.line(ln)

    def tick(self, every: float) -> None:
        now = time.monotonic()
        if now - self.at >= every * 0.99:
            self.at = now
            self.log(f"{self.what}: {self.step}, {now - self.t0:.0f} s")


def _follow(proc, timeout: float, what: str, log) -> tuple[str, str]:
    """(stdout, stderr) of ``proc`` while it runs, as ``communicate`` gives them, showing its
    progress through ``log`` (:class:`_Progress`; its interval is
    :func:`dsv4ctl.deploy.site.progress_interval`: ``DSV4CTL_PROGRESS_S``; 5 s on a terminal,
    30 s off one). subprocess.TimeoutExpired after ``timeout`` s."""
    import threading
    from .site import progress_interval
    every = progress_interval()
    prog = _Progress(what, log)
    out: list[str] = []
    err: list[str] = []

    def read_out():
        for line in proc.stdout:
            out.append(line)
            prog.line(line)
    threads = [threading.Thread(target=read_out, daemon=True),
               threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)]
    for th in threads:
        th.start()
    while True:
        left = timeout - (time.monotonic() - prog.t0)
        if left <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        try:
            proc.wait(min(every, left))
            break
        except subprocess.TimeoutExpired:
            prog.tick(every)
    for th in threads:
        th.join(10)
    return "".join(out), "".join(err)


def _run(argv: list[str], what: str, timeout: float = 3600, log=None) -> str:
    """stdout of ``argv`` run on this machine in a session of its own; with ``log``, its
    progress (:func:`_follow`) is shown while it runs. On an interrupt (SIGINT,
    or SIGTERM/SIGHUP raised as KeyboardInterrupt) or a timeout its whole process group gets
    SIGTERM, then SIGKILL after 5 s, and is waited for: a ``podman build`` takes its ``RUN``
    step's processes with it (nothing keeps building after dsv4ctl stopped). InputError (exit 2)
    on a non-zero exit with its last stderr line, or when the program is missing; RemoteError on
    the timeout."""
    import signal
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except FileNotFoundError:
        raise InputError(f"{what}: {argv[0]} not found on this machine (sglang.image.runtime; apt install podman)")
    try:
        out, err = proc.communicate(timeout=timeout) if log is None else _follow(proc, timeout, what, log)
    except BaseException as e:
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 30)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(wait)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
        if isinstance(e, subprocess.TimeoutExpired):
            raise RemoteError(f"{what}: no answer in {timeout:g} s") from None
        raise
    if proc.returncode != 0:
        tail = (err.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise InputError(f"{what}: {tail}")
    return out.strip()


class LocalBuilder:
    """Where an image is built when ``sglang.image.build_host`` is unset: this machine, podman
    on its own store (:func:`local_podman`). :class:`RemoteBuilder` is the same interface on a
    build host; :func:`build_image` and its helpers run through either, so both build the same
    Containerfiles from the same contexts (the same image id where the build is reproducible)."""

    where = host = ""

    def __init__(self, image, cache: Path):
        self.image, self.cache, self.pod = image, cache, local_podman(image, cache)

    def run(self, argv: list[str], what: str, log=None, timeout: float = 3600) -> str:
        """stdout of ``argv`` (:func:`_run`: InputError on a failure)."""
        return _run(argv, what, timeout, log)

    def ok(self, argv: list[str]) -> bool:
        return subprocess.run(argv, capture_output=True).returncode == 0

    def existing(self, paths: list[str]) -> set[str]:
        return {p for p in paths if os.path.exists(p)}

    def stage(self, bundle: Path, kind: str) -> str:
        """The builder's path of the local folder ``bundle`` (here: itself)."""
        return str(bundle)

    def unstage(self, path: str, kind: str) -> None:
        pass

    def cached(self, rec: "ImageRecord") -> bool:
        """True when the image of an earlier build is still where the ship takes it from."""
        return self.ok([*self.pod, "image", "exists", rec.image])


class RemoteBuilder(LocalBuilder):
    """The build host ``sglang.image.build_host`` (``t``: its SSH transport, ``root`` its deploy
    root): podman on the store ``ROOT/images/build`` there; the build contexts are sent with
    rsync (``rsync(argv, key)`` runs one: :func:`dsv4ctl.deploy.push._run_rsync`) into
    ``ROOT/images/build/ctx/`` (seeded by hard links from the previous context of its kind, so
    only changed files go), the build's output is read as it comes (the same progress lines as
    here). A failure is RemoteError (exit 3) naming the host."""

    def __init__(self, image, cache: Path, t: Transport, root: str, rsync):
        self.image, self.cache, self.t, self.rsync = image, cache, t, rsync
        self.dir = f"{root}/images/build"
        self.host, self.where = t.name, f" on {t.name}"
        from ..hosts.container import is_docker
        self.pod = ["podman", *store_args(self.dir), *LOCAL_STORE_ARGS[2:],      # podman builds, as here
                    *([] if is_docker(image) else [a for a in image.runtime_args if a not in LOCAL_STORE_ARGS])]

    def sh(self, cmd: str, what: str, *, input: bytes | None = None, timeout: float = 3600, log=None) -> str:
        """stdout of the shell command ``cmd`` on the build host (``log``: the build's progress
        lines as its output comes). RemoteError ``HOST: WHAT: <last line>`` on a failure."""
        import threading
        from .site import progress_interval
        prog, stop, every = (_Progress(what, log) if log else None), threading.Event(), progress_interval()

        def ticks():                    # a silent step (the environment's RUN) shows it is alive
            while not stop.wait(every):
                prog.tick(every)
        if prog is not None:
            threading.Thread(target=ticks, daemon=True).start()
        try:
            r = self.t.run(cmd, input=input, timeout=timeout, check=False, on_out=prog.feed if prog else None)
        finally:
            stop.set()
        if r.code != 0:
            raise RemoteError(f"{self.t.name}: {what}: {r.error_text()}")
        return r.out.strip()

    def run(self, argv: list[str], what: str, log=None, timeout: float = 3600) -> str:
        return self.sh(" ".join(q(a) for a in argv), what, timeout=timeout, log=log)

    def ok(self, argv: list[str]) -> bool:
        return self.t.run(" ".join(q(a) for a in argv), timeout=600, check=False).code == 0

    def existing(self, paths: list[str]) -> set[str]:
        if not paths:
            return set()
        out = self.sh("for p in " + " ".join(q(p) for p in paths) + "; do [ -e \"$p\" ] && echo \"$p\"; done; true",
                      "looking for the uv_args paths")
        return set(out.splitlines())

    def stage(self, bundle: Path, kind: str) -> str:
        """Send the local folder ``bundle`` to ``ROOT/images/build/ctx/<kind>-<pid>`` (rsync
        ``--delete`` into a hard-link copy of ``.seed-<kind>``, the previous one); its path."""
        from .push import rsync_user_args
        ctx = f"{self.dir}/ctx"
        dst, seed = f"{ctx}/{kind}-{os.getpid()}", f"{ctx}/.seed-{kind}"
        self.sh(f"mkdir -p {q(ctx)} && rm -rf {q(dst)} && if [ -d {q(seed)} ]; then cp -al {q(seed)} {q(dst)}; fi",
                "preparing the build context")
        extra, dest = self.t.rsync_dest(dst + "/", bulk=True)
        self.rsync(["rsync", "-a", "--delete", "--stats", "--info=progress2", *rsync_user_args(), *extra,
                    f"{bundle}/", dest], f"{self.t.name} build context")
        return dst

    def unstage(self, path: str, kind: str) -> None:
        """Keep the context sent as the seed of the next one of its kind (never fails)."""
        seed = f"{self.dir}/ctx/.seed-{kind}"
        self.t.run(f"rm -rf {q(seed)} && mv {q(path)} {q(seed)}", timeout=300, check=False)

    def cached(self, rec: "ImageRecord") -> bool:
        """The layout brought back is here (registry-free); with a registry, never (the push
        runs from the build host's store: build there again, from its cached layers)."""
        return not self.image.registry and (local_store(self.cache) / "oci" / rec.release / "index.json").is_file()


#: podman's image transports a base reference may start with.
TRANSPORTS = ("oci", "oci-archive", "docker-archive", "dir", "containers-storage", "docker")


def split_pin(base: str) -> tuple[str, str | None]:
    """(reference to pull, pinned manifest digest or None) of ``sglang.image.base`` (pure):
    ``oci:/x@sha256:HEX`` -> (``oci:/x``, ``sha256:HEX``); a registry name keeps its ``@sha256``
    (the registry checks it) and the digest is also returned."""
    ref, sep, dig = base.rpartition("@")
    if not sep or not dig.startswith("sha256:") or len(dig) != 71:
        return base, None
    transport = base.split(":", 1)[0] if ":" in base.split("/", 1)[0] else ""
    return (ref if transport in TRANSPORTS and transport != "docker" else base), dig


def check_base(image) -> None:
    """Before anything is built or pushed (dry runs too): a base in a local OCI layout
    (``oci:DIR[:TAG]``) must be there, and the registry's auth file must pass :func:`auth_bytes`
    (readable, a JSON object, not readable by others). InputError (exit 2) naming it; other
    transports are checked when the base is pulled."""
    if getattr(image, "registry_auth_file", None) is not None:
        auth_bytes(image)
    ref, _pin = split_pin(image.base)
    if ref.startswith("oci:") and not getattr(image, "build_host", None):     # else a folder of the build host
        path = Path(ref[4:].split(":", 1)[0])
        if not (path / "index.json").is_file():
            raise InputError(f"sglang.image.base {image.base}: no OCI image layout at {path} (its index.json is "
                             "missing): nothing was built or pushed")


def resolve_base(image, cache: Path, b=None) -> tuple[str, str]:
    """(image id, manifest digest) of the base in the builder's store (``b``: a
    :class:`LocalBuilder`, by default this machine's, or a :class:`RemoteBuilder`), pulled when
    it is not there. InputError (exit 2) when it cannot be pulled or a pinned digest differs."""
    b = b or LocalBuilder(image, cache)
    pod = b.pod
    ref, pin = split_pin(image.base)
    local = ":" not in ref.split("/", 1)[0] or ref.split(":", 1)[0] not in TRANSPORTS
    if local and b.ok([*pod, "image", "exists", ref]):
        iid = ref
    else:                 # a transport (oci:DIR, docker://...) or a name not here yet: pull prints the id
        iid = b.run([*pod, "pull", "-q", ref], f"sglang.image.base {image.base}: pull{b.where}").splitlines()[-1].strip()
    out = b.run([*pod, "image", "inspect", "--format", "{{.Id}} {{.Digest}}", iid], f"sglang.image.base {image.base}")
    iid, _, digest = out.splitlines()[-1].partition(" ")
    if pin and digest != pin:
        raise InputError(f"sglang.image.base {image.base}: the image is {digest}, not the pinned {pin}")
    return iid, digest


def record_path(cache: Path, rid: str) -> Path:
    return local_store(cache) / "records" / f"{rid}.json"


#: Where the environment build finds the lock, uv and uv's cache: a scratch folder of this
#: machine mounted over the image's ``/tmp`` for its one RUN step (a mount point made anywhere
#: else would stay in the layer as an empty file or folder).
ENV_IN = "/tmp"

ENV_CONTAINERFILE = """FROM {base}
LABEL dsv4ctl.env={digest}
RUN ["/bin/sh", "-c", {script}]
"""


def release_env(rel) -> tuple[str, Path] | None:
    """(digest, lock path) of the environment release ``rel`` runs on (its launch spec's
    ``python_env``, its ``environment.lock``), None without one."""
    from .environment import LOCK_NAME
    try:
        spec = json.loads((rel.path / "launch.json").read_text())
    except (OSError, ValueError):
        return None
    d = next((s.get("python_env") for s in spec.values() if isinstance(s, dict) and s.get("python_env")), None)
    return (d, rel.path / LOCK_NAME) if d else None


def env_mounts(uv_args, existing=None) -> list[str]:
    """``-v P:P`` for each absolute path among ``uv_args`` that exists where the build runs
    (``existing``: paths -> the set of those there, :meth:`LocalBuilder.existing`; default this
    machine): ``--find-links DIR``, ``--cache-dir DIR`` reach the build as they reach uv on a host."""
    cands = []
    for a in uv_args:
        for w in (a, a.partition("=")[2]):
            if w.startswith("/") and w not in cands:
                cands.append(w)
    there = (existing or (lambda ps: {p for p in ps if os.path.exists(p)}))(cands)
    return [x for w in cands if w in there for x in ("-v", f"{w}:{w}")]


def env_image(image, env, digest: str, lock: Path, base_id: str, cache: Path, log=lambda s: None, b=None) -> str:
    """The id of the environment image ``localhost/dsv4ctl-env:<digest>-<12 hex of the base id>``:
    the base plus ONE layer, ``/opt/dsv4ctl/envs/<digest>/`` (:func:`dsv4ctl.hosts.container.image_env`),
    the release's locked environment. Made once per lock and base; every release on it builds
    FROM it, so releases of one lock share that layer (same digest) and a new release adds only
    its own small layers. The layer is one ``RUN`` of the hosts' own builder inside the build
    (:func:`dsv4ctl.deploy.environment.build_command`: ``uv venv --python IMAGE_PYTHON`` + ``uv
    pip sync --require-hashes`` of the lock, then read-only), so the environment is made with
    the image's interpreter and C library; ``env`` (``sglang.environment``) names uv on this
    machine (mounted with the lock over ``/tmp``, never left in the image) and its arguments
    (paths among them mounted at the same place, where they exist on the builder). The base
    needs ``/bin/sh`` and coreutils. ``b``: where it is built (:class:`LocalBuilder`, the
    default, or the build host's :class:`RemoteBuilder`: uv and the lock are sent there with the
    context). InputError when uv is not found here or the build fails."""
    from .environment import LOCK_NAME, build_command
    from ..hosts.container import IMAGE_ENVS
    b = b or LocalBuilder(image, cache)
    tag = f"{IMAGE_NAME}-env:{digest}-{base_id.removeprefix('sha256:')[:12]}"
    pod = b.pod
    if b.ok([*pod, "image", "exists", tag]):
        return b.run([*pod, "image", "inspect", "--format", "{{.Id}}", tag], f"the environment image {tag}")
    uv_name, uv_args = (env.uv, env.uv_args) if env is not None else ("uv", ())
    uv = shutil.which(uv_name)
    if uv is None:
        raise InputError(f"{uv_name} not found on this machine: the image's environment layer is built with it "
                         "(sglang.environment.uv)")
    st = local_store(cache)
    ctx = st / f".ctx-env-{digest}-{os.getpid()}"
    shutil.rmtree(ctx, ignore_errors=True)
    t0 = time.monotonic()
    try:
        (ctx / "in").mkdir(parents=True)
        (ctx / "ctx").mkdir()
        shutil.copyfile(lock, ctx / "in" / LOCK_NAME)
        shutil.copy2(os.path.realpath(uv), ctx / "in" / "uv")
        script = build_command(IMAGE_ENVS.rsplit("/", 1)[0], digest, f"{ENV_IN}/{LOCK_NAME}", uv=f"{ENV_IN}/uv",
                               python=image.python, uv_args=uv_args)
        # the same layer wherever and whenever it is built (this machine or a build host):
        # ENV.json's built_at is the build's --timestamp 0, not the wall clock, and the staging
        # folder (named in the venv's activate scripts) is .tmp-<digest>-0, not the shell's pid
        # (one build per container: no other builder to keep apart)
        script = (f"export UV_CACHE_DIR={ENV_IN}/uv-cache TMPDIR={ENV_IN}; "
                  f"date() {{ command date -d @0 \"$@\"; }}; {script.replace('-$$', '-0')}")
        (ctx / "Containerfile").write_text(ENV_CONTAINERFILE.format(base=base_id, digest=digest,
                                                                    script=json.dumps(script)))
        at = b.stage(ctx, "env")
        try:
            out = b.run([*pod, "build", "--timestamp", "0", "--isolation", "chroot", "--layers=false", "-t", tag,
                         "-v", f"{at}/in:{ENV_IN}", *env_mounts(uv_args, b.existing),
                         "-f", f"{at}/Containerfile", f"{at}/ctx"], f"building the environment image {tag}{b.where}",
                        log=log)
        finally:
            b.unstage(at, "env")
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
    iid = out.splitlines()[-1].strip().removeprefix("sha256:")
    log(f"built environment layer {digest} (image {iid[:12]}){b.where} in {time.monotonic() - t0:.1f} s")
    return iid


CONTAINERFILE = """FROM {base}
COPY tree {dest}/tree
COPY meta/ {dest}/
LABEL dsv4ctl.release={rid}
"""


def build_image(image, rel, cache: Path, log=lambda s: None, env=None, b=None) -> ImageRecord:
    """Build (or reuse) the image of release ``rel`` (a :class:`~dsv4ctl.deploy.release.Release`
    in the local cache) on the base of ``image`` (:class:`~dsv4ctl.profile.deployment.ImageSettings`),
    or, when the release runs on a locked environment, on its environment image
    (:func:`env_image`; ``env``: ``sglang.environment``), where ``b`` builds
    (:class:`LocalBuilder`, the default: this machine; :class:`RemoteBuilder`: the build host).
    The build context is a hard-link copy of the release (``ctx/tree/``, and ``ctx/meta/`` with
    ``configs/`` and the JSON records) beside its Containerfile (sent to a build host with
    rsync); ``podman build --timestamp 0 --isolation chroot --layers``:
    one layer per ``COPY`` (``--layers=false`` would make the tree and the records one layer, and a
    serve-config change would ship the whole tree again). Cost
    measured here: about 1 s for a small tree on a cached base. The record is written once the
    image is built (an interrupted build records nothing). InputError (RemoteError on a build
    host) when the base cannot be had or the build fails; the context is removed whatever happened."""
    b = b or LocalBuilder(image, cache)
    done = _cached_record(image, cache, rel.id, b)
    if done is not None:
        return done
    base_id, digest = resolve_base(image, cache, b)
    renv = release_env(rel)
    from_id = env_image(image, env, renv[0], renv[1], base_id, cache, log, b) if renv else base_id
    ctx = local_store(cache) / f".ctx-{rel.id}-{os.getpid()}"
    shutil.rmtree(ctx, ignore_errors=True)
    try:
        _release_context(rel, ctx)
        (ctx / "Containerfile").write_text(CONTAINERFILE.format(base=from_id, dest=image_dir(rel.id), rid=rel.id))
        at = b.stage(ctx, "release")
        t0 = time.monotonic()
        try:
            out = b.run([*b.pod, "build", "--timestamp", "0", "--isolation", "chroot", "--layers",
                         "-t", f"{IMAGE_NAME}:{rel.id}", "-f", f"{at}/Containerfile", f"{at}/ctx"],
                        f"building the image of {rel.id}{b.where}", log=log)
        finally:
            b.unstage(at, "release")
        iid = out.splitlines()[-1].strip().removeprefix("sha256:")
        log(f"built image {iid[:12]} of {rel.id}" + (f" on {b.host} from " if b.host else " on ")
            + f"{image.base} ({digest}) in {time.monotonic() - t0:.1f} s")
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
    rec = ImageRecord(rel.id, iid, image.base, digest, base_id, renv[0] if renv else "",
                      from_id if renv else "", build_host=b.host)
    write_record(cache, rec)
    return rec


def _cached_record(image, cache: Path, rid: str, b) -> ImageRecord | None:
    """The record of an earlier build of ``rid`` on the same base whose image the ship can
    still take (:meth:`LocalBuilder.cached`), else None."""
    try:
        rec = ImageRecord(**json.loads(record_path(cache, rid).read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return rec if rec.base == image.base and b.cached(rec) else None


def _release_context(rel, ctx: Path) -> None:
    """Fill the build context ``ctx/ctx/``: ``tree/`` and ``meta/`` (``configs/``, the JSON
    records, the lock), hard links to the release's files."""
    meta = ctx / "ctx" / "meta"
    meta.mkdir(parents=True)
    subprocess.run(["cp", "-al", str(rel.path / "tree"), str(ctx / "ctx" / "tree")], check=True, capture_output=True)
    if (rel.path / "configs").is_dir():
        subprocess.run(["cp", "-al", str(rel.path / "configs"), str(meta / "configs")], check=True, capture_output=True)
    for f in ("launch.json", "MANIFEST.json", "RELEASE.json", "environment.lock"):
        if (rel.path / f).exists():
            os.link(rel.path / f, meta / f)


def write_record(cache: Path, rec: ImageRecord) -> None:
    """Write ``CACHE/../images/records/<release>.json`` (atomic)."""
    rp = record_path(cache, rec.release)
    rp.parent.mkdir(parents=True, exist_ok=True)
    tmp = rp.with_suffix(f".{os.getpid()}")
    tmp.write_text(json.dumps(rec.to_dict(), indent=1) + "\n")
    os.replace(tmp, rp)


def share_blobs(layout: Path, others: Path) -> int:
    """Replace each blob of the OCI layout ``layout`` that another layout under ``others``
    (``CACHE/../images/oci``) holds under the same ``sha256`` name and size by a hard link to
    that file (atomic rename over it). Returns the bytes now shared. Every release's layout is a
    whole copy of its image, base included: the kept releases' layouts then hold the base's (and
    the environment's) blobs once, not once per release."""
    shared = 0
    for b in (layout / "blobs" / "sha256").iterdir():
        size = b.stat().st_size
        for o in others.glob(f"*/blobs/sha256/{b.name}"):
            if o.parent.parent.parent == layout or o.stat().st_size != size or os.path.samefile(o, b):
                continue
            tmp = b.with_name(f".{b.name}.link")
            os.link(o, tmp)
            os.replace(tmp, b)
            shared += size
            break
    return shared


def saved_layout(image, cache: Path, rec: ImageRecord) -> Path:
    """The release's image as an OCI layout (``podman save --format oci-dir``), made once:
    ``CACHE/../images/oci/<release>`` (a partial save is never used: saved aside, renamed), its
    blobs that other releases' layouts hold already hard links to theirs (:func:`share_blobs`)."""
    out = local_store(cache) / "oci" / rec.release
    if (out / "index.json").is_file():
        return out
    tmp = out.parent / f".{rec.release}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        _run([*local_podman(image, cache), "save", "--format", "oci-dir", "-o", str(tmp), rec.image],
             f"saving the image of {rec.release}")
        share_blobs(tmp, out.parent)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def fetched_layout(b: RemoteBuilder, cache: Path, rec: ImageRecord, log=lambda s: None) -> Path:
    """The release's image as an OCI layout here (``CACHE/../images/oci/<release>``, as
    :func:`saved_layout` makes it), brought from the build host ``b``: ``podman save --format
    oci-dir`` there (into ``ROOT/images/build/oci/.<release>-<pid>``, removed after), then rsync
    into a new folder here that already holds, as hard links, every blob the other layouts here
    have (``--ignore-existing``: only the blobs this machine lacks are sent; ``--delete``: the
    ones the image does not use go), renamed into place once whole. RemoteError on a failure;
    nothing half-made is left here."""
    out = local_store(cache) / "oci" / rec.release
    if (out / "index.json").is_file():
        return out
    from .push import rsync_user_args
    rtmp = f"{b.dir}/oci/.{rec.release}-{os.getpid()}"
    tmp = out.parent / f".{rec.release}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "blobs" / "sha256").mkdir(parents=True)
    t0 = time.monotonic()
    try:
        for o in out.parent.glob("[!.]*/blobs/sha256/[!.]*"):
            if not (tmp / "blobs" / "sha256" / o.name).exists():
                os.link(o, tmp / "blobs" / "sha256" / o.name)
        b.sh(f"rm -rf {q(rtmp)} && mkdir -p {q(b.dir + '/oci')}", "preparing the image's layout")
        b.run([*b.pod, "save", "--format", "oci-dir", "-o", rtmp, rec.image], f"saving the image of {rec.release}{b.where}")
        extra, src = b.t.rsync_dest(rtmp + "/", bulk=True)
        stats = b.rsync(["rsync", "-a", "--ignore-existing", "--delete", "--stats", "--info=progress2",
                         *rsync_user_args(), *extra, src, f"{tmp}/"], f"{b.host} image layout")
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        b.t.run(f"rm -rf {q(rtmp)}", timeout=120, check=False)
    log(f"brought the image layout of {rec.release} from {b.host}: {int(stats.get('bytes_received', 0)):,} bytes "
        f"received in {time.monotonic() - t0:.1f} s")
    return out


def push_remote(b: RemoteBuilder, image, rec: ImageRecord, log=lambda s: None) -> str:
    """:func:`push_image` from the build host ``b``'s store: the auth file's bytes go on stdin
    into a file only its user reads (removed whatever happened), ``podman push --authfile
    --digestfile`` there; returns ``REPO@sha256:DIGEST``. RemoteError naming the host and the
    registry on a failure; the credentials are never on a command line or printed."""
    tls = "" if image.registry_tls_verify else " --tls-verify=false"
    pod = " ".join(q(a) for a in b.pod)
    t0 = time.monotonic()
    digest = b.sh("umask 077; A=$(mktemp) && D=$(mktemp) || exit 1; trap 'rm -f \"$A\" \"$D\"' EXIT; cat > \"$A\"; "
                  "if [ -s \"$A\" ]; then au=\"--authfile $A\"; else au=; fi; "
                  f"{pod} push -q{tls} --digestfile \"$D\" $au {q(rec.image)} "
                  f"{q(f'docker://{image.registry}:{rec.release}')} >&2 && cat \"$D\"",
                  f"pushing the image of {rec.release} to {image.registry}", input=auth_bytes(image))
    log(f"pushed image {rec.image[:12]} of {rec.release} to {image.registry} from {b.host} ({digest}) in "
        f"{time.monotonic() - t0:.1f} s")
    return f"{image.registry}@{digest}"


#: The largest registry auth file read (bytes): a containers auth.json is a few hundred.
AUTH_MAX = 1 << 20


#: Mode bits an auth file must not have (:func:`auth_bytes`): any access by others, a write by
#: its group (as ssh refuses a private key others can read).
AUTH_LOOSE = 0o027


def auth_bytes(image) -> bytes:
    """The bytes of ``sglang.image.registry``'s auth file (b"" without one). InputError (exit 2,
    naming the file, never its content) when it cannot be read, is not a regular file of at most
    :data:`AUTH_MAX` bytes (a FIFO, a folder, a device), has a mode in :data:`AUTH_LOOSE` (others
    may read it or its group write it: ``chmod 600``) or is not a JSON object."""
    f = image.registry_auth_file
    if f is None:
        return b""
    try:
        fd = os.open(f, os.O_RDONLY | os.O_NONBLOCK)    # a FIFO must not block the deploy forever
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > AUTH_MAX:
                raise InputError(f"sglang.image.registry.auth_file {f}: not a regular file of at most "
                                 f"{AUTH_MAX // 1024} KiB (a containers auth.json / docker config.json)")
            if st.st_mode & AUTH_LOOSE:
                raise InputError(f"sglang.image.registry.auth_file {f}: mode {stat.S_IMODE(st.st_mode):04o} lets "
                                 f"{'others read' if st.st_mode & 0o007 else 'its group write'} the registry "
                                 f"credentials: chmod 600 {f}")
            data = os.read(fd, AUTH_MAX + 1)
        finally:
            os.close(fd)
        ok = len(data) <= AUTH_MAX and isinstance(json.loads(data), dict)
    except OSError as e:
        raise InputError(f"sglang.image.registry.auth_file {f}: cannot read ({e.strerror or e})") from None
    except (ValueError, RecursionError):     # not JSON, or nested past the parser's depth
        ok = False
    if not ok:
        raise InputError(f"sglang.image.registry.auth_file {f}: not a containers auth.json / docker config.json "
                         "(a JSON object with \"auths\")")
    return data


def push_image(image, cache: Path, rec: ImageRecord, log=lambda s: None) -> str:
    """Push release ``rec.release``'s image to ``sglang.image.registry`` as ``REPO:<release>``
    from the control machine's store (``podman push --authfile`` with the profile's auth file:
    the credentials go to podman as a file, never on a command line or in a log); returns
    ``REPO@sha256:DIGEST``, the manifest pushed (the hosts pull exactly that). InputError when
    the push fails (its last line; podman does not print credentials)."""
    auth = auth_bytes(image)
    st = local_store(cache)
    tmp = st / f".push-{rec.release}-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        argv = [*local_podman(image, cache), "push", "-q", "--digestfile", str(tmp / "digest")]
        if auth:
            (tmp / "auth.json").touch(0o600)
            (tmp / "auth.json").write_bytes(auth)
            argv += ["--authfile", str(tmp / "auth.json")]
        if not image.registry_tls_verify:
            argv.append("--tls-verify=false")
        t0 = time.monotonic()
        _run([*argv, rec.image, f"docker://{image.registry}:{rec.release}"],
             f"pushing the image of {rec.release} to {image.registry}")
        digest = (tmp / "digest").read_text().strip()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"pushed image {rec.image[:12]} of {rec.release} to {image.registry} ({digest}) in "
        f"{time.monotonic() - t0:.1f} s")
    return f"{image.registry}@{digest}"


# -- hosts -------------------------------------------------------------------------------------

def host_image(site, host: str):
    """The ImageSettings a host's commands use: the profile's (runtime, store, arguments)."""
    return site.profile.sglang.image


def host_devices(spec: dict, host: str) -> list[str]:
    """Every CDI device the groups of ``spec`` use on ``host``."""
    return sorted({d for s in spec.values() for d in (s.get("container") or {}).get("devices", {}).get(host, [])})


def gpu_preflight_lines(site, spec: dict) -> list[str]:
    """What :func:`gpu_preflight` checks, one line per host the launch spec ``spec`` places GPUs
    on (a dry run lists them under ``preflight:``); [] without containers or GPUs."""
    from ..hosts.container import is_docker
    img = site.profile.sglang.image
    if img is None or not spec_image(spec):
        return []
    what = "the NVIDIA container toolkit (docker --gpus)" if is_docker(img) else \
        "a CDI spec naming nvidia.com/gpu (/etc/cdi, /var/run/cdi)"
    build = [f"preflight: build host {img.build_host}: podman (sglang.image.build_host), before anything is built "
             "or shipped"] if img.build_host else []
    return build + [f"preflight: {h}: {img.runtime} and {what} for {', '.join(d)}, before anything is built or "
                    "shipped" for h in site.hosts if (d := host_devices(spec, h))]


#: The build host's check (:func:`build_host_preflight`): podman is there (exit 4 otherwise).
BUILD_HOST_CHECK = ("command -v podman >/dev/null 2>&1 || { echo \"podman not found on the build host "
                    "(sglang.image.build_host builds the images with it: apt install podman)\" >&2; exit 4; }")


def build_host_preflight(site) -> None:
    """With ``sglang.image.build_host``: podman is on the build host (dry runs too: it only
    reads). RemoteError (exit 3) ``preflight: build host HOST: <why>: nothing was built or
    shipped`` otherwise, a host that cannot be reached too."""
    img = site.profile.sglang.image
    if img is None or not img.build_host:
        return
    try:
        r = build_transport(site).run(BUILD_HOST_CHECK, timeout=60, check=False)
        why = "" if r.code == 0 else r.error_text()
    except RemoteError as e:
        why = str(e).removeprefix(f"{img.build_host}: ")
    finally:
        if getattr(site, "build_transport", None) is not None:
            site.build_transport.close()
            site.build_transport = None
    if why:
        raise RemoteError(f"preflight: build host {img.build_host}: {why}: nothing was built or shipped")


def gpu_preflight(site, spec: dict) -> None:
    """Before anything is built or shipped (dry runs too: it only reads): the build host has
    podman (:func:`build_host_preflight`), and every host the launch
    spec ``spec`` places GPUs on can give them to its containers
    (:func:`dsv4ctl.hosts.container.host_check_cmd`), all
    hosts in parallel. RemoteError (exit 3) ``preflight: HOST: <the check's line>; ...``
    naming every host that cannot: nothing was built, pushed or switched."""
    from ..hosts.container import host_check_cmd
    from ..remote import run_parallel
    build_host_preflight(site)
    img = site.profile.sglang.image
    need = {h: host_devices(spec, h) for h in site.hosts} if img is not None and spec_image(spec) else {}
    need = {h: d for h, d in need.items() if d}
    if not need:
        return

    def one(t):
        r = t.run(host_check_cmd(img, need[t.name]), timeout=60, check=False)
        if r.code != 0:
            raise RemoteError(r.error_text())
    res = run_parallel({h: site.transports[h] for h in need}, one, timeout=site.opts.connect_timeout + 60)
    bad = [f"{h}: {r.error.removeprefix(h + ': ')}" for h, r in res.items() if not r.ok]
    if bad:
        raise RemoteError("preflight: " + "; ".join(bad) + ": nothing was built or shipped")


def ship_host(t: Transport, site, rec: ImageRecord, layout: Path, spec: dict) -> dict:
    """Ship release ``rec.release``'s image to the host behind ``t`` (see the module docstring):
    ``{"present": bool, "bytes_sent": N, "seconds": s, "registry": bool}``; with a registry
    (``rec.pushed``) the host pulls the pushed manifest (:func:`dsv4ctl.hosts.container.registry_load_cmd`,
    the credentials on stdin). RemoteError naming the host on any failure (no runtime, no CDI
    spec for the GPUs, the transfer, a loaded id that differs)."""
    from .push import _run_rsync, rsync_user_args
    img = host_image(site, t.name)
    root = site.paths[t.name].root
    t0 = time.monotonic()
    r = t.run(prepare_cmd(img, root, host_devices(spec, t.name), rec.image), timeout=120, check=False)
    if r.code != 0:
        raise RemoteError(f"{t.name}: {r.error_text()}")
    sent = 0
    present = r.out.strip().endswith("present")
    if rec.pushed:
        from ..hosts.container import registry_load_cmd
        r = t.run(registry_load_cmd(img, root, rec.release, rec.image, rec.pushed), input=auth_bytes(img),
                  timeout=1800, check=False)
        if r.code != 0:
            raise RemoteError(f"{t.name}: pulling the image of {rec.release} from {img.registry}: {r.error_text()}")
        return {"present": present, "bytes_sent": 0, "seconds": round(time.monotonic() - t0, 3), "registry": True}
    if not present:
        extra, dest = t.rsync_dest(pool_dir(root) + "/blobs/", bulk=True)
        stats = _run_rsync(t, site, _Named(rec.release),
                           ["rsync", "-a", "--ignore-existing", "--stats", "--info=progress2", *rsync_user_args(), *extra,
                            f"{layout}/blobs/", dest], key=transfer_key(t.name))
        sent = int(stats.get("bytes_sent", 0))
    r = t.run(load_cmd(img, root, rec.release, rec.image), input=(layout / "index.json").read_bytes(),
              timeout=1800, check=False)
    if r.code != 0:
        raise RemoteError(f"{t.name}: loading the image of {rec.release}: {r.error_text()}")
    return {"present": present, "bytes_sent": sent, "seconds": round(time.monotonic() - t0, 3)}


def transfer_key(host: str) -> str:
    """The progress key of the image transfer to ``host`` (``HOST image``: the tree push's key
    is the host's name, and it has ended when the image transfer starts)."""
    return f"{host} image"


@dataclass
class _Named:
    id: str


def verify_image_host(t: Transport, site, rid: str, expect: str | None):
    """Run the verify of release ``rid``'s image on the host behind ``t``: its CmdResult (the
    drift script's report, :func:`dsv4ctl.deploy.drift.parse_verify` reads it); RemoteError when
    the image is missing or not the one recorded (``expect``)."""
    from .verify import SCRIPT
    img = host_image(site, t.name)
    r = t.run(verify_image_cmd(img, site.paths[t.name].root, rid, site.python[t.name], SCRIPT, expect),
              timeout=1800, check=False)
    if r.code == 6:
        raise RemoteError(f"{t.name}: {r.error_text()}")
    return r


# -- steps -------------------------------------------------------------------------------------

def expected_image(site, rid: str) -> str | None:
    """The image id release ``rid`` was built as: this run's build, else the control machine's
    record (None: no record here; a host's own record is then all there is)."""
    rec = getattr(site, "image_records", {}).get(rid)
    if rec is not None:
        return rec.image
    from .release import default_cache
    try:
        return json.loads(record_path(Path(site.opts.cache or default_cache()), rid).read_text())["image"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def build_transport(site) -> Transport:
    """The transport of ``sglang.image.build_host``: the run's own when the host is one of its
    hosts, else a new connection (``site.build_transport``; the same host-key checks)."""
    name = site.profile.sglang.image.build_host
    t = site.transports.get(name) or getattr(site, "build_transport", None)
    if t is None:
        from ..remote import connect
        dep = site.profile
        t = site.build_transport = connect(dep.hosts[name], accept_new_host_keys=site.opts.accept_new_host_keys,
                                           connect_timeout=site.opts.connect_timeout, hosts=dep.hosts,
                                           record_host_keys=not site.opts.dry_run)
    return t


def builder(site, rid: str = "", cache: Path | None = None):
    """Where this run builds images: :class:`LocalBuilder` (this machine), or with
    ``sglang.image.build_host`` a :class:`RemoteBuilder` on that host's transport (the run's own
    when the host is one of its hosts, else a new connection with the same host-key checks;
    ``site.build_transport``, closed with the site's)."""
    from .release import default_cache
    img = site.profile.sglang.image
    cache = cache or Path(site.opts.cache or default_cache())
    name = img.build_host
    if not name:
        return LocalBuilder(img, cache)
    t = build_transport(site)
    from .push import _run_rsync
    return RemoteBuilder(img, cache, t, site.profile.host_root(name),
                         lambda argv, key: _run_rsync(t, site, _Named(rid), argv, key=key))


def _build_and_keep(site, img, rel, cache: Path):
    """(record, OCI layout or None) of release ``rel``'s image: built (or reused) where
    :func:`builder` says, then pushed to the registry (from where it was built) or kept as an
    OCI layout here (saved here, or brought from the build host)."""
    from dataclasses import replace
    b = builder(site, rel.id, cache)
    remote = isinstance(b, RemoteBuilder)
    try:
        rec = build_image(img, rel, cache, site.opts.log, site.profile.sglang.environment, b)
        if img.registry:
            rec = replace(rec, pushed=push_remote(b, img, rec, site.opts.log) if remote else
                          push_image(img, cache, rec, site.opts.log))
            write_record(cache, rec)
            return rec, None
        rec = replace(rec, pushed="")      # a record of an earlier push is not how this run ships
        return rec, (fetched_layout(b, cache, rec, site.opts.log) if remote else saved_layout(img, cache, rec))
    finally:
        t = getattr(site, "build_transport", None)
        if t is not None:
            t.close()
            site.build_transport = None


def run_images(site, rel, steps: list, trace, step_done, guard) -> str:
    """Run a deploy's image steps: build (or reuse) and save the image, then ship it to every
    host in parallel (``trace``/``step_done``: the engine's step hooks; ``guard``: the context
    manager that stops the rsyncs at once on an interrupt). Returns "" when every host has it,
    else ``host: why`` per failed host."""
    from ..remote import run_parallel
    from .release import default_cache
    if not steps:
        return ""
    img = site.profile.sglang.image
    cache = Path(site.opts.cache or default_cache())
    local = next(s for s in steps if s.host == "local")
    trace(site, local)
    t0 = time.monotonic()
    try:
        rec, layout = _build_and_keep(site, img, rel, cache)
    except (InputError, RemoteError) as e:
        return f"local: {e}"
    finally:
        step_done(site, local, time.monotonic() - t0)
    if not hasattr(site, "image_records"):
        site.image_records = {}
    site.image_records[rel.id] = rec
    spec = json.loads((rel.path / "launch.json").read_text())
    by_host = {s.host: s for s in steps if s.host != "local"}

    def body(t):
        trace(site, by_host[t.name])
        t1 = time.monotonic()
        try:
            return ship_host(t, site, rec, layout, spec)
        finally:
            step_done(site, by_host[t.name], time.monotonic() - t1)
    with guard():     # an interrupt stops the rsyncs at once, then the threads end
        res = run_parallel({h: site.transports[h] for h in by_host}, body, timeout=site.opts.host_timeout,
                           finish_on_interrupt=True)
    for h, r in res.items():
        if r.ok:
            site.opts.log(f"{h}: image {rec.image[:12]} " + ("present" if r.value["present"] else
                          f"pulled from {img.registry}" if r.value.get("registry") else
                          f"loaded, {r.value['bytes_sent']:,} bytes sent") + f" in {r.value['seconds']:.1f} s")
    return "; ".join(r.error if r.error.startswith(f"{h}: ") else f"{h}: {r.error}" for h, r in res.items() if not r.ok)



# -- the control machine's copies ----------------------------------------------------------------

def local_prune_ids(site, rid: str, prunes: dict[str, list[str]]) -> list[str]:
    """The releases whose copies on the control machine go with this run's pruning (pure over
    the site's facts): those ``prunes`` (host -> release ids its close prunes) names that no
    host of the run keeps after it (its releases less its prunes, and ``rid``, the release the
    run deploys). [] for a limited run (``--limit``: hosts outside it may keep them)."""
    if site.opts.only is not None:
        return []
    gone = {r for ids in prunes.values() for r in ids}
    kept = {rid} | {r for h, f in site.facts.items() for r in f.releases if r not in prunes.get(h, ())}
    return sorted(gone - kept)


def prune_local(site, rid: str, pruned: dict[str, list[str]]) -> list[str]:
    """After a good close (``pruned``: host -> the release ids its close pruned): remove the
    control machine's copies of the releases :func:`local_prune_ids` names: the OCI layout
    (``CACHE/../images/oci/<release>``, a whole copy of the image, made to ship it), the image
    ``localhost/dsv4ctl:<release>`` in the local store (its own layers; the base's and the
    environment's stay while an image is built on them), the record, then each environment
    image no remaining record is built on. Returns the ids pruned; a failure is a warning in
    the log (the hosts' pruning is done; the next prune tries again), never an error. Nothing
    without ``sglang.image``. With ``sglang.image.build_host`` the images are the build host's
    (its store ``ROOT/images/build``), removed there."""
    from .release import default_cache
    img = site.profile.sglang.image
    ids = local_prune_ids(site, rid, pruned) if img is not None else []
    if not ids:
        return []
    cache = Path(site.opts.cache or default_cache())
    st, b = local_store(cache), builder(site, rid, cache)
    pod = b.pod
    envs = set()
    for r in ids:
        try:
            envs.add(json.loads(record_path(cache, r).read_text()).get("env_image") or "")
        except (OSError, ValueError, AttributeError):
            pass
        shutil.rmtree(st / "oci" / r, ignore_errors=True)
        try:
            b.run([*pod, "rmi", "--ignore", f"{IMAGE_NAME}:{r}"], f"removing the image of {r}{b.where}", timeout=600)
        except (InputError, RemoteError) as e:
            site.opts.log(f"warning: {e}")
        record_path(cache, r).unlink(missing_ok=True)
    used = set()
    for p in (st / "records").glob("*.json"):
        try:
            used.add(json.loads(p.read_text()).get("env_image") or "")
        except (OSError, ValueError, AttributeError):
            continue
    for e in sorted(envs - used - {""}):
        try:
            b.ok([*pod, "rmi", "--ignore", e])
        except RemoteError as err:
            site.opts.log(f"warning: removing the environment image {e[:12]}{b.where}: {err}")
    if getattr(site, "build_transport", None) is not None:
        site.build_transport.close()
        site.build_transport = None
    site.opts.log(f"local: pruned the image copies of {', '.join(ids)}" + (f" (images on {b.host})" if b.host else ""))
    return ids
