"""Runbook engine: ordered steps of dsv4ctl's own actions, conditions on earlier results,
confirmation before mutating steps, dry-run, resume from the failed step, repeat caps, and a
timeline for the incident report. No general-purpose scripting: conditions are a tiny
comparison language (:func:`parse_condition`), actions come from a registry.

Playbook shape (``playbooks/*.yaml``, validated by ``PLAYBOOK_SCHEMA``)::

    name: toolcall-corruption
    description: ...
    steps:
      - id: measure
        action: check.load
        args: {concurrency: 60}
      - id: mitigate
        action: hicache.off
        when: measure.corruption_upper > 0.01
        repeat: {max: 3, until: "remeasure.ok == true"}   # optional
      - id: canary
        action: config.set
        args: {groups: "@diag.hicache_crash_groups", set: {kv-canary: log}}

An arg whose value is ``"@step.field"`` takes an earlier step's result when the step runs
(:func:`resolve_args`); a dry run shows the reference (:func:`is_ref`).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import jsonschema

from ..errors import InputError

MAX_STEPS = 100
#: a describe line starting with this says the real run would stop at that step (dry-run exit 1)
DRY_RUN_ERROR = "would stop:"
MAX_ARGS_DEPTH = 8


def _depth(x: Any, d: int = 0) -> int:
    if d > MAX_ARGS_DEPTH:
        return d
    if isinstance(x, dict):
        return max([_depth(v, d + 1) for v in x.values()] or [d + 1])
    if isinstance(x, list):
        return max([_depth(v, d + 1) for v in x] or [d + 1])
    return d


PLAYBOOK_SCHEMA: dict = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "steps"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]*$"},
        "description": {"type": "string"},
        "pd_only": {"type": "boolean"},
        "steps": {
            "type": "array", "minItems": 1, "maxItems": MAX_STEPS,
            "items": {
                "type": "object", "additionalProperties": False,
                "required": ["id", "action"],
                "properties": {
                    "id": {"type": "string", "pattern": "^[a-z0-9_]+$"},
                    "action": {"type": "string"},
                    "description": {"type": "string"},
                    "args": {"type": "object"},
                    "when": {"type": "string"},
                    "stage": {"type": "string"},
                    "repeat": {
                        "type": "object", "additionalProperties": False, "required": ["max"],
                        "properties": {"max": {"type": "integer", "minimum": 1, "maximum": 20},
                                       "until": {"type": "string"}},
                    },
                    "continue_on_failure": {"type": "boolean"},
                    "verifies": {"type": "boolean"},
                },
            },
        },
    },
}

_COND = re.compile(
    r"^\s*(?P<ref>[a-z0-9_]+(?:\.[A-Za-z0-9_]+)+)\s*"
    r"(?P<op>==|!=|>=|<=|>|<)\s*(?P<lit>-?\d+(?:\.\d+)?(?:e-?\d+)?|true|false|null|'[^']*'|\"[^\"]*\")\s*$")


@dataclass(frozen=True)
class Comparison:
    """``step.field[.sub] OP literal``."""

    ref: tuple[str, ...]
    op: str
    value: Any


def _literal(s: str) -> Any:
    if s in ("true", "false"):
        return s == "true"
    if s == "null":
        return None
    if s[0] in "'\"":
        return s[1:-1]
    return float(s) if any(c in s for c in ".e") else int(s)


def parse_condition(text: str) -> list[list[Comparison]]:
    """Parse ``a.b > 1 and c.ok == true or d.ran == false`` into OR-of-AND comparisons.

    Raises InputError naming the bad clause. Only dotted references, the six comparison
    operators and literals (numbers, true/false/null, quoted strings) are allowed."""
    alts = []
    for alt in re.split(r"\s+or\s+", text.strip()):
        clauses = []
        for clause in re.split(r"\s+and\s+", alt):
            m = _COND.match(clause)
            if not m:
                raise InputError(f"condition {text!r}: cannot parse {clause!r} "
                                 "(expected step.field OP literal, joined by and/or)")
            clauses.append(Comparison(tuple(m["ref"].split(".")), m["op"], _literal(m["lit"])))
        alts.append(clauses)
    return alts


def _lookup(results: dict[str, dict], ref: tuple[str, ...]) -> Any:
    cur: Any = results.get(ref[0])
    if cur is None:
        # a step that did not run: only .ran is defined (False)
        return False if ref[1:] == ("ran",) else None
    for part in ref[1:]:
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


_REF = re.compile(r"^@(?P<ref>[a-z0-9_]+(?:\.[A-Za-z0-9_]+)+)$")


def is_ref(value: Any) -> bool:
    """True for an arg value ``"@step.field[.sub]"`` (a reference to an earlier step's result)."""
    return isinstance(value, str) and _REF.match(value) is not None


def arg_refs(args: dict) -> list[tuple[str, ...]]:
    """The references among ``args``' top-level values, as ``(step, field, ...)`` tuples."""
    return [tuple(_REF.match(v)["ref"].split(".")) for v in args.values() if is_ref(v)]


def nested_refs(args: dict) -> list[str]:
    """``"@step.field"`` strings inside a list or mapping arg (not supported: a playbook that has one
    is refused at load; only a whole top-level value is a reference)."""
    def inside(x: Any) -> list[str]:
        if isinstance(x, dict):
            return [r for v in x.values() for r in inside(v)]
        if isinstance(x, list):
            return [r for v in x for r in inside(v)]
        return [x] if is_ref(x) else []
    return [r for v in args.values() if isinstance(v, (dict, list)) for r in inside(v)]


def resolve_args(args: dict, results: dict[str, dict]) -> dict:
    """``args`` with each ``"@step.field"`` value replaced by that earlier result: None when the
    step did not run (skipped by its condition). InputError when the step ran and its result has
    no such field (a misspelt reference must not turn into "nothing to do"). Pure."""
    out = {}
    for k, v in args.items():
        if not is_ref(v):
            out[k] = v
            continue
        ref = tuple(_REF.match(v)["ref"].split("."))
        res = results.get(ref[0])
        if res is not None and res.get("ran", True) is not False:
            cur: Any = res
            for part in ref[1:]:
                if not isinstance(cur, dict) or part not in cur:
                    raise InputError(f"args.{k}: {v}: step {ref[0]}'s result has no {'.'.join(ref[1:])} "
                                     f"(it has: {', '.join(sorted(res)) or 'nothing'})")
                cur = cur[part]
        out[k] = _lookup(results, ref)
    return out


def evaluate(cond: list[list[Comparison]], results: dict[str, dict]) -> bool:
    """Evaluate a parsed condition against earlier step results (missing values compare False)."""
    ops: dict[str, Callable[[Any, Any], bool]] = {
        "==": lambda a, b: a == b, "!=": lambda a, b: a != b, ">": lambda a, b: a > b,
        "<": lambda a, b: a < b, ">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b}

    def one(c: Comparison) -> bool:
        v = _lookup(results, c.ref)
        if v is None and c.op not in ("==", "!="):
            return False
        try:
            return ops[c.op](v, c.value)
        except TypeError:
            return False
    return any(all(one(c) for c in alt) for alt in cond)


@dataclass
class Action:
    """A built-in action. ``run(ctx, args) -> result dict`` (must contain ``ok``);
    ``describe(ctx, args) -> list of lines`` says what it would do (dry-run, confirmation)."""

    name: str
    mutating: bool
    run: Callable[[Any, dict], dict]
    describe: Callable[[Any, dict], list[str]]


@dataclass
class Step:
    id: str
    action: str
    args: dict
    when: Optional[str]
    repeat_max: int
    until: Optional[str]
    continue_on_failure: bool
    description: str = ""
    verifies: bool = False      # a final check: the last one that ran decides the run's outcome


@dataclass
class Playbook:
    name: str
    description: str
    steps: list[Step]
    pd_only: bool = False       # needs prefill and decode groups (a colocated profile is refused)


_YAML11_BOOLS = "on/off/yes/no/true/false"


def _bool_hint(data: dict, where: str) -> None:
    """A step id or playbook name that YAML 1.1 read as a boolean (``id: off``) gets a hint to
    quote it instead of the schema's "False is not of type 'string'"."""
    if isinstance(data.get("name"), bool):
        raise InputError(f"{where}: name: read as the boolean {data['name']} (YAML 1.1 reads "
                         f"{_YAML11_BOOLS} as booleans): quote it, e.g. name: \"off\"")
    steps = data.get("steps")
    for i, st in enumerate(steps if isinstance(steps, list) else []):
        if isinstance(st, dict) and isinstance(st.get("id"), bool):
            raise InputError(f"{where}: steps[{i}].id: read as the boolean {st['id']} (YAML 1.1 reads "
                             f"{_YAML11_BOOLS} as booleans): quote it, e.g. id: \"off\"")


def load_playbook_data(data: Any, where: str, actions: dict[str, Action]) -> Playbook:
    """Validate a parsed playbook against the schema, the action registry and the conditions."""
    if not isinstance(data, dict):
        raise InputError(f"{where}: a playbook must be a mapping")
    _bool_hint(data, where)
    for i, st in enumerate(data.get("steps") or [] if isinstance(data.get("steps"), list) else []):
        if isinstance(st, dict) and _depth(st.get("args")) > MAX_ARGS_DEPTH:
            raise InputError(f"{where}: steps[{i}].args: nested deeper than {MAX_ARGS_DEPTH} levels")
    errs = sorted(jsonschema.Draft202012Validator(PLAYBOOK_SCHEMA).iter_errors(data), key=lambda e: list(e.absolute_path))
    if errs:
        e = errs[0]
        path = ".".join(map(str, e.absolute_path)) or "(root)"
        raise InputError(f"{where}: {path}: {e.message}")
    steps, seen = [], set()
    for i, s in enumerate(data["steps"]):
        if s["id"] in seen:
            raise InputError(f"{where}: steps[{i}].id: duplicate step id {s['id']!r}")
        if s["action"] not in actions:
            raise InputError(f"{where}: steps[{i}].action: unknown action {s['action']!r} "
                             f"(built-in: {', '.join(sorted(actions))})")
        for key in ("when",):
            if s.get(key):
                for alt in parse_condition(s[key]):
                    for c in alt:
                        if c.ref[0] not in seen:
                            raise InputError(f"{where}: steps[{i}].{key}: refers to {c.ref[0]!r}, "
                                             "which is not an earlier step")
        deep = nested_refs(s.get("args", {}))
        if deep:
            raise InputError(f"{where}: steps[{i}].args: {deep[0]}: a reference is only taken as a whole "
                             "top-level arg value (e.g. groups: \"@diag.hicache_crash_groups\")")
        for ref in arg_refs(s.get("args", {})):
            if ref[0] not in seen:
                raise InputError(f"{where}: steps[{i}].args: refers to {ref[0]!r}, which is not an earlier step")
        seen.add(s["id"])
        rep = s.get("repeat", {})
        if rep.get("until"):
            for alt in parse_condition(rep["until"]):
                for c in alt:
                    if c.ref[0] not in seen:
                        raise InputError(f"{where}: steps[{i}].repeat.until: refers to {c.ref[0]!r}, "
                                         "which is not this or an earlier step")
        steps.append(Step(id=s["id"], action=s["action"], args=dict(s.get("args", {})), when=s.get("when"),
                          repeat_max=rep.get("max", 1), until=rep.get("until"),
                          continue_on_failure=s.get("continue_on_failure", False),
                          description=s.get("description", ""), verifies=bool(s.get("verifies", False))))
    return Playbook(name=data["name"], description=data.get("description", ""), steps=steps,
                    pd_only=bool(data.get("pd_only", False)))


@dataclass
class Event:
    """One timeline entry of a run."""

    step: str
    action: str
    status: str             # ran | skipped | failed | dry-run | dry-run-error | declined | interrupted
    started: float
    ended: float
    attempt: int = 1
    result: dict = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return dict(step=self.step, action=self.action, status=self.status, attempt=self.attempt,
                    started=self.started, ended=self.ended, result=self.result, lines=self.lines)


@dataclass
class RunState:
    """What a run has done so far; saved after every step so a failed run can resume."""

    playbook: str
    run_id: str
    results: dict[str, dict] = field(default_factory=dict)
    done: list[str] = field(default_factory=list)
    timeline: list[Event] = field(default_factory=list)
    failed_step: Optional[str] = None
    inputs: dict = field(default_factory=dict)     # what the run was started with (--release, --evidence)

    def to_dict(self) -> dict:
        return dict(playbook=self.playbook, run_id=self.run_id, results=self.results, done=self.done,
                    failed_step=self.failed_step, inputs=self.inputs, timeline=[e.to_dict() for e in self.timeline])

    @classmethod
    def from_dict(cls, d: dict) -> "RunState":
        """Rebuild a saved state; InputError when it is not one."""
        try:
            return cls._from_dict(d)
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise InputError(f"not a runbook run state ({type(e).__name__}: {e})") from None

    @classmethod
    def _from_dict(cls, d: dict) -> "RunState":
        st = cls(playbook=d["playbook"], run_id=d["run_id"], results=d.get("results", {}),
                 done=list(d.get("done", [])), failed_step=d.get("failed_step"), inputs=dict(d.get("inputs") or {}))
        st.timeline = [Event(**{k: v for k, v in e.items()}) for e in d.get("timeline", [])]
        return st


def execute(pb: Playbook, actions: dict[str, Action], ctx: Any, state: RunState, *,
            dry_run: bool = False, confirm: Callable[[Step, list[str]], bool] = lambda s, l: True,
            save: Callable[[RunState], None] = lambda s: None,
            clock: Callable[[], float] = time.time) -> RunState:
    """Run ``pb``'s steps in order, skipping steps already in ``state.done`` (resume).

    * ``when`` false → the step is skipped (recorded).
    * Mutating steps need ``confirm(step, lines)`` to return True (``--yes`` passes a
      function that always does); a declined step stops the run without failing it.
    * ``repeat: {max, until}`` re-runs a step until the condition holds, at most ``max`` times.
    * A failed step (``ok`` False or an exception) stops the run unless ``continue_on_failure``;
      ``state.failed_step`` names it and a later call resumes there.
    * ``dry_run`` runs nothing: each step's ``describe`` lines are recorded, conditions on
      unknown results are shown as such; ``"@step.field"`` args reach ``describe`` unresolved.
    * Otherwise ``"@step.field"`` args are resolved from the results so far (:func:`resolve_args`).
    """
    state.failed_step = None
    for step in pb.steps:
        if step.id in state.done:
            continue
        action = actions[step.action]
        if dry_run:
            _describe_step(step, action, ctx, state, clock)
            continue
        if not _run_step(step, action, ctx, state, confirm, save, clock):
            return state
    return state


def _describe_step(step: Step, action: Action, ctx: Any, state: RunState, clock: Callable[[], float]) -> None:
    """Dry run of one step: its ``describe`` lines (an error of ``describe`` becomes a line
    starting with :data:`DRY_RUN_ERROR`, the event ``dry-run-error``) appended to the timeline."""
    t0 = clock()
    try:
        lines = action.describe(ctx, step.args)
    except InputError as e:     # e.g. no tree configured: the real run would stop here
        lines = [f"{DRY_RUN_ERROR} {e}"]
    except Exception as e:  # noqa: BLE001 - a describe that cannot reach a host: said, not raised
        lines = [f"{DRY_RUN_ERROR} {type(e).__name__}: {e}"]
    bad = any(ln.startswith(DRY_RUN_ERROR) for ln in lines)
    if step.when:
        lines = [f"only if {step.when}"] + lines
    state.timeline.append(Event(step.id, step.action, "dry-run-error" if bad else "dry-run", t0, t0, lines=lines))


def _run_step(step: Step, action: Action, ctx: Any, state: RunState, confirm: Callable[[Step, list[str]], bool],
              save: Callable[[RunState], None], clock: Callable[[], float]) -> bool:
    """One step of a real run (see :func:`execute`): skipped on a false ``when``, its arguments
    resolved, confirmed when mutating, run (repeated as its ``repeat`` says). True when the run
    goes on; False when it stops here (a failed reference or step, a declined confirmation), with
    ``state`` saved."""
    t0 = clock()
    if step.when and not evaluate(parse_condition(step.when), state.results):
        state.results[step.id] = {"ran": False, "ok": True}
        state.done.append(step.id)
        state.timeline.append(Event(step.id, step.action, "skipped", t0, clock(),
                                    lines=[f"condition false: {step.when}"]))
        save(state)
        return True
    try:
        args = resolve_args(step.args, state.results)
    except InputError as e:     # a reference to a field the step's result does not have
        state.results[step.id] = {"ok": False, "ran": True, "error": str(e)}
        state.timeline.append(Event(step.id, step.action, "failed", t0, clock(), result=state.results[step.id]))
        state.failed_step = step.id
        save(state)
        return False
    if action.mutating:
        lines = action.describe(ctx, args)
        if not confirm(step, lines):
            state.timeline.append(Event(step.id, step.action, "declined", t0, clock(), lines=lines))
            save(state)
            return False
    ok = _attempts(step, action, ctx, args, state, save, clock)
    if not ok and not step.continue_on_failure:
        state.failed_step = step.id
        save(state)
        return False
    state.done.append(step.id)
    save(state)
    return True


def _attempts(step: Step, action: Action, ctx: Any, args: dict, state: RunState,
              save: Callable[[RunState], None], clock: Callable[[], float]) -> bool:
    """Run ``step`` until it is done: once, or again while its ``until`` does not hold (or, with
    no ``until``, while it fails) up to ``repeat_max`` attempts; every attempt's result and event
    recorded and saved. Returns whether the last attempt was ok. An InputError of the action, and
    an interrupt (recorded as ``interrupted``), propagate."""
    attempt = 0
    while True:
        attempt += 1
        t0 = clock()
        seen = len(getattr(ctx, "evidence", None) or [])
        try:
            result = dict(action.run(ctx, args))
        except InputError:
            raise
        except KeyboardInterrupt:   # SIGINT, or SIGTERM turned into one by the command
            state.results[step.id] = {"ok": False, "ran": True, "attempts": attempt, "error": "interrupted"}
            state.timeline.append(Event(step.id, step.action, "interrupted", t0, clock(), attempt=attempt,
                                        result=state.results[step.id]))
            state.failed_step = step.id
            save(state)
            raise
        except Exception as e:  # noqa: BLE001 - recorded in the timeline, the run stops
            result = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        result.setdefault("ok", False)
        result["ran"] = True
        result["attempts"] = attempt
        files = list((getattr(ctx, "evidence", None) or [])[seen:])
        if files:       # this attempt's own output files in the run folder (never overwritten)
            result["evidence_files"] = [f"{f}.out" for f in files]
        state.results[step.id] = result
        ok = bool(result["ok"])
        state.timeline.append(Event(step.id, step.action, "ran" if ok else "failed", t0, clock(),
                                    attempt=attempt, result=result))
        save(state)
        if step.until and attempt < step.repeat_max and not evaluate(parse_condition(step.until), state.results):
            continue
        if not step.until and not ok and attempt < step.repeat_max:
            continue
        return ok


def final_verification(pb: Playbook, state: RunState) -> dict | None:
    """The run's final verification (pure): the last step marked ``verifies: true`` that ran, as
    ``{"step", "action", "passed"}`` (``passed``: its result's ``passed``, else its ``ok``); None
    when none ran. A run that completes with ``passed`` False did not fix what it was for: the
    command exits 1."""
    last = None
    for st in pb.steps:
        res = state.results.get(st.id)
        if st.verifies and isinstance(res, dict) and res.get("ran", True) and st.id in state.done:
            last = {"step": st.id, "action": st.action,
                    "passed": bool(res.get("passed", res.get("ok", False)))}
    return last

