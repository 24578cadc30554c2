"""``dsv4ctl config lint``: thin CLI over :mod:`dsv4ctl.lint` (rules) and :mod:`dsv4ctl.configs` (reading)."""

from __future__ import annotations

from typing import Optional

import typer

from ..errors import InputError
from ..render import console, dump_json, markdown_table, rich_table

LINT_SCHEMA = "dsv4ctl.lint/1"


def lint_doc(profile, inp, findings) -> dict:
    """The ``dsv4ctl.lint/1`` JSON document."""
    g = inp.gating
    return dict(
        schema=LINT_SCHEMA, sglang_version="0.5.23", profile=profile.name, profile_path=str(profile.path),
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
    """Lint the profile's serve configs against SGLang 0.5.23's real argument table and the DSV4 rules.

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
    findings = restrict(lint(inp, load_table()), inp, groups)
    doc = lint_doc(prof, inp, findings)
    print_findings(findings, doc if as_json else None, markdown,
                   title=f"dsv4ctl config lint: {prof.name} (SGLang 0.5.23)")
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


def register(app: typer.Typer) -> None:
    """Add the ``config`` group (``config lint``) to the root app."""
    sub = typer.Typer(help="Serve configs (SGLang --config YAML): lint.", no_args_is_help=True)
    sub.command("lint")(lint_cmd)
    app.add_typer(sub, name="config")
