"""``dsv4ctl patch``: patch series on SGLang trees — thin CLI over :mod:`dsv4ctl.patches`.

Exit codes: 0 ok · 1 a patch/revert does not apply (tree restored) or ``check`` failed ·
2 bad input (tree, series, range; nothing changed) · 3 remote failure (``--host``) · 130
interrupted (SIGINT, SIGTERM or SIGHUP: git is stopped — on ``--host`` its process group on the host —
and the tree restored)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import InputError, VerdictError
from ..render import console, dump_json, markdown_table, rich_table

patch_app = typer.Typer(help="Patch series on SGLang trees: status, apply, revert, check, export.",
                        no_args_is_help=True)

_HOST = typer.Option(None, "--host", help="Run on this profile host's tree (through the remote layer).")
_PROFILE = typer.Option(None, "--profile", "-p", help="Profile for --host (default: the embedded one).")
_SERIES = typer.Option(None, "--series", help="Series directory (default: the shipped patches/sglang-<tree version>).")
_BASE_REF = typer.Option(None, "--base", help="Pristine base ref of the tree (default: tag v<version>).")
_JSON = typer.Option(False, "--json", help="Print JSON.")
_MD = typer.Option(False, "--markdown", help="Print Markdown.")
_DRY = typer.Option(False, "--dry-run", "-n", help="Print the actions; change nothing.")
_MESSAGE = typer.Option(None, "--message", "-m", help="Why: a git note (refs/notes/dsv4ctl) on every commit it makes; shown by patch status and git log --notes=dsv4ctl.")


def _git(tree: str, host: Optional[str], profile: Optional[str]):
    from ..patches.gitio import Git, transport_runner
    if host is None:
        p = Path(tree).expanduser()
        if not p.is_dir():
            raise InputError(f"{tree}: no such directory")
        return Git(str(p.resolve())), None
    from ..profile.model import load_profile
    from ..remote import connect
    from ..resources import resolve_profile
    prof = load_profile(resolve_profile(profile))
    if host not in prof.hosts:
        raise InputError(f"--host {host}: not a host of profile {prof.name} ({', '.join(prof.hosts)})")
    t = connect(prof.hosts[host], hosts=prof.hosts)
    return Git(tree, transport_runner(t), where=f"{host}:{tree}"), t


def _series_dir(series: Optional[str], version: Optional[str]) -> Path:
    from ..resources import shipped_dir
    if series:
        return Path(series).expanduser()
    if not version:
        raise InputError("cannot tell the tree's SGLang version; pass --series DIR")
    d = shipped_dir("patches") / f"sglang-{version}"
    if not (d / "series").is_file():
        raise InputError(f"no shipped series for SGLang {version} ({d}); pass --series DIR")
    return d


def _status_doc(state, ls, st) -> dict:
    return dict(
        schema="dsv4ctl.patch-status/1", tree=state.tree, version=state.version,
        base_ref=state.base_ref, base_commit=state.base_commit, head=state.head, branch=state.branch,
        series=str(ls.dir), series_base=ls.series.base, series_identity=ls.identity,
        complete=st.complete,
        patches=[dict(name=e.name, state=e.state, commit=e.commit, reverted_by=e.reverted_by,
                      patch_id=ls.ids.get(e.name), facts=ls.series.entry(e.name).facts)
                 for e in st.entries],
        extra_commits=[dict(sha=c.sha, subject=c.subject) for c in st.extra],
        reverts=[dict(sha=c.sha, subject=c.subject, reverts=c.reverts) for c in st.reverts],
        dirty=state.dirty, operation=state.operation)


@patch_app.command("status")
def status(tree: str = typer.Argument(..., help="SGLang git tree (a path; on --host, a path there)."),
           series: Optional[str] = _SERIES, base: Optional[str] = _BASE_REF,
           host: Optional[str] = _HOST, profile: Optional[str] = _PROFILE,
           as_json: bool = _JSON, markdown: bool = _MD) -> None:
    """Base version and commit, which series patches are applied (by git patch-id), reverted or
    missing, extra local commits and reverts, dirty files. Reads only."""
    from ..patches.ops import load_series, series_status
    from ..patches.tree import read_tree
    git, _ = _git(tree, host, profile)
    state = read_tree(git, base)
    ls = load_series(_series_dir(series, state.version))
    doc = _status_doc(state, ls, series_status(ls, state))
    from ..patches.notes import read_notes     # why each commit was made (patch apply|revert -m)
    doc["notes"] = read_notes(git, [c for c in [x for p in doc["patches"] for x in (p["commit"], p["reverted_by"])]
                                    + [c["sha"] for c in doc["extra_commits"] + doc["reverts"]] if c])
    if as_json:
        print(dump_json(doc))
        return
    rows = [[p["name"], p["state"], (p["commit"] or "")[:12],
             " ".join(f"{k}={v}" for k, v in p["facts"].items())] for p in doc["patches"]]
    rows += [[c["subject"], "extra commit", c["sha"][:12], ""] for c in doc["extra_commits"]]
    rows += [[c["subject"], f"revert of {c['reverts'][:12]}", c["sha"][:12], ""] for c in doc["reverts"]]
    head = (f"{doc['tree']}: SGLang {doc['version']} · base {doc['base_ref']} ({doc['base_commit'][:12]}) · "
            f"HEAD {doc['head'][:12]} · series {doc['series_base']} {doc['series_identity'][:19]}")
    tail = [f"dirty: {ln}" for ln in doc["dirty"]] + ([f"in progress: git {doc['operation']}"] if doc["operation"] else [])
    tail = [f"note on {sha[:12]}: {text}" for sha, text in doc["notes"].items()] + tail
    headers = ["patch / commit", "state", "commit", "facts"]
    if markdown:
        print(f"## {head}\n\n{markdown_table(headers, rows)}")
        for t in tail:
            print(f"- {t}")
        return
    con = console()
    con.print(rich_table(head, headers, rows))
    for t in tail:
        con.print(f"[yellow]{t}[/]")


@patch_app.command("apply")
def apply(tree: str = typer.Argument(..., help="SGLang git tree."),
          series: Optional[str] = _SERIES, base: Optional[str] = _BASE_REF,
          host: Optional[str] = _HOST, profile: Optional[str] = _PROFILE,
          dry_run: bool = _DRY, as_json: bool = _JSON, message: Optional[str] = _MESSAGE) -> None:
    """Apply the missing series patches with ``git am -3`` onto the clean tree. On a conflict the
    tree is restored exactly (HEAD and status) and the error names patch, file and hunk (exit 1)."""
    from ..patches.ops import execute_apply, load_series, plan_apply
    from ..patches.tree import read_tree
    note = _note("patch apply", message)
    git, _ = _git(tree, host, profile)
    state = read_tree(git, base)
    ls = load_series(_series_dir(series, state.version))
    actions = plan_apply(ls, state)
    if dry_run:
        _print_actions(actions, as_json, state.tree, dry=True, note=note)
        return
    res = execute_apply(git, ls, state, actions)
    new = git.out("rev-list", "--reverse", f"{res.head_before}..{res.head_after}").split()
    _add_notes(git, new, note)
    if as_json:
        print(dump_json(dict(schema="dsv4ctl.patch-apply/1", tree=state.tree, applied=res.applied,
                             skipped=res.skipped, head_before=res.head_before, head_after=res.head_after,
                             series_identity=ls.identity, **({"note": note} if note else {}))))
        return
    _print_actions(actions, False, state.tree, dry=False, note=note if new else None)
    print(f"{state.tree}: HEAD {res.head_before[:12]} -> {res.head_after[:12]} "
          f"({len(res.applied)} applied, {len(res.skipped)} already there)")


@patch_app.command("revert")
def revert(tree: str = typer.Argument(..., help="SGLang git tree."),
           commits: list[str] = typer.Argument(..., help="Commits to revert (in this order)."),
           base: Optional[str] = _BASE_REF, host: Optional[str] = _HOST,
           profile: Optional[str] = _PROFILE, dry_run: bool = _DRY, as_json: bool = _JSON,
           message: Optional[str] = _MESSAGE) -> None:
    """``git revert`` commits; each revert is a commit that ``patch status`` lists (and ``patch
    export`` can turn into a series entry). Restores the tree on a conflict (exit 1)."""
    from ..patches.ops import execute_revert, plan_revert
    from ..patches.tree import read_tree
    note = _note("patch revert", message)
    git, _ = _git(tree, host, profile)
    state = read_tree(git, base)
    actions = plan_revert(git, state, commits)
    if dry_run:
        _print_actions(actions, as_json, state.tree, dry=True, note=note)
        return
    new = execute_revert(git, state, actions)
    _add_notes(git, new, note)
    if as_json:
        print(dump_json(dict(schema="dsv4ctl.patch-revert/1", tree=state.tree,
                             reverted=[a.target for a in actions], commits=new, **({"note": note} if note else {}))))
        return
    for a, sha in zip(actions, new):
        print(f"{state.tree}: reverted {a.target[:12]} ({a.detail}) as {sha[:12]}")
    if note:
        print(f"noted on {len(new)} commit(s) (refs/notes/dsv4ctl): {note}")


@patch_app.command("check")
def check(base: Optional[str] = typer.Option(None, "--base", help="PACKAGE==VERSION to prove against (default: the series' base)."),
          series: Optional[str] = typer.Option(None, "--series", help="Series directory (default: the shipped patches/sglang-VERSION of --base, else of 0.5.23)."),
          keep: Optional[str] = typer.Option(None, "--keep", help="Build the tree in this (new) directory and keep it."),
          dry_run: bool = typer.Option(False, "--dry-run", help="Load the series and say where the pristine wheel would come from; fetch and build nothing."),
          as_json: bool = _JSON, markdown: bool = _MD) -> None:
    """Build a pristine tree of the base version (from the released wheel, cached), apply the
    series and compile every touched Python file. Exit 0 when proven, 1 when not."""
    from ..patches.check import check_series
    from ..patches.ops import load_series
    from ..patches.series import parse_base
    from ..plan.plan import SGLANG_VERSION
    want = parse_base(base, "--base") if base else None
    # the shipped series is keyed by base version: --base sglang==0.5.22 proves patches/sglang-0.5.22
    ls = load_series(_series_dir(series, (want[1] if want and want[0] == "sglang" else SGLANG_VERSION)
                                 if series is None else None))
    pkg, ver = want or (ls.series.package, ls.series.version)
    if (pkg, ver) != (ls.series.package, ls.series.version):
        print(f"note: series is cut for {ls.series.base}; checking against {pkg}=={ver}")
    if dry_run:
        from ..patches.pristine import fetch_plan
        names = [e.name for e in ls.series.entries]
        src = fetch_plan(pkg, ver)
        if as_json:
            print(dump_json(dict(schema="dsv4ctl.patch-check/1", dry_run=True, base=f"{pkg}=={ver}", series=str(ls.dir),
                                 series_identity=ls.identity, patches=names, wheel=src)))
        else:
            print(f"patch check --dry-run: {len(names)} patches of {ls.dir} on pristine {pkg}=={ver}; {src}")
            for n in names:
                print(f"  {n}")
        return
    workdir = None
    if keep:
        workdir = Path(keep).expanduser()
        if workdir.exists() and any(workdir.iterdir()):
            raise InputError(f"--keep {keep}: directory is not empty")
        workdir.mkdir(parents=True, exist_ok=True)
    rep = check_series(ls, pkg, ver, workdir)
    doc = dict(schema="dsv4ctl.patch-check/1", ok=rep.ok, base=rep.base, series=str(ls.dir),
               series_identity=rep.identity, base_commit=rep.base_commit, head=rep.head,
               tree=rep.tree if keep else None,
               patches=[dict(name=p.name, state=p.state, files=p.files, compiled=p.compiled)
                        for p in rep.patches], errors=rep.errors)
    if as_json:
        print(dump_json(doc))
    else:
        headers = ["patch", "state", "files", "compiled"]
        rows = [[p["name"], p["state"], len(p["files"]), len(p["compiled"])] for p in doc["patches"]]
        title = f"patch check: {ls.dir} on pristine {rep.base} ({rep.base_commit[:12]} -> {rep.head[:12]})"
        if markdown:
            print(f"## {title}\n\n{markdown_table(headers, rows)}")
        else:       # the title on its own line: a table's title wraps at the table's width, paths cut
            print(title)
            console().print(rich_table("", headers, rows))
        for e in rep.errors:
            print(f"error: {e}")
        if rep.ok:
            print(f"ok: {len(rep.patches)} patches apply to pristine {rep.base}; "
                  f"{sum(len(p.compiled) for p in rep.patches)} touched files compile")
        if keep:
            print(f"tree kept: {rep.tree}")
    if not rep.ok:
        raise VerdictError("patch check: " + rep.errors[0], label="check failed")


@patch_app.command("export")
def export(rng: str = typer.Argument(..., metavar="RANGE", help="Commits: A..B, or one commit."),
           series: str = typer.Option(..., "--series", help="Series directory to add to (created if absent)."),
           tree: str = typer.Option(".", "--tree", help="SGLang git tree holding the commits."),
           fact: list[str] = typer.Option([], "--fact", metavar="KEY=VALUE", help="Fact for every exported patch (index_k_dtype=bf16 ...). Repeatable."),
           dry_run: bool = _DRY, as_json: bool = _JSON) -> None:
    """Turn commits into series entries: one numbered git-format patch per commit plus its
    series line (commits whose patch-id the series has are skipped)."""
    from ..patches.ops import execute_export, load_series, plan_export
    from ..patches.series import parse_series
    from ..patches.tree import tree_version
    git, _ = _git(tree, None, None)
    facts: dict[str, str] = {}
    for f in fact:
        k, eq, v = f.partition("=")
        if not eq:
            raise InputError(f"--fact {f!r}: expected KEY=VALUE")
        facts[k] = v
    # Validate the facts the way the series parser will read them back.
    from ..patches.series import format_entry
    parse_series(format_entry("x.patch", facts), path="--fact", dirname="sglang-0")
    d = Path(series).expanduser()
    ls = load_series(d) if (d / "series").is_file() else None
    actions, texts = plan_export(git, rng, d, facts, ls)
    if dry_run:
        _print_actions(actions, as_json, str(d), dry=True)
        return
    version = tree_version(git)
    execute_export(d, actions, texts, None if ls else (f"sglang=={version}" if version else None))
    load_series(d)  # the result must parse
    _print_actions(actions, as_json, str(d), dry=False)


def _print_actions(actions, as_json: bool, where: str, dry: bool, note: Optional[str] = None) -> None:
    if as_json:
        print(dump_json(dict(schema="dsv4ctl.patch-actions/1", target=where, dry_run=dry,
                             actions=[dict(kind=a.kind, target=a.target, detail=a.detail) for a in actions],
                             **({"note": note} if note else {}))))
        return
    prefix = "dry-run: " if dry else ""
    for a in actions:
        print(f"{prefix}{a.describe()}")
    if not actions:
        print(f"{prefix}nothing to do")
    elif note:
        from ..patches.notes import note_command
        print(f"{prefix}{note_command(note)}")


def _note(command: str, message: Optional[str]) -> Optional[str]:
    """The git note of ``-m`` (checked by the one message rule; exit 2), or None without one."""
    from ..patches.notes import note_text
    from ..remote import who
    from .options import message as check_message
    message = check_message(message)
    return note_text(command, message, who()) if message else None


def _add_notes(git, commits: list[str], note: Optional[str]) -> None:
    if note and commits:
        from ..patches.notes import add_notes
        add_notes(git, commits, note)


def register(app: typer.Typer) -> None:
    """Add the ``patch`` group to the root app."""
    app.add_typer(patch_app, name="patch")
