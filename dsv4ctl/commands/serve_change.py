"""One CLI path for every serve-config change (``hicache on|off``, ``config set``): edit and lint
the profile's local copies (:mod:`dsv4ctl.serve.hicache_local`), or with ``--remote`` change the
running release — a new release with the edited configs, deployed by the deploy engine
(:mod:`dsv4ctl.deploy.change`: delta push, switch under the deploy lock, only the changed
groups restarted, the deploy's health gate, rolled back on failure) — then the local copies.
Diffs, findings, JSON and errors have the serve configs' secret values masked."""

from __future__ import annotations

import sys
from typing import Optional

from ..errors import DsvError, InputError
from ..render import dump_json


def _secrets_of(text: str) -> set[str]:
    from ..serve.edit import secret_values
    import yaml
    try:
        return secret_values(yaml.safe_load(text))
    except yaml.YAMLError:
        return set()


def printer(secrets: set[str]):
    """``print`` that replaces the serve configs' secret values with ``***`` (diffs are already
    masked line by line; this also covers findings, JSON and host output)."""
    from ..serve.edit import scrub

    def out(s: str = "", end: str = "\n") -> None:
        print(scrub(s, secrets), end=end)
    return out


def run_change(prof, groups, *, what: str, action: str, changes, tree: Optional[str], dry_run: bool, as_json: bool,
               remote: bool, health_timeout: Optional[float], verbose: bool, schema: str, doc: dict,
               unchanged: str, secrets: frozenset = frozenset(), quiet: bool = False,
               message: Optional[str] = None) -> None:
    """Apply ``changes`` (:data:`dsv4ctl.serve.hicache_local.ChangesFn`) to the serve configs of
    ``groups`` (GroupViews of the Deployment ``prof``): locally, or with ``remote`` as a release.

    ``what`` names the command in lines and errors (``hicache on``), ``action`` the audit/lock
    action (``hicache-on``), ``schema`` and ``doc`` head the ``--json`` document, ``unchanged``
    ends the line of a file that already says it (``HiCache already on``), ``secrets`` are values
    never printed (new secret values being set; the files' own are found here), ``message`` the
    ``-m`` reason (with ``remote`` only: audited on every host). Raises InputError
    (exit 2: bad value, lint error, nothing written), HealthError (exit 1: a restarted group was
    unhealthy, rolled back), RemoteError (exit 3)."""
    from ..serve.hicache_local import prepare_edits, refuse_shipped, write_all
    from .deploy import check_health_timeout

    from .options import message as check_message
    check_health_timeout(health_timeout)
    message = check_message(message)
    if message is not None and not remote:
        raise InputError(f"{what}: -m/--message goes with --remote (a change of the local files is not audited)")
    edits = prepare_edits(prof, groups, what, changes, tree)
    secrets = set(secrets).union(*(e.secrets for e in edits))
    out = printer(secrets)
    from ..serve.edit import scrub
    from ..serve.hicache_local import plan_guard
    try:
        plan_guard(prof, {e.group: e.new for e in edits if e.new != e.old}, what)
    except InputError as e:
        raise InputError(scrub(str(e), secrets)) from None
    # before any host is touched (--remote also rewrites the local copies), and in a dry run too:
    # the dry run is the run, and the run refuses
    refuse_shipped([e.path for e in edits if e.new != e.old])
    if remote:
        _remote(prof, groups, what, action, changes, tree, dry_run, as_json, edits, health_timeout, verbose,
                schema, doc, unchanged, secrets, quiet=quiet, message=message)
        return
    changed = [e for e in edits if e.new != e.old]
    if not dry_run and changed:
        from ..signals import terminate_as_interrupt
        terminate_as_interrupt()        # SIGTERM/SIGHUP: the files are all written first, then exit 130
        write_all([(e.path, e.new) for e in changed], expect={e.path: e.old for e in changed})
    if as_json:
        out(dump_json(dict(schema=schema, **doc, profile=prof.name, dry_run=dry_run,
                             groups=[dict(group=e.group, file=str(e.path), changed=e.new != e.old,
                                          written=(e.new != e.old) and not dry_run, diff=e.diff,
                                          findings=[f.to_dict() for f in e.findings]) for e in edits])))
        return
    for e in edits:
        if e.new == e.old:
            out(f"{e.group}: {e.path}: {unchanged}, unchanged")
            continue
        out(e.diff, end="" if e.diff.endswith("\n") else "\n")
        for f in e.findings:
            out(f.format())
    if changed:
        verb = "dry run: would write" if dry_run else "wrote"
        out(f"{verb} {len(changed)} file(s): {', '.join(str(e.path) for e in changed)}")


def new_side(diff: str, old: str, new: str) -> str:
    """``diff`` with its ``+++`` header naming release ``new`` where it named ``old`` (the
    ``---`` side keeps the release it was made from)."""
    return "".join(ln.replace(f"({old})", f"({new})") if ln.startswith("+++ ") else ln
                   for ln in diff.splitlines(keepends=True))


def undo_hint(profile, rid: str) -> str:
    """The exact command that undoes a ``--remote`` change: ``dsv4ctl rollback PROFILE --to RID``
    with the profile's path (shell-quoted), runnable as printed."""
    import shlex
    return f"dsv4ctl rollback {shlex.quote(str(profile))} --to {rid}"


def _deploy_options(dry_run: bool, health_timeout, verbose: bool, message: Optional[str], log):
    """The deploy options of a ``--remote`` change: ``log`` for progress, no --break-lock offer,
    with ``verbose`` (not in a dry run) every step and its seconds traced."""
    from ..deploy.site import Options as DeployOptions
    o = DeployOptions(dry_run=dry_run, health_timeout=health_timeout, log=log, offers_break_lock=False,
                      message=message)
    if verbose and not dry_run:
        o.trace = lambda st: log("step " + st.line(True))
        o.done = lambda st, sec: log(f"done {st.host}: {st.phase} in {sec:.2f} s")
    return o


def _remote_json(prof, schema: str, doc: dict, dry_run: bool, redits: list, local_edits: list, rid, frm,
                 wrote_local: bool, err) -> str:
    """The ``--json`` document of a ``--remote`` change: each host's edit (written only when the
    release deployed) and each local copy's, the release made (None when nothing changed) and
    the error, if any."""
    changed = [e for e in redits if e.new != e.old]
    return dump_json(dict(schema=schema, **doc, profile=prof.name, dry_run=dry_run, remote=True,
                          release=rid if changed else None, previous=frm,
                          groups=[dict(group=e.group, host=e.host, file=e.path, changed=e.new != e.old,
                                       written=(e.new != e.old) and not dry_run and err is None, release=rid,
                                       diff=e.diff, findings=[f.to_dict() for f in e.findings]) for e in redits],
                          local=[dict(group=e.group, file=str(e.path), changed=e.new != e.old, diff=e.diff,
                                      written=wrote_local and e.new != e.old) for e in local_edits],
                          error=str(err) if err is not None else None))


def _print_remote(out, secrets, prof, redits: list, rep: dict, unchanged: str, dry_run: bool, err,
                  changed_local: list, wrote_local: bool) -> None:
    """The text of a ``--remote`` change: each host's diff and findings; a dry run's release and
    steps (and those run instead on a failure); after a deploy the release and the command that
    undoes it; the local copies written."""
    from ..deploy.steps import Step, mask_secrets
    changed = [e for e in redits if e.new != e.old]
    rid, frm = rep.get("release"), rep.get("from")
    for e in redits:
        if e.new == e.old:
            out(f"{e.group}: {e.host}:{e.path}: {unchanged}, unchanged")
        else:
            out(e.diff, end="")
            for f in e.findings:
                out(f.format())
    if dry_run and changed:
        out(f"dry run: release {rid} = {frm} with the new serve config of {', '.join(e.group for e in changed)}; "
            "steps (nothing changed):")
        for st in rep.get("steps", []):
            out("  " + mask_secrets(Step(**st).line(False), secrets))
        if rep.get("on_failure"):
            out("  on a failed gate or an interrupt, instead:")
            for st in rep["on_failure"]:
                out("    " + mask_secrets(Step(**st).line(False), secrets))
    if not dry_run and err is None and changed:
        out(f"released {rid} (from {frm}): restarted {', '.join(f'{e.group} on {e.host}' for e in changed)}; "
            f"healthy; {undo_hint(prof.path, frm)} undoes it")
    if wrote_local:
        out(f"wrote {len(changed_local)} local file(s): {', '.join(str(e.path) for e in changed_local)}")


def _remote(prof, groups, what, action, changes, tree, dry_run, as_json, local_edits, health_timeout, verbose,
            schema, doc, unchanged, extra_secrets=frozenset(), quiet: bool = False,
            message: Optional[str] = None) -> None:
    """``--remote``: every change to a host is a release. The running release's serve configs are
    edited (:mod:`dsv4ctl.serve.hicache_live`), a new release is derived from it and deployed
    (:mod:`dsv4ctl.deploy.change`), then the profile's local copies get the same edit (so the
    next deploy keeps it)."""
    from ..deploy.change import change_configs
    from ..deploy.steps import deployment_secrets, mask_secrets
    from ..serve import hicache_live as hr
    from ..serve.hicache_local import write_all
    from ..signals import terminate_as_interrupt
    from .deploy import _Interrupted, _RunLog

    secrets = set(deployment_secrets(prof)) | set(extra_secrets) | set().union(*(e.secrets for e in local_edits))
    out = printer(secrets)
    names = [g.name for g in groups]
    redits: list = []

    def edit(texts: dict[str, str], rid: str) -> dict[str, bytes]:
        redits[:] = hr.edit_release_configs(prof, groups, what, changes, tree, texts, rid)
        for e in redits:
            secrets.update(_secrets_of(e.old))
        return {e.group: e.new.encode() for e in redits if e.new != e.old}

    def scrub_all(s: str) -> str:
        from ..serve.edit import scrub
        return scrub(s, secrets)

    def log(s: str) -> None:
        if not as_json and not quiet:
            print(f"dsv4ctl: {mask_secrets(scrub_all(s), secrets)}", file=sys.stderr, flush=True)
    o = _deploy_options(dry_run, health_timeout, verbose, message, log)
    if not dry_run:
        terminate_as_interrupt()
    err = None
    rep: dict = {}
    # the run log (<state>/runs.jsonl) names the release made, as a deploy's does: completion offers it
    with _Interrupted(secrets), _RunLog(f"{what} --remote", prof, secrets, dry_run) as runlog:
        try:
            rep = change_configs(prof, o, edit, action=action, groups=names)
            runlog.result = {"release": rep.get("release"), "from": rep.get("from")}
        except DsvError as e:
            err = e
            runlog.result = {"exit_code": e.exit_code, "error": mask_secrets(scrub_all(str(e)), secrets)}
    if err is not None and not redits:
        raise err
    changed_local = [e for e in local_edits if e.new != e.old]
    wrote_local = False
    if not dry_run and err is None and changed_local:
        write_all([(e.path, e.new) for e in changed_local], expect={e.path: e.old for e in changed_local})
        wrote_local = True
    changed = [e for e in redits if e.new != e.old]
    rid, frm = rep.get("release"), rep.get("from")
    if rid and frm and rid != frm:      # the diffs were made before the new release had its id
        for e in changed:
            e.diff = new_side(e.diff, frm, rid)
    if as_json:
        out(_remote_json(prof, schema, doc, dry_run, redits, local_edits, rid, frm, wrote_local, err))
    else:
        _print_remote(out, secrets, prof, redits, rep, unchanged, dry_run, err, changed_local, wrote_local)
    if err is not None:
        err.args = (mask_secrets(scrub_all(str(err)), secrets),) + tuple(err.args[1:])
        raise err
