"""Reading SGLang ``--config`` serve configs (dashed server-argument keys, reference ops §1.2).

Only what ``plan`` needs lives here: the server arguments as a dict with canonical dashed
names. Round-trip editing and lint live in :mod:`dsv4ctl.serve_edit` / :mod:`dsv4ctl.lint`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import InputError
from .yamlpos import Positions, load_yaml

# Common argparse aliases of 0.5.23 server arguments → canonical dashed name.
ALIASES = {
    "tensor-parallel-size": "tp-size",
    "pipeline-parallel-size": "pp-size",
    "data-parallel-size": "dp-size",
    "expert-parallel-size": "ep-size",
    "ep": "ep-size",
    "enable-hicache": "enable-hierarchical-cache",
    "model": "model-path",
}


def canonical(key: str) -> str:
    """The canonical dashed name of a serve-config key (aliases resolved)."""
    return ALIASES.get(key, key)


def read_serve_config(path: Path) -> tuple[dict[str, Any], Positions]:
    """Server arguments of one serve config, keyed by canonical dashed names.

    Raises InputError (exit 2) for a missing file, a YAML error (file:line), a non-mapping root,
    an underscore key (SGLang rejects ``model_path``) or a key given twice through an alias."""
    path = Path(path)
    if path.suffix not in (".yaml", ".yml"):
        raise InputError(f"{path}: SGLang only accepts --config files ending in .yaml or .yml")
    data, pos = load_yaml(path)
    if data is None:
        return {}, pos
    if not isinstance(data, dict):
        raise InputError(f"{path}:1: a serve config must be a mapping of server arguments")
    out: dict[str, Any] = {}
    for key, value in data.items():
        key_s = str(key)
        if "_" in key_s:
            raise InputError(f"{pos.where((key,))}: {key_s}: SGLang --config keys use dashes "
                             f"({key_s.replace('_', '-')})")
        c = canonical(key_s)
        if c in out:
            raise InputError(f"{pos.where((key,))}: {key_s}: given twice (alias of {c})")
        out[c] = value
    return out, pos
