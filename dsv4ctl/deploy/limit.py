"""Limited deploys (``deploy -g GROUP`` / ``--host HOST``): which hosts a deploy may switch, and
the rules that keep what runs coherent. One rule set, pure, applied before anything is read:

* A host has one active release (``<root>/current``): every group with a node on a switched host
  is switched and restarted. ``-g G`` on a host that also runs another group H is refused unless
  H is selected too (``-g H``) or the host is named (``--host``): nothing is restarted that the
  operator did not name.
* A multi-node server is whole: all its nodes switch or none (SGLang's nodes of one server must
  run one tree; a node alone is refused).
* A PD deployment's prefill and decode run one release: the KV cache crosses between them (the
  transfer backend, the page layout and the bootstrap protocol are the tree's), and no check says
  two releases agree on them. A selection that switches some but not all of the profile's
  prefill and decode servers is refused unless ``--allow-mixed-pd`` (the operator vouches for it;
  recorded in the audit records).
* Routers are separate: a router (alone on its host) may switch without its workers.

Every refusal is an InputError (exit 2, nothing read or changed) that names what to add."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError


@dataclass(frozen=True)
class Limit:
    """A checked selection: ``hosts`` to switch (profile order), ``groups`` whose servers (all or
    some replicas) switch with them, ``words`` (``-g decode --host h3``: the records say it),
    ``mixed_pd``: prefill and decode end on different releases (allowed by ``--allow-mixed-pd``)."""

    hosts: tuple[str, ...]
    groups: tuple[str, ...]
    words: str
    mixed_pd: bool


def _servers(dep) -> list[tuple[str, str, list[str]]]:
    """(group, server name, its hosts in node order) of every server and router of ``dep``."""
    return [(g.name, srv[0].server, [n.host for n in srv]) for g in dep.groups.values() for srv in g.server_nodes]


def limit_deploy(dep, groups: list[str], hosts: list[str], allow_mixed_pd: bool = False) -> Limit:
    """The :class:`Limit` of ``deploy -g GROUPS --host HOSTS`` over Deployment ``dep`` (at least
    one of the two given). InputError (exit 2) for an unknown group or host, a host that runs
    nothing, a group that shares a host with one not selected, a multi-node server cut, or a PD
    deployment left mixed without ``allow_mixed_pd``."""
    for g in groups:
        dep.group(g)
    for h in hosts:
        if h not in dep.hosts:
            raise InputError(f"--host {h!r}: not a host of {dep.path} ({', '.join(dep.hosts)})")
    servers = _servers(dep)
    on = {h: sorted({g for g, _, hs in servers if h in hs}) for h in dep.hosts}
    for h in hosts:
        if not on[h]:
            raise InputError(f"--host {h}: runs no group of {dep.path}")
    chosen = {h for g, _, hs in servers if g in groups for h in hs} | set(hosts)
    for h in sorted(chosen - set(hosts)):
        others = [g for g in on[h] if g not in groups]
        if others:
            raise InputError(f"-g {' -g '.join(groups)}: host {h} also runs {', '.join(others)} and a host has one "
                             f"active release (all its groups switch): add -g {' -g '.join(others)}, or name the "
                             f"host with --host {h}")
    for g, name, hs in servers:
        cut = [h for h in hs if h not in chosen]
        if len(hs) > 1 and len(cut) < len(hs) and cut:
            have = [h for h in hs if h in chosen]
            raise InputError(f"{name} is one server over {len(hs)} nodes ({', '.join(hs)}) and is deployed whole: "
                             f"{', '.join(have)} selected, {', '.join(cut)} not: add --host {' --host '.join(cut)} "
                             f"(or -g {g})")
    switched = sorted({g for g, _, hs in servers if set(hs) & chosen})
    pd = [(g, name, hs) for g, name, hs in servers if dep.groups[g].role in ("prefill", "decode")]
    moved = [name for g, name, hs in pd if set(hs) & chosen]
    kept = [name for g, name, hs in pd if not set(hs) & chosen]
    mixed = bool(moved and kept)
    if mixed and not allow_mixed_pd:
        raise InputError(f"a PD deployment's prefill and decode run one release (the KV cache crosses between them): "
                         f"this switches {', '.join(moved)} but not {', '.join(kept)}; add those "
                         f"(-g {' -g '.join(sorted({g for g, n, _ in pd if n in kept}))}), or --allow-mixed-pd "
                         "when both releases transfer KV alike")
    words = " ".join([f"-g {g}" for g in groups] + [f"--host {h}" for h in hosts]) + (" --allow-mixed-pd" if mixed else "")
    return Limit(tuple(h for h in dep.hosts if h in chosen), tuple(switched), words, mixed)
