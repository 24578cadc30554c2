"""Servers as containers (``sglang.image``): the pure command builders of a host's container
runtime, and the service wrapper that runs a group's launch command inside its release's image.

Layout on a host (``ROOT`` the deploy root):

* ``ROOT/images/ids/<release>``  the image id the release runs (written once the pulled image's
  id was checked against the id built on the control machine);
* ``ROOT/images/pool``           an OCI layout whose ``blobs/`` keep every layer shipped (rsync
  sends only the blobs the pool lacks; ``podman pull oci:ROOT/images/pool`` loads the image).

In the image the release is ``/opt/dsv4ctl/releases/<release>/`` (the same folder as on a host:
``tree/``, ``configs/``, ``launch.json``, ``MANIFEST.json``, ``RELEASE.json``), so the drift
verify runs unchanged on the image mounted read-only (``podman image mount``).

Every builder returns a shell command (or argv) and runs nothing."""

from __future__ import annotations

import re

from ..remote import q
from .layout import Paths

#: Where a release lives inside its image.
IMAGE_RELEASES = "/opt/dsv4ctl/releases"
#: Where a release's locked environment lives inside its image (``<digest>/bin/python``).
IMAGE_ENVS = "/opt/dsv4ctl/envs"
#: The local name a release's image carries (``localhost/dsv4ctl:<release>``).
IMAGE_NAME = "localhost/dsv4ctl"


def image_dir(rid: str) -> str:
    """The release folder inside its image."""
    return f"{IMAGE_RELEASES}/{rid}"


def image_env(digest: str) -> str:
    """The environment ``digest`` inside an image (beside the releases, as ``ROOT/envs`` on a
    host, so the drift verify finds it from the release folder)."""
    return f"{IMAGE_ENVS}/{digest}"


def images_root(root: str) -> str:
    return f"{root}/images"


def id_file(root: str, rid: str) -> str:
    """The host's record of the image id release ``rid`` runs."""
    return f"{root}/images/ids/{rid}"


def pool_dir(root: str) -> str:
    return f"{root}/images/pool"


def runroot(store: str) -> str:
    """podman's run-state folder for the store ``store`` (pure): ``/run/dsv4ctl/<12 hex of
    sha256(store)>``. podman 4.3 refuses a ``--runroot`` longer than 50 characters, and run state
    belongs on /run (gone at boot, as the containers are)."""
    import hashlib
    return "/run/dsv4ctl/" + hashlib.sha256(store.encode()).hexdigest()[:12]


def store_args(store: str) -> list[str]:
    """``--root STORE/storage --runroot`` :func:`runroot` ``--storage-driver overlay`` (pure)."""
    return ["--root", f"{store}/storage", "--runroot", runroot(store), "--storage-driver", "overlay"]


def is_docker(image) -> bool:
    """True when the hosts' runtime is docker (``sglang.image.runtime``): no per-store arguments,
    no ``image exists`` / ``image mount`` / ``pull oci:``, GPUs by ``--gpus``."""
    return image.runtime.rsplit("/", 1)[-1] == "docker"


def exists_cmd(image, rt: str, word: str) -> str:
    """Shell: exit 0 when the image the shell word ``word`` names (quoted by the caller) is in
    the runtime's store (pure)."""
    if is_docker(image):
        return f"{rt} image inspect {word} >/dev/null 2>&1"
    return f"{rt} image exists {word}"


def gpu_args(image, devices: list[str]) -> list[str]:
    """The ``run`` arguments giving a container the CDI ``devices`` (``nvidia.com/gpu=N``): one
    ``--device`` each with podman, one ``--gpus device=N,M`` with docker (pure)."""
    if not devices:
        return []
    if is_docker(image):
        return ["--gpus", "device=" + ",".join(d.rsplit("=", 1)[-1] for d in devices)]
    return [w for d in devices for w in ("--device", d)]


def runtime_argv(image, root: str) -> list[str]:
    """The runtime and its global arguments on a host whose deploy root is ``root`` (pure):
    ``podman``, with ``store`` (``{root}`` filled) as :func:`store_args`, then ``runtime_args``
    as given; docker has one store, its daemon's (``store`` is not used)."""
    argv = [image.runtime]
    if image.store and not is_docker(image):
        argv += store_args(image.store.replace("{root}", root))
    return argv + list(image.runtime_args)


def runtime_cmd(image, root: str) -> str:
    return " ".join(q(w) for w in runtime_argv(image, root))


def container_name(group: str, rank: int, rid: str) -> str:
    """``dsv4ctl-<group>-n<rank>-<release>`` (characters podman refuses become ``_``)."""
    return re.sub(r"[^a-zA-Z0-9_.-]", "_", f"dsv4ctl-{group}-n{rank}-{rid}")


def mount_args(mounts) -> list[str]:
    """``-v SRC:DST:ro`` per mount (``/src`` mounts at the same path)."""
    out = []
    for m in mounts:
        src, _, dst = m.partition(":")
        out += ["-v", f"{src}:{dst or src}:ro"]
    return out


def run_command(image, root: str, rid: str, group: str, rank: int, container: dict, devices: list[str],
                env_names, command: str) -> str:
    """The shell command a group's service runs for one node (pure): remove a container left
    with the same name, then ``exec RUNTIME run`` in the foreground (its exit is the server's;
    SIGTERM to it reaches the server through ``--init``): ``--init --rm --network host``, the
    name of :func:`container_name`, labels (root, group, release: how a stop finds it),
    ``--shm-size``, the release's mounts read-only (``container['mounts']``), ``--device`` per
    CDI device, ``-e NAME`` per environment variable (values come from the service's
    environment, never the command line), ``run_args``, the working folder, then the image id
    read from :func:`id_file` when the command runs, and ``sh -c COMMAND``."""
    rt = runtime_cmd(image, root)
    name = container_name(group, rank, rid)
    words = ["run", "--init", "--rm", "--network", "host", "--name", name,
             "--label", f"dsv4ctl.root={root}", "--label", f"dsv4ctl.group={group}", "--label", f"dsv4ctl.release={rid}",
             "--shm-size", str(container.get("shm_size") or image.shm_size), *mount_args(container.get("mounts") or ()),
             *gpu_args(image, devices), *[w for k in sorted(env_names) for w in ("-e", k)],
             *image.run_args, "-w", image_dir(rid)]
    return (f"{rt} rm -f {q(name)} >/dev/null 2>&1; "
            f"exec {rt} {' '.join(q(w) for w in words)} \"$(cat {q(id_file(root, rid))})\" sh -c {q(command)}")


def stop_containers_cmd(image, root: str, group: str, timeout: float) -> str:
    """Stop and remove every container of ``group`` under deploy root ``root`` (by label; pure):
    ``stop -t timeout`` (SIGTERM through ``--init``, then SIGKILL), then ``rm -f``. Nothing when
    the runtime is missing or none runs; never fails."""
    rt = runtime_cmd(image, root)
    n = max(1, int(round(timeout)))
    return (f"if command -v {q(image.runtime)} >/dev/null 2>&1; then "
            f"ids=$({rt} ps -aq --filter {q('label=dsv4ctl.root=' + root)} --filter {q('label=dsv4ctl.group=' + group)}"
            f" 2>/dev/null); if [ -n \"$ids\" ]; then {rt} stop -t {n} $ids >/dev/null 2>&1; "
            f"{rt} rm -f $ids >/dev/null 2>&1; fi; fi; true")


class ContainerService:
    """A service backend (:class:`dsv4ctl.hosts.service.Launcher` or ``Systemd``, ``inner``)
    whose groups run in containers: the start command is already the container's
    (:func:`run_command`, built by the launch-command renderer); a stop first stops the group's
    containers (a killed ``podman run`` leaves its container running under conmon), then the
    inner stop; alive is the inner's (the foreground ``podman run`` lives as long as its
    container)."""

    def __init__(self, inner, image, stop_timeout: float = 10.0):
        self.inner, self.image, self.stop_timeout = inner, image, stop_timeout
        self.name = f"{inner.name}, {image.runtime} container"

    def stop_cmd(self, p: Paths, group: str) -> str:
        return f"{stop_containers_cmd(self.image, p.root, group, self.stop_timeout)}; {self.inner.stop_cmd(p, group)}"

    def start_cmd(self, p: Paths, group: str, rid: str, command: str, env: dict[str, str]) -> str:
        return self.inner.start_cmd(p, group, rid, command, env)

    def alive_cmd(self, p: Paths, group: str) -> str:
        return self.inner.alive_cmd(p, group)

    def process_cmd(self, p: Paths, group: str, containers: bool = True) -> str:
        """The inner service's ``@alive``/``@proc`` lines, then (``containers``) ``@ctr`` of the
        group's running container (:func:`container_command`)."""
        cmd = self.inner.process_cmd(p, group)
        return f"{cmd}\n{container_command(runtime_cmd(self.image, p.root), p.root, group)}" if containers else cmd


def container_command(runtime: str, root: str, group: str) -> str:
    """Shell: ``@ctr G ID IMAGE AGE`` of the running container of group ``group`` under deploy
    root ``root`` (found by its labels, :func:`run_command`), ``AGE`` in seconds since it started;
    nothing when none runs or ``runtime`` (the runtime and its global arguments, shell words) is
    missing. Each restart of the group makes a new container (``--rm``): the group's restart count
    stays the log's (:func:`dsv4ctl.hosts.service.proc_command`). docker (its ``ps`` has no image
    id or start time): ``inspect`` of the container, its RFC 3339 start read by ``date -d``."""
    rt_bin = runtime.split()[0]
    labels = f"--filter {q('label=dsv4ctl.root=' + root)} --filter {q('label=dsv4ctl.group=' + group)}"
    if rt_bin.rsplit("/", 1)[-1] == "docker":
        read = (f"c=$({runtime} ps -q --no-trunc {labels} 2>/dev/null | head -n 1); [ -n \"$c\" ] && "
                f"c=$({runtime} inspect --format '{{{{.Id}}}} {{{{.Image}}}} {{{{.State.StartedAt}}}}' \"$c\" 2>/dev/null); "
                "[ -n \"$c\" ] && { set -- $c; c=\"$1 $2 $(date -d \"$3\" +%s 2>/dev/null || echo x)\"; }; ")
    else:
        read = (f"c=$({runtime} ps --no-trunc {labels} "
                f"--format '{{{{.ID}}}} {{{{.ImageID}}}} {{{{.StartedAt}}}}' 2>/dev/null | head -n 1); ")
    return (f"if command -v {rt_bin} >/dev/null 2>&1; then {read}"
            f"if [ -n \"$c\" ]; then set -- $c; case $3 in *[!0-9]*|'') a=-;; *) a=$(( $(date +%s) - $3 ));; esac; "
            f"echo \"@ctr {group} $1 $2 $a\"; fi; fi")


# -- the image on a host ----------------------------------------------------------------------

def cdi_check_cmd(devices: list[str], docker: bool = False) -> str:
    """Exit 0 when the host has a CDI spec naming ``nvidia.com/gpu`` (``/etc/cdi``,
    ``/var/run/cdi``; with ``docker``: the NVIDIA container toolkit, which ``--gpus`` needs),
    else a line naming what is missing and exit 4 (pure; nothing for no devices)."""
    if not devices:
        return "true"
    if docker:
        return ("{ command -v nvidia-container-runtime-hook || command -v nvidia-ctk; } >/dev/null 2>&1 || "
                "{ echo \"no NVIDIA container toolkit on this host for docker --gpus (" + " ".join(devices)
                + "): install nvidia-container-toolkit; sglang.image.gpus: none for CPU-only hosts\" >&2; exit 4; }")
    return ("grep -qs 'nvidia.com/gpu' /etc/cdi/*.yaml /etc/cdi/*.json /var/run/cdi/*.yaml /var/run/cdi/*.json || "
            "{ echo \"no CDI spec names nvidia.com/gpu (/etc/cdi, /var/run/cdi) for " + " ".join(devices)
            + ": nvidia-ctk cdi generate makes one; sglang.image.gpus: none for CPU-only hosts\" >&2; exit 4; }")


def host_check_cmd(image, devices: list[str]) -> str:
    """The runtime is on the host, and it can give the containers the GPUs ``devices``
    (:func:`cdi_check_cmd`); exit 4 with a line naming what is missing otherwise (pure). The
    deploy's preflight and the ship step (:func:`prepare_cmd`) run it, with the same words."""
    return (f"command -v {q(image.runtime)} >/dev/null 2>&1 || {{ echo \"{image.runtime} not found on this host "
            f"(sglang.image.runtime)\" >&2; exit 4; }}; {cdi_check_cmd(devices, is_docker(image))}")


def prepare_cmd(image, root: str, devices: list[str], image_id: str) -> str:
    """Before a ship: the runtime is there (exit 4 naming it otherwise), the CDI devices exist,
    the pool folders are made and the temporary files of a transfer cut short are removed
    (rsync's ``.NAME.XXXXXX``: a blob is in the pool whole, under its digest, or not at all);
    prints ``present`` when the image ``image_id`` is in the store
    already (nothing to send), else ``absent``."""
    rt = runtime_cmd(image, root)
    return (f"{host_check_cmd(image, devices)}; "
            f"mkdir -p {q(pool_dir(root) + '/blobs/sha256')} {q(images_root(root) + '/ids')} && "
            f"rm -f {q(pool_dir(root) + '/blobs/sha256')}/.[!.]* && "
            f"if {exists_cmd(image, rt, q(image_id))}; then echo present; else echo absent; fi")


def load_cmd(image, root: str, rid: str, image_id: str) -> str:
    """After the blobs were sent: the pool's ``index.json`` (stdin) names release ``rid``'s
    image, ``pull oci:POOL`` loads it, its id must be ``image_id`` (else the pulled image is
    removed and exit 5), it is tagged ``localhost/dsv4ctl:<rid>`` and the id recorded in
    :func:`id_file` (atomic). With the image present already, only tag and record. docker:
    ``docker load`` of the pool as an OCI archive (a tar stream, Docker 25 or later), then the
    image ``image_id`` must be there (exit 5 otherwise)."""
    rt = runtime_cmd(image, root)
    pool = pool_dir(root)
    if is_docker(image):
        load = (f"tar -C {q(pool)} -cf - oci-layout index.json blobs | {rt} load -q >/dev/null; "
                f"{exists_cmd(image, rt, q(image_id))} || {{ echo \"the image loaded is not the one built ({image_id})\" "
                ">&2; exit 5; }; ")
    else:
        load = (f"got=$({rt} pull -q {q('oci:' + pool)}) || exit 5; got=$(printf '%s\\n' \"$got\" | tail -n 1); "
                f"if [ \"$got\" != {q(image_id)} ]; then {rt} rmi -f \"$got\" >/dev/null 2>&1 || true; "
                f"echo \"the image loaded is $got, not the one built ({image_id})\" >&2; exit 5; fi; ")
    return (f"set -e; if ! {exists_cmd(image, rt, q(image_id))}; then cat > {q(pool + '/index.json.tmp')}; "
            f"mv -f {q(pool + '/index.json.tmp')} {q(pool + '/index.json')}; "
            f"printf '%s' '{{\"imageLayoutVersion\": \"1.0.0\"}}' > {q(pool + '/oci-layout')}; "
            f"{load}else cat >/dev/null; fi; {record_cmd(image, root, rid, image_id)}")


def record_cmd(image, root: str, rid: str, image_id: str) -> str:
    """Shell: tag image ``image_id`` ``localhost/dsv4ctl:<rid>`` and record it in :func:`id_file`
    (atomic; pure)."""
    rt, idf = runtime_cmd(image, root), id_file(root, rid)
    return (f"{rt} tag {q(image_id)} {q(IMAGE_NAME + ':' + rid)}; "
            f"printf '%s\\n' {q(image_id)} > {q(idf + '.tmp')} && mv -f {q(idf + '.tmp')} {q(idf)}")


def registry_load_cmd(image, root: str, rid: str, image_id: str, ref: str) -> str:
    """After a push to ``sglang.image.registry``: pull ``ref`` (``REPO@sha256:DIGEST``, the
    manifest pushed) on a host, the registry's credentials read from stdin (the auth file's
    bytes; empty: none) into a file only the host's user can read, removed whatever happened
    (podman ``--authfile``; docker: ``DOCKER_CONFIG`` naming a folder with it as
    ``config.json``); ``--tls-verify=false`` when the profile says so (podman). The pulled image's
    id must be ``image_id`` (exit 5 otherwise), then it is tagged and recorded
    (:func:`record_cmd`). Never prints the credentials."""
    rt = runtime_cmd(image, root)
    if is_docker(image):
        pull = f"DOCKER_CONFIG=\"$A\" {rt} pull -q {q(ref)} >/dev/null"
        auth = "A=$(mktemp -d); trap 'rm -rf \"$A\"' EXIT; cat > \"$A/config.json\"; "
    else:
        tls = "" if image.registry_tls_verify else " --tls-verify=false"
        pull = f"if [ -s \"$A\" ]; then au=\"--authfile $A\"; else au=; fi; {rt} pull -q{tls} $au {q(ref)} >/dev/null"
        auth = "A=$(mktemp); trap 'rm -f \"$A\"' EXIT; cat > \"$A\"; "
    return (f"set -e; umask 077; {auth}if ! {exists_cmd(image, rt, q(image_id))}; then {pull}; "
            f"{exists_cmd(image, rt, q(image_id))} || {{ echo \"the image pulled from {ref} is not the one built "
            f"({image_id})\" >&2; exit 5; }}; fi; {record_cmd(image, root, rid, image_id)}")


def verify_image_cmd(image, root: str, rid: str, python: str, script: str, expect: str | None) -> str:
    """Verify the image release ``rid`` runs on a host (read-only but for the mount): the
    recorded id (:func:`id_file`) is ``expect`` (when given; exit 6 otherwise), the image is in
    the store (exit 6), and the release folder inside it, mounted (``image mount``), hashes as
    its MANIFEST.json says (the drift verify ``script`` run by ``python``; its JSON report is
    the output), the image's environment layer checked against the release's lock. The image
    is unmounted whatever happened. docker (no image mount): the script runs with the image's
    ``python`` in a container of the image without network, on ``/opt/dsv4ctl/releases/<rid>``."""
    rt = runtime_cmd(image, root)
    idf = q(id_file(root, rid))
    job = f"{{\"verify\": [\"{image_dir(rid)}\"], \"image\": true}}"
    if is_docker(image):        # no image mount: the script runs in a container of the image (no network)
        check = (f"printf '%s' {q(job)} | {rt} run --rm -i --network none --entrypoint '' \"$id\" "
                 f"{q(image.python)} -S -c {q(script)}; exit $?")
    else:
        check = (f"m=$({rt} image mount \"$id\") || exit 6; "
                 f"printf '{{\"verify\": [\"%s\"], \"image\": true}}' \"$m{image_dir(rid)}\" | "
                 f"{q(python)} -S -c {q(script)}; rc=$?; "
                 f"{rt} image unmount \"$id\" >/dev/null 2>&1; exit $rc")
    has = exists_cmd(image, rt, '"$id"')
    want = (f"[ \"$id\" = {q(expect)} ] || {{ echo \"{rid}: the host records image $id, the release's image is "
            f"{expect}\" >&2; exit 6; }}; ") if expect else ""
    return (f"id=$(cat {idf} 2>/dev/null) || {{ echo \"{rid}: no image recorded ({id_file(root, rid)})\" >&2; exit 6; }}; "
            f"{want}{has} || "
            f"{{ echo \"{rid}: image $id is not in the host's store\" >&2; exit 6; }}; {check}")


def gc_images_cmd(image, root: str) -> str:
    """Remove the images no release on the host names any more (pure): for each
    :func:`id_file` whose release folder is gone, ``rmi`` its image (unless another kept release
    records the same id) and drop the record; then the pool's blobs go too when no image is
    left to share them with the next ship... they are kept otherwise (they make the next
    transfer a delta). Never fails."""
    rt = runtime_cmd(image, root)
    ids, rel = q(images_root(root) + "/ids"), q(root + "/releases")
    return (f"if [ -d {ids} ]; then for f in {ids}/*; do [ -f \"$f\" ] || continue; r=${{f##*/}}; "
            f"[ -d {rel}/\"$r\" ] && continue; id=$(cat \"$f\"); rm -f \"$f\"; "
            f"if ! cat {ids}/* 2>/dev/null | grep -qx \"$id\"; then {rt} rmi -f \"$id\" >/dev/null 2>&1 || true; fi; "
            f"done; fi; true")
