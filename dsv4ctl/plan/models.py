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


CHECKPOINT_FORMATS = ("fp4", "fp8")


@dataclass(frozen=True)
class ModelFacts:
    """Facts for estimates when the operator has not measured them (⚠ estimates; a measured
    ``weights_gib_per_rank`` / ``draft_weights_gib_per_rank`` always wins).

    ``checkpoint_gib``: checkpoint tensor payload in GiB of the published checkpoint, whose
    routed experts are FP4 (MXFP4 packed in int8, e8m0 scale per 32) and the rest FP8 (Flash
    ≈149 GiB, third-party notes; Pro 805.33 GiB, checkpoint inspection report; capacity
    reference §1.1). ``checkpoint_gib_fp8``: the same model with FP8 routed experts (block
    scales [128,128]): the routed-expert payload doubles and the per-32 e8m0 scales go, so
    experts x 2 x 16/17 (Flash 137.1 GiB -> 258.1, Pro 765.6 GiB -> 1,441.1; reference §1.1).
    ``mtp_layer_gib``: the MTP (nextn) draft layer, one layer's routed experts plus attention
    (Flash 3.19 + 0.2, Pro 12.55 + 0.45 GiB for FP4; FP8: experts x 32/17), sharded by TP/EP."""

    checkpoint_gib: Optional[float]
    checkpoint_gib_fp8: Optional[float] = None
    mtp_layer_gib: Optional[float] = None
    mtp_layer_gib_fp8: Optional[float] = None

    def checkpoint(self, fmt: str) -> Optional[float]:
        """Checkpoint GiB of format ``fmt`` (fp4 = the published mixed FP4/FP8 checkpoint)."""
        return self.checkpoint_gib_fp8 if fmt == "fp8" else self.checkpoint_gib

    def mtp_layer(self, fmt: str) -> Optional[float]:
        """GiB of the MTP draft layer in format ``fmt``."""
        return self.mtp_layer_gib_fp8 if fmt == "fp8" else self.mtp_layer_gib


SHIPPED = {
    "deepseek-v4-flash": ModelFacts(checkpoint_gib=149.0, checkpoint_gib_fp8=270.0,
                                    mtp_layer_gib=3.39, mtp_layer_gib_fp8=6.2),
    "deepseek-v4-pro": ModelFacts(checkpoint_gib=805.33, checkpoint_gib_fp8=1480.8,
                                  mtp_layer_gib=13.0, mtp_layer_gib_fp8=24.08),
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
# Longest model reference echoed in an error line (a 5,000-character path is cut).
MAX_SHOWN = 200


def shipped_names() -> list[str]:
    """Names accepted as ``model:`` in a profile or ``--set model=``."""
    return sorted(SHIPPED)


def _config_path(ref: str, base_dir: Optional[Path]) -> Path:
    """The ``config.json`` a model path names: ``~`` expanded, relative to ``base_dir``, a folder's
    ``config.json``. OSError / ValueError / RuntimeError pass through (name too long, NUL byte,
    unknown ``~user``)."""
    path = Path(ref).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return path / "config.json" if path.is_dir() else path


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
    shown = ref if len(ref) <= MAX_SHOWN else ref[:MAX_SHOWN] + f"... ({len(ref)} characters)"
    try:
        path = _config_path(ref, base_dir)
        found = path.is_file()
    except (OSError, ValueError, RuntimeError) as e:   # name too long, NUL byte, unknown ~user
        raise InputError(f"unknown model {shown!r}: not a shipped model ({', '.join(shipped_names())}) "
                         f"and not a readable path ({(getattr(e, 'strerror', None) or type(e).__name__).lower()})") from None
    if not found:
        where = str(path) if len(str(path)) <= MAX_SHOWN else shown
        raise InputError(
            f"unknown model {shown!r}: not a shipped model ({', '.join(shipped_names())}) "
            f"and no config.json at {where}")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise InputError(f"{path}: config.json larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB")
        cfg = json.loads(raw.decode())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise InputError(f"{path}: not a readable config.json ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{path}: config.json must be a JSON object")
    try:
        return ModelGeometry.from_config(cfg, str(path)), ModelFacts(checkpoint_gib=None)
    except CapacityError as e:
        raise InputError(str(e)) from None


def model_type_of(ref: str, base_dir: Optional[Path] = None) -> Optional[str]:
    """``model_type`` of a shipped name or a ``config.json`` path (None when it cannot be read).
    Lint uses it to apply DeepSeek-V4 rules to DeepSeek-V4 models only (a V3.2 config has no
    ``compress_ratios`` and :func:`load_model` refuses it)."""
    key = ALIASES.get(ref.lower(), ref.lower())
    if key in SHIPPED:
        return "deepseek_v4"
    try:
        path = _config_path(ref, base_dir)
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
        cfg = json.loads(raw.decode()) if len(raw) <= MAX_CONFIG_BYTES else None
    except (OSError, ValueError, RecursionError, RuntimeError):
        return None
    if not isinstance(cfg, dict):
        return None
    mt = cfg.get("model_type")
    return str(mt) if isinstance(mt, str) else None
