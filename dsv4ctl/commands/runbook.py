"""``dsv4ctl runbook list|show|run``: drive incident mitigation from playbooks/*.yaml."""

from __future__ import annotations

import getpass
import json
import os
from pathlib import Path
from typing import Optional

import typer

from ..errors import InputError, VerdictError

runbook_app = typer.Typer(help="Incident runbooks (playbooks/*.yaml): list, show, run with --dry-run/--yes/--resume.",
                          no_args_is_help=True)


def _state_root() -> Path:
    from ..resources import state_root
    return state_root() / "runs"


def _playbook_path(name: str) -> Path:
    from ..resources import shipped_dir
    p = Path(name)
    if p.suffix in (".yaml", ".yml") or "/" in name:
        return p
    return shipped_dir("playbooks") / f"{name}.yaml"


def _load(name: str, actions):
    from ..runbook.engine import load_playbook_data
    from ..profile.yamlpos import load_yaml
    path = _playbook_path(name)
    data, _ = load_yaml(path)
    return load_playbook_data(data, str(path), actions)


@runbook_app.command("list")
def list_() -> None:
    """List the shipped runbooks."""
    from ..resources import shipped_dir
    from ..profile.yamlpos import load_yaml
    for p in sorted(shipped_dir("playbooks").glob("*.yaml")):
        data, _ = load_yaml(p)
        print(f"{p.stem:24} {(data or {}).get('description', '').splitlines()[0] if data else ''}")


@runbook_app.command("show")
def show(name: str = typer.Argument(..., help="Runbook name or playbook path.")) -> None:
    """Print a runbook's steps with their conditions."""
    from ..runbook.actions import builtin_actions
    pb = _load(name, builtin_actions())
    print(f"{pb.name}: {pb.description}")
    for i, s in enumerate(pb.steps, 1):
        cond = f"  [only if {s.when}]" if s.when else ""
        rep = f"  [repeat ≤{s.repeat_max}{' until ' + s.until if s.until else ''}]" if s.repeat_max > 1 else ""
        print(f"{i:2}. {s.id:16} {s.action:16} {json.dumps(s.args) if s.args else ''}{cond}{rep}")


@runbook_app.command("run")
def run(
    name: str = typer.Argument(..., help="Runbook name (playbooks/NAME.yaml) or a playbook path."),
    profile: Optional[str] = typer.Option(None, "--profile", "-p", help="Profile path or shipped name (or DSV4CTL_PROFILE); required unless --dry-run."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before mutating steps."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print every step and what it would do; change nothing anywhere."),
    resume: Optional[str] = typer.Option(None, "--resume", help="Resume run ID from its failed (or declined) step."),
    report_dir: Optional[Path] = typer.Option(None, "--report-dir", help="Where the run's state and incident report go (default: $DSV4CTL_STATE_DIR/runs/ID)."),
) -> None:
    """Run a runbook step by step. Exit 0 completed, 1 a step failed or was declined, 2 bad input."""
    from ..runbook.actions import RunContext, builtin_actions
    from ..runbook.engine import RunState, execute
    from ..runbook.report import incident_document, incident_markdown

    actions = builtin_actions()
    pb = _load(name, actions)
    from .common import load_deployment_arg
    # note/wait/plan steps, and checks given their own URL, use no host of the profile; any other
    # step sends traffic to or changes the profile's hosts (or tree): then the profile must be named
    local_only = all(s.action in ("note", "wait", "plan") or (s.action.startswith("check.") and (s.args or {}).get("url"))
                     for s in pb.steps)
    prof = load_deployment_arg(profile, acts_on_hosts=not (dry_run or local_only)).profile
    if resume:
        run_dir = report_dir or _state_root() / resume
        state_file = run_dir / "state.json"
        if not state_file.is_file():
            raise InputError(f"--resume {resume}: no run state at {state_file}")
        try:
            saved = json.loads(state_file.read_text())
        except (OSError, ValueError) as e:
            raise InputError(f"--resume {resume}: {state_file}: unreadable run state ({e})") from None
        if not isinstance(saved, dict):
            raise InputError(f"--resume {resume}: {state_file}: not a runbook run state")
        try:
            state = RunState.from_dict(saved)
        except InputError as e:
            raise InputError(f"--resume {resume}: {state_file}: {e}") from None
        if state.playbook != pb.name:
            raise InputError(f"--resume {resume}: that run is of runbook {state.playbook!r}, not {pb.name!r}")
    else:
        from ..hosts.audit import file_stamp
        run_id = file_stamp() + f"-{pb.name}"
        run_dir = report_dir or _state_root() / run_id
        state = RunState(pb.name, run_id)
    scratch = None
    if dry_run:
        # evidence of what the steps would do goes to a scratch folder that is removed: a dry
        # run leaves nothing behind (no state, no report, no run folder)
        import tempfile
        scratch = tempfile.TemporaryDirectory(prefix="dsv4ctl-dry-run-")
        run_dir = Path(scratch.name)
    else:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            probe = run_dir / ".write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            raise InputError(f"run folder {run_dir}: not writable ({e.strerror or e})") from None
    state_file = run_dir / "state.json"

    def save(st: RunState) -> None:
        if dry_run:
            return
        tmp = state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(st.to_dict(), indent=2, default=str))
        tmp.replace(state_file)

    def confirm(step, lines) -> bool:
        if yes:
            return True
        if not os.isatty(0):
            raise InputError(f"step {step.id} ({step.action}) changes things; confirm interactively or pass --yes")
        print(f"step {step.id}: {step.action}")
        for line in lines:
            print(f"  {line}")
        return typer.confirm("run it?", default=False)

    ctx = RunContext(profile=prof, run_dir=run_dir)
    try:
        state = execute(pb, actions, ctx, state, dry_run=dry_run, confirm=confirm, save=save)
    finally:
        if scratch is not None:
            scratch.cleanup()
    doc = incident_document(state, who=getpass.getuser(), profile=prof.name, dry_run=dry_run)
    for e in state.timeline[-len(pb.steps):] if dry_run else []:
        print(f"{e.step:16} {e.action:16} " + " | ".join(e.lines))
    if not dry_run:
        (run_dir / "incident.json").write_text(json.dumps(doc, indent=2, default=str))
        (run_dir / "incident.md").write_text(incident_markdown(doc))
        _write_incident_html(run_dir)
        print(f"run {state.run_id}: report {run_dir / 'incident.md'}")
        if ctx.touched_hosts:
            from ..runbook.actions import audit_touched
            rec = {"action": f"runbook-{pb.name}", "result": "completed" if doc["completed"] else "stopped",
                   "detail": state.failed_step or "", "run_id": state.run_id,
                   "steps": [f"{e.step}:{e.status}" for e in state.timeline], "report": str(run_dir / "incident.md")}
            for w in audit_touched(ctx, rec):
                print(f"warning: {w}")
    if not doc["completed"] and not dry_run:
        where = state.failed_step or "a declined step"
        raise VerdictError(f"runbook {pb.name} stopped at {where}; resume with --resume {state.run_id}")


def _write_incident_html(run_dir: Path) -> None:
    """incident.html (timeline + the charts of the run's checks and plans) next to incident.md; a
    picture that cannot be drawn is a warning: the run's record and exit code stand without it."""
    from .. import __version__
    from ..hosts.audit import now_iso
    from ..report.inputs import incident_page
    try:
        (run_dir / "incident.html").write_text(incident_page(run_dir, generated=now_iso(), version=__version__))
    except Exception as e:     # noqa: BLE001 - any failure of the picture, never of the run
        print(f"warning: incident.html not written: {e}")


def register(app: typer.Typer) -> None:
    """Add the ``runbook`` group to the root app."""
    app.add_typer(runbook_app, name="runbook")
