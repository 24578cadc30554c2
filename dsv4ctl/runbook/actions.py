"""Built-in runbook actions: thin adapters from playbook args to dsv4ctl's own cores.

Each action returns a result dict with ``ok`` (the action could run) and its findings
(e.g. ``passed`` and ``corruption_upper`` for checks); a finding is data for later ``when``
conditions, not a failure of the run."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import InputError
from .engine import Action

MAX_WAIT_S = 3600


@dataclass
class RunContext:
    """What actions see: the profile, where evidence goes, how to print progress."""

    profile: Any
    run_dir: Path
    say: Callable[[str], None] = print
    sleep: Callable[[float], None] = time.sleep
    extra: dict = field(default_factory=dict)


def _note_run(ctx: RunContext, args: dict) -> dict:
    text = str(args.get("text", ""))
    ctx.say(f"note: {text}")
    return {"ok": True, "text": text}


def _wait_seconds(args: dict) -> float:
    try:
        s = float(args.get("seconds", 0))
    except (TypeError, ValueError):
        raise InputError(f"wait: seconds must be a number, got {args.get('seconds')!r}") from None
    if not 0 <= s <= MAX_WAIT_S:
        raise InputError(f"wait: seconds must be within 0..{MAX_WAIT_S}, got {s}")
    return s


def _wait_run(ctx: RunContext, args: dict) -> dict:
    s = _wait_seconds(args)
    ctx.sleep(s)
    return {"ok": True, "seconds": s}


def _plan_run(ctx: RunContext, args: dict) -> dict:
    from ..plan import build_plan, parse_set
    sets = [f"{k}={v}" for k, v in (args.get("set") or {}).items()]
    report = build_plan(ctx.profile, parse_set(sets), args.get("groups"))
    doc = report.to_dict()
    (ctx.run_dir / "plan.json").write_text(__import__("json").dumps(doc, indent=2))
    groups = {g["name"]: dict(errors=g["errors"], fixes=g["fixes"],
                              full_max_total_num_tokens=min(r["full_max_total_num_tokens"] for r in g["ranks"]) if g["ranks"] else 0,
                              headroom_gib=min(r["headroom_gib"] for r in g["ranks"]) if g["ranks"] else None)
              for g in doc["groups"]}
    return {"ok": True, "fits": report.ok, "groups": groups}


def _describe(fmt: str) -> Callable[[RunContext, dict], list[str]]:
    return lambda ctx, args: [fmt.format(args=args)]


def builtin_actions(extra: Optional[dict[str, Action]] = None) -> dict[str, Action]:
    """The action registry: note, wait, plan, plus the remote/check actions when present."""
    acts = {
        "note": Action("note", False, _note_run, _describe("record a note: {args[text]}")),
        "wait": Action("wait", False, _wait_run, lambda ctx, a: [f"wait {_wait_seconds(a):g} s"]),
        "plan": Action("plan", False, _plan_run, _describe("plan the profile's groups with overrides {args}")),
    }
    acts.update(extra or {})
    return acts
