"""Releases on SSH hosts: push (delta), activate (atomic ``current`` switch + service restart),
health gate with automatic rollback, operator rollback, locks, audit log.

Host layout under ``<root>`` (profile ``hosts[].root`` or ``deploy.root``)::

    releases/<id>/            complete, verified releases (immutable)
    releases/.incoming-<id>/  a push in flight (never referenced by ``current``)
    current -> releases/<id>  symlink, switched by rename(2)
    previous -> releases/<id> the release active before ``current``
    state.json                per release: pushed/activated when and by whom, good/failed
    audit.jsonl               append-only JSON lines: who, when, what, result
    .lock/holder.json         the per-host deploy lock
    run/<group>.pid           launcher pid files; logs/<group>.log server logs
"""
