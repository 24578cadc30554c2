"""``dsv4ctl config lint|set``: thin CLI over :mod:`dsv4ctl.serve.lint` (rules),
:mod:`dsv4ctl.serve.setargs` (``KEY=VALUE`` edits) and :mod:`dsv4ctl.commands.serve_change`
(local files, or ``--remote``: a release)."""

from __future__ import annotations

from typing import Optional

import typer

from ..errors import InputError
from ..render import console, dump_json, markdown_table, rich_table
from .options import duration_option

LINT_SCHEMA = "dsv4ctl.lint/1"


def lint_doc(profile, inp, findings) -> dict:
    """The ``dsv4ctl.lint/1`` JSON document."""
    g = inp.gating
    return dict(
        schema=LINT_SCHEMA, sglang_version=inp.sglang_version, profile=profile.name, profile_path=str(profile.path),
        tree=inp.tree,
        gating=None if g is None else dict(gated=g.gated, summary=g.summary(),
                                           problems=[str(p) for p in g.problems]),
        plan_error=inp.plan_error,
        ok=not any(f.severity == "error" for f in findings),
        errors=sum(f.severity == "error" for f in findings),
        warnings=sum(f.severity == "warning" for f in findings),
        findings=[f.to_dict() for f in findings],
    )


def print_findings(findings, as_json_doc: Optional[dict] = None, markdown: bool = False, title: str = "") -> None:
    """Render findings as a rich table (default), Markdown or the JSON document."""
    if as_json_doc is not None:
        print(dump_json(as_json_doc))
        return
    headers = ["severity", "rule", "file:line", "group", "message"]
    rows = [[f.severity, f"{f.rule} {f.name}", f"{f.file}:{f.line}", f.group or "-", f.message] for f in findings]
    if markdown:
        if title:
            print(f"## {title}\n")
        print(markdown_table(headers, rows) if rows else "No findings.")
        return
    con = console()
    if rows:
        con.print(rich_table(title, headers, rows))
    else:
        con.print(f"{title}: no findings")


def lint_cmd(
    profile: Optional[str] = typer.Argument(None, help="Profile path or shipped name (default: the embedded dsv4-flash-8xb200-pd)."),
    group: list[str] = typer.Option([], "--group", "-g", help="Only these server groups. Repeatable."),
    tree: Optional[str] = typer.Option(None, "--tree", help="SGLang tree whose index-K gating is checked (default: the profile's sglang.tree)."),
    as_json: bool = typer.Option(False, "--json", help="Print the dsv4ctl.lint/1 JSON document."),
    markdown: bool = typer.Option(False, "--markdown", help="Print Markdown."),
) -> None:
    """Lint the profile's serve configs against the real argument table of the SGLang release the
    profile ships (0.5.18-0.5.23: the tree's own version, else sglang.version) and the DSV4 rules.

    Exit 0 when there is no error (warnings allowed), 2 when a file is missing or malformed or any
    rule reports an error."""
    from ..serve.argtable import load_table
    from ..serve.lintinput import build_input, restrict
    from ..serve.lint import lint
    from .common import load_deployment_arg

    prof = load_deployment_arg(profile)
    groups = [prof.group(n) for n in group] or None
    if groups:
        for g in groups:
            if not g.is_server:
                raise InputError(f"group {g.name!r} is the router: it has no serve config")
    inp = build_input(prof, groups, tree)
    findings = restrict(lint(inp, load_table(version=inp.sglang_version)), inp, groups)
    doc = lint_doc(prof, inp, findings)
    print_findings(findings, doc if as_json else None, markdown,
                   title=f"dsv4ctl config lint: {prof.name} (SGLang {inp.sglang_version})")
    if not as_json:
        g = inp.gating
        if g is not None:
            print(f"index-K gating ({inp.tree}): {g.summary()}")
        if inp.plan_error:
            print(f"note: host-RAM rule skipped, plan unavailable: {inp.plan_error}")
        print(f"{doc['errors']} error(s), {doc['warnings']} warning(s)")
    errs = [f for f in findings if f.severity == "error"]
    if errs:
        raise InputError(f"config lint: {len(errs)} error(s); first: {errs[0].format()}")


SET_SCHEMA = "dsv4ctl.config-set/1"


def set_cmd(
    profile: Optional[str] = typer.Argument(None, help="Profile path (or DSV4CTL_PROFILE; required: a shipped profile is never edited, start from dsv4ctl profile init)."),
    settings: list[str] = typer.Argument(None, metavar="KEY=VALUE...", help="Serve-config keys to set, e.g. kv-canary=log (values are YAML)."),
    group: list[str] = typer.Option([], "--group", "-g", help="Groups to edit (required). Repeatable."),
    unset: list[str] = typer.Option([], "--unset", help="Remove this key from the serve config. Repeatable."),
    tree: Optional[str] = typer.Option(None, "--tree", help="SGLang tree for the index-K gating check (default: the profile's sglang.tree)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the diff, the lint result (and with --remote the release steps); change nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print the dsv4ctl.config-set/1 JSON document."),
    remote: bool = typer.Option(False, "--remote", help="Change the running release: a new release with the edited serve configs, "
                                                      "pushed (delta), switched under the deploy lock, only the changed groups "
                                                      "restarted, the deploy's health gate (rolled back on failure), audit log; "
                                                      "then the local copies."),
    health_timeout: Optional[float] = duration_option(None, "--health-timeout", help="How long to wait for /health after a restart (900, 90s, 15m; at most 1d; default deploy.health_timeout_s, 900)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="With --remote: each step as it runs, and its duration when it ends (secret values masked)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="With --remote: no progress lines on stderr; only errors and the verdict."),
    message: Optional[str] = typer.Option(None, "--message", "-m", metavar="TEXT", help="With --remote: why (recorded in every host's audit log and the release's record; shown by audit and releases)."),
) -> None:
    """Set (or --unset) SGLang server arguments in the selected groups' serve configs, e.g.
    ``kv-canary=log``: keys and values checked against the argument table of the profile's SGLang release, the whole
    profile linted before anything is written, comments and key order kept.

    Exit 0 written (or nothing to do), 1 a restarted group was unhealthy and rolled back,
    2 bad input or a lint error (nothing written), 3 a host step failed."""
    from ..serve.argtable import table_for
    from ..serve.hicache_local import select_groups
    from ..serve.setargs import changes_for_set, parse_assignment
    from .common import load_deployment_arg
    from .serve_change import run_change

    import os
    settings = list(settings or [])
    if profile is not None and "=" in profile and not os.path.exists(profile):
        # `config set kv-canary=log -g prefill`: the first setting was taken for the profile
        if not os.environ.get("DSV4CTL_PROFILE"):
            raise InputError(f"config set: {profile!r} is a setting, not a profile: give the profile first "
                             "(dsv4ctl config set PROFILE KEY=VALUE... -g GROUP) or set DSV4CTL_PROFILE")
        profile, settings = None, [profile] + settings
    if not group:
        raise InputError("config set: name the groups to edit (--group/-g)")
    sets = [parse_assignment(s) for s in settings]
    if not sets and not unset:
        raise InputError("config set: nothing to set (give KEY=VALUE or --unset KEY)")
    prof = load_deployment_arg(profile, acts_on_hosts=True)
    table = table_for(prof)        # the argument table of the release the profile ships
    changes_for_set({}, sets, unset, table, "config set")       # the keys and values, before any serve config is read
    groups = select_groups(prof, group, "set")
    from ..profile.secrets import is_secret_key, secret_strings
    secrets = frozenset(secret_strings({k: v for k, v in sets}))     # new secret values: never printed
    shown = {k: "***" if is_secret_key(k) else v for k, v in sets}
    desc = ", ".join([f"{k}={v}" for k, v in shown.items()] + [f"-{k}" for k in unset])
    groups = list({g.name: g for g in groups}.values())             # -g prefill -g prefill: once
    run_change(prof, groups, what="config set", action="config-set",
               changes=lambda data, tbl, label: changes_for_set(data, sets, unset, tbl, label),
               tree=tree, dry_run=dry_run, as_json=as_json, remote=remote, health_timeout=health_timeout,
               verbose=verbose, quiet=quiet, schema=SET_SCHEMA, doc=dict(set=shown, unset=list(unset)),
               unchanged=f"already {desc}", secrets=secrets, message=message)


def register(app: typer.Typer) -> None:
    """Add the ``config`` group (``config lint``, ``config set``) to the root app."""
    sub = typer.Typer(help="Serve configs (SGLang --config YAML): lint, set.", no_args_is_help=True)
    sub.command("lint")(lint_cmd)
    sub.command("set")(set_cmd)
    app.add_typer(sub, name="config")
