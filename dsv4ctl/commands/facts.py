"""``dsv4ctl facts``: nvidia-smi on every host of the profile's server groups, over SSH (the
read-only fact :mod:`dsv4ctl.hosts.gpus`), and the per-GPU memory inputs ``plan`` uses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import typer

from ..render import dump_json
from .options import duration_option


def facts(
    profile: Optional[str] = typer.Argument(None, help="Profile path or shipped name (or DSV4CTL_PROFILE; required: it names real hosts)."),
    group: Optional[list[str]] = typer.Option(None, "--group", "-g", help="Only these server groups. Repeatable."),
    as_json: bool = typer.Option(False, "--json", help="Print the dsv4ctl.facts/1 JSON document."),
    timeout: float = duration_option(30.0, "--timeout", hi=3600, help="How long per host (30, 90s, 2m; at most 1h)."),
    write: bool = typer.Option(False, "--write", help="Write each group's measured free_gib_before_load "
                               "(one value per GPU) into the profile; only that value's line changes."),
    dry_run: bool = typer.Option(False, "--dry-run", help="With --write: print the diff, write nothing."),
    force: bool = typer.Option(False, "--force", help="With --write: write GPUs with processes holding memory "
                               "as measured, and keep the profile's value for a GPU nvidia-smi did not report."),
) -> None:
    """Per GPU of each server group: total / used / free memory and the processes holding it
    (nvidia-smi over SSH), and the measured ``free_gib_before_load`` per GPU (plan sizes pools from
    the minimum and reports each rank's own headroom). Without ``--write`` it prints the YAML to
    paste under ``groups[].memory``; ``--write`` sets ``groups[].memory.free_gib_before_load`` in the
    profile (a list in the group's ``gpus`` order, commented ``# measured by dsv4ctl facts <UTC
    time>``), every other byte kept, atomically, after checking that the profile still loads. It
    writes all selected groups or none: a GPU with processes holding memory, or not reported,
    refuses the write (exit 1) unless ``--force``. Shipped profiles are never written (exit 2).
    Exit 0, 1 when the write is refused, 2 on bad input, 3 when a host or nvidia-smi cannot be read
    or the profile cannot be written."""
    from ..errors import InputError
    from ..plan.facts import memory_yaml, server_facts
    from .common import load_deployment_arg
    from .options import duration

    if (dry_run or force) and not write:
        raise InputError(f"{'--dry-run' if dry_run else '--force'} goes with --write")
    duration(timeout, "--timeout", hi=3600)
    dep = load_deployment_arg(profile, acts_on_hosts=True)
    prof = dep.profile
    if write:
        from ..serve.hicache_local import refuse_shipped
        refuse_shipped([prof.path])          # before any host is read: the run would refuse too
    groups = _server_groups(prof, group)
    parsed = _read_gpus(prof, groups, timeout)
    out = [server_facts(g.name, _places(g), {h: parsed[h] for h in g.hosts}, tp=_tp(dep, g),
                        server_size=len(g.server_gpus))
           for g in groups]
    result = _write(prof, out, force, dry_run) if write else None
    if as_json:
        doc = dict(schema="dsv4ctl.facts/1", profile=prof.name, groups=[f.to_dict() for f in out],
                   written=result.written if result else [])
        if result:
            doc.update(file=str(prof.path), dry_run=dry_run, diff=result.diff, refused=result.problems)
        print(dump_json(doc))
    else:
        _print_facts(out)
        if result is None:
            print(memory_yaml(out))
        elif not result.problems:
            print(result.diff, end="" if result.diff.endswith("\n") or not result.diff else "\n")
            verb = "dry run: would write" if dry_run else "wrote"
            print(f"{verb} {prof.path}: groups[].memory.free_gib_before_load of {', '.join(f.group for f in out)}")
    if result and result.problems:
        _refuse(out, result.problems)


def _server_groups(prof, group: Optional[list[str]]) -> list:
    """The profile's server groups, or those named by ``--group`` (in the order given, once
    each); the router is refused (InputError: it has no GPUs)."""
    from ..errors import InputError
    if not group:
        return prof.servers()
    groups = [prof.group(n) for n in dict.fromkeys(group)]
    for g in groups:
        if not g.is_server:
            raise InputError(f"group {g.name!r} is the router: it has no GPUs")
    return groups


def _read_gpus(prof, groups: list, timeout: float) -> dict:
    """host -> parsed nvidia-smi GPUs (:func:`dsv4ctl.hosts.gpus.parse_gpus`) of every node of every
    group, read over SSH in parallel within ``timeout`` seconds per host; RemoteError (exit 3) when
    a host or its nvidia-smi cannot be read."""
    from ..errors import RemoteError
    from ..hosts.gpus import GpuFactError, gpus_command, parse_gpus
    from ..remote import connect, run_parallel

    hosts = sorted({h for g in groups for h in g.hosts})     # every node of every server
    transports = {h: connect(prof.hosts[h], hosts=prof.hosts) for h in hosts}
    cmd = gpus_command()
    try:
        results = run_parallel(transports, lambda t: t.run(cmd, timeout=timeout).out, timeout=timeout + 5)
    finally:
        for t in transports.values():
            t.close()
    parsed = {}
    for h, r in results.items():
        if not r.ok:
            raise RemoteError(r.error or f"{h}: nvidia-smi failed")
        try:
            parsed[h] = parse_gpus(r.value)
        except GpuFactError as e:
            raise RemoteError(f"{h}: {e}") from None
    return parsed


def _print_facts(out: list) -> None:
    """The human lines of each group's facts: per GPU its memory, free_gib_before_load and the
    processes holding memory, then the group's notes."""
    from ..hosts.gpus import mib_text
    for f in out:
        print(f"{f.group} on {', '.join(dict.fromkeys(h for h, _ in f.places))}:")
        for i, gpu in enumerate(f.gpus):
            if gpu is None:
                print(f"  {f.gpu_name(i)}: not reported")
                continue
            procs = ", ".join(f"{p.name} {mib_text(p.used_mib)}" for p in gpu.processes) or "no processes"
            free = f.free_gib_before_load[i]
            print(f"  {f.gpu_name(i)}: {gpu.name}: {gpu.memory_text()} "
                  f"-> free_gib_before_load {'unknown' if free is None else free} ({procs})")
        for n in f.notes:
            print(f"  note: {n}")


def _refuse(out: list, problems: list[str]) -> None:
    """Raise the refused write's VerdictError (exit 1): the first reason, the groups refused and
    those that could have been written."""
    from ..errors import VerdictError
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    bad = [f.group for f in out if any(p.startswith(f"group {f.group}: ") for p in problems)]
    fine = [f.group for f in out if f.group not in bad]
    raise VerdictError(f"facts --write: {problems[0]}{more}; nothing written (refused: {', '.join(bad)}"
                       + (f"; writable: {', '.join(fine)}" if fine else "") + "): measure again on idle GPUs, "
                       "or --force", label="refused")


def _tp(dep, g) -> int:
    """The tp-size the group's server runs (its serve config's, else the profile's): the
    imbalance note applies with tp > 1."""
    v = dep.groups[g.name].arg("tp-size") if g.serve_config and g.serve_config.is_file() else None
    try:
        return int(v) if v is not None else g.tp
    except (TypeError, ValueError):
        return g.tp


def _places(g) -> list[tuple[str, int]]:
    """(host, GPU index) of every GPU of every server of group ``g``, replica- then node-major:
    the order of the profile's per-GPU memory lists."""
    return [(node.host, i) for srv in g.servers for node in srv for i in node.gpus]


@dataclass
class _Written:
    """What ``--write`` did: group names written (empty in a dry run or when refused), the
    unified diff, the reasons it refused (one line each)."""

    written: list[str]
    diff: str
    problems: list[str]


def _write(prof, out, force: bool, dry_run: bool) -> _Written:
    """Edit the profile with every group's measured values, check that it loads, and replace it
    atomically (mode and owner kept), or write nothing (a refusal, a dry run)."""
    import os
    import tempfile
    from pathlib import Path

    from ..errors import EXIT_REMOTE, DsvError, InputError
    from ..hosts.audit import now_iso
    from ..plan.facts import profile_with_facts, values_to_write
    from ..profile.model import load_profile
    from ..profile.yamlpos import read_yaml_bytes
    from ..serve.edit import unified_diff
    from ..serve.hicache_local import write_local

    path = Path(prof.path)
    problems, values = [], {}
    for f in out:
        g = prof.group(f.group)
        vals, why = values_to_write(f, [i for _, i in _places(g)], g.memory.free_gib_before_load, force)
        problems += why
        if vals is not None:
            values[prof.groups.index(g)] = vals
    if problems:
        return _Written([], "", problems)
    raw = read_yaml_bytes(path)
    try:
        old = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    new = profile_with_facts(old, str(path), values, now_iso())
    try:        # next to the profile: its relative paths (serve configs, series) resolve as they will
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".check.yaml", dir=path.parent)
    except OSError as e:
        raise DsvError(f"{path.parent}: cannot write ({e.strerror or e}); nothing written", EXIT_REMOTE) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(new)
        try:
            load_profile(tmp)
        except InputError as e:
            raise InputError(f"{str(e).replace(tmp, str(path))} (after the edit); nothing written") from None
    finally:
        os.unlink(tmp)
    diff = unified_diff(old, new, str(path).lstrip("/"))
    if dry_run:
        return _Written([], diff, [])
    from ..signals import terminate_as_interrupt
    terminate_as_interrupt()            # SIGTERM/SIGHUP: the profile is written whole first, then exit 130
    write_local(path, new, expect=old)
    return _Written([f.group for f in out], diff, [])


def register(app: typer.Typer) -> None:
    """Add ``facts`` to the root app."""
    app.command("facts")(facts)
