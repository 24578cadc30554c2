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
    """dsv4ctl's local cache folder (release builds, pristine SGLang wheels and trees, parsed YAML):
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


def read_file_capped(path: Path | str, limit: int, label: str, hint: str = "") -> bytes:
    """The bytes of ``path``, at most ``limit`` of them (a mistaken multi-gigabyte file is never
    read into memory). InputError (exit 2) naming ``label`` when it cannot be read
    (``LABEL: strerror``) or is larger (``LABEL: larger than N MiB`` + ``hint``)."""
    from .errors import InputError
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
    except OSError as e:
        raise InputError(f"{label}: {e.strerror or e}") from None
    if len(raw) > limit:
        raise InputError(f"{label}: larger than {limit >> 20} MiB{hint}")
    return raw
