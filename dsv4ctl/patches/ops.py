"""Changing a tree: every change is first a list of :class:`Action` (printed by ``--dry-run``),
then executed. Apply and revert restore the tree exactly when git stops on a conflict."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..errors import DsvError, InputError, VerdictError
from .diffparse import failing_hunks, parse_files, subject
from .gitio import Git, last_line
from .series import Entry, Series, format_entry, parse_series, series_identity
from .tree import SeriesStatus, TreeState, match_series, operation_in_progress, patch_ids_of_files, read_tree


@dataclass(frozen=True)
class Action:
    """One step of a change. ``kind``: ``skip`` (nothing to do), ``am`` (apply a series patch),
    ``revert`` (git revert a commit), ``write`` (create a file), ``append`` (add a series line)."""

    kind: str
    target: str
    detail: str = ""

    def describe(self) -> str:
        verb = {"skip": "skip", "am": "git am -3", "revert": "git revert", "write": "write",
                "append": "append to series"}[self.kind]
        return f"{verb} {self.target}" + (f"  ({self.detail})" if self.detail else "")


@dataclass
class LoadedSeries:
    """A series with its directory, patch texts and patch-ids."""

    dir: Path
    series: Series
    texts: dict[str, str]
    ids: dict[str, str]

    @property
    def identity(self) -> str:
        return series_identity(self.series, self.ids)

    def path(self, e: Entry) -> Path:
        return self.dir / e.name


#: A series file or one patch of it is kilobytes (SGLang's largest upstream patches: a few
#: hundred KB); more is not a patch series to read into memory.
MAX_PATCH_BYTES = 16 << 20


def _read_text(path: Path, label: str) -> str:
    """The text of a series or patch file: a regular file of at most MAX_PATCH_BYTES
    (:func:`dsv4ctl.resources.read_file_capped`; a FIFO or ``/dev/zero`` is refused unread), UTF-8.
    InputError (exit 2) naming ``label`` otherwise."""
    from ..resources import read_file_capped
    raw = read_file_capped(path, MAX_PATCH_BYTES, label, " (not a patch series)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{label}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_patch_text(path: Path | str, label: str | None = None) -> str:
    """The text of one patch file given by the operator (``deploy --patch``): the same checks as
    a series' patches (a regular file of at most MAX_PATCH_BYTES, UTF-8); InputError (exit 2)
    naming ``label`` (default: the path)."""
    return _read_text(Path(path), label or str(path))


def load_series(directory: Path | str) -> LoadedSeries:
    """Read ``DIR/series`` and its patch files (each a regular file of at most MAX_PATCH_BYTES).
    InputError (exit 2) when the directory, the series file or a listed patch is missing, not a
    regular file or too large, or a patch has no diff."""
    d = Path(directory).expanduser()
    sf = d / "series"
    if not sf.exists():
        raise InputError(f"{d}: no series file (expected {sf})")
    series = parse_series(_read_text(sf, str(sf)), path=str(sf), dirname=d.resolve().name)
    texts = {}
    for e in series.entries:
        p = d / e.name
        if not p.exists():
            raise InputError(f"{sf}:{e.line}: {e.name}: no such file in {d}")
        texts[e.name] = _read_text(p, f"{sf}:{e.line}: {e.name}")
        if not parse_files(texts[e.name]):
            raise InputError(f"{sf}:{e.line}: {e.name}: not a git-format patch (no diff)")
    ids = patch_ids_of_files([d / e.name for e in series.entries])
    for e in series.entries:
        if e.name not in ids:
            raise InputError(f"{sf}:{e.line}: {e.name}: git patch-id found no change in it")
    return LoadedSeries(dir=d, series=series, texts=texts, ids=ids)


def series_status(ls: LoadedSeries, state: TreeState) -> SeriesStatus:
    """Which patches of ``ls`` the tree has (by patch-id)."""
    return match_series(ls.ids, [e.name for e in ls.series.entries], state.commits)


# -- apply ---------------------------------------------------------------------------------


def plan_apply(ls: LoadedSeries, state: TreeState, any_version: bool = False) -> list[Action]:
    """Actions that bring ``state`` to the whole series applied: ``skip`` for patches already
    there, ``am`` for the others, in series order. Pure. InputError when the tree is not clean
    or (unless ``any_version``, as ``patch check --base`` uses it) its version is not the
    series base."""
    _require_clean(state, "apply")
    if not any_version and state.version and state.version != ls.series.version:
        raise InputError(f"{state.tree}: tree is SGLang {state.version}, the series is for "
                         f"{ls.series.base} ({ls.series.path})")
    st = series_status(ls, state)
    out = []
    for e, s in zip(ls.series.entries, st.entries):
        if s.state == "applied":
            out.append(Action("skip", e.name, f"already applied as {s.commit[:12]}"))
        else:
            out.append(Action("am", e.name, subject(ls.texts[e.name])
                              + (" (re-apply: was reverted)" if s.state == "reverted" else "")))
    return out


def _require_clean(state: TreeState, what: str) -> None:
    if state.operation:
        raise InputError(f"{state.tree}: a git {state.operation} is in progress; finish or abort it before {what}")
    changed = [ln[3:] for ln in state.dirty if not ln.startswith("??")]
    if changed:
        more = f" (+{len(changed) - 3} more)" if len(changed) > 3 else ""
        raise InputError(f"{state.tree}: uncommitted changes in {', '.join(changed[:3])}{more}; "
                         f"commit or stash them before {what}")


@dataclass
class ApplyResult:
    applied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    head_before: str = ""
    head_after: str = ""


def execute_apply(git: Git, ls: LoadedSeries, state: TreeState, actions: list[Action]) -> ApplyResult:
    """Run ``git am -3`` with every ``am`` action's patch (one mbox on stdin, one am session).

    On failure the am session is aborted and the tree checked back to ``state.head`` with the
    same status as before; then VerdictError (exit 1) names the patch, file and hunk. Raises
    DsvError if the tree could not be restored (never expected; the message says how to)."""
    todo = [a.target for a in actions if a.kind == "am"]
    res = ApplyResult(skipped=[a.target for a in actions if a.kind == "skip"], head_before=state.head)
    if not todo:
        res.head_after = state.head
        return res
    mbox = "".join(ls.texts[n] if ls.texts[n].endswith("\n") else ls.texts[n] + "\n" for n in todo)
    started = _tree_clock(git)
    with interrupts():
        try:
            r = git.run("am", "-3", "--quiet", input=mbox, check=False, config=git.identity_config())
            if r.ok:
                res.applied = todo
                res.head_after = git.out("rev-parse", "HEAD")
                return res
            return _failed_apply(git, ls, state, todo, r)
        except KeyboardInterrupt:
            _restore_after_interrupt(git, state, "am", started)
            raise _interrupted(state) from None


def _failed_apply(git: Git, ls: LoadedSeries, state: TreeState, todo: list[str], r) -> ApplyResult:
    """The am session stopped: restore the tree, then VerdictError naming patch, file and hunk."""
    # Which patch stopped the session, and where.
    text = r.out + "\n" + r.err
    m = re.search(r"Patch failed at (\d+)", text)
    failed = todo[int(m.group(1)) - 1] if m and 0 < int(m.group(1)) <= len(todo) else todo[0]
    stop_head = git.out("rev-parse", "HEAD")
    conflicted = git.run("diff", "--name-only", "--diff-filter=U", check=False).out.split()
    _restore(git, state, "am")
    where = explain_conflict(git, stop_head, ls.texts[failed], conflicted)
    where = where or last_line(text)
    raise VerdictError(f"{state.tree}: patch {failed} does not apply: {where}; "
                       f"tree restored to {state.head[:12]}")


def explain_conflict(git: Git, rev: str, patch_text: str, conflicted: list[str]) -> str:
    """``FILE hunk #N (@@ ... @@)`` for the first hunk of ``patch_text`` that does not fit the file
    at ``rev``; files missing at ``rev`` are named as such. '' when nothing can be pinned."""
    files = parse_files(patch_text)
    order = sorted(files, key=lambda f: (f.path not in conflicted,))
    for fp in order:
        if not fp.hunks:
            continue
        r = git.run("show", f"{rev}:{fp.old_path}", check=False)
        if not r.ok:
            if all(h.old_start == 0 for h in fp.hunks):
                continue  # a new file
            return f"{fp.path}: file does not exist in the tree"
        bad = failing_hunks(r.out, fp)
        if bad:
            h = bad[0]
            return f"{fp.path} hunk #{h.index} {h.header.split(' @@')[0]} @@ (line {h.old_start})"
    if conflicted:
        return f"{conflicted[0]}: merge conflict"
    return ""


class interrupts:
    """While a tree is being changed, SIGTERM and SIGHUP are handled like Ctrl-C (SIGINT): KeyboardInterrupt in
    the main thread. The git child is in its own process group (:func:`.gitio.local_runner`) and is
    stopped first; the caller then puts the tree back (exit 130). Outside the main thread (no
    signals there) this does nothing."""

    def __enter__(self):
        import signal
        import threading
        self.old = None
        if threading.current_thread() is threading.main_thread():
            from ..signals import STOPPING, raise_interrupt
            self.old = {s: signal.signal(s, raise_interrupt) for s in STOPPING}
        return self

    def __exit__(self, *exc):
        import signal
        for s, h in (self.old or {}).items():
            signal.signal(s, h)
        return False


def _interrupted(state: TreeState) -> DsvError:
    from ..errors import EXIT_INTERRUPTED
    return DsvError(f"{state.tree}: interrupted; tree restored to {state.head[:12]}", exit_code=EXIT_INTERRUPTED)


def _tree_clock(git: Git) -> float:
    """Now, by the clock of the machine the tree is on (``date +%s`` there for a host's tree; 0
    when that cannot be read: then no lock file is removed after an interrupt)."""
    from .gitio import local_runner
    if git.runner is local_runner:
        return time.time()
    try:
        code, out, _ = git.runner(["date", "+%s"], None)
        return float(out.strip()) if code == 0 else 0.0
    except (DsvError, ValueError):
        return 0.0


# lock files of the git dir (top level and refs/) changed at or after $2 (epoch seconds) — on a host
_STALE_LOCKS_SH = ('find "$1" -maxdepth 1 -name "*.lock" -newermt "@$2" -exec rm -f {} +; '
                   '[ -d "$1/refs" ] && find "$1/refs" -name "*.lock" -newermt "@$2" -exec rm -f {} +; true')


def _remove_stale_locks(git: Git, since: float) -> None:
    """Lock files a git stopped by a signal may leave (``index.lock``, ``HEAD.lock``,
    ``MERGE_MSG.lock``, ref locks) and that
    appeared after ``since`` (this run's git made them; a lock of someone else's older git is left
    alone; ``since`` is by the tree machine's clock, :func:`_tree_clock`). dsv4ctl stopped that
    git itself (locally its process group; on a host the group of its SSH command)."""
    from pathlib import Path

    from .gitio import local_runner
    r = git.run("rev-parse", "--absolute-git-dir", check=False)
    if not r.ok:
        return
    if git.runner is not local_runner:
        git.runner(["sh", "-c", _STALE_LOCKS_SH, "sh", r.out.strip(), str(int(since) - 1)], None)
        return
    gitdir = Path(r.out.strip())
    for p in [*gitdir.glob("*.lock"), *gitdir.glob("refs/**/*.lock")]:
        try:
            if p.stat().st_mtime >= since - 1:
                p.unlink()
        except OSError:
            pass


def _restore_after_interrupt(git: Git, state: TreeState, op: str, since: float = 0.0) -> None:
    """Interrupted (SIGINT, SIGTERM or SIGHUP) while ``git op`` ran or right after: the git child
    has been stopped (:func:`.gitio.local_runner`); put the tree back exactly. Every stopping signal
    (:data:`dsv4ctl.signals.STOPPING`) is ignored until that is done: a second Ctrl-C, or the SIGHUP
    of a terminal closing after a Ctrl-C, must not stop ``git am --abort`` half-way and leave the
    session (was: SIGHUP cut the restore, ``.git/rebase-apply`` left, the next apply refused)."""
    import signal
    import threading

    from ..signals import STOPPING
    sigs = STOPPING if threading.current_thread() is threading.main_thread() else ()
    old = {s: signal.signal(s, signal.SIG_IGN) for s in sigs}
    try:
        if since:
            _remove_stale_locks(git, since)
        _restore(git, state, op)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _restore(git: Git, state: TreeState, op: str) -> None:
    """Abort the git ``op`` session and prove the tree is back at ``state``: HEAD, status, and no
    git operation left in progress (``.git/rebase-apply`` / ``.git/sequencer``, which would make
    the next apply refuse the tree)."""
    def now() -> tuple[str, list[str]]:
        status = git.run("status", "--porcelain=v1", "--untracked-files=normal", check=False).out
        return (git.run("rev-parse", "HEAD", check=False).out.strip(), [ln for ln in status.splitlines() if ln.strip()])
    git.run(op, "--abort", check=False)
    head, dirty = now()
    if head != state.head or dirty != state.dirty:
        # a git stopped by a signal can leave a file it was writing changed in the work tree even
        # after --abort; the tree was clean (tracked files) before, so reset --hard is exact
        git.run("reset", "--hard", "-q", state.head, check=False)
        head, dirty = now()
    if head == state.head and dirty == state.dirty:
        # an abort that failed half-way (git stopped mid-sequence) can leave the session folder
        # (.git/sequencer, .git/rebase-apply): forget it, the tree itself is back
        git.run(op, "--quit", check=False)
    if head != state.head or dirty != state.dirty:
        raise DsvError(f"{state.tree}: git {op} failed and the tree could not be restored to "
                       f"{state.head[:12]}; run 'git -C {state.tree} {op} --abort'")
    left = operation_in_progress(git.run("status", check=False).out)     # verified, not assumed
    if left is not None:
        raise DsvError(f"{state.tree}: the tree is back at {state.head[:12]} but a git {left} session is left; "
                       f"run 'git -C {state.tree} {op} --abort'")


# -- revert --------------------------------------------------------------------------------


def plan_revert(git: Git, state: TreeState, commits: list[str]) -> list[Action]:
    """One ``revert`` action per commit (newest first as given). InputError for an unknown
    commit, a commit not in HEAD's history, or a dirty tree."""
    _require_clean(state, "revert")
    out = []
    for c in commits:
        r = git.run("rev-parse", "--verify", "-q", f"{c}^{{commit}}", check=False)
        if not r.ok:
            raise InputError(f"{state.tree}: {c}: no such commit")
        sha = r.out.strip()
        if not git.run("merge-base", "--is-ancestor", sha, state.head, check=False).ok:
            raise InputError(f"{state.tree}: {c} is not in the history of HEAD")
        if any(x.reverts == sha for x in state.commits):
            raise InputError(f"{state.tree}: {c} is already reverted")
        out.append(Action("revert", sha, git.out("log", "-1", "--format=%s", sha)))
    return out


def execute_revert(git: Git, state: TreeState, actions: list[Action]) -> list[str]:
    """``git revert --no-edit`` each commit (one sequence). Restores the tree on a conflict and
    raises VerdictError naming the commit and file. Returns the new commits' shas."""
    shas = [a.target for a in actions if a.kind == "revert"]
    if not shas:
        return []
    started = _tree_clock(git)
    with interrupts():
        try:
            r = git.run("revert", "--no-edit", *shas, check=False, config=git.identity_config())
            if not r.ok:
                conflicted = git.run("diff", "--name-only", "--diff-filter=U", check=False).out.split()
                current = git.run("rev-parse", "-q", "--verify", "REVERT_HEAD", check=False).out.strip()
                _restore(git, state, "revert")
                what = f"in {conflicted[0]}" if conflicted else last_line(r.err or r.out)
                raise VerdictError(f"{state.tree}: revert of {(current or shas[0])[:12]} conflicts {what}; "
                                   f"tree restored to {state.head[:12]}")
            return git.out("rev-list", "--reverse", f"{state.head}..HEAD").split()
        except KeyboardInterrupt:
            _restore_after_interrupt(git, state, "revert", started)
            raise _interrupted(state) from None


# -- export --------------------------------------------------------------------------------


def plan_export(git: Git, rng: str, series_dir: Path, facts: dict[str, str],
                ls: Optional[LoadedSeries]) -> tuple[list[Action], dict[str, str]]:
    """Actions turning the commits of ``rng`` (``A..B`` or one commit) into series entries in
    ``series_dir``: ``write`` a numbered patch file per commit and ``append`` its series line;
    ``skip`` commits whose patch-id the series already has. Returns the actions and the patch
    texts to write, keyed by file name."""
    if ".." not in rng:
        rng = f"{rng}^!"
    r = git.run("rev-list", "--reverse", "--no-merges", rng, check=False)
    if not r.ok:
        raise InputError(f"{git.where}: bad range {rng!r}: {last_line(r.err)}")
    shas = r.out.split()
    if not shas:
        raise InputError(f"{git.where}: range {rng!r} has no commits")
    have = set(ls.ids.values()) if ls else set()
    n = len(ls.series.entries) if ls else 0
    actions, texts = [], {}
    for sha in shas:
        text = git.out("format-patch", "-1", "--stdout", "--no-signature", "--no-stat", sha) + "\n"
        pid = git.run("patch-id", "--stable", input=text).out.split()
        subj = subject(text)
        if pid and pid[0] in have:
            actions.append(Action("skip", sha[:12], f"{subj}: already in the series"))
            continue
        n += 1
        slug = re.sub(r"[^A-Za-z0-9]+", "-", subj).strip("-")[:52].rstrip("-") or "patch"
        name = f"{n:04d}-{slug}.patch"
        texts[name] = text
        actions.append(Action("write", str(series_dir / name), f"{sha[:12]} {subj}"))
        actions.append(Action("append", format_entry(name, facts, f"from {sha[:12]}: {subj}")))
    return actions, texts


def execute_export(series_dir: Path, actions: list[Action], texts: dict[str, str],
                   base: Optional[str]) -> None:
    """Write the patch files, then the series lines (a new series file starts with a header and
    ``base`` line). The series file is replaced atomically."""
    series_dir.mkdir(parents=True, exist_ok=True)
    for a in actions:
        if a.kind == "write":
            p = Path(a.target)
            tmp = p.with_suffix(".tmp")
            tmp.write_text(texts[p.name])
            tmp.replace(p)
    sf = series_dir / "series"
    old = _read_text(sf, str(sf)) if sf.exists() else (
        f"# patch series (dsv4ctl patch export)\n" + (f"base {base}\n" if base else ""))
    if old and not old.endswith("\n"):
        old += "\n"
    new = old + "".join(a.target + "\n" for a in actions if a.kind == "append")
    tmp = sf.with_name(".series.tmp")
    tmp.write_text(new)
    tmp.replace(sf)
