"""Shipped DeepSeek-V4 model configs and facts used for estimates.

Configs are the published Hugging Face ``config.json`` files of DeepSeek-V4-Flash and -Pro
(provenance: shared/reference/models/README.md). Any local ``config.json`` is accepted too."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .capacity import CapacityError, ModelGeometry
from ..errors import InputError
from ..resources import MODELS_DIR


@dataclass(frozen=True)
class ModelFacts:
    """Facts for estimates when the operator has not measured them (⚠ estimates).

    ``checkpoint_gib``: checkpoint tensor payload in GiB (Flash ≈149 GiB, third-party notes;
    Pro 805.33 GiB, checkpoint inspection report; capacity reference §1.1)."""

    checkpoint_gib: Optional[float]


SHIPPED = {
    "deepseek-v4-flash": ModelFacts(checkpoint_gib=149.0),
    "deepseek-v4-pro": ModelFacts(checkpoint_gib=805.33),
}
ALIASES = {
    "flash": "deepseek-v4-flash", "pro": "deepseek-v4-pro",
    "deepseek-ai/deepseek-v4-flash": "deepseek-v4-flash",
    "deepseek-ai/deepseek-v4-pro": "deepseek-v4-pro",
}

# Replicated (non-sharded) weight GiB per rank added to checkpoint/(tp*pp) in the estimate.
# Calibrated on the third-party B200 TP8 figures (Flash 21.83, Pro 105.57 GiB/rank), ⚠.
REPLICATED_WEIGHTS_GIB = 3.0
# Largest config.json read (bytes); published DSV4 configs are ~2 KiB.
MAX_CONFIG_BYTES = 16 * 1024 * 1024


def shipped_names() -> list[str]:
    """Names accepted as ``model:`` in a profile or ``--set model=``."""
    return sorted(SHIPPED)


def load_model(ref: str, base_dir: Optional[Path] = None) -> tuple[ModelGeometry, ModelFacts]:
    """Resolve a shipped name (``deepseek-v4-flash``, ``flash``, ``deepseek-ai/DeepSeek-V4-Pro``)
    or a path to a ``config.json`` (relative to ``base_dir``). Raises InputError (exit 2) for an
    unknown name, a file over MAX_CONFIG_BYTES, invalid JSON or an invalid field
    (:meth:`ModelGeometry.from_config`)."""
    key = ALIASES.get(ref.lower(), ref.lower())
    if key in SHIPPED:
        cfg = json.loads((MODELS_DIR / f"{key}.json").read_text())
        try:
            return ModelGeometry.from_config(cfg, key), SHIPPED[key]
        except CapacityError as e:  # pragma: no cover - shipped data is tested
            raise InputError(str(e)) from None
    path = Path(ref).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    try:
        if path.is_dir():
            path = path / "config.json"
        usable = path.is_file()
    except OSError as e:      # a 5,000-character path: ENAMETOOLONG, never a traceback
        shown = ref if len(ref) <= 80 else f"{ref[:60]}... ({len(ref)} characters)"
        raise InputError(f"model {shown!r}: not a usable path ({(e.strerror or str(e)).lower()})") from None
    if not usable:
        raise InputError(
            f"unknown model {ref!r}: not a shipped model ({', '.join(shipped_names())}) "
            f"and no config.json at {path}")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise InputError(f"{path}: config.json larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB")
        cfg = json.loads(raw.decode())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise InputError(f"{path}: not a readable config.json ({type(e).__name__}: {e})") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{path}: config.json must be a JSON object")
    try:
        return ModelGeometry.from_config(cfg, str(path)), ModelFacts(checkpoint_gib=None)
    except CapacityError as e:
        raise InputError(str(e)) from None
