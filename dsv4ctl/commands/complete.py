"""``dsv4ctl __complete KIND [PROFILE]``: the values the shell completions (completions/) cannot
know in advance, one per line on stdout.

KIND is ``groups`` or ``hosts`` (the names in the profile), ``servers`` (the server groups: every
group but a router, what ``plan``, ``facts``, ``config`` and ``hicache`` take), ``releases``
(release ids this machine deployed, promoted, rolled back to or made by ``hicache on|off --remote``
/ ``config set --remote`` with that profile, newest first, from the run log
``<state>/runs.jsonl``), ``runbooks`` (the shipped runbook names) or ``profiles`` (the shipped
profile names). PROFILE is what the command line being completed gives (positional PROFILE or
``-p/--profile``); empty or absent: ``DSV4CTL_PROFILE``, else the embedded default, as the
commands resolve it (:func:`dsv4ctl.resources.resolve_profile`).

It is a completion helper, not a command: ``dsv4ctl.cli.main`` dispatches to :func:`run` before
typer is imported (no typer app, no ``--help``, absent from the command tree and the generated
scripts' command lists). It reads the profile's YAML only (through the parsed-YAML cache: no
PyYAML on a profile seen before), never a serve config, never SSH or HTTP. Whatever goes wrong
(no such profile, broken YAML, an unknown KIND, an unreadable run log) prints nothing and exits
0: completion must never write into the user's prompt."""

from __future__ import annotations

import os
import re
import sys

KINDS = ("groups", "hosts", "servers", "releases", "runbooks", "profiles")
# A value offered to a shell: no whitespace or control characters (a word list is split on them).
_WORD = re.compile(r"[^\s\x00-\x1f\x7f]+")
_RELEASE_ID = re.compile(r"r[0-9a-f]{12}")
# The run log is read from its end, this much at most (a run record is a few KiB).
RUNLOG_TAIL_BYTES = 4 * 1024 * 1024


def _profile_path(arg: str | None):
    """The profile file for a PROFILE word (None/empty: ``DSV4CTL_PROFILE``, else the default)."""
    from ..resources import resolve_profile
    return resolve_profile(arg or os.environ.get("DSV4CTL_PROFILE") or None)


def _names(data, key: str, routers: bool = True) -> list[str]:
    """The ``name`` of every entry of the profile's ``key`` list (``groups``, ``hosts``); without
    ``routers``, groups whose ``role`` is ``router`` are left out."""
    items = data.get(key) if isinstance(data, dict) else None
    if not isinstance(items, list):
        return []
    return [x["name"] for x in items if isinstance(x, dict) and isinstance(x.get("name"), str)
            and (routers or x.get("role") != "router")]


def profile_names(kind: str, arg: str | None) -> list[str]:
    """Group (``kind`` ``groups``), server group (``servers``: no router) or host (``hosts``) names
    of the profile ``arg``, in profile order. Reads the YAML only; raises whatever reading it
    raises (InputError for a missing or broken file)."""
    from ..profile.yamlpos import load_yaml
    data, _ = load_yaml(_profile_path(arg))
    return _names(data, "groups", routers=False) if kind == "servers" else _names(data, kind)


def _same_profile(logged: str, real: str, name: str) -> bool:
    """Whether a run log's ``profile`` (the path as it was given) is the profile at ``real``: the
    same file, or, for a path logged relative to a working folder unknown now, the same file name."""
    try:
        if os.path.realpath(os.path.expanduser(logged)) == real:
            return True
    except (OSError, ValueError):
        return False
    return not os.path.isabs(logged) and os.path.basename(logged) == name


def release_ids(arg: str | None) -> list[str]:
    """Release ids of the runs recorded in the local run log (``<state>/runs.jsonl``, written by
    deploy, promote, rollback and the ``--remote`` serve-config changes) for the profile ``arg``, newest first, each once. Nothing else
    on this machine lists releases per profile (the build cache ``<cache>/releases/`` is shared by
    every profile); the authoritative list is on the hosts (``dsv4ctl releases``, over SSH)."""
    import json

    from ..resources import state_root
    path = _profile_path(arg)
    real, name = os.path.realpath(path), os.path.basename(path)
    try:
        with open(state_root() / "runs.jsonl", "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - RUNLOG_TAIL_BYTES))
            raw = f.read(RUNLOG_TAIL_BYTES)
    except OSError:
        return []
    out: list[str] = []
    for line in reversed(raw.splitlines()):
        try:
            rec = json.loads(line)
        except ValueError:
            continue          # a line cut by the tail, or a torn write
        if not isinstance(rec, dict):
            continue
        rid, logged = rec.get("release"), rec.get("profile")
        if (isinstance(rid, str) and _RELEASE_ID.fullmatch(rid) and rid not in out and isinstance(logged, str)
                and _same_profile(logged, real, name)):
            out.append(rid)
    return out


def values(kind: str, arg: str | None = None) -> list[str]:
    """The candidates of ``kind`` (one of :data:`KINDS`) for the profile ``arg``; [] for another
    kind. Raises what reading the profile raises."""
    if kind in ("groups", "hosts", "servers"):
        found = profile_names(kind, arg)
    elif kind == "releases":
        found = release_ids(arg)
    elif kind == "runbooks":
        from ..resources import runbook_names
        found = runbook_names()
    elif kind == "profiles":
        from ..resources import shipped_profile_names
        found = shipped_profile_names()
    else:
        return []
    return [v for v in dict.fromkeys(found) if _WORD.fullmatch(v)]


def run(args: list[str]) -> int:
    """``__complete KIND [PROFILE]``: print the candidates, one per line; always exit 0, and write
    nothing on stderr (a warning a read would print, e.g. an untrusted cache folder, is dropped)."""
    err = sys.stderr
    try:
        sys.stderr = open(os.devnull, "w")
    except OSError:
        pass
    try:
        if 1 <= len(args) <= 2:
            found = values(args[0], args[1] if len(args) == 2 else None)
            if found:
                sys.stdout.write("\n".join(found) + "\n")
                sys.stdout.flush()
    except Exception:  # noqa: BLE001 - completion is silent whatever happens
        pass
    finally:
        if sys.stderr is not err:
            try:
                sys.stderr.close()
            except OSError:
                pass
            sys.stderr = err
    return 0
