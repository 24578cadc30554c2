"""``dsv4ctl hicache on|off|status``: thin CLI over :mod:`dsv4ctl.serve.hicache_local` (the
profile's serve configs), :mod:`dsv4ctl.serve.hicache_live` (the live files on hosts) and
:mod:`dsv4ctl.serve.hicache` (edits and status)."""

from __future__ import annotations

from typing import Optional

import typer

from ..errors import EXIT_FAILED, EXIT_REMOTE, DsvError, InputError
from ..render import console, dump_json, markdown_table, rich_table

SCHEMA_EDIT = "dsv4ctl.hicache-edit/1"
SCHEMA_STATUS = "dsv4ctl.hicache-status/1"


def _toggle(action: str, profile, group, ratio, write_policy, io_backend, mem_layout, storage_backend,
            tree, dry_run, as_json, remote: bool = False, health_timeout: Optional[float] = None) -> None:
    from ..serve.hicache import Options
    from ..serve.hicache_local import prepare_edits, select_groups, write_all
    from .common import load_deployment_arg

    prof = load_deployment_arg(profile, acts_on_hosts=True)      # on/off edit files (or hosts)
    groups = select_groups(prof, group, action)
    if not groups:
        raise InputError(f"hicache {action}: no group selected (use --group)")
    opts = Options(ratio=ratio, write_policy=write_policy, io_backend=io_backend, mem_layout=mem_layout,
                   storage_backend=storage_backend)
    edits = prepare_edits(prof, groups, action, opts, tree)
    out = _printer(set().union(*(e.secrets for e in edits)))
    if remote:
        _remote(prof, groups, action, opts, tree, dry_run, as_json, edits, health_timeout)
        return
    changed = [e for e in edits if e.new != e.old]
    if not dry_run and changed:
        write_all([(e.path, e.new) for e in changed])
    if as_json:
        out(dump_json(dict(schema=SCHEMA_EDIT, action=action, profile=prof.name, dry_run=dry_run,
                             groups=[dict(group=e.group, file=str(e.path), changed=e.new != e.old,
                                          written=(e.new != e.old) and not dry_run, diff=e.diff,
                                          findings=[f.to_dict() for f in e.findings]) for e in edits])))
        return
    for e in edits:
        if e.new == e.old:
            out(f"{e.group}: {e.path}: HiCache already {action}, unchanged")
            continue
        out(e.diff, end="" if e.diff.endswith("\n") else "\n")
        for f in e.findings:
            out(f.format())
    if changed:
        verb = "dry run: would write" if dry_run else "wrote"
        out(f"{verb} {len(changed)} file(s): {', '.join(str(e.path) for e in changed)}")


def _remote(prof, groups, action, opts, tree, dry_run, as_json, local_edits, health_timeout) -> None:
    """``--remote``: the live files on the hosts (backup, atomic write, restart, health, audit), then
    the profile's local copies (so the next deploy keeps the setting)."""
    from ..serve import hicache_live as hr
    from ..serve.hicache_local import write_all
    from ..remote import connect, describe_actions

    hosts = sorted({g.group.host for g in groups})
    transports = {h: connect(prof.hosts[h], hosts=prof.hosts) for h in hosts}
    try:
        redits = hr.plan_remote(prof, groups, action, opts, tree, transports)
        out = _printer(set().union(*(e.secrets for e in local_edits), *(_secrets_of(e.old) for e in redits)))
        acts = hr.actions(prof, redits)
        if not as_json:
            for e in redits:
                if e.new == e.old:
                    out(f"{e.group}: {e.host}:{e.path}: HiCache already {action}, unchanged")
                else:
                    out(e.diff, end="")
                    for f in e.findings:
                        out(f.format())
            if dry_run:
                for line in describe_actions(acts):
                    out(f"dry run: {line}")
                for e in redits:
                    if e.new != e.old:
                        out(f"dry run: wait for {e.url}/health, append to {e.host}:{e.root}/audit.jsonl")
        timeout = health_timeout if health_timeout is not None else prof.deploy.health_timeout_s
        err = None
        if not dry_run:
            try:
                hr.apply_remote(prof, redits, transports, action, timeout, log=(lambda s: None) if as_json else out)
            except DsvError as e:
                err = e
        changed_local = [e for e in local_edits if e.new != e.old]
        if not dry_run and err is None and changed_local:
            write_all([(e.path, e.new) for e in changed_local])
        if as_json:
            out(dump_json(dict(schema=SCHEMA_EDIT, action=action, profile=prof.name, dry_run=dry_run, remote=True,
                                 groups=[dict(group=e.group, host=e.host, file=e.path, changed=e.new != e.old,
                                              written=(e.new != e.old) and not dry_run and not e.rolled_back and err is None,
                                              backup=e.backup if e.new != e.old else None, diff=e.diff,
                                              restart=e.restart, healthy=e.healthy, rolled_back=e.rolled_back,
                                              findings=[f.to_dict() for f in e.findings]) for e in redits],
                                 local=[dict(group=e.group, file=str(e.path), changed=e.new != e.old, diff=e.diff)
                                        for e in local_edits])))
        else:
            for e in changed_local:
                out(e.diff, end="")
            if not dry_run and err is None:
                done = [e for e in redits if e.new != e.old]
                for e in done:
                    how = (e.restart or {}).get("how", "?")
                    out(f"{e.host}: {e.group}: wrote {e.path} (backup {e.backup}), restarted ({how}), healthy")
                if changed_local:
                    out(f"wrote {len(changed_local)} local file(s): {', '.join(str(e.path) for e in changed_local)}")
        if err is not None:
            raise err
    finally:
        for t in transports.values():
            t.close()


def _secrets_of(text: str) -> set[str]:
    from ..serve.edit import secret_values
    import yaml
    try:
        return secret_values(yaml.safe_load(text))
    except yaml.YAMLError:
        return set()


def _printer(secrets: set[str]):
    """``print`` that replaces the serve configs' secret values with ``***`` (diffs are already
    masked line by line; this also covers findings, JSON and host output)."""
    from ..serve.edit import scrub

    def out(s: str = "", end: str = "\n") -> None:
        print(scrub(s, secrets), end=end)
    return out


def _opts_doc():
    return dict(
        group=typer.Option([], "--group", "-g", help="Groups to edit (default: on → prefill/colocated groups, off → all server groups). Repeatable."),
        ratio=typer.Option(None, "--ratio", help="hicache-ratio: host pool / device pool (DSV4 needs it explicit; default 2.0 when the file has none)."),
        write_policy=typer.Option(None, "--write-policy", help="hicache-write-policy: write_back, write_through, write_through_selective."),
        io_backend=typer.Option(None, "--io-backend", help="hicache-io-backend: direct, kernel, kernel_ascend."),
        mem_layout=typer.Option(None, "--mem-layout", help="hicache-mem-layout (DSV4: layer_first, page_first, page_first_direct)."),
        storage_backend=typer.Option(None, "--storage-backend", help="hicache-storage-backend (L3), e.g. file, mooncake."),
    )


_O = _opts_doc()
_PROFILE = typer.Argument(None, help="Profile path or shipped name (default: the embedded dsv4-flash-8xb200-pd).")
_TREE = typer.Option(None, "--tree", help="SGLang tree for the index-K gating check (default: the profile's sglang.tree).")
_DRY = typer.Option(False, "--dry-run", help="Print the diff and lint result; write nothing.")
_JSON = typer.Option(False, "--json", help="Print the dsv4ctl.hicache-edit/1 JSON document.")
_REMOTE = typer.Option(False, "--remote", help="Edit the live files on the groups' hosts (<root>/current/configs/G.yaml): "
                                              "backup, atomic write, restart, wait for /health, audit log; then the local copies.")
_HEALTH = typer.Option(None, "--health-timeout", help="Seconds to wait for /health after a restart (default deploy.health_timeout_s, 900).")


def on(profile: Optional[str] = _PROFILE, group: list[str] = _O["group"], ratio: Optional[float] = _O["ratio"],
       write_policy: Optional[str] = _O["write_policy"], io_backend: Optional[str] = _O["io_backend"],
       mem_layout: Optional[str] = _O["mem_layout"], storage_backend: Optional[str] = _O["storage_backend"],
       tree: Optional[str] = _TREE, dry_run: bool = _DRY, as_json: bool = _JSON, remote: bool = _REMOTE,
       health_timeout: Optional[float] = _HEALTH) -> None:
    """Turn HiCache on in the selected groups' serve configs (diff printed, linted before writing).

    Exit 0 written (or nothing to do), 1 a restarted group was unhealthy and rolled back,
    2 bad input or a lint error (nothing written), 3 a host step failed."""
    _toggle("on", profile, group, ratio, write_policy, io_backend, mem_layout, storage_backend, tree, dry_run,
            as_json, remote, health_timeout)


def off(profile: Optional[str] = _PROFILE, group: list[str] = _O["group"], tree: Optional[str] = _TREE,
        dry_run: bool = _DRY, as_json: bool = _JSON, remote: bool = _REMOTE,
        health_timeout: Optional[float] = _HEALTH) -> None:
    """Turn HiCache off (``enable-hierarchical-cache: false``; other hicache-* keys are kept, inert).

    Exit 0 written (or nothing to do), 1 a restarted group was unhealthy and rolled back,
    2 bad input or a lint error (nothing written), 3 a host step failed."""
    _toggle("off", profile, group, None, None, None, None, None, tree, dry_run, as_json, remote, health_timeout)


async def _fetch_all(urls: dict[str, str], timeout: float) -> dict[str, tuple[Optional[dict], Optional[str]]]:
    import asyncio

    import aiohttp

    async def one(session, url):
        try:
            async with session.get(url + "/server_info") as r:
                if r.status != 200:
                    return None, f"/server_info HTTP {r.status}"
                return await r.json(content_type=None), None
        except aiohttp.ClientError as e:     # operator words: "cannot connect to HOST:PORT (connection refused)"
            from ..check.driver import describe_client_error
            return None, f"unreachable: {describe_client_error(e, url + '/server_info')[1]}"
        except asyncio.TimeoutError:
            return None, f"unreachable: no answer within {timeout:g} s"
        except (ValueError, RecursionError):
            return None, "/server_info: not a JSON document"

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
        res = await asyncio.gather(*(one(s, u) for u in urls.values()))
    return dict(zip(urls, res))


def status(profile: Optional[str] = _PROFILE,
           group: list[str] = typer.Option([], "--group", "-g", help="Only these groups. Repeatable."),
           timeout: float = typer.Option(5.0, "--timeout", help="Seconds per /server_info request."),
           no_server: bool = typer.Option(False, "--no-server", help="Only what the files say; query no server."),
           remote: bool = typer.Option(False, "--remote", help="Read the live files on the hosts (<root>/current/configs/G.yaml) instead of the profile's copies."),
           as_json: bool = typer.Option(False, "--json", help="Print the dsv4ctl.hicache-status/1 JSON document."),
           markdown: bool = typer.Option(False, "--markdown", help="Print Markdown.")) -> None:
    """Per group: HiCache as the serve config says (resolved like SGLang) and as the running server's
    /server_info reports; differences are flagged.

    Exit 0 all match, 1 a file and its server differ, 2 bad input, 3 a server could not be queried."""
    import asyncio

    from .options import seconds
    seconds(timeout, "--timeout", hi=3600)

    from ..profile.serveconfig import parse_serve_config
    from ..serve.argtable import load_table
    from ..serve.hicache import GroupStatus, compare, file_view
    from ..serve.hicache_local import select_groups
    from ..serve.lint import check_keys
    from .common import load_deployment_arg

    prof = load_deployment_arg(profile, acts_on_hosts=remote)
    groups = select_groups(prof, group, "status")
    table = load_table()
    rows: list[GroupStatus] = []
    live: dict[str, object] = {}
    if remote:
        from ..serve import hicache_live as hr
        from ..remote import connect, read_text
        for h in sorted({g.group.host for g in groups}):
            t = connect(prof.hosts[h], hosts=prof.hosts)
            try:
                for g in groups:
                    if g.group.host == h:
                        path = hr.live_config(g.root, g.name)
                        text = read_text(t, path, default=None)
                        if text is None:
                            raise InputError(f"{h}:{path}: no such file on the host (deploy a release first)")
                        live[g.name] = parse_serve_config(text, f"{h}:{path}")
            finally:
                t.close()
    for g in groups:
        if g.name in live:
            cfg = live[g.name]
        elif g.serve_config_path is None:
            raise InputError(f"{prof.path}: group {g.name}: no serve_config")
        else:
            cfg = g.serve
        findings, resolved = check_keys(cfg, table, g.name)
        bad = [f for f in findings if f.severity == "error"]
        if bad:
            raise InputError(bad[0].format())
        rows.append(GroupStatus(g.name, g.role, g.group.host, cfg.path,
                                None if no_server else g.url_with(cfg), file_view(resolved.args)))
    if not no_server:
        got = asyncio.run(_fetch_all({r.group: r.url for r in rows}, timeout))
        for r in rows:
            info, err = got[r.group]
            r.error = err
            if info is not None:
                r.server_says = {k: info.get(k) for k in r.file_says}
                r.differences = compare(r.file_says, r.server_says)
    if as_json:
        print(dump_json(dict(schema=SCHEMA_STATUS, profile=prof.name, groups=[r.to_dict() for r in rows])))
    else:
        def fmt(d):
            if d is None:
                return "-"
            if not d.get("enable_hierarchical_cache"):
                return "off"
            return (f"on ratio {d.get('hicache_ratio')} {d.get('hicache_write_policy')} "
                    f"{d.get('hicache_mem_layout')}/{d.get('hicache_io_backend')}"
                    + (f" L3 {d['hicache_storage_backend']}" if d.get("hicache_storage_backend") else ""))
        headers = ["group", "role", "host", "file says", "server says", "verdict"]
        body = [[r.group, r.role, r.host, fmt(r.file_says), r.error or fmt(r.server_says),
                 "not queried" if no_server else ("ERROR" if r.error else ("DIFFERS: " + "; ".join(r.differences)
                                                                           if r.differences else "match"))]
                for r in rows]
        if markdown:
            print(markdown_table(headers, body))
        else:
            console().print(rich_table(f"dsv4ctl hicache status: {prof.name}", headers, body))
    errs = [r for r in rows if r.error]
    if errs:
        raise DsvError(f"hicache status: {errs[0].group}: {errs[0].url}: {errs[0].error}", EXIT_REMOTE)
    diffs = [r for r in rows if r.differences]
    if diffs:
        raise DsvError(f"hicache status: {len(diffs)} group(s) differ from their file: "
                       f"{diffs[0].group}: {diffs[0].differences[0]}", EXIT_FAILED)


def register(app: typer.Typer) -> None:
    """Add the ``hicache`` group (``on``, ``off``, ``status``) to the root app."""
    sub = typer.Typer(help="HiCache in serve configs: on, off, status (file vs running server).",
                      no_args_is_help=True)
    sub.command("on")(on)
    sub.command("off")(off)
    sub.command("status")(status)
    app.add_typer(sub, name="hicache")
