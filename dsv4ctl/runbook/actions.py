"""Built-in runbook actions: thin adapters from playbook args to dsv4ctl's own cores.

Each action returns a result dict with ``ok`` (the action could run) and its findings
(e.g. ``passed`` and ``corruption_upper`` for checks); a finding is data for later ``when``
conditions, not a failure of the run."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import InputError
from .engine import DRY_RUN_ERROR, Action, is_ref

MAX_WAIT_S = 3600


@dataclass
class RunContext:
    """What actions see: the profile, where evidence goes, how to print progress."""

    profile: Any
    run_dir: Path
    say: Callable[[str], None] = print
    sleep: Callable[[float], None] = time.sleep
    extra: dict = field(default_factory=dict)
    touched_hosts: set = field(default_factory=set)   # hosts a mutating step changed (audit)
    children: set = field(default_factory=set)        # dsv4ctl child processes running now
    evidence: list = field(default_factory=list)      # evidence files written so far, in order (names)
    _deployment: Any = None

    def evidence_name(self, base: str) -> str:
        """``base``, or ``base-2``, ``base-3``... when a step of this run already wrote it: a
        step's output is never overwritten (a runbook that runs smoke twice keeps both)."""
        name, n = base, 1
        while (self.run_dir / f"{name}.out").exists() or name in self.evidence:
            n += 1
            name = f"{base}-{n}"
        return name

    @property
    def deployment(self):
        """The profile resolved once (:func:`dsv4ctl.profile.deployment.resolve`)."""
        if self._deployment is None:
            from ..profile.deployment import as_deployment
            self._deployment = as_deployment(self.profile)
        return self._deployment

    def groups(self, args: dict) -> list:
        """The server groups named by ``args.groups``; without the key every server group; a
        key resolved to nothing (``"@diag.hicache_crash_groups"`` naming none) none. InputError
        for an unresolved reference (describe it with :func:`groups_line` instead)."""
        if "groups" not in args:
            return self.profile.servers()
        names = args["groups"]
        if is_ref(names):
            raise InputError(f"groups: {names} is known when the step runs")
        if isinstance(names, str):
            names = [names]
        return [self.profile.group(n) for n in names or []]


def _bad_groups(args: dict) -> Optional[str]:
    """Why ``args.groups`` is not a group name or a list of names (e.g. a reference that resolved
    to a boolean), else None."""
    g = args.get("groups")
    if g is None or isinstance(g, str) or (isinstance(g, list) and all(isinstance(x, str) for x in g)):
        return None
    return f"groups: expected a group name or a list of names, got {g!r}"


def groups_line(ctx: RunContext, args: dict) -> Optional[str]:
    """For a describe (dry run): the group words of an unresolved ``"@step.field"`` groups arg
    (``the groups diag.hicache_crash_groups names``), else None."""
    g = args.get("groups")
    return f"the groups {g[1:]} names (known when it runs)" if is_ref(g) else None


def _note_run(ctx: RunContext, args: dict) -> dict:
    text = str(args.get("text", ""))
    ctx.say(f"note: {text}")
    return {"ok": True, "text": text}


def _wait_seconds(args: dict) -> float:
    try:
        s = float(args.get("seconds", 0))
    except (TypeError, ValueError):
        raise InputError(f"wait: seconds must be a number, got {args.get('seconds')!r}") from None
    if not 0 <= s <= MAX_WAIT_S:
        raise InputError(f"wait: seconds must be within 0..{MAX_WAIT_S}, got {s}")
    return s


def _wait_run(ctx: RunContext, args: dict) -> dict:
    s = _wait_seconds(args)
    ctx.sleep(s)
    return {"ok": True, "seconds": s}


def _plan_run(ctx: RunContext, args: dict) -> dict:
    from ..plan.plan import build_plan, parse_set
    sets = [f"{k}={v}" for k, v in (args.get("set") or {}).items()]
    report = build_plan(ctx.deployment, parse_set(sets), args.get("groups"))
    doc = report.to_dict()
    (ctx.run_dir / "plan.json").write_text(__import__("json").dumps(doc, indent=2))
    groups = {g["name"]: dict(errors=g["errors"], fixes=g["fixes"], level=g["verdict"]["level"],
                              deciding=g["verdict"]["deciding"], shortfall_gib=g["verdict"].get("shortfall_gib"),
                              full_max_total_num_tokens=min(r["full_max_total_num_tokens"] for r in g["ranks"]) if g["ranks"] else 0,
                              headroom_gib=min(r["headroom_gib"] for r in g["ranks"]) if g["ranks"] else None)
              for g in doc["groups"]}
    return {"ok": True, "fits": _worst(doc) == "fits", "level": _worst(doc), "planned_ok": report.ok,
            "groups": groups, "summary": plan_summary(doc)}


def _worst(doc: dict) -> str:
    """The worst group verdict of a plan document: ``fails``, ``tight`` or ``fits``."""
    levels = [g["verdict"]["level"] for g in doc["groups"]]
    return next((lv for lv in ("fails", "tight") if lv in levels), "fits")


def plan_summary(doc: dict) -> str:
    """One line of a plan for a runbook note, in the plan's words: each group that is not ``fits``
    with its verdict, deciding term, shortfall and first fix (issue 44.4: a ``tight`` is never
    reported as fitting); "every group fits" otherwise."""
    parts = []
    for g in doc["groups"]:
        v = g["verdict"]
        if v["level"] == "fits":
            continue
        short = (f", short by {v['shortfall_gib']} GiB" if v.get("shortfall_gib") else
                 f", short of {v['shortfall_requests']} request(s)" if v.get("shortfall_requests") else "")
        fix = f"; fix: {g['fixes'][0]}" if g["fixes"] else "; no fix found"
        parts.append(f"{g['name']} {v['level']} ({v['deciding']}{short}){fix}")
    return "; ".join(parts) if parts else "every group fits"


def _cli_argv(ctx: RunContext, base: list[str], args: dict, flags: dict[str, str],
              positional: tuple[str, ...] = ()) -> list[str]:
    """Build ``dsv4ctl`` argv from playbook args: ``flags`` maps arg name → option; lists repeat
    the option; True booleans become bare flags; ``positional`` args come first."""
    argv = list(base)
    for name in positional:
        v = args.get(name)
        if v is None:
            continue
        argv += [str(x) for x in v] if isinstance(v, list) else [str(v)]
    for name, opt in flags.items():
        v = args.get(name)
        if v is None or v is False:
            continue
        if v is True:
            argv.append(opt)
        elif isinstance(v, list):
            if opt in ("--concurrency", "-c"):
                argv += [opt, ",".join(map(str, v))]
            else:
                for x in v:
                    argv += [opt, str(x)]
        else:
            argv += [opt, str(v)]
    unknown = sorted(set(args) - set(flags) - set(positional))
    if unknown:
        raise InputError(f"{' '.join(base)}: unknown argument(s) {', '.join(unknown)}")
    return argv


def _run_cli(ctx: RunContext, argv: list[str], evidence: str) -> tuple[int, Any, str]:
    """Run ``dsv4ctl ARGV`` (a child process of the same installation); keep its output as
    evidence in the run folder; return (exit code, parsed JSON or None, last stderr line)."""
    import json
    import subprocess
    import sys
    evidence = ctx.evidence_name(evidence)
    ctx.evidence.append(evidence)
    argv = with_message(argv, ctx.extra.get("evidence"))
    out_p, err_p = ctx.run_dir / f"{evidence}.out", ctx.run_dir / f"{evidence}.err"
    # the child runs in its own process group: on SIGINT/SIGTERM of the runbook it is stopped
    # (TERM to its group, KILL after CHILD_STOP_S) before the runbook exits, so nothing keeps
    # changing hosts behind an interrupted run
    with open(out_p, "w") as fo, open(err_p, "w") as fe:
        proc = subprocess.Popen([sys.executable, "-m", "dsv4ctl.cli", *argv], stdout=fo, stderr=fe,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        ctx.children.add(proc)
        t0 = time.monotonic()
        try:
            while True:
                try:
                    proc.wait(timeout=PROGRESS_S)
                    break
                except subprocess.TimeoutExpired:
                    ctx.say(f"  ... dsv4ctl {argv[0]}{' ' + argv[1] if len(argv) > 1 and not argv[1].startswith(('/', '-')) else ''}"
                            f" running for {time.monotonic() - t0:.0f} s{_progress_hint(ctx, argv)}")
        except BaseException:
            stop_child(proc)
            raise
        finally:
            ctx.children.discard(proc)
    stdout, stderr = out_p.read_text(), err_p.read_text()
    try:
        doc = json.loads(stdout) if stdout.strip().startswith(("{", "[")) else None
    except ValueError:
        doc = None
    err = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    return proc.returncode, doc, err


#: Commands that take ``-m`` (their audit records carry it); ``hicache``/``config set`` with
#: ``--remote`` only.
MESSAGE_COMMANDS = ("deploy", "rollback", "promote", "start", "stop", "restart")
MESSAGE_MAX = 500       # dsv4ctl.commands.options.MAX_MESSAGE


def with_message(argv: list[str], why) -> list[str]:
    """``argv`` with ``-m WHY`` (the run's ``--evidence/-m``, its first MESSAGE_MAX characters)
    when the command it runs changes hosts and takes ``-m``: the run's reason is in every audit
    record it causes. ``argv`` unchanged without a reason or when it already gives one."""
    if not why or "-m" in argv or "--message" in argv or not argv:
        return argv
    remote = "--remote" in argv and argv[0] in ("hicache", "config")
    if argv[0] not in MESSAGE_COMMANDS and not remote:
        return argv
    return [*argv, "-m", str(why)[:MESSAGE_MAX].strip()]


#: seconds between progress lines while a child command runs; seconds a stopped child gets
PROGRESS_S = 10.0
CHILD_STOP_S = 20.0


def _progress_hint(ctx: RunContext, argv: list[str]) -> str:
    """``, N turns done`` for a check load writing ``--records`` (lines so far), else ''."""
    if "--records" in argv:
        try:
            with open(argv[argv.index("--records") + 1], "rb") as f:
                return f", {sum(1 for _ in f)} turns done"
        except (OSError, IndexError):
            return ""
    return ""


def stop_child(proc) -> None:
    """SIGTERM the child's process group, SIGKILL it after :data:`CHILD_STOP_S` s (the child
    finishes or undoes its change and writes its audit record in between); the one group stop
    (:func:`dsv4ctl.patches.gitio.stop_group`)."""
    from ..patches.gitio import stop_group
    if proc.poll() is None:
        stop_group(proc, CHILD_STOP_S)


def _profile_args(ctx: RunContext) -> list[str]:
    return [str(ctx.profile.path)]


_LOAD_FLAGS = {"concurrency": "--concurrency", "turns": "--turns", "max_corruption": "--max-corruption",
               "stream": "--stream", "stall_timeout": "--stall-timeout", "min_requests": "--min-requests",
               "answer_words": "--answer-words", "model": "--model", "max_duration": "--max-duration"}


def _check_load_argv(ctx: RunContext, args: dict) -> list[str]:
    a = dict(args)
    url = a.pop("url", None)
    a.setdefault("concurrency", ctx.deployment.check.concurrency_arg)
    a.setdefault("max_corruption", ctx.deployment.check.max_corruption)
    base = ["check", "load"] + ([url] if url else ["--profile", str(ctx.profile.path)])
    return _cli_argv(ctx, base, a, _LOAD_FLAGS) + ["--json", "--no-progress"]


def _check_load_run(ctx: RunContext, args: dict) -> dict:
    n = sum(1 for _ in ctx.run_dir.glob("check-load*.out"))
    name = f"check-load-{n + 1}"
    argv = _check_load_argv(ctx, args) + ["--records", str(ctx.run_dir / f"{name}.jsonl")]
    code, doc, err = _run_cli(ctx, argv, name)
    if code not in (0, 1) or not isinstance(doc, dict):
        return {"ok": False, "reachable": False, "error": err or f"check load exited {code}"}
    levels = doc.get("levels", [])
    crashed = [lv for lv in levels if lv.get("crashed")]
    if crashed:
        # the server stopped answering: not a measurement of corruption; the playbook diagnoses
        why = crashed[0].get("crash_reason") or err or "the server stopped answering"
        out = {"ok": False, "reachable": False, "passed": False, "crashed": True, "error": why,
               "evidence": f"{name}.out"}
        out.update(_mark_failed(ctx, "runbook check.load (the server stopped answering)", why,
                                [f"{ctx.run_dir / name}.out"], None))
        return out
    worst = max(levels, key=lambda lv: lv["wilson95"][1]) if levels else {"wilson95": [None, None]}
    return {"ok": True, "reachable": True, "passed": code == 0, "corruption_rate": worst.get("rate"),
            "corruption_upper": worst["wilson95"][1], "concurrency": worst.get("concurrency"),
            "stuck": sum(lv.get("stuck", 0) for lv in levels),
            # the servers' counter when scraped, and never fewer than the PD aborts the client saw
            "transfer_failed": sum(max((lv.get("metrics") or {}).get("sglang:num_transfer_failed_reqs_total", 0),
                                       sum((lv.get("classes") or {}).get(c, {}).get("count", 0)
                                           for c in ("pd_transfer_failed", "pd_bootstrap_failed")))
                                   for lv in levels),
            "aborted": sum((lv.get("metrics") or {}).get("sglang:num_aborted_requests_total", 0) for lv in levels),
            "turns": sum(lv.get("turns", 0) for lv in levels), "evidence": f"{name}.out"}


def _check_smoke_run(ctx: RunContext, args: dict) -> dict:
    a = dict(args)
    url = a.pop("url", None)
    base = ["check", "smoke"] + ([url] if url else ["--profile", str(ctx.profile.path)])
    code, doc, err = _run_cli(ctx, _cli_argv(ctx, base, a, {"model": "--model", "timeout": "--timeout"}) + ["--json"], "check-smoke")
    if code not in (0, 1):
        return {"ok": False, "reachable": False, "error": err or f"check smoke exited {code}"}
    return {"ok": True, "reachable": True, "passed": code == 0, "evidence": f"{ctx.evidence[-1]}.out"}


_HICACHE_FLAGS = {"groups": "--group", "ratio": "--ratio", "write_policy": "--write-policy",
                  "io_backend": "--io-backend", "mem_layout": "--mem-layout",
                  "storage_backend": "--storage-backend", "remote": "--remote",
                  "health_timeout": "--health-timeout", "tree": "--tree"}


def _hicache(state: str):
    def argv(ctx: RunContext, args: dict) -> list[str]:
        flags = _HICACHE_FLAGS if state == "on" else {k: v for k, v in _HICACHE_FLAGS.items()
                                                      if k in ("groups", "remote", "health_timeout", "tree")}
        return _cli_argv(ctx, ["hicache", state] + _profile_args(ctx), args, flags)

    def run(ctx: RunContext, args: dict) -> dict:
        if _bad_groups(args):
            return {"ok": False, "error": _bad_groups(args)}
        if "groups" in args and not args["groups"]:     # a reference that names no group: not "every group"
            return {"ok": True, "hicache": state, "changed": [], "note": "no group to change"}
        code, doc, err = _run_cli(ctx, argv(ctx, args) + ["--json"], f"hicache-{state}")
        if args.get("remote"):
            ctx.touched_hosts.update(h for g in ctx.groups(args) for h in g.hosts)
        return {"ok": code == 0, "error": err} if code else {"ok": True, "hicache": state}

    def describe(ctx: RunContext, args: dict) -> list[str]:
        return _serve_change_describe(ctx, args, argv, f"hicache-{state}-dry-run")
    return run, describe


def _serve_change_describe(ctx: RunContext, args: dict, argv: Callable[[RunContext, dict], list[str]],
                           evidence: str) -> list[str]:
    """Dry-run lines of a serve-config change (``hicache on|off``, ``config set``): the command and
    its own ``--dry-run`` output; with ``groups`` still a reference, the command with the groups
    named as such (its dry run needs them)."""
    if groups_line(ctx, args):
        a = {k: v for k, v in args.items() if k != "groups"}
        return [f"dsv4ctl {' '.join(argv(ctx, a))} -g <{groups_line(ctx, args)}>"
                + (": a release with the edited serve configs; only those groups restart behind the deploy's gate"
                   if args.get("remote") else "")]
    code, _, err = _run_cli(ctx, argv(ctx, args) + ["--dry-run"], evidence)
    out = (ctx.run_dir / f"{ctx.evidence[-1]}.out").read_text().splitlines()
    return [f"dsv4ctl {' '.join(argv(ctx, args))}"] + out[:40] + \
        ([f"{DRY_RUN_ERROR} {err or 'the dry run exited ' + str(code)}"] if code else [])


_CONFIG_FLAGS = {"groups": "--group", "unset": "--unset", "remote": "--remote", "health_timeout": "--health-timeout",
                 "tree": "--tree"}


def _config_set_argv(ctx: RunContext, args: dict) -> list[str]:
    import json
    a = dict(args)
    sets = a.pop("set", None) or {}
    if not isinstance(sets, dict):
        raise InputError(f"config.set: set must be a mapping of serve-config keys to values, got {sets!r}")
    from ..profile.secrets import is_secret_key
    bad = [k for k in sets if is_secret_key(str(k))]
    if bad:      # a playbook's args end up in argv, the dry run and the evidence files
        raise InputError(f"config.set: {bad[0]} is a secret: set it in the serve config by hand "
                         "(dsv4ctl config set keeps it out of its output, a playbook cannot)")
    def text(v) -> str:       # YAML for the CLI: a plain string stays plain when it reads back as itself
        import yaml
        if isinstance(v, str):
            try:
                if yaml.safe_load(v) == v:
                    return v
            except yaml.YAMLError:
                pass
        return json.dumps(v)
    return _cli_argv(ctx, ["config", "set"] + _profile_args(ctx) + [f"{k}={text(v)}" for k, v in sets.items()],
                     a, _CONFIG_FLAGS)


def _config_set_run(ctx: RunContext, args: dict) -> dict:
    """``dsv4ctl config set PROFILE KEY=VALUE... -g G [--remote]``: with ``remote`` a release
    with the edited serve configs, only the changed groups restarted behind the deploy's gate.
    Result: ``changed`` (groups), ``release``, ``restarted`` (a release restarted them: the
    watch's ``last_start`` is now). No group to change → nothing run, ``changed`` []."""
    from ..hosts.audit import now_iso
    if _bad_groups(args):
        return {"ok": False, "restarted": False, "error": _bad_groups(args)}
    if "groups" in args and not args["groups"]:
        return {"ok": True, "changed": [], "restarted": False, "note": "no group to change"}
    started = now_iso()
    code, doc, err = _run_cli(ctx, _config_set_argv(ctx, args) + ["--json"], "config-set")
    if args.get("remote"):
        ctx.touched_hosts.update(h for g in ctx.groups(args) for h in g.hosts)
    if code or not isinstance(doc, dict):
        return {"ok": False, "restarted": False, "error": err or f"config set exited {code}"}
    changed = sorted(g["group"] for g in doc.get("groups", []) if g.get("changed"))
    restarted = bool(args.get("remote")) and bool(changed)
    if restarted:
        ctx.extra["last_start"] = started
    return {"ok": True, "changed": changed, "restarted": restarted, "release": doc.get("release")}


def _config_set_describe(ctx: RunContext, args: dict) -> list[str]:
    return _serve_change_describe(ctx, args, _config_set_argv, "config-set-dry-run")


def _patch(verb: str):
    def argv(ctx: RunContext, args: dict) -> list[str]:
        a = dict(args)
        tree = a.pop("tree", None)
        # args.tree is taken from the profile's folder; sglang.tree already is (resolved once by
        # the Deployment: joining the folder again doubled it for a profile given as dir/p.yaml)
        tree_p = (Path(tree) if Path(tree).is_absolute() else ctx.profile.base_dir / tree) if tree else \
            ctx.deployment.sglang.tree
        if tree_p is None:
            raise InputError(f"patch.{verb}: no tree (args.tree or the profile's sglang.tree)")
        tree_p = tree_p.absolute()
        flags = {"series": "--series"} if verb == "apply" else {}
        pos = ("commits",) if verb == "revert" else ()
        return _cli_argv(ctx, ["patch", verb, str(tree_p)], a, flags, positional=pos)

    def run(ctx: RunContext, args: dict) -> dict:
        code, _, err = _run_cli(ctx, argv(ctx, args), f"patch-{verb}")
        return {"ok": code == 0, **({"error": err} if code else {})}

    def describe(ctx: RunContext, args: dict) -> list[str]:
        return [f"dsv4ctl {' '.join(argv(ctx, args))}"]
    return run, describe


#: What a restart is on Slurm (``deploy.backend: slurm``): no server restarts inside its job.
_RESUBMIT = "cancel its Slurm job, submit the active release's batch script again (a new job)"


def _restart_describe(ctx: RunContext, args: dict) -> list[str]:
    from ..deploy.service import restarts_in_place
    from ..hosts.layout import Paths
    dep = ctx.deployment
    in_place = restarts_in_place(dep)
    if groups_line(ctx, args):
        how = ("in place (started from the active release when the process is gone; a multi-node server: every "
               "node stopped, then started together)" if in_place else f"as Slurm jobs: {_RESUBMIT}")
        return [f"restart {groups_line(ctx, args)} {how}, wait for /health, audit"]
    out = []
    for g in ctx.groups(args):
        for srv in dep.groups[g.name].server_nodes:
            if not in_place and dep.groups[g.name].role != "router":      # a router runs over SSH
                out.append(f"{', '.join(n.host for n in srv)}: restart {srv[0].server}: {_RESUBMIT}, wait for "
                           "node 0's /health, audit")
            elif len(srv) == 1:
                out.append(f"{srv[0].host}: restart group {g.name} in place "
                           f"({Paths(dep.host_root(srv[0].host), node=dep.node_tag(srv[0].host)).pidfile(g.name)}), "
                           "wait for /health, audit")
            else:
                out.append(f"{', '.join(n.host for n in srv)}: restart {srv[0].server} (one server over "
                           f"{len(srv)} nodes): stop every node, start every node from the active release "
                           "(its own --node-rank), wait for node 0's /health, audit")
    return out


def _restart_run(ctx: RunContext, args: dict) -> dict:
    """Restart the groups' servers on their hosts (the deploy launcher or systemd unit), wait for
    /health at each server's node 0, and append an audit record on every host restarted. A
    one-host server restarts in place; a server over several nodes cannot take a node back, so
    every node is stopped and all are started together from the active release
    (:func:`start_dead_groups` with ``restart``). On Slurm no server restarts in place
    (:func:`dsv4ctl.deploy.service.restarts_in_place`): each server's job is cancelled and the
    active release's batch script submitted again, as ``dsv4ctl restart`` does."""
    from ..hosts.audit import audit_record
    from ..hosts.health import wait_health
    from ..hosts.lock import check_unlocked
    from ..deploy.service import restart_in_place, restarts_in_place
    from ..hosts.layout import Paths
    from ..remote import append_jsonl, connect
    dep = ctx.deployment
    groups = ctx.groups(args)
    timeout = float(args.get("health_timeout", dep.deploy.health_timeout_s))
    py = dep.deploy.python
    urls = _server_urls(dep, groups)
    # a group whose process is gone cannot be restarted from /proc: start it from the active
    # release's launch spec instead (the server-down case); so is every multi-node server
    from ..hosts.audit import now_iso
    ctx.extra["last_start"] = now_iso()
    # ... and on Slurm every server: a job is restarted by cancelling it and submitting the
    # active release's script again (dsv4ctl/deploy/service.py restarts_in_place)
    dead = start_dead_groups(ctx, groups, restart_multi_node=True, restart_all=not restarts_in_place(dep))
    transports = {}
    try:
        done: dict[str, tuple[list, str]] = {}      # server -> ([(transport, root)], how)
        for g in groups:
            for srv in dep.groups[g.name].server_nodes:
                name = srv[0].server
                hosts = [n.host for n in srv]
                for h in hosts:
                    if h not in transports:
                        transports[h] = connect(ctx.profile.hosts[h], hosts=ctx.profile.hosts)
                ends = [(transports[h], dep.host_root(h)) for h in hosts]
                if name in dead:
                    done[name] = (ends, "service-start" if dead[name]["how"] == "start" else "service-restart")
                else:
                    t, root = ends[0]
                    check_unlocked(t, root, profile=str(dep.path))
                    restart_in_place(t, py, Paths(root, node=dep.node_tag(hosts[0])), g.name)
                    done[name] = (ends, "service-restart")
                ctx.touched_hosts.update(hosts)
        health = wait_health(urls, timeout)
        for name, (ends, event) in done.items():
            for t, root in ends:
                append_jsonl(t, f"{root}/audit.jsonl", audit_record(
                    t.name, event, "ok" if health[name] is None else "unhealthy", health[name] or "",
                    group=name.split("#")[0]))
    finally:
        for t in transports.values():
            t.close()
    bad = {k: v for k, v in health.items() if v}
    return {"ok": not bad, "groups": [g.name for g in groups], "servers": sorted(urls),
            "started": sorted(n for n, d in dead.items() if d["how"] == "start"),
            **({"error": "; ".join(f"{k}: {v}" for k, v in bad.items())} if bad else {})}


def _server_urls(dep, groups) -> dict[str, str]:
    """{server: node 0's URL} of every server of ``groups`` (``G``, ``G#R`` for replica R)."""
    return {name: url for g in groups for name, url in dep.groups[g.name].replica_urls}


_DEPLOY_FLAGS = {"tree": "--tree", "base": "--base", "patch": "--patch", "health_timeout": "--health-timeout",
                 "accept_new_host_keys": "--accept-new-host-keys", "break_lock": "--break-lock"}


def _deploy_like(verb: str):
    flags = dict(_DEPLOY_FLAGS, **({"to": "--to"} if verb == "rollback" else {}))
    if verb == "rollback":
        for k in ("tree", "base", "patch"):
            flags.pop(k)
    else:
        flags.update({"promote": "--promote", "canary": "--canary", "concurrency": "--concurrency",
                      "max_corruption": "--max-corruption", "turns": "--turns", "min_requests": "--min-requests"})

    def argv(ctx: RunContext, args: dict) -> list[str]:
        return _cli_argv(ctx, [verb] + _profile_args(ctx), args, flags)

    def run(ctx: RunContext, args: dict) -> dict:
        code, doc, err = _run_cli(ctx, argv(ctx, args) + ["--json"], verb)
        ctx.touched_hosts.update(ctx.profile.hosts)
        out = {"ok": code == 0}
        if isinstance(doc, dict):
            out["release"] = doc.get("release") or doc.get("to") or doc.get("id")
        if code:
            out["error"] = err or f"{verb} exited {code}"
        return out

    def describe(ctx: RunContext, args: dict) -> list[str]:
        refs = {k: v for k, v in args.items() if is_ref(v)}
        if refs:        # e.g. to: "@mark.rollback_to": the release is known when the step runs
            known = {k: f"<{v[1:]}, known when it runs>" for k, v in refs.items()}
            return [f"dsv4ctl {' '.join(argv(ctx, {**args, **known}))}"]
        code, _, err = _run_cli(ctx, argv(ctx, args) + ["--dry-run"], f"{verb}-dry-run")
        out = (ctx.run_dir / f"{ctx.evidence[-1]}.out").read_text().splitlines()
        return [f"dsv4ctl {' '.join(argv(ctx, args))}"] + out[:40] + ([f"{DRY_RUN_ERROR} {err or 'the dry run exited ' + str(code)}"] if code else [])
    return run, describe


def audit_touched(ctx: RunContext, record: dict) -> list[str]:
    """Append ``record`` (plus ts/who/host) to ``<root>/audit.jsonl`` on every host a mutating
    step touched. Returns one warning line per host that could not be reached."""
    from ..hosts.audit import now_iso
    from ..remote import append_jsonl, connect, who
    warnings = []
    for name in sorted(ctx.touched_hosts):
        host = ctx.profile.hosts[name]
        try:
            t = connect(host, hosts=ctx.profile.hosts)
            try:
                append_jsonl(t, f"{ctx.deployment.host_root(name)}/audit.jsonl",
                             {"ts": now_iso(), "who": who(), "host": name, **record})
            finally:
                t.close()
        except Exception as e:  # noqa: BLE001 - the local report is kept; say which host missed it
            warnings.append(f"{name}: audit record not written ({e})")
    return warnings


def start_dead_groups(ctx: RunContext, groups: list, dry_run: bool = False, *,
                      restart_multi_node: bool = False, restart_all: bool = False) -> dict[str, dict]:
    """Start each server of ``groups`` whose process is not running, from the active release
    (``current/launch.json``, the same start command a deploy uses, each node its own
    ``--node-rank``; launcher or systemd as the host runs). Running servers are left alone. A
    server over several nodes with any node down is started whole: the nodes still running are
    stopped first (node 0 is stuck in a collective and cannot take a node back); with
    ``restart_multi_node`` every multi-node server is (a restart), with ``restart_all`` every
    server but routers (Slurm: :func:`dsv4ctl.deploy.service.restarts_in_place`). Returns {server: {"how":
    "start" | "restart", "release": RID, "hosts": [...]}} for the servers started (``G``, ``G#R``
    for replica R; with ``dry_run``: would start, nothing run). RemoteError naming the host when
    a node has no active release or launch spec, or the nodes of one server run different
    releases."""
    from ..deploy.engine import run_server_steps
    from ..deploy.servers import plan_servers, read_alive, server_steps
    from ..deploy.site import Options, gather_facts, open_site
    from ..errors import RemoteError
    from ..hosts.lock import check_unlocked
    dep = ctx.deployment
    names = [g.name for g in groups]
    # the servers as the profile places them (node-rank order), in the launch-spec shape the
    # deploy layer's plan reads: one rule for which server a start touches (deploy/servers.py)
    topo = {g: {"role": dep.groups[g].role, "servers": [[n.host for n in srv] for srv in dep.groups[g].server_nodes]}
            for g in names}
    site = open_site(dep, Options())
    out: dict[str, dict] = {}
    try:
        gather_facts(site)
        alive = read_alive(site, topo, sorted({h for t in topo.values() for srv in t["servers"] for h in srv}))
        actions = plan_servers(topo, alive, "start", names)
        if restart_multi_node or restart_all:
            started = {a.server for a in actions}
            actions += [a for a in plan_servers(topo, alive, "restart", names)
                        if (len(a.start) > 1 or restart_all and topo[a.group]["role"] != "router")
                        and a.server not in started]
        rid_of, spec_of = {}, {}
        for a in actions:
            for h in a.start:
                f = site.facts[h]
                if not f.current or not (f.current_launch or {}).get(a.group):
                    raise RemoteError(f"{h}: group {a.group} is not running and the host has no active "
                                      f"release with a launch spec for it ({site.paths[h].current}/launch.json)")
                rid_of[h], spec_of[h] = f.current, f.current_launch
            rids = {h: rid_of[h] for h in a.start}
            if len(set(rids.values())) > 1:
                raise RemoteError(f"group {a.group}: the nodes of {a.server} run different releases ("
                                  + ", ".join(f"{h}: {r}" for h, r in rids.items())
                                  + "): roll back or deploy so that every node runs one, then start it")
            out[a.server] = {"how": "restart" if a.why == "restart" else "start", "release": rids[a.start[0]],
                             "hosts": list(a.start)}
        if dry_run or not actions:
            return out
        for h in sorted({h for a in actions for h in a.start}):
            check_unlocked(site.transports[h], site.paths[h].root, profile=str(dep.path))
        errors = run_server_steps(site, server_steps(site, rid_of, spec_of, actions))
        if errors:
            raise RemoteError("; ".join(errors))
        ctx.touched_hosts.update(h for a in actions for h in a.start)
    finally:
        site.close()
    return out


def _start_describe(ctx: RunContext, args: dict) -> list[str]:
    if groups_line(ctx, args):
        return [f"start {groups_line(ctx, args)} from the active release if not running, wait for /health, audit"]
    dep = ctx.deployment
    return [f"{', '.join(n.host for n in srv)}: start {srv[0].server} from the active release if its process is "
            "not running (running servers are left alone" + ("; a node down: every node stopped, then all started"
                                                            if len(srv) > 1 else "") + "), wait for /health, audit"
            for g in ctx.groups(args) for srv in dep.groups[g.name].server_nodes]


def _start_run(ctx: RunContext, args: dict) -> dict:
    """Start the servers that are not running (:func:`start_dead_groups`), wait for /health of the
    ones started, one audit record per host started."""
    from ..hosts.audit import audit_record
    from ..hosts.health import wait_health
    from ..remote import append_jsonl, connect
    dep = ctx.deployment
    groups = ctx.groups(args)
    timeout = float(args.get("health_timeout", dep.deploy.health_timeout_s))
    from ..hosts.audit import now_iso
    ctx.extra["last_start"] = now_iso()
    started = start_dead_groups(ctx, groups)
    if started:
        ctx.say(f"started {', '.join(sorted(started))}; waiting for /health (timeout {timeout:g} s)")
    urls = _server_urls(dep, groups)
    health = wait_health({n: urls[n] for n in started}, timeout) if started else {}
    for n, info in started.items():
        for h in info["hosts"]:
            t = connect(ctx.profile.hosts[h], hosts=ctx.profile.hosts)
            try:
                append_jsonl(t, f"{dep.host_root(h)}/audit.jsonl", audit_record(
                    t.name, "service-start", "ok" if health[n] is None else "unhealthy", health[n] or "",
                    group=n.split("#")[0]))
            finally:
                t.close()
    bad = {k: v for k, v in health.items() if v}
    return {"ok": not bad, "started": sorted(started),
            "already_running": sorted(n for n in urls if n not in started),
            **({"error": "; ".join(f"{k}: {v}" for k, v in bad.items())} if bad else {})}


_CRASH_RULES = ("cuda_oom", "illegal_memory_access", "nan_sampling", "hicache_load_back", "kernel_argument", "dead_rank")
_STALL_RULES = ("watchdog_stall", "transfer_error", "transfer_wedge", "gpu_busy_no_progress", "never_scheduled")


def _diagnose_argv(ctx: RunContext, args: dict) -> list[str]:
    a = dict(args)
    a.setdefault("window", 2)
    return _cli_argv(ctx, ["diagnose"] + _profile_args(ctx), a,
                     {"groups": "--group", "since": "--since", "window": "--window", "lines": "--lines"}) + ["--json"]


def summarize_diagnosis(doc: dict) -> dict:
    """The fields a playbook's conditions use, from a ``dsv4ctl.diagnose/1`` document (pure):
    ``healthy``, ``rule``/``cause``/``runbook`` of the top finding, ``hicache_crash`` (a finding
    names the hicache-crash runbook) and ``hicache_crash_groups`` (the groups of those findings), ``crash``, ``stall``, ``down`` (a group not alive or not
    answering /health), ``rules`` (every rule that fired), ``groups`` (groups with a finding)."""
    fs = [f for f in doc.get("findings", []) if f["rule"] != "healthy"]
    top = fs[0] if fs else None
    gd = doc.get("groups", {})
    return {"healthy": bool(doc.get("ok")), "rule": top["rule"] if top else "healthy",
            "cause": top["cause"] if top else "healthy", "runbook": top["runbook"] if top else None,
            "hicache_crash": any(f["runbook"] == "hicache-crash" for f in fs),
            "hicache_crash_groups": sorted({f["group"] for f in fs if f["runbook"] == "hicache-crash" and f.get("group")}),
            "crash": any(f["rule"] in _CRASH_RULES for f in fs), "stall": any(f["rule"] in _STALL_RULES for f in fs),
            "down": any(g.get("alive") is False or g.get("health") != "ok" for g in gd.values()),
            "rules": sorted({f["rule"] for f in fs}), "groups": sorted({f["group"] for f in fs}),
            "evidence": [e for f in fs[:3] for e in f["evidence"][:2]]}


def _diagnose_run(ctx: RunContext, args: dict, mark: bool = True) -> dict:
    n = sum(1 for _ in ctx.run_dir.glob("diagnose*.out"))
    code, doc, err = _run_cli(ctx, _diagnose_argv(ctx, args), f"diagnose-{n + 1}")
    if code not in (0, 1) or not isinstance(doc, dict):
        return {"ok": False, "error": err or f"diagnose exited {code}"}
    out = {"ok": True, **summarize_diagnosis(doc), "evidence_file": f"{ctx.evidence[-1]}.out"}
    ctx.say(f"diagnose: {out['cause']}" + (f" -> runbook {out['runbook']}" if out["runbook"] else ""))
    for e in out["evidence"]:
        ctx.say(f"    {e}")
    if mark and (out.get("crash") or out.get("stall")):
        hosts = sorted({f.get("host") for f in doc.get("findings") or []
                        if f.get("severity") in ("crash", "stall") and f.get("host")}) or None
        out.update(_mark_failed(ctx, f"runbook diagnose ({out.get('rule')})", str(out["cause"]),
                                list(out["evidence"]), hosts))
    return out


def _mark_failed(ctx: RunContext, check: str, failure: str, evidence: list[str], hosts: Optional[list[str]]) -> dict:
    """A step saw a crash or a stall: the release the hosts run is recorded failed with its
    evidence (:func:`dsv4ctl.deploy.mark.mark_running_failed`), so a plain deploy does not
    re-activate it unawares. Returns ``{"marked_failed": {host: release}}`` or, when the hosts
    could not be marked (a held lock, SSH), ``{"mark_error": why}``: the step's own verdict
    stands either way. Nothing without a profile (a check against a bare URL)."""
    if ctx.profile is None or not getattr(ctx.profile, "hosts", None):
        return {}
    from ..deploy.mark import mark_running_failed
    from ..errors import DsvError
    try:
        marked = mark_running_failed(ctx.profile, hosts=hosts, check=check, failure=failure, evidence=evidence)
    except DsvError as e:
        ctx.say(f"could not mark the running release failed: {e}")
        return {"mark_error": str(e)}
    if marked:
        ctx.say("marked failed: " + ", ".join(f"{r} on {h}" for h, r in sorted(marked.items())))
        ctx.touched_hosts.update(marked)
    return {"marked_failed": marked}


def _mark_args(ctx: RunContext, args: dict) -> tuple[str, str]:
    unknown = sorted(set(args) - {"check"})
    if unknown:
        raise InputError(f"release.mark_failed: unknown argument(s) {', '.join(unknown)}")
    return str(args.get("check") or "runbook"), str(ctx.extra.get("evidence") or "the operator ran the runbook")


def _mark_for_rollback_run(ctx: RunContext, args: dict) -> dict:
    """Under the deploy lock: the hosts run the release the evidence is about (``--release``, when
    given) and a release marked good is there to go back to; then the running release is marked
    failed with the evidence (:func:`dsv4ctl.deploy.mark.mark_for_rollback`). ``rollback_to``
    is the good release for the rollback step; a refusal changes nothing (``ok`` False)."""
    from ..deploy.mark import NotRolledBack, mark_for_rollback
    from ..errors import DsvError
    check, failure = _mark_args(ctx, args)
    try:
        out = mark_for_rollback(ctx.profile, expect=ctx.extra.get("release"), check=check, failure=failure,
                                evidence=[failure, str(ctx.run_dir)])
    except NotRolledBack as e:
        return {"ok": False, "refused": True, "error": str(e)}
    except DsvError as e:
        return {"ok": False, "error": str(e)}
    ctx.touched_hosts.update(out["marked_failed"])
    ctx.say(f"marked failed: {out['release']} on {', '.join(sorted(out['marked_failed'])) or 'no host (already)'}; "
            f"rolling back to {out['rollback_to']} ({out['why']})")
    return {"ok": True, **out}


def _mark_for_rollback_describe(ctx: RunContext, args: dict) -> list[str]:
    from ..deploy.mark import NotRolledBack, rollback_choice
    from ..deploy.site import Options, gather_facts, open_site
    check, failure = _mark_args(ctx, args)
    site = open_site(ctx.deployment, Options(dry_run=True))
    try:
        facts = gather_facts(site)
    finally:
        site.close()
    expect = ctx.extra.get("release")
    try:
        rid, target, why = rollback_choice(facts, expect)
    except NotRolledBack as e:
        return [f"{DRY_RUN_ERROR} {e}"]
    return [f"under the deploy lock, if every host still runs {rid}" + (" (the release the evidence is about)"
                                                                        if expect else "")
            + f": mark it failed ({check}: {failure}); rollback_to {target}: {why}"]


def _watch_run(ctx: RunContext, args: dict) -> dict:
    """Diagnose every ``interval`` s for ``seconds`` (bounded), counting the polls in which a
    crash signature or a KV canary violation (``count: crash``, the default) or any finding but
    healthy (``count: any``) shows in the evidence since the watch started (``from: last_start``:
    since the last service.restart/service.start of this run; a resumed run starts from now);
    stops early at ``stop_after`` such polls. ``repeats`` > 0 means it came back; ``rules`` are the
    last poll's (``kv_canary`` among them when the canary logged a violation)."""
    from ..hosts.audit import now_iso
    secs = _wait_seconds({"seconds": args.get("seconds", 60)})
    interval = max(1.0, float(args.get("interval", 10)))
    stop_after = int(args.get("stop_after", 1))
    count = args.get("count", "crash")
    if count not in ("crash", "any"):
        raise InputError(f"watch: count must be crash or any, got {count!r}")
    since = ctx.extra.get("last_start") if args.get("from") == "last_start" else None
    since = since or now_iso()
    unknown = sorted(set(args) - {"seconds", "interval", "stop_after", "count", "from", "groups"})
    if unknown:
        raise InputError(f"watch: unknown argument(s) {', '.join(unknown)}")
    a = {k: v for k, v in args.items() if k in ("groups",)}
    a.update(since=since, window=0)
    t_end = time.monotonic() + secs
    polls, repeats, canary, last = 0, 0, 0, {}
    while True:
        polls += 1
        last = _diagnose_run(ctx, a, mark=False)      # marked once, after the watch
        if last.get("ok"):
            hit = (not last.get("healthy") and last.get("rule") != "unknown") if count == "any" else \
                bool(last.get("crash") or "kv_canary" in last.get("rules", []))
            if hit:
                repeats += 1
            canary += int("kv_canary" in last.get("rules", []))
        ctx.say(f"watch: poll {polls}, {max(0.0, t_end - time.monotonic()):.0f} s left, repeats {repeats}")
        if repeats >= stop_after or time.monotonic() + interval > t_end:
            break
        ctx.sleep(interval)
    out = {"ok": True, "polls": polls, "repeats": repeats, "canary_polls": canary, "since": since,
           "rule": last.get("rule"), "cause": last.get("cause"), "rules": last.get("rules", [])}
    if repeats and (last.get("crash") or last.get("stall")):
        out.update(_mark_failed(ctx, f"runbook watch ({last.get('rule')})", str(last.get("cause")),
                                list(last.get("evidence") or []), None))
    return out


def _describe(fmt: str) -> Callable[[RunContext, dict], list[str]]:
    return lambda ctx, args: [fmt.format(args=args)]


def builtin_actions(extra: Optional[dict[str, Action]] = None) -> dict[str, Action]:
    """The action registry: note, wait, plan, plus the remote/check actions when present."""
    acts = {
        "note": Action("note", False, _note_run, lambda ctx, a: [f"record a note: {a.get('text', '')}"]),
        "wait": Action("wait", False, _wait_run, lambda ctx, a: [f"wait {_wait_seconds(a):g} s"]),
        "plan": Action("plan", False, _plan_run, _describe("plan the profile's groups with overrides {args}")),
    }
    acts["check.load"] = Action("check.load", False, _check_load_run,
                                lambda ctx, a: [f"dsv4ctl {' '.join(_check_load_argv(ctx, a))}",
                                                "a server that stops answering marks the release the hosts run failed"])
    acts["check.smoke"] = Action("check.smoke", False, _check_smoke_run,
                                 lambda ctx, a: [f"dsv4ctl check smoke --profile {ctx.profile.path}"])
    for state in ("on", "off"):
        run, describe = _hicache(state)
        acts[f"hicache.{state}"] = Action(f"hicache.{state}", True, run, describe)
    acts["config.set"] = Action("config.set", True, _config_set_run, _config_set_describe)
    for verb in ("apply", "revert"):
        run, describe = _patch(verb)
        acts[f"patch.{verb}"] = Action(f"patch.{verb}", True, run, describe)
    acts["service.restart"] = Action("service.restart", True, _restart_run, _restart_describe)
    acts["service.start"] = Action("service.start", True, _start_run, _start_describe)
    acts["diagnose"] = Action("diagnose", False, _diagnose_run,
                              lambda ctx, a: [f"dsv4ctl {' '.join(_diagnose_argv(ctx, a))}",
                                              "a crash or stall found marks the release the hosts run failed"])
    acts["watch"] = Action("watch", False, _watch_run, lambda ctx, a: [
        f"diagnose every {float(a.get('interval', 10)):g} s for at most {_wait_seconds({'seconds': a.get('seconds', 60)}):g} s: "
        + ("count any finding" if a.get("count") == "any" else "count crash signatures and KV canary violations")
        + (" logged since the last (re)start" if a.get("from") == "last_start" else " logged since the watch began")])
    for verb in ("deploy", "rollback"):
        run, describe = _deploy_like(verb)
        acts[verb] = Action(verb, True, run, describe)
    acts["release.mark_failed"] = Action("release.mark_failed", True, _mark_for_rollback_run,
                                         _mark_for_rollback_describe)
    acts.update(extra or {})
    return acts
