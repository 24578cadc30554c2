"""``dsv4ctl hicache on|off|status``: thin CLI over :mod:`dsv4ctl.serve.hicache_local` (the
profile's serve configs), :mod:`dsv4ctl.serve.hicache_live` (the running release's configs; the change is a release, :mod:`dsv4ctl.deploy.change`) and
:mod:`dsv4ctl.serve.hicache` (edits and status)."""

from __future__ import annotations

from typing import Optional

import typer

from ..errors import EXIT_FAILED, EXIT_REMOTE, DsvError, InputError
from ..render import console, dump_json, markdown_table, rich_table

SCHEMA_EDIT = "dsv4ctl.hicache-edit/1"
SCHEMA_STATUS = "dsv4ctl.hicache-status/1"


def _toggle(action: str, profile, group, ratio, write_policy, io_backend, mem_layout, storage_backend,
            tree, dry_run, as_json, remote: bool = False, health_timeout: Optional[float] = None,
            verbose: bool = False) -> None:
    from ..serve.hicache import Options
    from ..serve.hicache_local import prepare_edits, refuse_shipped, select_groups, write_all
    from .common import load_deployment_arg

    from .deploy import check_health_timeout
    check_health_timeout(health_timeout)
    prof = load_deployment_arg(profile, acts_on_hosts=True)      # on/off edit files (or hosts)
    groups = select_groups(prof, group, action)
    if not groups:
        raise InputError(f"hicache {action}: no group selected (use --group)")
    opts = Options(ratio=ratio, write_policy=write_policy, io_backend=io_backend, mem_layout=mem_layout,
                   storage_backend=storage_backend)
    edits = prepare_edits(prof, groups, action, opts, tree)
    out = _printer(set().union(*(e.secrets for e in edits)))
    # before any host is touched (--remote also rewrites the local copies), and in a dry run too:
    # the dry run is the run, and the run refuses
    refuse_shipped([e.path for e in edits if e.new != e.old])
    if remote:
        _remote(prof, groups, action, opts, tree, dry_run, as_json, edits, health_timeout, verbose)
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


def _remote(prof, groups, action, opts, tree, dry_run, as_json, local_edits, health_timeout, verbose=False) -> None:
    """``--remote``: every change to a host is a release. The running release's serve configs are
    edited (:mod:`dsv4ctl.serve.hicache_live`), a new release is derived from it and deployed
    (:mod:`dsv4ctl.deploy.change`: delta push, verify, switch under the deploy lock, restart of the
    changed groups only, the deploy's health gate; a failure or an interrupt puts every host back),
    then the profile's local copies get the same edit (so the next deploy keeps it)."""
    from ..deploy.change import change_configs
    from ..deploy.site import Options as DeployOptions
    from ..deploy.steps import Step, deployment_secrets, mask_secrets
    from ..serve import hicache_live as hr
    from ..serve.hicache_local import write_all
    from .deploy import _Interrupted, _sigterm_as_interrupt

    secrets = set(deployment_secrets(prof)) | set().union(*(e.secrets for e in local_edits))
    out = _printer(secrets)
    names = [g.name for g in groups]
    redits: list = []

    def edit(texts: dict[str, str], rid: str) -> dict[str, bytes]:
        redits[:] = hr.edit_release_configs(prof, groups, action, opts, tree, texts, rid)
        for e in redits:
            secrets.update(_secrets_of(e.old))
        return {e.group: e.new.encode() for e in redits if e.new != e.old}

    def log(s: str) -> None:
        if not as_json:
            import sys
            print(f"dsv4ctl: {mask_secrets(scrub_all(s), secrets)}", file=sys.stderr, flush=True)

    def scrub_all(s: str) -> str:
        from ..serve.edit import scrub
        return scrub(s, secrets)
    o = DeployOptions(dry_run=dry_run, health_timeout=health_timeout, log=log)
    if verbose and not dry_run:
        o.trace = lambda st: log("step " + st.line(True))
        o.done = lambda st, sec: log(f"done {st.host}: {st.phase} in {sec:.2f} s")
    if not dry_run:
        _sigterm_as_interrupt()
    err = None
    rep: dict = {}
    with _Interrupted(secrets):
        try:
            rep = change_configs(prof, o, edit, action=f"hicache-{action}", groups=names)
        except DsvError as e:
            err = e
    if err is not None and not redits:
        raise err
    changed_local = [e for e in local_edits if e.new != e.old]
    wrote_local = False
    if not dry_run and err is None and changed_local:
        write_all([(e.path, e.new) for e in changed_local])
        wrote_local = True
    changed = [e for e in redits if e.new != e.old]
    rid, frm = rep.get("release"), rep.get("from")
    if as_json:
        out(dump_json(dict(schema=SCHEMA_EDIT, action=action, profile=prof.name, dry_run=dry_run, remote=True,
                           release=rid if changed else None, previous=frm,
                           groups=[dict(group=e.group, host=e.host, file=e.path, changed=e.new != e.old,
                                        written=(e.new != e.old) and not dry_run and err is None, release=rid,
                                        diff=e.diff, findings=[f.to_dict() for f in e.findings]) for e in redits],
                           local=[dict(group=e.group, file=str(e.path), changed=e.new != e.old, diff=e.diff,
                                       written=wrote_local and e.new != e.old) for e in local_edits],
                           error=str(err) if err is not None else None)))
    else:
        for e in redits:
            if e.new == e.old:
                out(f"{e.group}: {e.host}:{e.path}: HiCache already {action}, unchanged")
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
                f"healthy; dsv4ctl rollback --to {frm} undoes it")
        if wrote_local:
            out(f"wrote {len(changed_local)} local file(s): {', '.join(str(e.path) for e in changed_local)}")
    if err is not None:
        err.args = (mask_secrets(scrub_all(str(err)), secrets),) + tuple(err.args[1:])
        raise err


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
_REMOTE = typer.Option(False, "--remote", help="Change the running release: a new release with the edited serve configs, "
                                              "pushed (delta), switched under the deploy lock, only the changed groups "
                                              "restarted, the deploy's health gate (rolled back on failure), audit log; "
                                              "then the local copies.")
_VERBOSE = typer.Option(False, "--verbose", "-v", help="With --remote: each step as it runs, and its duration when it ends (secret values masked).")
_HEALTH = typer.Option(None, "--health-timeout", help="Seconds to wait for /health after a restart (default deploy.health_timeout_s, 900).")


def on(profile: Optional[str] = _PROFILE, group: list[str] = _O["group"], ratio: Optional[float] = _O["ratio"],
       write_policy: Optional[str] = _O["write_policy"], io_backend: Optional[str] = _O["io_backend"],
       mem_layout: Optional[str] = _O["mem_layout"], storage_backend: Optional[str] = _O["storage_backend"],
       tree: Optional[str] = _TREE, dry_run: bool = _DRY, as_json: bool = _JSON, remote: bool = _REMOTE,
       health_timeout: Optional[float] = _HEALTH, verbose: bool = _VERBOSE) -> None:
    """Turn HiCache on in the selected groups' serve configs (diff printed, linted before writing).

    Exit 0 written (or nothing to do), 1 a restarted group was unhealthy and rolled back,
    2 bad input or a lint error (nothing written), 3 a host step failed."""
    _toggle("on", profile, group, ratio, write_policy, io_backend, mem_layout, storage_backend, tree, dry_run,
            as_json, remote, health_timeout, verbose)


def off(profile: Optional[str] = _PROFILE, group: list[str] = _O["group"], tree: Optional[str] = _TREE,
        dry_run: bool = _DRY, as_json: bool = _JSON, remote: bool = _REMOTE,
        health_timeout: Optional[float] = _HEALTH, verbose: bool = _VERBOSE) -> None:
    """Turn HiCache off (``enable-hierarchical-cache: false``; other hicache-* keys are kept, inert).

    Exit 0 written (or nothing to do), 1 a restarted group was unhealthy and rolled back,
    2 bad input or a lint error (nothing written), 3 a host step failed."""
    _toggle("off", profile, group, None, None, None, None, None, tree, dry_run, as_json, remote, health_timeout, verbose)


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
