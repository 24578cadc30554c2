"""How SGLang 0.5.23 resolves a ``--config`` key to a server argument: exact long option, else an
argparse abbreviation (``allow_abbrev=True``, the default of ``argparse.ArgumentParser``; SGLang's
``ConfigArgumentMerger._convert_config_to_args`` in ``srt/utils/server_args_config_parser.py``
turns every YAML key into ``--key`` before ``parser.parse_args``). A prefix of exactly one long
option selects it (``tp`` -> ``tp-size``, ``speculative-algo`` -> ``speculative-algorithm``); a
prefix of several is argparse's "ambiguous option" error (``cuda-graph-max-bs`` could match
``cuda-graph-max-bs-decode`` and ``cuda-graph-max-bs-prefill``).

The option names come from the shipped table ``dsv4ctl/data/server_args-0.5.23.json`` (extracted
from the real parser by ``scripts/gen_server_args.py``; :mod:`dsv4ctl.serve.argtable` reads the
same file with its types)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Optional

TABLE_PATH = Path(__file__).resolve().parent.parent / "data" / "server_args-0.5.23.json"


class AmbiguousOption(ValueError):
    """argparse's "ambiguous option" error, phrased as argparse phrases it."""


@functools.lru_cache(maxsize=4)
def option_names(version: Optional[str] = None) -> dict[str, str]:
    """Every long spelling (name and aliases, without ``--``) -> the argument's main name, of
    SGLang ``version``'s table (default 0.5.23's)."""
    path = TABLE_PATH if version in (None, "0.5.23") else TABLE_PATH.with_name(f"server_args-{version}.json")
    doc = json.loads(path.read_text())
    out: dict[str, str] = {}
    for a in doc["arguments"]:
        for k in [a["name"], *a["aliases"]]:
            out[k] = a["name"]
    return out


def resolve_option(key: str, names: Optional[dict[str, str]] = None) -> Optional[str]:
    """The main dashed name SGLang's parser gives ``key``; None when no option matches (SGLang
    then fails with "unrecognized arguments"; lint reports it). Raises :class:`AmbiguousOption`
    when ``key`` abbreviates more than one option."""
    names = option_names() if names is None else names
    if key in names:
        return names[key]
    matches = sorted(k for k in names if k.startswith(key))
    targets = sorted({names[k] for k in matches})
    if len(targets) > 1:
        raise AmbiguousOption(f"ambiguous option: --{key} could match "
                              + ", ".join(f"--{k}" for k in matches))
    return targets[0] if targets else None
