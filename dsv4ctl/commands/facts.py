"""``dsv4ctl facts``: nvidia-smi on every host of the profile's server groups, over SSH (the
read-only fact :mod:`dsv4ctl.hosts.gpus`), and the per-GPU memory inputs ``plan`` uses."""

from __future__ import annotations

from typing import Optional

import typer

from ..render import dump_json


def facts(
    profile: Optional[str] = typer.Argument(None, help="Profile path or shipped name."),
    group: Optional[list[str]] = typer.Option(None, "--group", "-g", help="Only these server groups. Repeatable."),
    as_json: bool = typer.Option(False, "--json", help="Print the dsv4ctl.facts/1 JSON document."),
    timeout: float = typer.Option(30.0, "--timeout", help="Seconds per host (finite, at most 3600)."),
) -> None:
    """Per GPU of each server group: total / used / free memory and the processes holding it
    (nvidia-smi over SSH), and the measured ``free_gib_before_load`` per GPU to paste into the
    profile's ``groups[].memory`` (plan sizes pools from the minimum and reports each rank's own
    headroom). Exit 0, 2 on bad input, 3 when a host or nvidia-smi cannot be read."""
    from ..errors import InputError, RemoteError
    from ..hosts.gpus import GpuFactError, gpus_command, parse_gpus
    from ..plan.facts import group_facts, memory_yaml
    from ..remote import connect, run_parallel
    from .common import load_deployment_arg
    from .options import seconds

    seconds(timeout, "--timeout", hi=3600)
    dep = load_deployment_arg(profile, acts_on_hosts=True)
    prof = dep.profile
    groups = prof.servers()
    if group:
        groups = [prof.group(n) for n in dict.fromkeys(group)]
        for g in groups:
            if not g.is_server:
                raise InputError(f"group {g.name!r} is the router: it has no GPUs")
    hosts = sorted({g.host for g in groups})
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
    out = [group_facts(g.name, g.host, list(g.gpus), parsed[g.host]) for g in groups]
    if as_json:
        print(dump_json(dict(schema="dsv4ctl.facts/1", profile=prof.name, groups=[f.to_dict() for f in out])))
        return
    for f in out:
        print(f"{f.group} on {f.host}:")
        for i, (idx, gpu) in enumerate(zip(prof.group(f.group).gpus, f.gpus)):
            if gpu is None:
                print(f"  GPU {idx}: not reported")
                continue
            procs = ", ".join(f"{p.name} {p.used_mib} MiB" for p in gpu.processes) or "no processes"
            print(f"  GPU {idx}: {gpu.name}: total {gpu.total_mib} MiB, used {gpu.used_mib} MiB, free {gpu.free_mib} MiB "
                  f"-> free_gib_before_load {f.free_gib_before_load[i]} ({procs})")
        for n in f.notes:
            print(f"  note: {n}")
    print(memory_yaml(out))


def register(app: typer.Typer) -> None:
    """Add ``facts`` to the root app."""
    app.command("facts")(facts)
