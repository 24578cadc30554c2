"""Host layout, facts (read-only state of one host) and the pure decisions made from them."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field

from ..errors import InputError, RemoteError
from ..remote import Transport, q

STATE_SCHEMA = "dsv4ctl.deploy-state/1"


@dataclass
class Paths:
    """Absolute paths of one host's deploy root. ``node``: the host's name when the root is one
    folder several nodes share (``deploy.slurm.shared_root``): what each node writes on its own
    (its logs, its pid files) is under ``logs/<node>/`` and ``run/<node>/`` so nodes never write
    each other's files; None: the root is the host's own."""

    root: str
    node: str | None = None

    @property
    def releases(self) -> str: return f"{self.root}/releases"
    def release(self, rid: str) -> str: return f"{self.root}/releases/{rid}"
    def env(self, digest: str) -> str: return f"{self.root}/envs/{digest}"
    def incoming(self, rid: str) -> str: return f"{self.root}/releases/.incoming-{rid}"
    @property
    def current(self) -> str: return f"{self.root}/current"
    @property
    def previous(self) -> str: return f"{self.root}/previous"
    @property
    def state(self) -> str: return f"{self.root}/state.json"
    @property
    def audit(self) -> str: return f"{self.root}/audit.jsonl"
    @property
    def lock(self) -> str: return f"{self.root}/.lock"
    @property
    def owner(self) -> str: return f"{self.root}/owner.json"
    @property
    def logdir(self) -> str: return f"{self.root}/logs" + (f"/{self.node}" if self.node else "")
    @property
    def rundir(self) -> str: return f"{self.root}/run" + (f"/{self.node}" if self.node else "")
    def pidfile(self, group: str) -> str: return f"{self.rundir}/{group}.pid"
    def logfile(self, group: str) -> str: return f"{self.logdir}/{group}.log"


@dataclass
class HostFacts:
    """What one host has: complete releases (id → RELEASE.json), current/previous ids, the
    state file, the lock holder (None when free), whether rsync and systemd are present."""

    host: str
    root: str
    releases: dict[str, dict] = field(default_factory=dict)
    current: str | None = None
    previous: str | None = None
    state: dict = field(default_factory=lambda: {"schema": STATE_SCHEMA, "releases": {}})
    lock: dict | None = None
    rsync: bool = False
    systemd: bool = False
    incoming: list[str] = field(default_factory=list)
    current_launch: dict | None = None
    foreign: dict[str, str] = field(default_factory=dict)   # current/previous -> a target outside releases/
    broken: list[str] = field(default_factory=list)         # release folders missing MANIFEST.json or RELEASE.json
    envs: set[str] = field(default_factory=set)             # complete release environments (ROOT/envs/<digest>)
    owner: dict | None = None                               # ROOT/owner.json: the profile this root belongs to

    def release_state(self, rid: str) -> str:
        """active / previous / good / failed / pushed / ran. Only the current release is
        ``active``: one recorded ``active`` (its health gate passed) that is no longer current
        is ``ran``."""
        if rid == self.current:
            return "active"
        if rid == self.previous:
            return "previous"
        st = self.state.get("releases", {}).get(rid, {}).get("state", "pushed")
        return "ran" if st == "active" else st

    def recorded(self, rid: str) -> str | None:
        """The release's recorded state (pushed / active / good / failed), None without a record."""
        return self.state.get("releases", {}).get(rid, {}).get("state")

    def good(self, rid: str) -> bool:
        return self.recorded(rid) == "good"

    def when(self, rid: str) -> str:
        """Newest of activated_at / pushed_at / built_at (ISO 8601 UTC) for ordering."""
        s = self.state.get("releases", {}).get(rid, {})
        return s.get("activated_at") or s.get("pushed_at") or self.releases.get(rid, {}).get("built_at", "")


def facts_command(root: str) -> str:
    """One shell command printing every fact of a host in ``@section`` blocks (read-only)."""
    r = q(root)
    return f"""R={r}
echo @current; readlink "$R/current" 2>/dev/null || true
echo @previous; readlink "$R/previous" 2>/dev/null || true
echo @state; cat "$R/state.json" 2>/dev/null; echo
echo @lock; if [ -d "$R/.lock" ]; then cat "$R/.lock/holder.json" 2>/dev/null || echo '{{}}'; echo; fi
echo @rsync; command -v rsync >/dev/null 2>&1 && echo yes || true
echo @systemd; [ -d /run/systemd/system ] && echo yes || true
echo @launch; cat "$R/current/launch.json" 2>/dev/null; echo
echo @incoming; ls -1a "$R/releases" 2>/dev/null | grep '^\\.incoming-' || true
echo @envs; for d in "$R"/envs/e*/; do [ -f "$d/ENV.json" ] && basename "$d"; done; true
echo @owner; head -c 4096 "$R/owner.json" 2>/dev/null; echo
echo @broken
for d in "$R"/releases/r*/; do
  if [ -d "$d" ] && ! {{ [ -f "$d/RELEASE.json" ] && [ -f "$d/MANIFEST.json" ]; }}; then basename "$d"; fi
done
for d in "$R"/releases/r*/; do
  if [ -f "$d/RELEASE.json" ] && [ -f "$d/MANIFEST.json" ]; then echo @release; cat "$d/RELEASE.json"; echo; fi
done
echo @end"""


class StateFileError(RemoteError):
    """The host's state.json cannot be read as a state document (exit 3): nothing is written over it."""


_TEXT_FIELDS = ("state", "activated_at", "pushed_at", "promoted_at", "failed_at", "forced_at", "built_at")


def parse_state(host: str, root: str, body: str) -> dict:
    """The host's ``state.json`` (pure): ``{"releases": {id: {state, ...}}}`` with text states and
    times. Anything else — not JSON, another shape, a number where a time belongs — is a
    StateFileError naming the host and the path (exit 3, one line; nothing is written over it)."""
    def bad(why: str) -> StateFileError:
        return StateFileError(f"{host}: {root}/state.json is not a dsv4ctl state document ({why}); "
                              "move it aside or repair it")
    try:
        st = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise bad(f"not JSON: {str(e)[:80]}") from None
    if not isinstance(st, dict):
        raise bad(f"a JSON {type(st).__name__}, not an object")
    recs = st.get("releases", {})
    if not isinstance(recs, dict):
        raise bad("releases is not {id: {state, ...}}")
    for rid, rec in recs.items():
        if not isinstance(rec, dict):
            raise bad(f"releases.{rid[:40]} is not an object")
        for k in _TEXT_FIELDS:
            if k in rec and rec[k] is not None and not isinstance(rec[k], str):
                raise bad(f"releases.{rid[:40]}.{k} is not text")
    st["releases"] = recs
    return st


def release_link(root: str, target: str) -> str | None:
    """The release id a ``current``/``previous`` symlink target names (pure): ``releases/<id>``
    as the switch writes it, or ``<root>/releases/<id>``; None for anything else (a link into
    another folder, any ``..``: lexical normalisation cannot follow symlinks): that is not a
    release of this root. Empty and ``.`` components are dropped (``./releases//<id>``)."""
    def norm(p: str) -> str:
        parts = [x for x in p.split("/") if x not in ("", ".")]
        return ("/" if p.startswith("/") else "") + "/".join(parts) if ".." not in parts else "\0"
    t = norm(target)
    for pre in ("releases/", norm(root) + "/releases/"):
        if t.startswith(pre):
            rid = t[len(pre):]
            if rid and "/" not in rid and rid not in (".", "..") and not rid.startswith("."):
                return rid
    return None


def parse_facts(host: str, root: str, text: str) -> HostFacts:
    """HostFacts from the output of :func:`facts_command` (pure). A malformed state.json, launch.json or RELEASE.json → StateFileError (exit 3) naming the host and path."""
    sections: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("@") and line[1:].isalpha():
            sections.append((line[1:], []))
        elif sections:
            sections[-1][1].append(line)
    f = HostFacts(host, root)
    for name, lines in sections:
        body = "\n".join(lines).strip()
        if name in ("current", "previous") and body:
            rid = release_link(root, body)
            if rid is None:
                f.foreign[name] = body[:200]      # not ours: drift, replaced by the next switch
            else:
                setattr(f, name, rid)
        elif name == "state" and body:
            f.state = parse_state(host, root, body)
        elif name == "lock" and body:
            try:
                f.lock = json.loads(body)
            except ValueError:
                f.lock = {"raw": body[:200]}
        elif name == "rsync":
            f.rsync = body == "yes"
        elif name == "systemd":
            f.systemd = body == "yes"
        elif name == "launch" and body:
            try:
                f.current_launch = json.loads(body)
            except ValueError:
                f.current_launch = None
            if not isinstance(f.current_launch, dict) or not all(isinstance(v, dict)
                                                                 for v in f.current_launch.values()):
                raise StateFileError(f"{host}: {root}/current/launch.json is not a dsv4ctl launch spec "
                                     "(a release file was edited on the host: dsv4ctl verify)")
        elif name == "incoming" and body:
            f.incoming = [x[len(".incoming-"):] for x in body.split()]
        elif name == "broken" and body:
            f.broken = body.split()
        elif name == "envs" and body:
            f.envs = set(body.split())
        elif name == "owner" and body:
            f.owner = parse_owner(body)
        elif name == "release" and body:
            try:
                meta = json.loads(body)
            except ValueError:
                meta = None
            if not isinstance(meta, dict) or not isinstance(meta.get("id"), str):
                raise StateFileError(f"{host}: a RELEASE.json under {root}/releases is not a release record "
                                     "(a release file was edited on the host: dsv4ctl verify)")
            f.releases[meta["id"]] = meta
    return f


# -- which profile a deploy root belongs to ----------------------------------------------------

OWNER_SCHEMA = "dsv4ctl.root-owner/1"


def owner_doc(profile_name: str, profile_path) -> dict:
    """``ROOT/owner.json`` of a profile: its ``name`` (what ownership compares), the file it was
    read from, who, and (stamped by the host) since when."""
    from ..remote import who
    return {"schema": OWNER_SCHEMA, "profile": profile_name, "path": str(profile_path), "who": who()}


def parse_owner(body: str) -> dict:
    """An ``owner.json`` text → its dict (pure); ``{"raw": ...}`` when it is no owner record."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("profile"), str):
        return {"raw": body[:120]}
    return doc


def claim_cmd(root: str, doc: dict) -> str:
    """Shell: record ``doc`` as ``ROOT/owner.json`` unless the root has an owner already (run
    under the root's lock, when a run first takes it; written whole, then renamed)."""
    from .audit import stamped_json_cmd
    own = f"{root}/owner.json"
    return (f"if [ ! -e {q(own)} ] && [ ! -L {q(own)} ]; then {stamped_json_cmd(doc, key='since')} > {q(own + '.tmp')} "
            f"&& mv -f {q(own + '.tmp')} {q(own)}; fi")


class RootOwned(InputError):
    """A host's deploy root belongs to another profile (exit 2: nothing was changed)."""


def owner_conflict(facts: dict[str, HostFacts], profile_name: str) -> RootOwned | None:
    """The refusal (pure) when a host's deploy root belongs to another profile than
    ``profile_name`` (its recorded ``owner.json``; the profiles' ``name`` are compared): one line
    naming the host, the root and both profiles. None when every root is this profile's or has
    no owner yet."""
    for h, f in facts.items():
        o = f.owner
        if o is None or o.get("profile") == profile_name:
            continue
        if "raw" in o:
            return RootOwned(f"{h}: {f.root}/owner.json is not a dsv4ctl owner record: nothing changed (move it "
                             "aside if this root is profile " + repr(profile_name) + "'s)")
        since = f", since {o['since']}" if isinstance(o.get("since"), str) else ""
        return RootOwned(f"{h}: deploy root {f.root} belongs to profile {o['profile']!r} ({o.get('who', '?')}{since}); "
                         f"profile {profile_name!r} would replace its releases and stop its servers: nothing changed "
                         f"(give {profile_name!r} its own deploy.root or hosts[].root)")
    return None


def read_facts(t: Transport, root: str) -> HostFacts:
    """Facts of the host behind ``t`` (no change)."""
    return parse_facts(t.name, root, t.run(facts_command(root), timeout=60).out)


def select_prune(facts: HostFacts, keep: int, protect: set[str] = frozenset()) -> list[str]:
    """Release ids to delete so at most ``keep`` remain (``keep`` >= 1). Never deleted: ``current``
    (the running release), ``previous``, ``protect`` and the newest *good* release other than
    ``current`` (the target of a bare ``rollback`` and of the ``bad-release`` runbook). Among the rest, failed releases go
    first, then the others; oldest first by :meth:`HostFacts.when` within each kind. Returns the
    ids sorted."""
    keep = max(1, keep)
    ids = sorted(facts.releases, key=lambda r: (facts.when(r), r), reverse=True)      # newest first
    newest_good = next((r for r in ids if facts.good(r) and r != facts.current), None)
    fixed = {facts.current, facts.previous, newest_good} | set(protect)
    kept = [r for r in ids if r in fixed]
    rest = [r for r in ids if r not in fixed]
    # keep the newest non-failed ones first, then the newest failed ones, within ``keep``
    order = [r for r in rest if facts.recorded(r) != "failed"] + [r for r in rest if facts.recorded(r) == "failed"]
    room = max(0, keep - len(kept))
    return sorted(order[room:])


def kept_after_prune(facts: HostFacts, pruned: list[str]) -> list[str]:
    """The release ids a host keeps after ``pruned`` are deleted (newest first): what the audit
    record states."""
    gone = set(pruned)
    return [r for r in sorted(facts.releases, key=lambda r: (facts.when(r), r), reverse=True) if r not in gone]


def gated_ok(f: HostFacts, rid: str) -> bool:
    """``rid`` passed its health gate on the host of ``f`` (recorded ``active`` or ``good``) and
    was never marked failed (a ``--force-failed`` activation keeps its ``failed_at``)."""
    rec = f.state.get("releases", {}).get(rid, {})
    return rec.get("state") in ("active", "good") and not rec.get("failed_at")


def built(f: HostFacts, rid: str) -> str:
    """When ``rid`` was built (its RELEASE.json ``built_at``), else :meth:`HostFacts.when`."""
    return f.releases.get(rid, {}).get("built_at") or f.when(rid)


def choose_rollback_target(facts: dict[str, HostFacts], to: str | None = None,
                           command: str = "dsv4ctl rollback PROFILE", good_only: bool = False) -> tuple[str, str]:
    """(the release ``rollback`` activates, why it was chosen) (pure). ``to``: that release (it
    must be complete on every host). Without ``to``: the newest release built before the active
    one that is on every host, passed its health gate there and was never marked failed
    (:func:`gated_ok`; a release that is only pushed never ran); with ``good_only`` the newest
    such release recorded ``good`` (its promotion gate passed) on every host: the target of the
    ``bad-release`` runbook. InputError when there is none (nothing changes); its hint is a
    complete ``command`` (the profile as the user gave it)."""
    hosts = list(facts)
    if to is not None:
        missing = [h for h in hosts if to not in facts[h].releases]
        if missing:
            raise InputError(f"release {to} is not present on {', '.join(missing)} (see dsv4ctl releases)")
        return to, "given with --to"
    common = set.intersection(*(set(f.releases) for f in facts.values())) if facts else set()
    currents = {f.current for f in facts.values()}
    active = sorted(c for c in currents if c)
    newest_active = max((built(facts[h], facts[h].current) for h in hosts if facts[h].current), default=None)
    cands = [r for r in common if currents != {r} and all(gated_ok(f, r) for f in facts.values())
             and (newest_active is None or max(built(facts[h], r) for h in hosts) < newest_active)
             and (not good_only or all(f.recorded(r) == "good" for f in facts.values()))]
    if not cands and good_only:
        raise InputError(f"no release built before the active {', '.join(active) or '(none)'} is marked good "
                         "(passed its promotion gate: deploy --promote or dsv4ctl promote) on every host without "
                         "being marked failed: nothing to roll back to (see dsv4ctl releases)")
    if not cands:
        prev = {f.previous for f in facts.values()}
        hint = ""
        if len(prev) == 1 and None not in prev:
            p = next(iter(prev))
            forced = any(facts[h].state.get("releases", {}).get(p, {}).get("failed_at") for h in hosts)
            hint = (f"; the previous release is {p}" + (" (marked failed)" if forced else "")
                    + f": {command} --to {p}" + (" --force-failed" if forced else ""))
        raise InputError(f"no release built before the active {', '.join(active) or '(none)'} passed its health "
                         "gate on every host without being marked failed (see dsv4ctl releases)" + hint)
    target = max(cands, key=lambda r: (max(built(facts[h], r) for h in hosts), r))
    states = sorted({facts[h].recorded(target) for h in hosts})
    if good_only:
        return target, f"the newest release built before the active {', '.join(active)} marked good on every host"
    return target, (f"the newest release built before the active {', '.join(active)} that passed its health gate on "
                    f"every host and is not marked failed (recorded {'/'.join(states)})")


# -- launch commands ---------------------------------------------------------------------------

def render_launch(template: str, values: dict) -> str:
    """Fill ``{name}`` placeholders of a launch template (values are shell-quoted, except
    ``router_args`` and ``node_args``, already quoted words). InputError for an unknown name."""
    qv = {k: (v if k in ("router_args", "node_args") else shlex.quote(str(v))) for k, v in values.items()}
    try:
        return template.format(**qv)
    except (KeyError, IndexError) as e:
        raise InputError(f"launch command {template!r}: unknown placeholder {e} "
                         f"(known: {', '.join(sorted(values))})")
    except ValueError as e:
        raise InputError(f"launch command {template!r}: {e}")
