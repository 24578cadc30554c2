"""The one reader of SGLang ``--config`` serve configs (dashed server-argument keys, ops reference §1.2).

A serve config is read once per command run (:func:`read_serve_config`, called by
:func:`dsv4ctl.profile.deployment.resolve`) into a :class:`ServeConfig` holding the raw bytes (what
a release ships), the text (what an edit rewrites), the data as SGLang's ``yaml.safe_load`` gives
it (what lint judges), each key's line, and the canonical arguments (what plan and deploy read).
A live file read from a host goes through :func:`parse_serve_config` with a ``host:path`` label."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..errors import InputError
from .yamlpos import parse_yaml, read_yaml_bytes

# sglang 0.5.23 srt/utils/server_args_config_parser.py: ``path.suffix.lower() not in [".yaml", ".yml"]``.
SUFFIXES = (".yaml", ".yml")

# The argparse aliases of 0.5.23 server arguments → canonical dashed name: every alias of
# dsv4ctl/data/server_args-0.5.23.json except the ``no-X`` negations of boolean options (those
# invert the value). Kept here for start-up time (the table is 150 KB of JSON);
# tests/test_serve_aliases.py proves it equals the table's.
ALIASES = {
    "attention-context-parallel-size": "attn-cp-size",
    "attention-data-parallel-size": "attn-dp-size",
    "context-bucket": "cuda-graph-prefill-max-context",
    "data-parallel-size": "dp-size",
    "decode-context-parallel-size": "dcp-size",
    "enable-hicache": "enable-hierarchical-cache",
    "ep": "ep-size",
    "expert-parallel-size": "ep-size",
    "grpc-http-sidecar-port": "smg-http-sidecar-port",
    "hierarchical-sparse-attention-extra-config": "hisparse-config",
    "model": "model-path",
    "moe-data-parallel-size": "moe-dp-size",
    "nccl-init-addr": "dist-init-addr",
    "pipeline-parallel-size": "pp-size",
    "speculative-draft-model": "speculative-draft-model-path",
    "tensor-parallel-size": "tp-size",
}
HICACHE_KEYS = ("enable-hierarchical-cache", "enable-hicache")

# Counts every file read by read_serve_config (tests assert one read per serve config per command).
READS: dict[str, int] = {}


def canonical(key: str) -> str:
    """The canonical dashed name of a serve-config key (aliases resolved)."""
    return ALIASES.get(key, key)


def check_suffix(path: Path | str) -> None:
    """SGLang only accepts ``--config`` files whose suffix, lower-cased, is .yaml or .yml.

    Raises InputError (exit 2) otherwise."""
    if Path(str(path)).suffix.lower() not in SUFFIXES:
        raise InputError(f"{path}: SGLang only accepts --config files ending in .yaml or .yml")


@dataclass(frozen=True)
class ServeConfig:
    """One parsed serve config.

    ``path``: its label (local path, or ``host:path`` for a live file); ``raw``: the bytes as stored;
    ``data``: the mapping as PyYAML ``safe_load`` gives it (keys as written, aliases unresolved);
    ``lines``: key → 1-based line."""

    path: str
    data: dict
    lines: dict[str, int] = field(default_factory=dict)
    raw: bytes = b""

    @property
    def text(self) -> str:
        """The file's text exactly as stored (no newline translation)."""
        return self.raw.decode("utf-8")

    def line(self, key: Optional[str]) -> int:
        """The 1-based line of ``key`` (1 when absent or None)."""
        return self.lines.get(key, 1) if key is not None else 1

    def where(self, key: str) -> str:
        """``label:line`` of ``key``, for error messages."""
        return f"{self.path}:{self.line(key)}"

    def args(self) -> dict[str, Any]:
        """The server arguments keyed by canonical dashed names.

        Raises InputError (exit 2) for an underscore key (SGLang rejects ``model_path``) or a key
        given twice through an alias."""
        out: dict[str, Any] = {}
        for key, value in self.data.items():
            if "_" in key:
                raise InputError(f"{self.where(key)}: {key}: SGLang --config keys use dashes "
                                 f"({key.replace('_', '-')})")
            c = canonical(key)
            if c in out:
                raise InputError(f"{self.where(key)}: {key}: given twice (alias of {c})")
            out[c] = value
        return out

    def get(self, key: str, default: Any = None) -> Any:
        """The value of canonical argument ``key`` written under its name or an alias (no checks)."""
        for k, v in self.data.items():
            if canonical(k) == key:
                return v
        return default

    @property
    def hicache_enabled(self) -> bool:
        """True when the file turns HiCache on (``enable-hierarchical-cache``/``enable-hicache: true``)."""
        return any(self.data.get(k) is True for k in HICACHE_KEYS)


def parse_serve_config(raw: bytes | str, label: str) -> ServeConfig:
    """Parse serve-config bytes (or text) as sglang 0.5.23 does (PyYAML ``safe_load``), with key lines.

    Raises InputError (exit 2): not UTF-8, a YAML syntax error (``label:line``), a duplicate key,
    a non-mapping root. An empty file is an empty mapping (SGLang: no options)."""
    raw_b = raw.encode("utf-8") if isinstance(raw, str) else raw
    data, pos = parse_yaml(raw_b, label)
    if data is None:
        return ServeConfig(path=label, data={}, raw=raw_b)
    if not isinstance(data, dict):
        raise InputError(f"{label}:1: a serve config must be a mapping of server arguments")
    data = {str(k): v for k, v in data.items()}
    return ServeConfig(path=label, data=data, lines={k: pos.line((k,)) for k in data}, raw=raw_b)


def read_serve_config(path: Path | str) -> ServeConfig:
    """Read and parse the local serve config ``path`` (suffix checked first).

    Raises InputError (exit 2): a bad suffix, a missing/unreadable file or folder, plus the
    errors of :func:`parse_serve_config`."""
    check_suffix(path)
    READS[str(path)] = READS.get(str(path), 0) + 1
    return parse_serve_config(read_yaml_bytes(path), str(path))
