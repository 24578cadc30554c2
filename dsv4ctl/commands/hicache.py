"""``dsv4ctl hicache on|off|status``: thin CLI over :mod:`dsv4ctl.serve.hicache_local` (the
profile's serve configs), :mod:`dsv4ctl.serve.hicache_live` (the running release's configs; the change is a release, :mod:`dsv4ctl.deploy.change`) and
:mod:`dsv4ctl.serve.hicache` (edits and status)."""

from __future__ import annotations

from typing import Optional

import typer

from ..errors import EXIT_REMOTE, DsvError, InputError, VerdictError
from ..render import console, dump_json, markdown_table, rich_table
from .options import duration_option

SCHEMA_EDIT = "dsv4ctl.hicache-edit/1"
SCHEMA_STATUS = "dsv4ctl.hicache-status/1"


def _toggle(action: str, profile, group, ratio, write_policy, io_backend, mem_layout, storage_backend,
            tree, dry_run, as_json, remote: bool = False, health_timeout: Optional[float] = None,
            verbose: bool = False, quiet: bool = False, message: Optional[str] = None) -> None:
    from ..serve.hicache import Options, changes_for
    from ..serve.hicache_local import select_groups
    from .common import load_deployment_arg
    from .deploy import check_health_timeout
    from .serve_change import run_change

    check_health_timeout(health_timeout)
    prof = load_deployment_arg(profile, acts_on_hosts=True)      # on/off edit files (or hosts)
    groups = select_groups(prof, group, action)
    if not groups:
        raise InputError(f"hicache {action}: no group selected (use --group)")
    opts = Options(ratio=ratio, write_policy=write_policy, io_backend=io_backend, mem_layout=mem_layout,
                   storage_backend=storage_backend)
    run_change(prof, groups, what=f"hicache {action}", action=f"hicache-{action}",
               changes=lambda data, table, label: changes_for(action, data, opts, table, label),
               tree=tree, dry_run=dry_run, as_json=as_json, remote=remote, health_timeout=health_timeout,
               verbose=verbose, quiet=quiet, schema=SCHEMA_EDIT, doc=dict(action=action), unchanged=f"HiCache already {action}",
               message=message)


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
_PROFILE_EDIT = typer.Argument(None, help="Profile path (or DSV4CTL_PROFILE; required: a shipped profile is never edited, start from dsv4ctl profile init).")
_TREE = typer.Option(None, "--tree", help="SGLang tree for the index-K gating check (default: the profile's sglang.tree).")
_DRY = typer.Option(False, "--dry-run", help="Print the diff and lint result; write nothing.")
_JSON = typer.Option(False, "--json", help="Print the dsv4ctl.hicache-edit/1 JSON document.")
_REMOTE = typer.Option(False, "--remote", help="Change the running release: a new release with the edited serve configs, "
                                              "pushed (delta), switched under the deploy lock, only the changed groups "
                                              "restarted, the deploy's health gate (rolled back on failure), audit log; "
                                              "then the local copies.")
_VERBOSE = typer.Option(False, "--verbose", "-v", help="With --remote: each step as it runs, and its duration when it ends (secret values masked).")
_QUIET = typer.Option(False, "--quiet", "-q", help="With --remote: no progress lines on stderr; only errors and the verdict.")
_MESSAGE = typer.Option(None, "--message", "-m", metavar="TEXT", help="With --remote: why (recorded in every host's audit log and the release's record; shown by audit and releases).")
_HEALTH = duration_option(None, "--health-timeout", help="How long to wait for /health after a restart (900, 90s, 15m; at most 1d; default deploy.health_timeout_s, 900).")


def on(profile: Optional[str] = _PROFILE_EDIT, group: list[str] = _O["group"], ratio: Optional[float] = _O["ratio"],
       write_policy: Optional[str] = _O["write_policy"], io_backend: Optional[str] = _O["io_backend"],
       mem_layout: Optional[str] = _O["mem_layout"], storage_backend: Optional[str] = _O["storage_backend"],
       tree: Optional[str] = _TREE, dry_run: bool = _DRY, as_json: bool = _JSON, remote: bool = _REMOTE,
       health_timeout: Optional[float] = _HEALTH, verbose: bool = _VERBOSE, quiet: bool = _QUIET,
       message: Optional[str] = _MESSAGE) -> None:
    """Turn HiCache on in the selected groups' serve configs (diff printed, linted before writing).

    Exit 0 written (or nothing to do), 1 a restarted group was unhealthy and rolled back,
    2 bad input or a lint error (nothing written), 3 a host step failed."""
    _toggle("on", profile, group, ratio, write_policy, io_backend, mem_layout, storage_backend, tree, dry_run,
            as_json, remote, health_timeout, verbose, quiet, message)


def off(profile: Optional[str] = _PROFILE_EDIT, group: list[str] = _O["group"], tree: Optional[str] = _TREE,
        dry_run: bool = _DRY, as_json: bool = _JSON, remote: bool = _REMOTE,
        health_timeout: Optional[float] = _HEALTH, verbose: bool = _VERBOSE, quiet: bool = _QUIET,
        message: Optional[str] = _MESSAGE) -> None:
    """Turn HiCache off (``enable-hierarchical-cache: false``; other hicache-* keys are kept, inert).

    Exit 0 written (or nothing to do), 1 a restarted group was unhealthy and rolled back,
    2 bad input or a lint error (nothing written), 3 a host step failed."""
    _toggle("off", profile, group, None, None, None, None, None, tree, dry_run, as_json, remote, health_timeout, verbose,
            quiet, message)


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
           timeout: float = duration_option(5.0, "--timeout", hi=3600, help="How long per /server_info request (5, 500ms, 1m; at most 1h)."),
           no_server: bool = typer.Option(False, "--no-server", help="Only what the files say; query no server."),
           remote: bool = typer.Option(False, "--remote", help="Read the live files on the hosts (<root>/current/configs/G.yaml) instead of the profile's copies."),
           as_json: bool = typer.Option(False, "--json", help="Print the dsv4ctl.hicache-status/1 JSON document."),
           markdown: bool = typer.Option(False, "--markdown", help="Print Markdown.")) -> None:
    """Per group: HiCache as the serve config says (resolved like SGLang) and as the running server's
    /server_info reports; differences are flagged.

    Exit 0 all match, 1 a file and its server differ, 2 bad input, 3 a server could not be queried."""
    from .options import duration
    duration(timeout, "--timeout", hi=3600)

    from ..serve.argtable import table_for
    from ..serve.hicache_local import select_groups
    from .common import load_deployment_arg

    prof = load_deployment_arg(profile, acts_on_hosts=remote)
    groups = select_groups(prof, group, "status")
    table = table_for(prof)
    rows = _file_rows(prof, groups, table, _live_configs(prof, groups) if remote else {}, no_server)
    if not no_server:
        _ask_servers(rows, timeout)
    if as_json:
        print(dump_json(dict(schema=SCHEMA_STATUS, profile=prof.name, groups=[r.to_dict() for r in rows])))
    else:
        headers = ["group", "role", "host", "file says", "server says", "verdict"]
        body = [[r.group, r.role, r.host, _hicache_text(r.file_says), r.error or _hicache_text(r.server_says),
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
        raise VerdictError(f"hicache status: {len(diffs)} group(s) differ from their file: "
                           f"{diffs[0].group}: {diffs[0].differences[0]}", label="differs")


def _live_configs(prof, groups: list) -> dict:
    """group name -> the running release's serve config of each of ``groups``, read over SSH from
    ``<root>/current/configs/G.yaml`` on its host (one connection per host); InputError when a
    host has none (no release deployed)."""
    from ..profile.serveconfig import parse_serve_config
    from ..remote import connect, read_text
    from ..serve import hicache_live as hr

    live: dict[str, object] = {}
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
    return live


def _file_rows(prof, groups: list, table, live: dict, no_server: bool) -> list:
    """One :class:`dsv4ctl.serve.hicache.GroupStatus` per group: HiCache as its serve config (the
    live one from ``live``, else the profile's) says after SGLang's resolution (argument ``table``
    of the release, :func:`dsv4ctl.serve.argtable.table_for`), and the URL to ask
    (None with ``no_server``). InputError for a group without a serve config or a config whose keys
    are errors."""
    from ..serve.hicache import GroupStatus, file_view
    from ..serve.lint import check_keys

    rows = []
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
    return rows


def _ask_servers(rows: list, timeout: float) -> None:
    """Fill each row's ``server_says`` (the same keys as ``file_says``), ``differences`` or
    ``error`` from its server's /server_info (all at once, ``timeout`` seconds per request)."""
    import asyncio

    from ..serve.hicache import compare

    got = asyncio.run(_fetch_all({r.group: r.url for r in rows}, timeout))
    for r in rows:
        info, err = got[r.group]
        r.error = err
        if info is not None:
            r.server_says = {k: info.get(k) for k in r.file_says}
            r.differences = compare(r.file_says, r.server_says)


def _hicache_text(d: Optional[dict]) -> str:
    """A HiCache view in one table cell: ``-`` (none), ``off``, or ``on ratio R POLICY LAYOUT/IO [L3 B]``."""
    if d is None:
        return "-"
    if not d.get("enable_hierarchical_cache"):
        return "off"
    return (f"on ratio {d.get('hicache_ratio')} {d.get('hicache_write_policy')} "
            f"{d.get('hicache_mem_layout')}/{d.get('hicache_io_backend')}"
            + (f" L3 {d['hicache_storage_backend']}" if d.get("hicache_storage_backend") else ""))


def register(app: typer.Typer) -> None:
    """Add the ``hicache`` group (``on``, ``off``, ``status``) to the root app."""
    sub = typer.Typer(help="HiCache in serve configs: on, off, status (file vs running server).",
                      no_args_is_help=True)
    sub.command("on")(on)
    sub.command("off")(off)
    sub.command("status")(status)
    app.add_typer(sub, name="hicache")
