"""``dsv4ctl exec GROUP [PROFILE] -- CMD...``: one command on every host and node of a group, in
parallel, output prefixed per host (core: :mod:`dsv4ctl.deploy.execute`)."""

from __future__ import annotations

import sys
from typing import Optional

import typer
from typer.core import TyperCommand

from ..errors import DsvError, InputError, VerdictError
from .options import duration_option

_P = typer.Argument(None, help="Profile path or shipped name; required (or DSV4CTL_PROFILE): the command acts on hosts.")


class AfterDoubleDash(TyperCommand):
    """A command whose ``command`` parameter is every word after the first ``--``, however many
    positionals come before it (click alone would hand the first of them to an optional PROFILE:
    ``exec decode -- nvidia-smi`` with DSV4CTL_PROFILE set)."""

    def parse_args(self, ctx, args):
        args = list(args)
        cut = args.index("--") if "--" in args else len(args)
        before, after = args[:cut], args[cut + 1:]
        rest = super().parse_args(ctx, list(before))     # click consumes the list it is given
        if ctx.params.get("command"):
            raise InputError(f"exec: put the command after --: {as_typed(before, ctx.params['command'])}")
        ctx.params["command"] = tuple(after)
        return rest


def as_typed(before: list[str], command) -> str:
    """The ``dsv4ctl exec`` line the user meant, to copy: their words ``before`` (group, profile,
    options, as given) without the ``command`` words click took as positionals (the last ones of
    each, in order), then ``--`` and those words, each shell-quoted."""
    import shlex
    words, want = list(before), list(command)
    for i in range(len(words) - 1, -1, -1):
        if want and words[i] == want[-1]:
            want.pop()
            del words[i]
    return " ".join(["dsv4ctl", "exec", *map(shlex.quote, words), "--", *map(shlex.quote, command)])


def exec_(group: str = typer.Argument(..., help="Server group (or the router): every host and node it runs on, every replica."),
          profile: Optional[str] = _P,
          command: list[str] = typer.Argument(None, metavar="-- CMD...", help="The command, after --: its words joined with spaces and run by each host's sh."),
          host: list[str] = typer.Option([], "--host", help="Only this host of the group (repeatable)."),
          timeout: float = duration_option(600.0, "--timeout", hi=86400, help="How long the command may run per host (600, 90s, 15m; at most 1d): then it is stopped there."),
          message: Optional[str] = typer.Option(None, "--message", "-m", metavar="TEXT", help="Why (recorded in each host's audit line; shown by audit)."),
          dry_run: bool = typer.Option(False, "--dry-run", help="Print the ssh command of each host; run nothing."),
          accept_new: bool = typer.Option(False, "--accept-new-host-keys", help="Add unknown SSH host keys (accept-new)."),
          as_json: bool = typer.Option(False, "--json", help="Print the dsv4ctl.exec/1 JSON document (each host's output and exit status).")) -> None:
    """Run one command on every host and node of a group (every node of a multi-node server, every
    replica; --host narrows), all at once, like `kamal app exec`: each output line prefixed with
    its host (`host/node1` for node 1), stdout to stdout, stderr to stderr, each host's exit status.

    On each host the command runs in the active release's folder (<root>/current), with the
    group's environment as that release launched it (its `env` in launch.json: the values stay on
    the host and are masked in what is printed), DSV4CTL_GROUP, DSV4CTL_RELEASE, DSV4CTL_REPLICA,
    DSV4CTL_NODE_RANK, and the release's Python environment first on PATH; stdin is closed. It
    runs outside the server's container (sglang.image) and, with deploy.backend slurm, over SSH on
    the job's nodes (the same hosts). No deploy lock is taken; each host's audit log gets one
    `exec` line (the command, ok or failed, -m).

    Exit 0 it exited 0 on every host · 1 it failed, timed out or could not start (no active
    release) on a host · 2 bad input · 3 a host unreachable."""
    from ..deploy.execute import exec_steps, exec_targets, exec_verdict, run_exec, ssh_line
    from ..deploy.site import Options, open_site
    from ..deploy.steps import deployment_secrets, mask_secrets
    from ..render import dump_json, printable
    from .common import load_deployment_arg
    from .options import duration, message as check_message
    duration(timeout, "--timeout", hi=86400)
    message = check_message(message)
    if not command or not "".join(command).strip():     # -- '' would run sh -c '' and report exit 0
        import shlex
        raise InputError(f"exec: give the command after --: dsv4ctl exec {shlex.quote(group)} "
                         f"{shlex.quote(profile) + ' ' if profile else ''}-- CMD...")
    dep = load_deployment_arg(profile, acts_on_hosts=True)
    targets = exec_targets(dep, group, list(host) or None)
    secrets = deployment_secrets(dep)
    site = open_site(dep, Options(dry_run=dry_run, accept_new_host_keys=accept_new))
    try:
        steps = exec_steps(site, group, targets, list(command), message)
        doc = {"schema": "dsv4ctl.exec/1", "profile": dep.name, "group": group, "command": " ".join(command),
               "dry_run": dry_run}
        if dry_run:
            doc["hosts"] = {s.host: {"label": s.extra["label"], "ssh": ssh_line(dep.hosts[s.host], s.cmd)} for s in steps}
            if as_json:
                print(mask_secrets(dump_json(doc), secrets))
                return
            print(f"dry run: exec on group {group} ({len(steps)} host(s); nothing run)")
            for s in steps:    # the command as typed may carry ESC/BEL...: shown as \x1b, never sent to the terminal
                print(printable(mask_secrets(f"  {s.line()}\n    $ {doc['hosts'][s.host]['ssh']}", secrets)))
            return
        hosts = run_exec(site, steps, timeout)
    finally:
        site.close()
    code, why = exec_verdict(hosts)
    doc.update(hosts=hosts, ok=code == 0)
    if as_json:
        print(mask_secrets(dump_json(doc), secrets))
    else:
        for h, e in hosts.items():
            for stream, text in ((sys.stdout, e["stdout"]), (sys.stderr, e["stderr"])):
                for ln in text.splitlines():
                    print(f"{e['label']}: {printable(mask_secrets(ln, secrets))}", file=stream)
            sys.stdout.flush()
        for h, e in hosts.items():
            state = (f"error: {e['error']}" if e["error"] else f"not run: {e['not_run']}" if e["not_run"]
                     else f"exit {e['exit_status']}" + (f" (release {e['release']})" if e["release"] else ""))
            print(f"{e['label']}: {printable(mask_secrets(state, secrets))}", file=sys.stderr)
    if code == 3:
        raise DsvError(f"exec: {mask_secrets(why, secrets)}", 3)
    if code == 1:
        raise VerdictError(f"exec: {mask_secrets(why, secrets)}")


def register(app: typer.Typer) -> None:
    """Add ``exec`` to the root app."""
    app.command("exec", cls=AfterDoubleDash)(exec_)
