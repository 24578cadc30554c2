"""``hicache on|off --remote`` and ``config set --remote``: an edit of the serve configs a
running release was built with. Nothing here writes to a host: the edited configs become a new release
(:mod:`dsv4ctl.deploy.change`), pushed, switched and gated like a deploy — releases are
immutable, and every change to a host is a release.

:func:`edit_release_configs` takes the release's serve configs (the text each server runs
with, ``<root>/current/configs/<group>.yaml``), applies the same round-trip edit as the local
command (:func:`dsv4ctl.serve.hicache.changes_for`, :func:`dsv4ctl.serve.setargs.changes_for_set`) and lints the result with the whole profile
(pairs, host RAM, index-K gating): an error the edit brings refuses the change (exit 2, nothing
written; :func:`dsv4ctl.serve.hicache_local.new_errors`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..errors import InputError


def live_config(root: str, group: str) -> str:
    """Path of a group's live serve config on its host (what its server was started with)."""
    return f"{root}/current/configs/{group}.yaml"


@dataclass
class ReleaseEdit:
    """One group's edit of the running release's serve config."""

    group: str
    host: str
    path: str                 # the live path on the host (what the server runs with)
    old: str
    new: str
    diff: str
    findings: list = field(default_factory=list)


def edit_release_configs(prof, groups, what: str, changes, tree: Optional[str], texts: dict[str, str],
                         release: str) -> list[ReleaseEdit]:
    """The edits ``changes(data, table, label)`` (:data:`dsv4ctl.serve.hicache_local.ChangesFn`)
    of ``groups`` (GroupViews of the Deployment ``prof``) applied to ``texts`` (the running
    release's serve configs {group: text}); linted; ``what`` names the command in errors. InputError (exit 2) for a group the
    release has no config for, a YAML error, a bad option or a lint error. Pure."""
    from dataclasses import replace

    from ..profile.serveconfig import parse_serve_config
    from .argtable import table_for
    from .edit import apply_changes, unified_diff
    from .lint import lint
    from .hicache_local import new_errors
    from .lintinput import build_input, restrict

    table = table_for(prof)
    out: list[ReleaseEdit] = []
    for g in groups:
        path = live_config(g.root, g.name)
        label = f"{g.group.host}:{path} ({release})"
        text = texts.get(g.name)
        if text is None:
            raise InputError(f"{label}: release {release} has no serve config for group {g.name}")
        cfg = parse_serve_config(text, label)
        edits_ = changes(cfg.data, table, label)
        new = apply_changes(text, edits_, label) if edits_ else text
        out.append(ReleaseEdit(group=g.name, host=g.group.host, path=path, old=text, new=new,
                               diff=unified_diff(text, new, label)))
    changed = [e for e in out if e.new != e.old]
    if changed:
        def findings_of(texts: dict[str, str]) -> list:
            inp = build_input(prof, None, tree, texts=texts)
            for gi in inp.groups:     # findings on the release's text name the host path
                e = next((e for e in changed if e.group == gi.name), None)
                if e is not None and gi.config is not None:
                    gi.config = replace(gi.config, path=f"{e.host}:{e.path}")
            return restrict(lint(inp, table), inp, [e.group for e in changed])
        findings = findings_of({e.group: e.new for e in changed})
        for e in changed:
            e.findings = [f for f in findings if f.group == e.group or f.file == f"{e.host}:{e.path}"]
        errs = new_errors(findings, findings_of({e.group: e.old for e in changed}))
        if errs:
            raise InputError(f"{what}: not changed: {errs[0].format()}"
                             + (f" (+{len(errs) - 1} more error(s))" if len(errs) > 1 else ""))
    return out
