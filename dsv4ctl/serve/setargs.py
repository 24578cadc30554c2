"""``KEY=VALUE`` settings of serve-config keys (``dsv4ctl config set``, the runbook action
``config.set``): parsed and checked against SGLang 0.5.23's argument table, turned into
round-trip edits (:class:`dsv4ctl.serve.edit.Change`). Pure: no file or host is read.

A value is read as YAML (``kv-canary=log`` → ``"log"``, ``max-running-requests=64`` → ``64``,
``enable-metrics=true`` → ``True``, ``cuda-graph-bs=[1,2,4]`` → a list), which is what the
same text would mean in the ``--config`` file. The key must be a full long option name or one
of its aliases as the table spells it (no argparse abbreviations: a file edited by a tool says
what it means); ``--unset KEY`` removes a key (its spelling in the file, whichever it is)."""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import InputError
from .argtable import ConvertError, Table, convert
from .edit import REMOVE, Change

#: keys ``config set`` refuses: each has its own command, which checks what goes with it
OWNED = {
    "enable-hierarchical-cache": "dsv4ctl hicache on|off",
    "config": "the serve config cannot name another config file",
}
#: argument dests that are the group's topology in the profile (model, tp/dp/pp/ep/attn-dp sizes,
#: GPUs, address, port, PD role, multi-node set-up): routers, plans, gates and other groups depend
#: on them, so they change with the profile and a deploy, not one serve config at a time
TOPOLOGY = frozenset({"model_path", "tp_size", "dp_size", "pp_size", "ep_size", "attn_dp_size", "base_gpu_id",
                      "gpu_id_step", "host", "port", "disaggregation_mode", "nnodes", "node_rank", "dist_init_addr"})


def parse_assignment(text: str) -> tuple[str, Any]:
    """``"KEY=VALUE"`` → (KEY, the YAML value of VALUE). InputError (exit 2) for a missing ``=``,
    an empty key or a value that is not one YAML scalar, list or mapping."""
    import yaml
    key, sep, raw = text.partition("=")
    key = key.strip().removeprefix("--")
    if not sep or not key:
        raise InputError(f"{text!r}: expected KEY=VALUE (e.g. kv-canary=log)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        # the value itself is never echoed: it may be a secret (api-key=...)
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise InputError(f"{key}: the value is not YAML ({what}); quote it, e.g. {key}='\"...\"'") from None
    return key, value


def _arg(table: Table, key: str):
    arg = table.get(key)
    if arg is None:
        pref = table.prefix_matches(key)
        dashed = key.replace("_", "-")
        hint = (f" (serve-config keys are dashed, as SGLang's --config reads them: {dashed})"
                if dashed != key and table.get(dashed) is not None else
                f" (did you mean {', '.join(pref[:4])}?)" if pref else "")
        raise InputError(f"{key}: not an SGLang {table.version} server argument{hint}")
    if key in OWNED or arg.name in OWNED:
        raise InputError(f"{key}: set it with {OWNED.get(key) or OWNED[arg.name]}")
    if arg.dest in TOPOLOGY:
        raise InputError(f"{key}: part of the group's topology in the profile (model, parallel sizes, GPUs, "
                         "address, port, PD role): edit the profile and its serve configs together, then "
                         "dsv4ctl deploy")
    if arg.config == "unsupported":
        raise InputError(f"{key}: SGLang {table.version}'s --config reader rejects this key "
                         "(BooleanOptionalAction or deprecated flag); it cannot be set in a serve config")
    return arg


def changes_for_set(data: dict, sets: Sequence[tuple[str, Any]], unsets: Sequence[str], table: Table,
                    label: str) -> list[Change]:
    """The edits that make a serve config (raw mapping ``data``) hold ``sets`` [(key, value)] and
    not hold ``unsets`` [key]; [] when it already does.

    Each value is converted as SGLang 0.5.23 would convert it at start-up
    (:func:`dsv4ctl.serve.argtable.convert`: type, choices, flag-ness); InputError (exit 2,
    ``label: key: reason``) for an unknown key, a key set twice, a value SGLang rejects, or a key
    another command owns (:data:`OWNED`) or the profile's topology holds (:data:`TOPOLOGY`). An existing spelling of the key (an alias) is edited in
    place; a new key goes after the last entry. ``--unset`` also takes a key SGLang does not know
    (the repair of a typo)."""
    seen: dict[str, str] = {}
    out: list[Change] = []
    for key, value in list(sets) + [(k, REMOVE) for k in unsets]:
        if value is REMOVE and table.get(key) is None:
            # a key SGLang does not know (a typo lint reports as SGL001) can be removed: the repair
            if key in seen:
                raise InputError(f"{key}: given twice")
            seen[key] = key
            if key in data:
                out.append(Change(key, REMOVE, spellings=(key,)))
            continue
        arg = _arg(table, key)
        if arg.name in seen:
            raise InputError(f"{key}: given twice (also as {seen[arg.name]})")
        seen[arg.name] = key
        present = [k for k in data if k in arg.spellings]
        if value is REMOVE:
            if present:
                out.append(Change(arg.name, REMOVE, spellings=arg.spellings))
            continue
        try:
            convert(arg, value)
        except ConvertError as e:
            raise InputError(f"{label}: {key}: {e}") from None
        if len(present) == 1 and data[present[0]] == value and type(data[present[0]]) is type(value):
            continue
        out.append(Change(arg.name, value, spellings=arg.spellings))
    return out
