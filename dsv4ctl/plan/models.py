"""Shipped DeepSeek-V4 model configs and facts used for estimates.

Configs are the published Hugging Face ``config.json`` files of DeepSeek-V4-Flash and -Pro
(provenance: shared/reference/models/README.md). Any local ``config.json`` is accepted too."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from .capacity import CapacityError, ModelGeometry
from ..errors import InputError
from ..resources import MODELS_DIR


# Routed-expert formats of ``--set checkpoint_format``: fp4 = the published checkpoints (MXFP4
# experts, FP8 elsewhere; SGLang logs them "quant=fp8"), fp8 = FP8 experts (e.g. the -Base models).
CHECKPOINT_FORMATS = ("fp4", "fp8")


@dataclass(frozen=True)
class ModelFacts:
    """Where a model's weights per rank come from when the operator has not measured them (a
    measured ``weights_gib_per_rank`` / ``draft_weights_gib_per_rank`` always wins):
    ``shipped`` (a shipped model: the published checkpoint's table), ``checkpoint_dir`` (a local
    checkpoint folder: its safetensors headers), else neither (a bare ``config.json``: the
    operator must measure). The estimate itself is :func:`dsv4ctl.plan.weights.estimate`.
    ``config_path``: the ``config.json`` read."""

    shipped: Optional[str] = None
    config_path: Optional[Path] = None
    checkpoint_dir: Optional[Path] = None


SHIPPED = {"deepseek-v4-flash": ModelFacts(), "deepseek-v4-pro": ModelFacts()}
ALIASES = {
    "flash": "deepseek-v4-flash", "pro": "deepseek-v4-pro",
    "deepseek-ai/deepseek-v4-flash": "deepseek-v4-flash",
    "deepseek-ai/deepseek-v4-pro": "deepseek-v4-pro",
}

# Replicated (non-sharded) weight GiB per rank kept when a fix rescales weights to another TP
# size (plan fixes); the estimate itself is dsv4ctl.plan.weights (Pro TP8: 3.31 GiB replicated).
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


def _kind(path: Path) -> str:
    """What ``path`` is when it is no regular file (:func:`dsv4ctl.resources.file_kind`)."""
    from ..resources import file_kind
    try:
        return file_kind(path.stat().st_mode)
    except OSError as e:
        return e.strerror or "unreadable"


def load_model(ref: str, base_dir: Optional[Path] = None) -> tuple[ModelGeometry, ModelFacts]:
    """Resolve a shipped name (``deepseek-v4-flash``, ``flash``, ``deepseek-ai/DeepSeek-V4-Pro``)
    or a path to a ``config.json`` (relative to ``base_dir``). Raises InputError (exit 2) for an
    unknown name, a file over MAX_CONFIG_BYTES, invalid JSON or an invalid field
    (:meth:`ModelGeometry.from_config`)."""
    key = ALIASES.get(ref.lower(), ref.lower())
    if key in SHIPPED:
        cfg_path = MODELS_DIR / f"{key}.json"
        cfg = json.loads(cfg_path.read_text())
        try:
            return ModelGeometry.from_config(cfg, key), replace(SHIPPED[key], shipped=key, config_path=cfg_path)
        except CapacityError as e:  # pragma: no cover - shipped data is tested
            raise InputError(str(e)) from None
    shown = ref if len(ref) <= MAX_SHOWN else ref[:MAX_SHOWN] + f"... ({len(ref)} characters)"
    from .weights import is_checkpoint_dir     # here: a shipped model's plan never loads the header reader
    try:
        path = _config_path(ref, base_dir)
        found = path.is_file()
        # a folder, or a config.json beside safetensors shards, is a checkpoint (weights from its headers)
        ckdir = path.parent if found and (path.name != Path(ref).name or is_checkpoint_dir(path.parent)) else None
    except (OSError, ValueError, RuntimeError) as e:   # name too long, NUL byte, unknown ~user
        raise InputError(f"unknown model {shown!r}: not a shipped model ({', '.join(shipped_names())}) "
                         f"and not a readable path ({(getattr(e, 'strerror', None) or type(e).__name__).lower()})") from None
    from ..resources import FileTooLarge, NotRegularFile, read_regular
    if not found:
        where = str(path) if len(str(path)) <= MAX_SHOWN else shown
        if path.exists():               # a FIFO, a device (/dev/zero), a socket: never opened
            raise InputError(f"{where}: config.json is not a regular file ({_kind(path)})")
        raise InputError(
            f"unknown model {shown!r}: not a shipped model ({', '.join(shipped_names())}) "
            f"and no config.json at {where}")
    try:
        cfg = json.loads(read_regular(path, MAX_CONFIG_BYTES).decode())
    except FileTooLarge:
        raise InputError(f"{path}: config.json larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB") from None
    except NotRegularFile as e:         # swapped after the check above
        raise InputError(f"{path}: config.json is not a regular file ({e.kind})") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:   # ValueError: JSON, or an int past 4,300 digits
        raise InputError(f"{path}: not a readable config.json ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{path}: config.json must be a JSON object")
    try:
        return ModelGeometry.from_config(cfg, str(path)), ModelFacts(config_path=path, checkpoint_dir=ckdir)
    except CapacityError as e:
        raise InputError(str(e)) from None


def model_type_of(ref: str, base_dir: Optional[Path] = None) -> Optional[str]:
    """``model_type`` of a shipped name or a ``config.json`` path (None when it cannot be read).
    Lint uses it to apply DeepSeek-V4 rules to DeepSeek-V4 models only (a V3.2 config has no
    ``compress_ratios`` and :func:`load_model` refuses it)."""
    key = ALIASES.get(ref.lower(), ref.lower())
    if key in SHIPPED:
        return "deepseek_v4"
    from ..resources import read_regular
    try:     # a FIFO, a device or a file over the limit is no config (never waited on, never read whole)
        cfg = json.loads(read_regular(_config_path(ref, base_dir), MAX_CONFIG_BYTES).decode())
    except (OSError, ValueError, RecursionError, RuntimeError):
        return None
    if not isinstance(cfg, dict):
        return None
    mt = cfg.get("model_type")
    return str(mt) if isinstance(mt, str) else None
