"""``dsv4ctl hicache on|off|status``: thin CLI over :mod:`dsv4ctl.hicache`, :mod:`dsv4ctl.serve_edit`
and :mod:`dsv4ctl.lint`. Edits the profile's serve configs (local files)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer

from ..errors import EXIT_FAILED, EXIT_REMOTE, DsvError, InputError
from ..render import console, dump_json, markdown_table, rich_table

SCHEMA_EDIT = "dsv4ctl.hicache-edit/1"
SCHEMA_STATUS = "dsv4ctl.hicache-status/1"


@dataclass
class Edit:
    """One group's planned edit: old and new text, the unified diff, lint findings of the new text."""

    group: str
    path: Path
    old: str
    new: str
    diff: str
    findings: list
    secrets: frozenset = frozenset()


def select_groups(prof, names: list[str], action: str):
    """``--group`` names, else the default: ``on`` → prefill/colocated groups (never decode, ops
    §2.4), ``off``/``status`` → every server group."""
    if names:
        out = [prof.group(n) for n in names]
        for g in out:
            if not g.is_server:
                raise InputError(f"group {g.name!r} is the router: it has no serve config")
        return out
    if action == "on":
        return [g for g in prof.servers() if g.role in ("prefill", "colocated")]
    return prof.servers()


def prepare_edits(prof, groups, action: str, opts, tree: Optional[str]) -> list[Edit]:
    """Read, edit and lint every selected group's serve config; nothing is written.

    Raises InputError (exit 2) for a missing file, a YAML error, a bad option value, or a lint
    error in an edited file (the first error, one line)."""
    from ..argtable import load_table
    from ..configs import build_input, parse_config_text, restrict
    from ..hicache import changes_for
    from ..lint import lint
    from ..serve_edit import apply_changes, secret_values, unified_diff

    table = load_table()
    edits: list[Edit] = []
    for g in groups:
        if g.serve_config is None:
            raise InputError(f"{prof.path}: group {g.name}: no serve_config")
        old = read_exact(g.serve_config)
        cfg = parse_config_text(old, str(g.serve_config))
        changes = changes_for(action, cfg.data, opts, table, str(g.serve_config))
        new = apply_changes(old, changes, str(g.serve_config)) if changes else old
        edits.append(Edit(g.name, g.serve_config, old, new, unified_diff(old, new, _rel(g.serve_config)), [],
                          frozenset(secret_values(cfg.data))))
    changed = [e for e in edits if e.new != e.old]
    if changed:
        inp = build_input(prof, None, tree, texts={e.group: e.new for e in changed})
        findings = restrict(lint(inp, table), inp, [prof.group(e.group) for e in changed])
        for e in changed:
            e.findings = [f for f in findings if f.file == str(e.path) or f.group == e.group]
        errs = [f for f in findings if f.severity == "error"]
        if errs:
            from ..serve_edit import scrub
            raise InputError(scrub(f"hicache {action}: not written: {errs[0].format()}"
                                   + (f" (+{len(errs) - 1} more error(s))" if len(errs) > 1 else ""),
                                   set().union(*(e.secrets for e in edits))))
    return edits


def _rel(p: Path) -> str:
    try:
        return str(Path(p).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(p).lstrip("/")


def read_exact(path: Path) -> str:
    """A local serve config's text exactly as stored: bytes decoded as UTF-8 with no newline
    translation, so CRLF/CR line ends and a missing final newline survive an edit.

    InputError (exit 2) for a missing/unreadable file, a bad suffix or bytes that are not UTF-8."""
    from ..configs import check_suffix
    path = Path(path)
    check_suffix(path)
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a folder, not a serve config") from None
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror or e})") from None


def write_all(files: list[tuple[Path, str]]) -> None:
    """Write several local files as one step: all or nothing.

    Each target is resolved first (a symlinked serve config is written through to its target; the
    link stays a link). Phase 1 writes every new text to a temp file next to its target, fsyncs it
    and gives it the target's mode; any failure removes every temp file and raises DsvError (exit 3,
    no file changed). Phase 2 renames the temps over the targets (atomic per file) and fsyncs the
    folders; if a rename fails, the files already renamed get their old bytes back the same way."""
    staged: list[tuple[Path, str, bytes]] = []      # (target, temp path, old bytes)
    try:
        for path, text in files:
            target = Path(os.path.realpath(path))
            st = target.stat()
            old = target.read_bytes()
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            staged.append((target, tmp, old))
            with os.fdopen(fd, "wb") as f:
                f.write(text.encode("utf-8"))
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, st.st_mode & 0o7777)
    except OSError as e:
        _unlink_all(t for _, t, _ in staged)
        where = e.filename or (staged[-1][0] if staged else (files[0][0] if files else "?"))
        raise DsvError(f"{where}: cannot write ({e.strerror or e}); no file was changed", EXIT_REMOTE) from None
    done: list[tuple[Path, bytes]] = []
    try:
        for target, tmp, old in staged:
            os.replace(tmp, target)
            done.append((target, old))
    except OSError as e:
        _unlink_all(t for _, t, _ in staged[len(done):])
        for target, old in done:
            try:
                fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
                with os.fdopen(fd, "wb") as f:
                    f.write(old)
                os.replace(tmp, target)
            except OSError:
                pass
        raise DsvError(f"{e.filename or '?'}: rename failed ({e.strerror or e}); files put back", EXIT_REMOTE) from None
    for d in {t.parent for t, _ in done}:
        try:
            dfd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass


def _unlink_all(paths) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except OSError:
            pass


def write_local(path: Path, text: str) -> None:
    """Atomic local write of one file (see :func:`write_all`)."""
    write_all([(Path(path), text)])


def _toggle(action: str, profile, group, ratio, write_policy, io_backend, mem_layout, storage_backend,
            tree, dry_run, as_json, remote: bool = False, health_timeout: Optional[float] = None) -> None:
    from ..hicache import Options
    from ..profile import load_profile
    from ..resources import resolve_profile

    prof = load_profile(resolve_profile(profile))
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
    from .. import hicache_remote as hr
    from ..remote import connect, describe_actions

    hosts = sorted({g.host for g in groups})
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
        timeout = health_timeout if health_timeout is not None else float(prof.deploy.get("health_timeout_s", 900))
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
    from ..serve_edit import secret_values
    import yaml
    try:
        return secret_values(yaml.safe_load(text))
    except yaml.YAMLError:
        return set()


def _printer(secrets: set[str]):
    """``print`` that replaces the serve configs' secret values with ``***`` (diffs are already
    masked line by line; this also covers findings, JSON and host output)."""
    from ..serve_edit import scrub

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


def group_url(prof, g, cfg_data: dict) -> str:
    """``http://<host address>:<port>``: the group's ``port``, else the serve config's, else 30000."""
    port = g.port or cfg_data.get("port") or 30000
    return f"http://{prof.hosts[g.host].address}:{int(port)}"


async def _fetch_all(urls: dict[str, str], timeout: float) -> dict[str, tuple[Optional[dict], Optional[str]]]:
    import asyncio

    import aiohttp

    async def one(session, url):
        try:
            async with session.get(url + "/server_info") as r:
                if r.status != 200:
                    return None, f"/server_info HTTP {r.status}"
                return await r.json(content_type=None), None
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            return None, f"unreachable ({type(e).__name__}{': ' + str(e) if str(e) else ''})"

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

    from ..argtable import load_table
    from ..configs import parse_config_text, read_config_text
    from ..hicache import GroupStatus, compare, file_view
    from ..lint import check_keys
    from ..profile import load_profile
    from ..resources import resolve_profile

    prof = load_profile(resolve_profile(profile))
    groups = select_groups(prof, group, "status")
    table = load_table()
    rows: list[GroupStatus] = []
    texts: dict[str, tuple[str, str]] = {}
    if remote:
        from .. import hicache_remote as hr
        from ..remote import connect, read_text
        for h in sorted({g.host for g in groups}):
            t = connect(prof.hosts[h], hosts=prof.hosts)
            try:
                for g in groups:
                    if g.host == h:
                        path = hr.live_config(hr.host_root(prof, prof.hosts[h]), g.name)
                        text = read_text(t, path, default=None)
                        if text is None:
                            raise InputError(f"{h}:{path}: no such file on the host (deploy a release first)")
                        texts[g.name] = (text, f"{h}:{path}")
            finally:
                t.close()
    for g in groups:
        if g.name in texts:
            cfg = parse_config_text(texts[g.name][0], texts[g.name][1])
        elif g.serve_config is None:
            raise InputError(f"{prof.path}: group {g.name}: no serve_config")
        else:
            cfg = parse_config_text(read_config_text(g.serve_config), str(g.serve_config))
        findings, resolved = check_keys(cfg, table, g.name)
        bad = [f for f in findings if f.severity == "error"]
        if bad:
            raise InputError(bad[0].format())
        rows.append(GroupStatus(g.name, g.role, g.host, cfg.path,
                                None if no_server else group_url(prof, g, cfg.data), file_view(resolved.args)))
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
