"""Locations of data shipped with dsv4ctl: model configs, profiles, patch series, playbooks.

In a checkout (or an editable install) the repository's own ``profiles/``, ``patches/`` and
``playbooks/`` are used; a wheel carries copies under ``dsv4ctl/_shipped/``."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent
MODELS_DIR = PACKAGE_DIR / "data" / "models"
DEFAULT_PROFILE_NAME = "dsv4-flash-8xb200-pd"


def shipped_dir(name: str) -> Path:
    """``profiles`` / ``patches`` / ``playbooks``: the repository folder, else the wheel's copy."""
    repo = REPO_DIR / name
    if repo.is_dir():
        return repo
    return PACKAGE_DIR / "_shipped" / name


def default_profile_path() -> Path:
    """Path of the embedded default profile ``profiles/dsv4-flash-8xb200-pd.yaml``."""
    return shipped_dir("profiles") / f"{DEFAULT_PROFILE_NAME}.yaml"


def resolve_profile(arg: str | None) -> Path:
    """A profile argument: None → the default, a shipped name (``dsv4-flash-8xb200-pd``), or a path."""
    if arg is None:
        return default_profile_path()
    p = Path(arg).expanduser()
    if p.exists() or "/" in arg or arg.endswith((".yaml", ".yml")):
        return p
    return shipped_dir("profiles") / f"{arg}.yaml"


def cache_root() -> Path:
    """dsv4ctl's local cache folder (release builds, pristine SGLang wheels, parsed YAML):
    ``$DSV4CTL_CACHE``, else ``$XDG_CACHE_HOME/dsv4ctl``, else ``~/.cache/dsv4ctl``."""
    base = os.environ.get("DSV4CTL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dsv4ctl")
    return Path(base).expanduser()


def state_root() -> Path:
    """dsv4ctl's local state folder (runbook runs, the run log): ``$DSV4CTL_STATE_DIR``, else
    ``$XDG_STATE_HOME/dsv4ctl``, else ``~/.local/state/dsv4ctl``."""
    base = os.environ.get("DSV4CTL_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "dsv4ctl")
    return Path(base).expanduser()
