"""Locations of data shipped with dsv4ctl and of its local folders.

Shipped data: model configs, the argument table and the JSON Schemas live in the package
(``dsv4ctl/data/``). Profiles (with their serve configs), patch series, playbooks and shell
completions live in the repository's ``profiles/``, ``patches/``, ``playbooks/`` and
``completions/``; the wheel carries copies of them under ``dsv4ctl/_shipped/`` (setup.py). A
wheel install (pip, pipx, uv tool) reads ``_shipped/``; a checkout or an editable install, which
has no ``_shipped/``, reads the repository folders. Same names, same files either way.

Local folders: one cache (``$DSV4CTL_CACHE``, else ``$XDG_CACHE_HOME/dsv4ctl``, else
``~/.cache/dsv4ctl``: release builds, pristine SGLang wheels and trees, parsed YAML), one state
folder (``$DSV4CTL_STATE_DIR``, else ``$XDG_STATE_HOME/dsv4ctl``, else ``~/.local/state/dsv4ctl``:
run log, runbook runs, promotion evidence)."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent
DATA_DIR = PACKAGE_DIR / "data"
MODELS_DIR = DATA_DIR / "models"
SCHEMAS_DIR = DATA_DIR / "schemas"
SHIPPED_DIR = PACKAGE_DIR / "_shipped"
SHIPPED_FOLDERS = ("profiles", "patches", "playbooks", "completions")
DEFAULT_PROFILE_NAME = "dsv4-flash-8xb200-pd"
# The profiles dsv4ctl ships (``profiles/NAME.yaml`` + ``profiles/NAME/``); setup.py copies these
# into the wheel and no command edits them. Other files an operator adds to ``profiles/`` are theirs.
SHIPPED_PROFILES = ("dsv4-flash-8xb200-pd", "dsv4-pro-4xh200-pd")


def shipped_dir(name: str) -> Path:
    """``profiles`` / ``patches`` / ``playbooks`` / ``completions``: the wheel's copy
    (``dsv4ctl/_shipped/NAME``) when dsv4ctl runs from a wheel, else the checkout's folder."""
    if name not in SHIPPED_FOLDERS:
        raise ValueError(f"not a shipped folder: {name}")
    wheel = SHIPPED_DIR / name
    if wheel.is_dir():
        return wheel
    return REPO_DIR / name


def default_profile_path() -> Path:
    """Path of the embedded default profile ``profiles/dsv4-flash-8xb200-pd.yaml``."""
    return shipped_dir("profiles") / f"{DEFAULT_PROFILE_NAME}.yaml"


def shipped_profile_names() -> list[str]:
    """Names of the shipped profiles (:data:`SHIPPED_PROFILES` present in ``profiles/``), sorted; an
    operator's own profile made in a checkout's ``profiles/`` (``profile init profiles/my.yaml``)
    is not one of them."""
    d = shipped_dir("profiles")
    return sorted(n for n in SHIPPED_PROFILES if (d / f"{n}.yaml").is_file())


def resolve_profile(arg: str | None) -> Path:
    """A profile argument: None → the default, a shipped name (``dsv4-flash-8xb200-pd``), or a path.
    A bare name that is a folder here (a profile's serve-config folder has its name) is
    ``NAME.yaml`` here when that file exists (an operator's copy, or ``profiles/``), else the
    shipped profile of that name.
    InputError (exit 2) for a path with a component longer than NAME_MAX (255 bytes)."""
    if arg is None:
        return default_profile_path()
    long = [c for c in arg.split("/") if len(os.fsencode(c)) > 255]
    if long:
        from .errors import InputError
        raise InputError(f"profile path: a component of {len(os.fsencode(long[0]))} bytes "
                         f"({long[0][:24]}…) is longer than file names may be (255)")
    p = Path(arg).expanduser()
    try:
        exists = p.exists()
    except (OSError, ValueError):
        exists = False
    if "/" in arg or arg.endswith((".yaml", ".yml")):
        return p
    shipped = shipped_dir("profiles") / f"{arg}.yaml"
    if exists and p.is_dir():
        own = Path(f"{arg}.yaml")
        if own.is_file():           # the profile beside its serve-config folder (a copy, or profiles/)
            return own
        return shipped if shipped.is_file() else p
    return p if exists else shipped


def is_shipped(path: Path) -> bool:
    """True when ``path`` is data shipped with dsv4ctl, which a command must never rewrite (start
    from a copy: ``dsv4ctl profile init``): anything in the ``dsv4ctl`` package folder (its
    ``_shipped/`` and ``data/`` included), or in
    a checkout a shipped profile (:data:`SHIPPED_PROFILES`) with its serve-config folder, a patch
    series, a playbook or a completion script. Symlinks are followed."""
    try:
        real = Path(os.path.realpath(path))
    except (OSError, ValueError):
        return False
    prof = REPO_DIR / "profiles"
    files = [prof / f"{n}.yaml" for n in SHIPPED_PROFILES]
    folders = [SHIPPED_DIR, Path(__file__).resolve().parent, *(prof / n for n in SHIPPED_PROFILES),
               *(REPO_DIR / n for n in SHIPPED_FOLDERS if n != "profiles")]
    if any(real == Path(os.path.realpath(f)) for f in files):
        return True
    for root in folders:
        r = Path(os.path.realpath(root))
        if real == r or r in real.parents:
            return True
    return False


def schema_path(name: str) -> Path:
    """The shipped JSON Schema ``dsv4ctl/data/schemas/NAME.schema.json``."""
    return SCHEMAS_DIR / f"{name}.schema.json"


def data_path(*parts: str) -> Path:
    """A file shipped inside the package: ``dsv4ctl/data/<parts>`` (rules, dashboards, tables)."""
    return PACKAGE_DIR / "data" / Path(*parts)


def runbook_names() -> list[str]:
    """Names of the shipped runbooks (``playbooks/NAME.yaml``), sorted."""
    return sorted(p.stem for p in shipped_dir("playbooks").glob("*.yaml"))


def schema_names() -> list[str]:
    """Names of the shipped JSON Schemas (``profile``, ``plan``, …), sorted."""
    return sorted(p.name[:-len(".schema.json")] for p in SCHEMAS_DIR.glob("*.schema.json"))


def _xdg(var: str, default: str) -> str:
    """``$VAR`` when it is an absolute path (the XDG spec ignores relative ones), else ``default``."""
    v = os.environ.get(var) or ""
    return v if os.path.isabs(v) else os.path.expanduser(default)


def cache_root() -> Path:
    """dsv4ctl's local cache folder (release builds, pristine SGLang wheels and trees, parsed YAML,
    checkpoint headers, compiled dataclass methods):
    ``$DSV4CTL_CACHE``, else ``$XDG_CACHE_HOME/dsv4ctl``, else ``~/.cache/dsv4ctl``. Anything here
    can be deleted; state that must survive lives in :func:`state_root`."""
    base = os.environ.get("DSV4CTL_CACHE") or os.path.join(_xdg("XDG_CACHE_HOME", "~/.cache"), "dsv4ctl")
    return Path(base).expanduser()


def state_root() -> Path:
    """dsv4ctl's local state folder (the run log, runbook runs, promotion evidence):
    ``$DSV4CTL_STATE_DIR``, else ``$XDG_STATE_HOME/dsv4ctl``, else ``~/.local/state/dsv4ctl``."""
    base = os.environ.get("DSV4CTL_STATE_DIR") or os.path.join(_xdg("XDG_STATE_HOME", "~/.local/state"), "dsv4ctl")
    return Path(base).expanduser()


def prune_files(folder: Path, keep: int, pattern: str = "*") -> int:
    """Delete the least recently modified files matching ``pattern`` in ``folder`` beyond the
    newest ``keep``; best effort (a file that vanishes or cannot be removed is skipped). Returns
    how many were deleted."""
    try:
        entries = []
        for p in folder.glob(pattern):
            try:
                entries.append((p.stat().st_mtime, p))
            except OSError:
                continue
    except OSError:
        return 0
    if len(entries) <= keep:
        return 0
    entries.sort(key=lambda e: e[0], reverse=True)
    gone = 0
    for _, p in entries[keep:]:
        try:
            p.unlink()
            gone += 1
        except OSError:
            pass
    return gone


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is, for messages: ``a folder``, ``a device``
    (``/dev/zero``), ``a pipe`` (a FIFO), ``a socket``, else ``not a file``."""
    import stat
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a file"


class NotRegularFile(OSError):
    """:func:`read_regular` was given a folder, device, FIFO or socket (``kind`` says which)."""

    def __init__(self, kind: str):
        super().__init__(kind)
        self.kind = kind


class FileTooLarge(OSError):
    """:func:`read_regular` was given a file larger than its limit (nothing past the limit read)."""


def read_regular(path: Path | str, limit: int) -> bytes:
    """The bytes of the regular file ``path`` (links followed), at most ``limit``: the one reader
    of files an operator names. A folder, a device (``/dev/zero``), a FIFO or a socket raises
    :class:`NotRegularFile` before a byte is read (checked before opening, so no device is opened,
    and again on the opened descriptor, which is opened non-blocking: a FIFO swapped in between
    never waits for a writer); a larger file raises :class:`FileTooLarge` (its size from
    ``fstat``, so a huge file is not read). Other OSErrors pass through."""
    import stat
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise NotRegularFile(file_kind(mode))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(file_kind(st.st_mode))
        if st.st_size > limit:
            raise FileTooLarge(f"{st.st_size} bytes")
        chunks, n = [], 0
        while n <= limit:
            b = os.read(fd, min(1 << 20, limit + 1 - n))
            if not b:
                break
            chunks.append(b)
            n += len(b)
    finally:
        os.close(fd)
    if n > limit:                   # it grew after fstat
        raise FileTooLarge(f"over {limit} bytes")
    return b"".join(chunks)


def read_file_capped(path: Path | str, limit: int, label: str, hint: str = "") -> bytes:
    """The bytes of ``path``, at most ``limit`` of them (:func:`read_regular`: a mistaken
    multi-gigabyte file is never read into memory, a FIFO or device is never waited on).
    InputError (exit 2) naming ``label`` when it cannot be read (``LABEL: strerror``), is no
    regular file (``LABEL: not a regular file (a pipe)``) or is larger (``LABEL: larger than N
    MiB`` + ``hint``)."""
    from .errors import InputError
    try:
        return read_regular(path, limit)
    except NotRegularFile as e:
        raise InputError(f"{label}: not a regular file ({e.kind})") from None
    except FileTooLarge:
        raise InputError(f"{label}: larger than {limit >> 20} MiB{hint}") from None
    except OSError as e:
        raise InputError(f"{label}: {e.strerror or e}") from None


class UntrustedFolder(OSError):
    """A cache folder another user owns or can write (:func:`cache_folder`); ``str()`` is the
    one-line reason a command that refuses it prints."""

    def __init__(self, where: Path, uid: int, mode: int, planted: str):
        self.where, self.uid, self.mode = where, uid, mode
        super().__init__(f"cache folder {where} is not yours alone (owner uid {uid}, mode {mode:o}): another user "
                         f"could plant {planted} there; make it yours with mode 700, or point DSV4CTL_CACHE at a "
                         "private folder")

    def __str__(self) -> str:
        return self.args[0]


def untrusted(st: os.stat_result) -> bool:
    """The one trust rule of dsv4ctl's cache folders: True when a folder with status ``st`` is
    owned by another user or writable by its group or by others (they could plant an entry)."""
    import stat
    return st.st_uid != os.getuid() or bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def cache_folder(path: Path, create: bool, planted: str = "an entry") -> int:
    """A descriptor (O_DIRECTORY, caller closes) of the cache folder ``path`` (``<cache>/yaml``,
    ``<cache>/wheels``, ``<cache>/trees``) once it and its parent (the cache folder) pass
    :func:`untrusted`, checked with ``fstat`` on the opened descriptors (nothing swapped in
    between); ``path`` is opened relative to its parent's descriptor. With ``create``, missing
    folders are made 0700. Raises :class:`UntrustedFolder` (saying what another user could
    plant) or OSError (absent, unreadable). Files in it are opened relative to the descriptor,
    without following links (:func:`open_cache_file`)."""
    import stat
    path = Path(path)
    if create:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    rfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fd = -1
    try:
        if create:
            try:
                os.mkdir(path.name, 0o700, dir_fd=rfd)
            except FileExistsError:
                pass
        fd = os.open(path.name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=rfd)
        for d, where in ((rfd, path.parent), (fd, path)):
            st = os.fstat(d)
            if untrusted(st):
                raise UntrustedFolder(where, st.st_uid, stat.S_IMODE(st.st_mode), planted)
        return fd
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    finally:
        os.close(rfd)


def open_cache_file(dir_fd: int, name: str, flags: int, mode: int = 0o600) -> int:
    """Open ``name`` in a trusted cache folder (:func:`cache_folder`'s descriptor) without
    following a link (``O_NOFOLLOW``; a FIFO is opened non-blocking) and check, on the opened
    descriptor, that it is a regular file of this user. OSError otherwise (``ELOOP`` for a link,
    ``EEXIST`` with ``O_EXCL``; :class:`NotRegularFile` for anything else; ``EPERM`` for a file
    another user owns)."""
    import errno
    import stat
    fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(file_kind(st.st_mode))
        if st.st_uid != os.getuid():
            raise OSError(errno.EPERM, f"owned by uid {st.st_uid}")
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_cache_entry(folder: str, name: str, limit: int, planted: str = "an entry") -> bytes | None:
    """The bytes of entry ``name`` of the cache folder ``<cache>/<folder>``, or None: absent, the
    folder untrusted (:func:`cache_folder`), the entry a link, not a regular file of this user
    (:func:`open_cache_file`) or larger than ``limit`` bytes, or unreadable. A hit refreshes the
    entry's mtime (kept by :func:`prune_files`)."""
    try:
        d = cache_folder(cache_root() / folder, create=False, planted=planted)
    except OSError:
        return None
    try:
        fd = open_cache_file(d, name, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            raw = os.read(fd, size + 1) if size <= limit else b""    # a regular file: one read
            try:
                os.utime(fd)
            except OSError:
                pass
        finally:
            os.close(fd)
    except OSError:
        return None
    finally:
        os.close(d)
    return raw if 0 < len(raw) <= limit and len(raw) == size else None


def write_cache_entry(folder: str, name: str, data: bytes, planted: str = "an entry") -> bool:
    """Write ``data`` as entry ``name`` of ``<cache>/<folder>`` (made 0700 when missing; it must be
    trusted, :func:`cache_folder`): a 0600 temp file created with ``O_EXCL`` and ``O_NOFOLLOW``
    under a random name, renamed in place (a planted link is never written through). Best effort:
    False when anything failed (nothing half-written is left under ``name``)."""
    try:
        d = cache_folder(cache_root() / folder, create=True, planted=planted)
    except OSError:
        return False
    tmp = f".{name}.{os.urandom(8).hex()}.tmp"
    try:
        fd = open_cache_file(d, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, name, src_dir_fd=d, dst_dir_fd=d)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=d)
            except OSError:
                pass
            raise
        return True
    except OSError:
        return False
    finally:
        os.close(d)
