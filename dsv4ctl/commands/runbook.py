"""``dsv4ctl runbook list|show|run``: drive incident mitigation from playbooks/*.yaml."""

from __future__ import annotations

import getpass
import json
import os
from pathlib import Path
from typing import Optional

import typer

from ..errors import EXIT_INTERRUPTED, DsvError, InputError, VerdictError

runbook_app = typer.Typer(help="Incident runbooks (playbooks/*.yaml): list, show, run with --dry-run/--yes/--resume.",
                          no_args_is_help=True)


def _state_root() -> Path:
    from ..resources import state_root
    return state_root() / "runs"


def _playbook_path(name: str) -> Path:
    """A playbook file (``.yaml``/``.yml`` or a path) or a shipped runbook's name; InputError
    listing the shipped runbooks for a name that is none of them."""
    from ..errors import InputError
    from ..resources import shipped_dir
    p = Path(name)
    if p.suffix in (".yaml", ".yml") or "/" in name:
        return p
    d = shipped_dir("playbooks")
    if not (d / f"{name}.yaml").is_file():
        raise InputError(f"{name}: no such runbook (shipped: {', '.join(sorted(q.stem for q in d.glob('*.yaml')))}; "
                         "or give a playbook file)")
    return d / f"{name}.yaml"


def _load(name: str, actions):
    from ..runbook.engine import load_playbook_data
    from ..profile.yamlpos import load_yaml
    path = _playbook_path(name)
    data, _ = load_yaml(path)
    return load_playbook_data(data, str(path), actions)


def _pd_profile(prof) -> bool:
    roles = {g.role for g in prof.servers()}
    return "prefill" in roles and "decode" in roles


@runbook_app.command("list")
def list_(as_json: bool = typer.Option(False, "--json", help="Print {schema, runbooks: [{name, description, pd_only, path}]} as JSON.")) -> None:
    """List the shipped runbooks."""
    from ..resources import shipped_dir
    from ..profile.yamlpos import load_yaml
    rows = []
    for p in sorted(shipped_dir("playbooks").glob("*.yaml")):
        data, _ = load_yaml(p)
        data = data if isinstance(data, dict) else {}
        desc = str(data.get("description", "")).strip()
        rows.append({"name": p.stem, "description": desc, "pd_only": bool(data.get("pd_only", False)), "path": str(p)})
    if as_json:
        print(json.dumps({"schema": "dsv4ctl.runbooks/1", "runbooks": rows}, indent=2))
        return
    for r in rows:
        first = r["description"].splitlines()[0] if r["description"] else ""
        print(f"{r['name']:24} {'[PD only] ' if r['pd_only'] else ''}{first}")


@runbook_app.command("show")
def show(name: str = typer.Argument(..., help="Runbook name or playbook path."),
         as_json: bool = typer.Option(False, "--json", help="Print the runbook (name, description, pd_only, steps) as JSON.")) -> None:
    """Print a runbook's steps with their conditions."""
    from ..runbook.actions import builtin_actions
    pb = _load(name, builtin_actions())
    if as_json:
        print(json.dumps({"schema": "dsv4ctl.runbook/1", "name": pb.name, "description": pb.description, "pd_only": pb.pd_only,
                          "steps": [{"id": s.id, "action": s.action, "args": s.args, "when": s.when,
                                     "repeat_max": s.repeat_max, "until": s.until,
                                     "continue_on_failure": s.continue_on_failure, "description": s.description}
                                    for s in pb.steps]}, indent=2))
        return
    print(f"{pb.name}: {'[PD only] ' if pb.pd_only else ''}{pb.description}")
    for i, s in enumerate(pb.steps, 1):
        cond = f"  [only if {s.when}]" if s.when else ""
        rep = f"  [repeat ≤{s.repeat_max}{' until ' + s.until if s.until else ''}]" if s.repeat_max > 1 else ""
        print(f"{i:2}. {s.id:16} {s.action:16} {json.dumps(s.args) if s.args else ''}{cond}{rep}")


@runbook_app.command("run")
def run(
    name: str = typer.Argument(..., help="Runbook name (playbooks/NAME.yaml) or a playbook path."),
    profile_arg: Optional[str] = typer.Argument(None, metavar="[PROFILE]",
                                                help="Profile path or shipped name (the same as -p)."),
    profile: Optional[str] = typer.Option(None, "--profile", "-p", help="Profile path or shipped name (or DSV4CTL_PROFILE); required unless --dry-run."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before mutating steps."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print every step and what it would do; change nothing anywhere."),
    resume: Optional[str] = typer.Option(None, "--resume", help="Resume run ID from its failed (or declined) step."),
    report_dir: Optional[Path] = typer.Option(None, "--report-dir", help="Where the run's state and incident report go (default: $DSV4CTL_STATE_DIR/runs/ID)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also each step's outcome and evidence lines as it ends."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines from the steps; only the run id, errors and the verdict."),
    release: Optional[str] = typer.Option(None, "--release", metavar="RELEASE", help="The release the evidence is about (watch --on-alert gives the corrupted probes' release): release.mark_failed stops, changing nothing, unless every host runs it."),
    evidence: Optional[str] = typer.Option(None, "--evidence", "--message", "-m", metavar="REASON", help="Why the run was started (one line; recorded with a release marked failed and in the report, and as -m of every step that changes hosts: shown by audit)."),
) -> None:
    """Run a runbook step by step; the state and incident report are written after every step.

    Exit 0 completed (and its final verification, the last step marked `verifies`, passed) · 1 a
    step failed or was declined, the final verification failed (or, with --dry-run, a step reports
    that the run would stop) · 2 bad input, or a step to confirm without a terminal and without --yes (the
    run stops before it, resumable) · 130 interrupted (SIGINT, SIGTERM or SIGHUP; resume with --resume ID)."""
    from ..runbook.actions import RunContext

    if profile_arg is not None and profile is not None and profile_arg != profile:
        raise InputError(f"runbook run: two profiles given ({profile_arg!r} and -p {profile!r}): give one")
    profile = profile if profile is not None else profile_arg
    actions, pb, dep = _resolve(name, profile, dry_run)
    state, run_dir = _run_state(pb, resume, report_dir)
    _set_inputs(state, release, evidence)
    run_dir, scratch = _run_folder(run_dir, dry_run)
    ctx = RunContext(profile=dep.profile, run_dir=run_dir,
                     say=(lambda m: None) if quiet else (lambda m: print(m, flush=True)), extra=dict(state.inputs))
    r = _RunHooks(pb, dep.profile, state, run_dir, dry_run=dry_run, yes=yes, verbose=verbose)
    if not dry_run:
        print(f"run {state.run_id}: {pb.name} on {dep.profile.name}; state and report in {run_dir}", flush=True)
    state, interrupted = _execute(r, actions, ctx, scratch)
    doc = r.write_report(state)
    if dry_run:
        _dry_run_verdict(pb, state, profile)
        return
    r.save(state)
    _write_incident_html(run_dir)
    print(f"run {state.run_id}: report {run_dir / 'incident.md'}")
    if ctx.touched_hosts:
        _audit(ctx, pb, state, doc, run_dir, interrupted)
    _verdict(pb, state, doc, run_dir, report_dir, interrupted, r.unconfirmed, profile, name)


def _resolve(name: str, profile: Optional[str], dry_run: bool):
    """``(actions, playbook, deployment)`` of a run: the built-in actions, the playbook ``name``
    loaded against them, the deployment of ``profile`` (required to act on hosts unless the run
    is a dry run or every step is local). InputError for a PD-only runbook on a profile without
    prefill and decode groups."""
    from ..runbook.actions import builtin_actions
    from .common import load_deployment_arg
    actions = builtin_actions()
    pb = _load(name, actions)
    # note/wait/plan steps, and checks given their own URL, use no host of the profile; any other
    # step sends traffic to or changes the profile's hosts (or tree): then the profile must be named
    local_only = all(s.action in ("note", "wait", "plan") or (s.action.startswith("check.") and (s.args or {}).get("url"))
                     for s in pb.steps)
    dep = load_deployment_arg(profile, acts_on_hosts=not (dry_run or local_only))
    if pb.pd_only and not _pd_profile(dep):
        raise InputError(f"runbook {pb.name} is for PD profiles (prefill and decode groups); {dep.name} has none: "
                         "use toolcall-corruption, scheduler-stall or hicache-crash on a colocated profile")
    return actions, pb, dep


def _run_state(pb, resume: Optional[str], report_dir: Optional[Path]):
    """``(state, run folder)``: the saved state of run ``resume`` (InputError when it is missing,
    unreadable, not a run state or of another runbook), else a new run's (its id: a time stamp
    and the runbook's name)."""
    from ..runbook.engine import RunState
    if not resume:
        from ..hosts.audit import file_stamp
        run_id = file_stamp() + f"-{pb.name}"
        return RunState(pb.name, run_id), report_dir or _state_root() / run_id
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
    return state, run_dir


def _run_folder(run_dir: Path, dry_run: bool):
    """``(folder, scratch)``: the run folder, created and checked writable (InputError if not);
    for a dry run a scratch folder instead (``scratch``, a TemporaryDirectory to clean up, else
    None), so a dry run leaves nothing behind (no state, no report, no run folder)."""
    if dry_run:
        # evidence of what the steps would do goes to a scratch folder that is removed
        import tempfile
        scratch = tempfile.TemporaryDirectory(prefix="dsv4ctl-dry-run-")
        return Path(scratch.name), scratch
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise InputError(f"run folder {run_dir}: not writable ({e.strerror or e})") from None
    return run_dir, None


class _RunHooks:
    """The hooks :func:`dsv4ctl.runbook.engine.execute` calls during one run: ``save`` after every
    step (the state for --resume and the incident report so far; with -v the steps' outcomes),
    ``confirm`` before a mutating step; ``unconfirmed`` keeps the step that needed a confirmation
    no terminal could give."""

    def __init__(self, pb, prof, state, run_dir: Path, *, dry_run: bool, yes: bool, verbose: bool) -> None:
        self.pb, self.prof, self.state, self.run_dir = pb, prof, state, run_dir
        self.dry_run, self.yes, self.verbose = dry_run, yes, verbose
        self.shown: list = list(state.timeline)     # -v: the steps already shown (a resumed run's earlier ones)
        self.unconfirmed: list = []

    def write_report(self, st) -> dict:
        """The incident document of ``st`` (written as incident.json and .md unless a dry run)."""
        from ..runbook.engine import final_verification
        from ..runbook.report import incident_document, incident_markdown
        doc = incident_document(st, who=getpass.getuser(), profile=self.prof.name, dry_run=self.dry_run,
                                verification=None if self.dry_run else final_verification(self.pb, st))
        if not self.dry_run:
            _atomic(self.run_dir / "incident.json", json.dumps(doc, indent=2, default=str))
            _atomic(self.run_dir / "incident.md", incident_markdown(doc))
        return doc

    def save(self, st) -> None:
        """After every step: the state (for --resume) and the incident report so far."""
        if self.verbose and not self.dry_run:     # a dry run lists every step at its end anyway
            for e in st.timeline[len(self.shown):]:
                print(f"step {e.step} ({e.action}): {e.status}" + "".join(f"\n  {ln}" for ln in e.lines), flush=True)
            self.shown[:] = st.timeline
        if self.dry_run:
            return
        _atomic(self.run_dir / "state.json", json.dumps(st.to_dict(), indent=2, default=str))
        self.write_report(st)

    def confirm(self, step, lines) -> bool:
        """Whether mutating ``step`` (described by ``lines``) may run: --yes, else the operator's
        answer; without a terminal the run stops before it (as if declined, state saved)."""
        measured = _measured(self.state)
        if self.yes:
            for line in measured:
                print(f"  {line}")
            return True
        if not os.isatty(0):
            # nobody to ask: the run stops before the step as if declined, with its state saved,
            # so the run id printed above resumes here (with --yes)
            self.unconfirmed.append(step)
            return False
        print(f"step {step.id}: {step.action}")
        if measured:
            print("  measured so far:")
            for line in measured:
                print(f"    {line}")
        for line in lines:
            print(f"  {line}")
        return typer.confirm("run it?", default=False)


def _execute(r: _RunHooks, actions, ctx, scratch):
    """``(state, interrupted)``: the run's steps executed with SIGTERM/SIGHUP as Ctrl-C; on an
    interrupt the children the steps started are stopped; the dry run's scratch folder removed."""
    from ..runbook.engine import execute
    state, interrupted = r.state, False
    with _signals_as_interrupt():
        try:
            state = execute(r.pb, actions, ctx, state, dry_run=r.dry_run, confirm=r.confirm, save=r.save)
        except KeyboardInterrupt:
            interrupted = True
            for child in list(ctx.children):
                from ..runbook.actions import stop_child
                stop_child(child)
        finally:
            if scratch is not None:
                scratch.cleanup()
    return state, interrupted


def _dry_run_verdict(pb, state, profile: Optional[str]) -> None:
    """Print a dry run's steps; VerdictError when a step says the run would stop (the embedded
    example's read-only serve configs excepted: a note instead)."""
    for e in state.timeline[-len(pb.steps):]:
        print(f"{e.step:16} {e.action:16} " + " | ".join(e.lines))
    bad = [e for e in state.timeline[-len(pb.steps):] if e.status == "dry-run-error"]
    if profile is None and bad and all(any("shipped with dsv4ctl, not edited" in ln for ln in e.lines) for e in bad):
        # the embedded example is read-only by design: its dry run shows the steps; the only
        # stops are the edits a real profile would get
        print(f"note: steps {', '.join(e.step for e in bad)} edit serve configs: the embedded example is never "
              f"edited, your own profile is (dsv4ctl profile init my.yaml; dsv4ctl runbook run {pb.name} my.yaml "
              "--dry-run)")
        return
    bad = [e.step for e in bad]
    if bad:
        raise VerdictError(f"runbook {pb.name} --dry-run: the run would stop at step {bad[0]} "
                           f"({len(bad)} step(s) report an error above)")


def _audit(ctx, pb, state, doc: dict, run_dir: Path, interrupted: bool) -> None:
    """The run's record in the audit log of every host its steps touched (warnings printed)."""
    from ..runbook.actions import audit_touched
    rec = {"action": f"runbook-{pb.name}",
           "result": "interrupted" if interrupted else "stopped" if not doc["completed"] else
           "verification-failed" if doc["verification"] and not doc["verification"]["passed"] else "completed",
           "detail": state.failed_step or "", "run_id": state.run_id,
           "steps": [f"{e.step}:{e.status}" for e in state.timeline], "report": str(run_dir / "incident.md")}
    for w in audit_touched(ctx, rec):
        print(f"warning: {w}")


def _verdict(pb, state, doc: dict, run_dir: Path, report_dir: Optional[Path], interrupted: bool,
             unconfirmed: list, profile: Optional[str] = None, book: Optional[str] = None) -> None:
    """The run's exit: nothing (completed, verified) or the error of its exit code (130
    interrupted, 2 a step left unconfirmed, 1 stopped or its final verification failed), each
    naming the whole command that resumes it (as typed: the runbook, the profile as given)."""
    import shlex
    again = (f"dsv4ctl runbook run {shlex.quote(book or pb.name)}" + (f" {shlex.quote(profile)}" if profile else "")
             + f" --resume {state.run_id}" + (f" --report-dir {shlex.quote(str(report_dir))}" if report_dir else ""))
    if interrupted:
        raise DsvError(f"runbook {pb.name} interrupted at {state.failed_step or 'a step'}; "
                       f"resume with {again}", EXIT_INTERRUPTED)
    if unconfirmed and not doc["completed"]:
        step = unconfirmed[-1]
        raise InputError(f"step {step.id} ({step.action}) changes things; confirm interactively or pass --yes "
                         f"(nothing of it ran; resume with {again} --yes)")
    if not doc["completed"]:
        where = state.failed_step or "a declined step"
        why = str((state.results.get(state.failed_step) or {}).get("error") or "")[:400]
        raise VerdictError(f"runbook {pb.name} stopped at {where}" + (f": {why}" if why else "")
                           + f"; resume with {again}")
    v = doc["verification"]
    if v and not v["passed"]:
        from ..errors import GateFailed
        raise GateFailed(f"runbook {pb.name} completed, but its final verification failed: step {v['step']} "
                           f"({v['action']}); see {run_dir / 'incident.md'}")


def _set_inputs(state, release: Optional[str], evidence: Optional[str]) -> None:
    """``--release`` and ``--evidence`` into the run's state (a resumed run keeps those it was
    started with unless given again). InputError for a release id that is no single word or an
    evidence text that is not one line of printable characters (its first MAX_MESSAGE are each
    host-changing step's ``-m``: :func:`dsv4ctl.commands.options.message`'s rule)."""
    import re
    if release is not None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", release):
            raise InputError(f"--release {release!r}: a release id is one word of letters, digits, '.', '_', '-'")
        state.inputs["release"] = release
    if evidence is not None:
        from .options import message
        if "\n" in evidence or "\r" in evidence or len(evidence) > 2000:
            raise InputError("--evidence: one line of at most 2000 characters")
        message(evidence[:500], "--evidence/-m")
        state.inputs["evidence"] = evidence


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _measured(state) -> list[str]:
    """One line per step that ran with a finding (numbers first), for the confirmation."""
    from ..runbook.report import _short
    return [f"{sid}: {_short(r)}" for sid, r in state.results.items() if r.get("ran")]


class _signals_as_interrupt:
    """SIGTERM (and SIGHUP) raise KeyboardInterrupt in the main thread while the run lasts, so
    they are handled exactly like Ctrl-C: the step is recorded as interrupted, children stopped,
    the state and report written, exit 130."""

    def __enter__(self):
        import signal
        self._old = {}
        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                self._old[sig] = signal.signal(sig, self._raise)
            except (ValueError, OSError):    # not the main thread
                pass
        return self

    @staticmethod
    def _raise(signum, frame):
        from ..signals import raise_interrupt
        raise_interrupt(signum, frame)

    def __exit__(self, *exc):
        import signal
        for sig, h in self._old.items():
            signal.signal(sig, h)
        return False


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
