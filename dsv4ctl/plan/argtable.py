"""SGLang server-argument tables (shipped data, one per release) and how a ``--config`` YAML value
is parsed. Lives in the plan layer because the start-up validation (:mod:`dsv4ctl.plan.startup`)
that plan, lint, the preflight and ``config set`` share reads it.

The table ``dsv4ctl/data/server_args-0.5.23.json`` is extracted from the real parser by
``scripts/gen_server_args.py``; sglang is never imported here. Value conversion mirrors what
sglang 0.5.23 does with a YAML key (``srt/utils/server_args_config_parser.py``,
``ConfigArgumentMerger._convert_config_to_args``): booleans of store_true flags become the bare
flag or nothing, other booleans ``true``/``false`` strings, lists one argv item per element,
mappings ``json.dumps``, everything else ``str(value)`` (so ``null`` is the string ``"None"``);
argparse then applies the argument's ``type`` and ``choices``."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

DATA = Path(__file__).resolve().parent.parent / "data"
TABLE_PATH = DATA / "server_args-0.5.23.json"


def table_path(version: str) -> Path:
    """The shipped argument table of SGLang ``version`` (scripts/gen_server_args.py --version)."""
    return DATA / f"server_args-{version}.json"


def table_for(deployment) -> "Table":
    """The argument table of the SGLang release the deployment ships
    (:func:`dsv4ctl.plan.sglang_version.resolve_version`: the tree's version, else the profile's).
    InputError (exit 2) for an unsupported release."""
    from .sglang_version import resolve_version
    from ..profile.deployment import as_deployment
    return load_table(version=resolve_version(as_deployment(deployment)).version)


@dataclass(frozen=True)
class Arg:
    """One SGLang server argument. ``name`` is the dashed long option without ``--``."""

    name: str
    aliases: tuple[str, ...]
    dest: str
    action: str
    type: Optional[str]
    choices: Optional[tuple]
    default: Any
    nargs: Any
    config: str          # store_true | value | unsupported (how --config YAML treats the key)

    @property
    def spellings(self) -> tuple[str, ...]:
        return (self.name,) + self.aliases


@dataclass(frozen=True)
class Table:
    """The whole table: ``by_key`` maps every long spelling (name and aliases) to its Arg."""

    version: str
    args: tuple[Arg, ...]
    by_key: dict

    def get(self, key: str) -> Optional[Arg]:
        return self.by_key.get(key)

    def canonical(self, key: str) -> str:
        """The main dashed name of ``key`` (an alias resolves to its argument's name)."""
        a = self.by_key.get(key)
        return a.name if a else key

    def prefix_matches(self, key: str) -> list[str]:
        """Long options ``key`` abbreviates (argparse ``allow_abbrev``)."""
        return sorted(k for k in self.by_key if k.startswith(key) and k != key)

    @functools.cached_property
    def by_dest(self) -> dict:
        """``{dest: Arg}`` (the last Arg of a dest wins), built once per table: plan checks every
        re-planned fix against it (start-up, benchmarks/startup.py)."""
        return {a.dest: a for a in self.args}

    @functools.cached_property
    def defaults(self) -> dict:
        """``{dest: default}`` (the last Arg of a dest wins), built once per table; copy before changing it."""
        return {a.dest: a.default for a in self.args}


@functools.lru_cache(maxsize=4)
def load_table(path: Optional[Path] = None, version: Optional[str] = None) -> Table:
    """Load a shipped table (about 5 ms): ``path``, else SGLang ``version``'s, else 0.5.23's.
    Raises FileNotFoundError if the data is missing."""
    path = path or (table_path(version) if version else TABLE_PATH)
    doc = json.loads(Path(path).read_text())
    args = []
    by_key: dict[str, Arg] = {}
    for a in doc["arguments"]:
        config = a["config"]
        if a["action"].endswith("StoreConstAction") and a["nargs"] is None and a["choices"]:
            # --monokernel-backend amd: SGLang's DeprecatedStoreConstAction with nargs=None takes one
            # value (server_args.py:424-432); the extraction classed it as a bare flag
            config = "value"
        arg = Arg(name=a["name"], aliases=tuple(a["aliases"]), dest=a["dest"], action=a["action"],
                  type=a["type"], choices=tuple(a["choices"]) if a["choices"] is not None else None,
                  default=a["default"], nargs=a["nargs"], config=config)
        args.append(arg)
        for k in arg.spellings:
            by_key[k] = arg
    return Table(version=doc["sglang_version"], args=tuple(args), by_key=by_key)


class ConvertError(ValueError):
    """argparse would reject the value (message phrased like argparse's)."""


_HRI = re.compile(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)")


def _human_readable_int(s: str) -> int:
    # sglang 0.5.23 srt/utils/common.py human_readable_int
    s = s.strip()
    m = _HRI.fullmatch(s)
    if m:
        num, suf = m.groups()
        if suf in ("Ki", "Mi", "Gi", "Ti"):
            if "." in num:
                raise ConvertError(f"decimals are not allowed with IEC suffix {suf!r}")
            return int(num) * 2 ** (10 * ("KMGT".index(suf[0]) + 1))
        return int(float(num) * 10 ** (3 * ("kMGT".index(suf) + 1)))
    return int(s)


def _json(s: str) -> Any:
    return json.loads(s)


def _cuda_graph_backend(s: str) -> str:
    # sglang 0.5.23 srt/model_executor/cuda_graph_config.py parse_cuda_graph_backend_arg
    if s == "tc_piecewise":
        raise ConvertError("tc_piecewise was removed; select breakable, full, or disabled")
    return s


def _json_object(s: str) -> dict:
    v = json.loads(s)
    if not isinstance(v, dict):
        raise ConvertError(f"must be a JSON object, got {type(v).__name__}")
    return v


CONVERTERS = {
    None: str,
    "str": str,
    "int": int,
    "float": float,
    "json.loads": _json,
    "sglang.srt.utils.common.human_readable_int": _human_readable_int,
    "sglang.srt.utils.common.json_list_type": _json,
    "sglang.srt.utils.common.nullable_str": lambda s: None if not s or s == "None" else s,
    "sglang.srt.model_executor.cuda_graph_config.parse_cuda_graph_backend_arg": _cuda_graph_backend,
    "sglang.srt.model_executor.cuda_graph_config.parse_cuda_graph_config_arg": _json_object,
}


def _argv_items(arg: Arg, value: Any) -> Optional[list[str]]:
    """The argv items after ``--key`` for ``value`` (None: the key is omitted), as sglang emits them."""
    if isinstance(value, bool):
        if arg.config == "store_true":
            return [] if value else None
        return [str(value).lower()]
    if isinstance(value, list):
        return [str(v) for v in value] if value else None
    if isinstance(value, dict):
        return [json.dumps(value)]
    return [str(value)]


def convert(arg: Arg, value: Any) -> Any:
    """The value argparse would store for YAML ``value`` of ``arg``.

    Returns the converted value (``None`` when sglang omits the key: a false store_true flag or
    an empty list). Raises ConvertError with an argparse-like reason when sglang 0.5.23 would
    reject it at start-up."""
    items = _argv_items(arg, value)
    if items is None:
        return None
    if arg.config == "store_true":
        if items:
            raise ConvertError(f"is a flag: use true (or leave it out), not {value!r}")
        return True
    nargs = arg.nargs
    if nargs in (None, "?") and len(items) != 1:
        raise ConvertError(f"takes one value, got a list of {len(items)}")
    conv = CONVERTERS.get(arg.type)
    if conv is None:   # a type added by a newer table: accept, argparse will judge
        conv = str
    out = []
    for s in items:
        try:
            v = conv(s)
        except ConvertError:
            raise
        except (ValueError, TypeError) as e:
            tname = (arg.type or "str").rsplit(".", 1)[-1]
            raise ConvertError(f"invalid {tname} value: {s!r}") from e
        if arg.choices is not None and v not in arg.choices:
            shown = ", ".join(repr(c) for c in arg.choices)
            raise ConvertError(f"invalid choice: {s!r} (choose from {shown})")
        out.append(v)
    return out if nargs in ("+", "*") or (isinstance(nargs, int) and nargs > 1) else out[0]
