"""Serve-config changes (``hicache on|off``, ``config set``) on the profile's local serve configs: choose groups, edit and lint
(:func:`prepare_edits`, nothing written), then write every changed file as one step
(:func:`write_all`). A change of the running release on the hosts (a new release) is :mod:`dsv4ctl.serve.hicache_live`."""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import EXIT_REMOTE, DsvError, InputError
from ..profile.deployment import Deployment, GroupView
from .edit import Change

#: the edits of one serve config: (raw mapping, argument table, label) -> changes
ChangesFn = Callable[[dict, Any, str], list[Change]]


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


def select_groups(dep: Deployment, names: list[str], action: str) -> list[GroupView]:
    """``--group`` names, else the default: ``on`` → prefill/colocated groups (never decode, ops
    §2.4), ``off``/``status`` → every server group. InputError for an unknown group or the router."""
    if names:
        out = [dep.group(n) for n in names]
        for g in out:
            if not g.is_server:
                raise InputError(f"group {g.name!r} is the router: it has no serve config")
        return out
    if action == "on":
        return [g for g in dep.servers() if g.role in ("prefill", "colocated")]
    return dep.servers()


def prepare_edits(dep: Deployment, groups: list[GroupView], what: str, changes: ChangesFn,
                  tree: Optional[str]) -> list[Edit]:
    """Edit and lint every selected group's serve config (as the Deployment read it); nothing is
    written. ``changes(data, table, label)`` gives the edits of one file (its raw mapping) —
    :func:`dsv4ctl.serve.hicache.changes_for`, :func:`dsv4ctl.serve.setargs.changes_for_set`;
    ``what`` names the command in errors (``hicache on``).

    Raises InputError (exit 2) for a missing file, a YAML error, text that is not UTF-8, a bad
    option value, or a lint error in an edited file (the first error, one line)."""
    from .argtable import table_for
    from .edit import apply_changes, scrub, secret_values, unified_diff
    from .lint import lint
    from .lintinput import build_input, restrict

    table = table_for(dep)
    edits: list[Edit] = []
    for g in groups:
        if g.serve_config_path is None:
            raise InputError(f"{dep.path}: group {g.name}: no serve_config")
        cfg = g.serve
        old = cfg.text
        label = str(g.serve_config_path)
        edits_ = changes(cfg.data, table, label)
        new = apply_changes(old, edits_, label) if edits_ else old
        edits.append(Edit(g.name, g.serve_config_path, old, new, unified_diff(old, new, _rel(g.serve_config_path)), [],
                          frozenset(secret_values(cfg.data))))
    changed = [e for e in edits if e.new != e.old]
    if changed:
        def findings_of(texts: dict[str, str]) -> list:
            inp = build_input(dep, None, tree, texts=texts)
            return restrict(lint(inp, table), inp, [e.group for e in changed])
        findings = findings_of({e.group: e.new for e in changed})
        for e in changed:
            e.findings = [f for f in findings if f.file == str(e.path) or f.group == e.group]
        errs = new_errors(findings, findings_of({e.group: e.old for e in changed}))
        if errs:
            raise InputError(scrub(f"{what}: not written: {errs[0].format()}"
                                   + (f" (+{len(errs) - 1} more error(s))" if len(errs) > 1 else ""),
                                   set().union(*(e.secrets for e in edits))))
    return edits


#: lint errors about how a config that starts behaves under load (a race, wrong output, a
#: corruption report), not about whether SGLang starts with it: index-K read ungated with HiCache,
#: the DSV4 parsers, the sglang#31252 combination
RISK_RULES = frozenset({"DSV108", "DSV111", "DSV119"})


def new_errors(after: list, before: list) -> list:
    """The error findings of ``after`` (lint of the edited texts) that refuse the edit: every
    error, except a :data:`RISK_RULES` error that ``before`` (lint of the same files unedited)
    already had — the edit does not cause it, and an incident runbook must be able to add
    ``kv-canary: log`` to a config whose bf16 index-K is ungated (DSV111) while it runs. Errors
    SGLang refuses to start with (unknown keys, page size, pairs, …) block every edit.
    Findings compare by rule, group and message."""
    key = lambda f: (f.rule, f.group, f.message)      # noqa: E731
    had = {key(f) for f in before if f.severity == "error" and f.rule in RISK_RULES}
    return [f for f in after if f.severity == "error" and key(f) not in had]


def plan_guard(dep: Deployment, texts: dict[str, str], what: str) -> None:
    """Refuse (InputError, exit 2) serve-config edits ``texts`` {group: new text} that break the
    group's plan: the profile cannot be planned with them (a size the profile disagrees with, a
    bad value the plan reads) or a changed group's verdict becomes ``fails`` (``dsv4ctl plan``:
    it would not start or serve) when it did not fail before. Plans both (SGLang 0.5.23 pool
    model, :mod:`dsv4ctl.plan.plan`); a profile that cannot be planned before the edit is not
    judged here."""
    from ..plan.plan import build_plan
    try:
        before = {gp.group.name: gp.verdict for gp in build_plan(dep).groups}
    except InputError:
        return
    new = dep.with_serve_texts(texts)      # the files were read once (dep): the edited texts, the rest as read
    try:
        after = build_plan(new).groups
    except InputError as e:
        raise InputError(f"{what}: not written: the profile cannot be planned with the edit: {e}") from None
    for gp in after:
        n = gp.group.name
        if n in texts and gp.verdict.get("level") == "fails" and (before.get(n) or {}).get("level") != "fails":
            raise InputError(f"{what}: not written: {n} would fail its plan ({gp.verdict.get('deciding')}): "
                             f"{gp.verdict.get('message')}")


def _rel(p: Path) -> str:
    try:
        return str(Path(p).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(p).lstrip("/")


def refuse_shipped(paths) -> None:
    """InputError (exit 2) when one of ``paths`` is data shipped with dsv4ctl
    (:func:`dsv4ctl.resources.is_shipped`): commands edit the operator's copy, never the
    installation's (``dsv4ctl profile init`` makes one)."""
    from ..resources import is_shipped
    for path in paths:
        if is_shipped(path):
            raise InputError(f"{path}: shipped with dsv4ctl, not edited; start from your own copy: "
                             "dsv4ctl profile init my-profile.yaml")


class EditConflict(DsvError):
    """A file changed between the moment a command read it and the moment it would write it
    (another dsv4ctl edit or an editor): nothing was written (exit 3)."""

    exit_code = EXIT_REMOTE


def write_all(files: list[tuple[Path, str]], expect: dict | None = None) -> None:
    """Write several local files as one step: all or nothing.

    Concurrent editors are serialised: an exclusive ``flock`` on each target's folder is held
    from the check to the last rename, and with ``expect`` ({path: the text the edit was computed
    from}) a target whose bytes differ now is :class:`EditConflict` (exit 3, nothing written,
    naming the file and when it changed): two commands editing one file either both land (one
    after the other, each on the other's result) or the loser fails; an edit is never lost.

    Each target is resolved first (a symlinked serve config is written through to its target; the
    link stays a link). Phase 1 writes every new text to a temp file next to its target, fsyncs it
    and gives it the target's mode and owner; any failure removes every temp file and raises DsvError
    (exit 3, no file changed). Phase 2 renames the temps over the targets (atomic per file) and fsyncs
    the folders; if a rename fails, the files already renamed get their old bytes, mode and owner
    back the same way. SIGINT, SIGTERM and SIGHUP are held while both phases run. A file shipped with dsv4ctl (the installation's or the checkout's shipped
    profiles and serve configs) is never written: InputError (exit 2) naming ``dsv4ctl profile init``,
    nothing changed."""
    refuse_shipped([p for p, _ in files])
    # SIGINT/SIGTERM/SIGHUP wait until the files are all written or all put back (a few small local
    # files: milliseconds) and are acted on afterwards. Their handlers are swapped, not the signal
    # mask: with other threads alive (SSH transports) the kernel may hand a blocked signal to one of
    # them and Python would still run the handler in the main thread, mid-write.
    from ..remote.parallel import interrupts_deferred
    expect = {os.path.realpath(p): t for p, t in (expect or {}).items()}
    with _folder_locks([Path(os.path.realpath(p)).parent for p, _ in files]):
        with interrupts_deferred():
            _write_all(files, expect)


@contextlib.contextmanager
def _folder_locks(folders):
    """Exclusive ``flock`` on each folder (sorted: two writers never wait on each other in a
    cycle); a folder that cannot be opened is not locked (the write then fails with its reason)."""
    import fcntl
    fds = []
    try:
        for d in sorted({str(f) for f in folders}):
            try:
                fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            except OSError:
                continue
            fds.append(fd)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        for fd in fds:
            os.close(fd)         # closing the descriptor releases its lock


def _write_all(files: list[tuple[Path, str]], expect: dict[str, str]) -> None:
    staged: list[tuple[Path, str, bytes, os.stat_result]] = []      # (target, temp path, old bytes, old stat)
    for path, _ in files:
        target = os.path.realpath(path)
        if target in expect:
            try:
                now, st = Path(target).read_bytes(), os.stat(target)
            except OSError:
                continue            # the write below reports it
            if now != expect[target].encode("utf-8"):
                import time
                when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(st.st_mtime))
                raise EditConflict(f"{path}: changed at {when} by another command or editor since this command "
                                   "read it; nothing written: run the command again")
    try:
        for path, text in files:
            target = Path(os.path.realpath(path))
            st = target.stat()
            old = target.read_bytes()
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            staged.append((target, tmp, old, st))
            with os.fdopen(fd, "wb") as f:
                f.write(text.encode("utf-8"))
                f.flush()
                os.fsync(f.fileno())
            _same_mode_and_owner(tmp, st)
    except OSError as e:
        _unlink_all(t for _, t, _, _ in staged)
        where = e.filename or (staged[-1][0] if staged else (files[0][0] if files else "?"))
        raise DsvError(f"{where}: cannot write ({e.strerror or e}); no file was changed", EXIT_REMOTE) from None
    done: list[tuple[Path, bytes, os.stat_result]] = []
    current = None
    try:
        for target, tmp, old, st in staged:
            current = target
            os.replace(tmp, target)
            done.append((target, old, st))
    except OSError as e:
        _unlink_all(t for _, t, _, _ in staged[len(done):])
        for target, old, st in done:
            try:
                fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
                with os.fdopen(fd, "wb") as f:
                    f.write(old)
                _same_mode_and_owner(tmp, st)      # mkstemp makes 0600 files of whoever runs dsv4ctl
                os.replace(tmp, target)
            except OSError:
                pass
        raise DsvError(f"{current or e.filename or '?'}: rename failed ({e.strerror or e}); files put back",
                       EXIT_REMOTE) from None
    for d in {t.parent for t, _, _ in done}:
        try:
            dfd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass


def _same_mode_and_owner(path: str, st: os.stat_result) -> None:
    """Give ``path`` the owner (when this process may: root, or its own files) and mode of ``st``;
    chown first, since it can clear set-id bits."""
    if (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()):
        try:
            os.chown(path, st.st_uid, st.st_gid)
        except PermissionError:
            pass
    os.chmod(path, st.st_mode & 0o7777)


def _unlink_all(paths) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except OSError:
            pass


def write_local(path: Path, text: str, expect: str | None = None) -> None:
    """Atomic local write of one file (see :func:`write_all`); ``expect``: the text it was read as."""
    write_all([(Path(path), text)], None if expect is None else {Path(path): expect})


