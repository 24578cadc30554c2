"""A serve-config change on the hosts (``hicache on|off --remote``) is a release: one write path.

The running release R (the same on every host) is copied into a new release whose changed
serve configs are new files (:func:`dsv4ctl.deploy.release.derive_release`; R is never
written), and that release is deployed by the deploy engine — lock, delta push (only the
changed configs and the metadata cross), verify, switch, restart of **only the groups whose
config changed**, the same health gate, close (audit record, state) — so a failed gate or an
interrupt puts every host back on R exactly as a deploy does, and ``rollback`` undoes it.

R comes from the local release cache (where the deploy that pushed it built it); otherwise the
profile is built and must give R (else exit 2: deploy first)."""

from __future__ import annotations

import time
from typing import Callable

from ..errors import InputError, RemoteError
from ..profile.deployment import as_deployment
from ..remote import who
from .release import (Release, build_release, cached_release, default_cache, derive_release, private_groups,
                      release_environment, release_inputs)
from .site import Options, Site, gather_facts, open_site


def running_release(site: Site) -> str:
    """The release every host runs (a fact). RemoteError (exit 3) when the hosts disagree,
    InputError (exit 2) when none runs one."""
    cur = {h: f.current for h, f in site.facts.items()}
    ids = set(cur.values())
    if ids == {None}:
        raise InputError("no release is active on the hosts: deploy one first (dsv4ctl deploy)")
    if len(ids) != 1:
        raise RemoteError("the hosts run different releases (" + ", ".join(f"{h}: {c or 'none'}" for h, c in cur.items())
                          + "): finish or roll back that deploy first")
    return ids.pop()


def local_base(dep, rid: str, cache) -> Release:
    """Release ``rid`` from the local cache, else built from the profile (it must give ``rid``)."""
    from pathlib import Path
    c = Path(cache or default_cache())
    rel = cached_release(c, rid)
    if rel is not None:
        return rel
    tree_p, base_ref, pl, configs, spec, ident = release_inputs(dep, None, None, None)
    rel = build_release(tree_p, base_ref, pl, configs, spec, cache=c, who=who(), series_identity=ident,
                        private=private_groups(dep), environment=release_environment(dep))
    if rel.id != rid:
        raise InputError(f"the hosts run {rid}, which is not in the local release cache ({c}), and the profile builds "
                         f"{rel.id}: deploy the profile first (dsv4ctl deploy), then change it")
    return rel


def change_configs(profile, opts: Options, edit: Callable[[dict[str, str], str], dict[str, bytes]], *, action: str,
                   groups: list[str], record: dict | None = None) -> dict:
    """Build and deploy the release R' = R with ``edit``'s serve configs. ``edit`` gets R's serve
    configs {group: text} and returns the changed ones {group: new bytes} (it lints them; it may
    raise InputError, nothing changed; its second argument is R's id); none changed → nothing to do. Only those groups are
    restarted. Returns the deploy report (``changed``: the groups); ``--dry-run``: the steps."""
    from . import engine as E
    from .steps import DRY_RUN_TOKEN, deploy_steps
    t_start = time.monotonic()
    dep = as_deployment(profile)
    site = open_site(dep, opts)     # one release on every node of every server
    what = f"{action} {','.join(groups)}"
    try:
        if opts.dry_run:
            gather_facts(site)
            rid = running_release(site)
            import tempfile
            from pathlib import Path
            from .release import default_cache as dc
            cache = Path(opts.cache or dc())
            with tempfile.TemporaryDirectory(prefix="dsv4ctl-dry-run-") as tmp:
                base = local_base(dep, rid, cache if (cache / rid / "RELEASE.json").is_file() else Path(tmp) / "releases")
                new = edit(_configs(base), base.id)
                if not new:
                    return {"schema": "dsv4ctl.deploy/1", "dry_run": True, "release": rid, "from": rid, "changed": [],
                            "actions": [], "steps": [], "on_failure": []}
                rel = derive_release(base, new, cache=Path(tmp) / "releases", change=what)
                site.token = DRY_RUN_TOKEN
                run = deploy_steps(site, rel.id, _spec(rel), locked=False, extra=record, action=action,
                                   restart=frozenset(new), lock_what=what)
                return {"schema": "dsv4ctl.deploy/1", "dry_run": True, "release": rel.id, "from": rid,
                        "changed": sorted(new), "actions": run.lines(), "steps": [s.to_dict() for s in run.steps],
                        "on_failure": [s.to_dict() for s in run.on_failure]}
        try:
            E.acquire_locks(site, what)
            rid = running_release(site)
            base = local_base(dep, rid, opts.cache)
            new = edit(_configs(base), base.id)
            if not new:
                E.release_locks(site)
                return {"schema": "dsv4ctl.deploy/1", "release": rid, "from": rid, "changed": [], "result": "ok",
                        "unchanged": True, "hosts": {h: {"from": rid} for h in site.hosts}}
            rel = derive_release(base, new, cache=opts.cache, who=who(), change=what)
            opts.log(f"built {rel.id} from {rid} with the new serve config of {', '.join(sorted(new))}")
            from .states import Refused, refusals
            bad = refusals(site.facts, rel.id, opts.force_failed)
            if bad:       # this exact change failed its gate before
                raise Refused(bad[0] + f"; this exact change of {rid} failed before: change something else, or edit "
                              "the profile's serve config the same way and run dsv4ctl deploy --force-failed")
            rep = E._deploy_locked(site, rel, t_start, None, action=action, restart=frozenset(new),
                                   record={**(record or {}), "groups": sorted(new)})
            rep["changed"] = sorted(new)
            rep["from"] = rid
            return rep
        finally:
            E.release_locks(site)
    finally:
        site.close()


def _configs(rel: Release) -> dict[str, str]:
    return {g: (rel.path / "configs" / f"{g}.yaml").read_text() for g in rel.meta.get("configs", {})}


def _spec(rel: Release) -> dict:
    import json
    return json.loads((rel.path / "launch.json").read_text())
