"""Incident reports of runbook runs: a JSON document (``dsv4ctl.incident/1``) and Markdown."""

from __future__ import annotations

import json
from typing import Any

from ..render import markdown_table
from .engine import RunState

SCHEMA = "dsv4ctl.incident/1"


def _ts(t: float) -> str:
    from ..hosts.audit import now_iso
    return now_iso(t)


def _short(result: dict) -> str:
    keys = [k for k in result if k not in ("ran", "attempts", "details", "lines", "evidence_files")]
    parts = []
    for k in keys[:6]:
        v = result[k]
        if isinstance(v, float):
            v = round(v, 4)
        if isinstance(v, (dict, list)):
            v = json.dumps(v)[:60]
        parts.append(f"{k}={v}")
    return ", ".join(parts)


def incident_document(state: RunState, *, who: str, profile: str, dry_run: bool,
                      before: Any = None, after: Any = None, verification: dict | None = None) -> dict:
    """The JSON incident report: who ran which playbook on which profile, the timeline with
    UTC timestamps, every step's result, and the state before and after (as collected).
    ``completed``: no step failed and every declined step ran later (a resumed run);
    ``verification``: the final verification (:func:`dsv4ctl.runbook.engine.final_verification`)."""
    return dict(schema=SCHEMA, playbook=state.playbook, run_id=state.run_id, who=who,
                profile=profile, dry_run=dry_run, failed_step=state.failed_step,
                completed=state.failed_step is None and all(e.step in state.done for e in state.timeline
                                                            if e.status == "declined"),
                verification=verification, inputs=state.inputs,
                state_before=before, state_after=after,
                timeline=[e.to_dict() for e in state.timeline], results=state.results)


def _outcome(doc: dict) -> str:
    """``completed``, ``completed, but the final verification (step X) failed`` or ``stopped at X``."""
    if not doc["completed"]:
        return "stopped at " + str(doc["failed_step"] or "a declined step")
    v = doc.get("verification")
    if v and not v["passed"]:
        return f"completed, but the final verification (step {v['step']}, {v['action']}) failed"
    return "completed" + (f"; verified by step {v['step']}" if v else "")


def incident_markdown(doc: dict) -> str:
    """Render :func:`incident_document` as Markdown for humans."""
    out = [f"# Incident report: {doc['playbook']} ({doc['run_id']})", "",
           f"- who: {doc['who']}", f"- profile: {doc['profile']}",
           f"- dry run: {'yes' if doc['dry_run'] else 'no'}",
           *[f"- {k}: {v}" for k, v in (doc.get("inputs") or {}).items()],
           f"- outcome: {_outcome(doc)}",
           "- charts: [incident.html](incident.html) (the timeline and the charts of the checks it ran)",
           "", "## Timeline", ""]
    rows = []
    for e in doc["timeline"]:
        dur = round(e["ended"] - e["started"], 1)
        detail = _short(e["result"]) if e["result"] else "; ".join(e["lines"])
        files = (e["result"] or {}).get("evidence_files") or []
        rows.append([_ts(e["started"]), e["step"], e["action"], e["status"] + (f" (try {e['attempt']})" if e["attempt"] > 1 else ""), f"{dur}s", detail,
                     ", ".join(f"[{f}]({f})" for f in files) or "-"])
    out.append(markdown_table(["UTC", "step", "action", "status", "took", "result", "output"], rows))
    for label, key in (("State before", "state_before"), ("State after", "state_after")):
        if doc.get(key) is not None:
            out += ["", f"## {label}", "", "```json", json.dumps(doc[key], indent=2, default=str), "```"]
    return "\n".join(out) + "\n"
