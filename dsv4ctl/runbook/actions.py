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
from .engine import Action

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
    _deployment: Any = None

    @property
    def deployment(self):
        """The profile resolved once (:func:`dsv4ctl.profile.deployment.resolve`)."""
        if self._deployment is None:
            from ..profile.deployment import as_deployment
            self._deployment = as_deployment(self.profile)
        return self._deployment

    def groups(self, args: dict) -> list:
        """The server groups named by ``args.groups`` (default: all server groups)."""
        names = args.get("groups")
        if not names:
            return self.profile.servers()
        return [self.profile.group(n) for n in names]


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
    groups = {g["name"]: dict(errors=g["errors"], fixes=g["fixes"],
                              full_max_total_num_tokens=min(r["full_max_total_num_tokens"] for r in g["ranks"]) if g["ranks"] else 0,
                              headroom_gib=min(r["headroom_gib"] for r in g["ranks"]) if g["ranks"] else None)
              for g in doc["groups"]}
    return {"ok": True, "fits": report.ok, "groups": groups}


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
    proc = subprocess.run([sys.executable, "-m", "dsv4ctl.cli", *argv], capture_output=True, text=True)
    (ctx.run_dir / f"{evidence}.out").write_text(proc.stdout)
    (ctx.run_dir / f"{evidence}.err").write_text(proc.stderr)
    try:
        doc = json.loads(proc.stdout) if proc.stdout.strip().startswith(("{", "[")) else None
    except ValueError:
        doc = None
    err = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
    return proc.returncode, doc, err


def _profile_args(ctx: RunContext) -> list[str]:
    return [str(ctx.profile.path)]


_LOAD_FLAGS = {"concurrency": "--concurrency", "turns": "--turns", "max_corruption": "--max-corruption",
               "stream": "--stream", "stall_timeout": "--stall-timeout", "min_requests": "--min-requests",
               "answer_words": "--answer-words", "model": "--model"}


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
        return {"ok": False, "error": err or f"check load exited {code}"}
    levels = doc.get("levels", [])
    worst = max(levels, key=lambda lv: lv["wilson95"][1]) if levels else {"wilson95": [None, None]}
    return {"ok": True, "passed": code == 0, "corruption_rate": worst.get("rate"),
            "corruption_upper": worst["wilson95"][1], "concurrency": worst.get("concurrency"),
            "stuck": sum(lv.get("stuck", 0) for lv in levels),
            "transfer_failed": sum((lv.get("metrics") or {}).get("sglang:num_transfer_failed_reqs_total", 0) for lv in levels),
            "aborted": sum((lv.get("metrics") or {}).get("sglang:num_aborted_requests_total", 0) for lv in levels),
            "turns": sum(lv.get("turns", 0) for lv in levels), "evidence": f"{name}.out"}


def _check_smoke_run(ctx: RunContext, args: dict) -> dict:
    a = dict(args)
    url = a.pop("url", None)
    base = ["check", "smoke"] + ([url] if url else ["--profile", str(ctx.profile.path)])
    code, doc, err = _run_cli(ctx, _cli_argv(ctx, base, a, {"model": "--model", "timeout": "--timeout"}) + ["--json"], "check-smoke")
    if code not in (0, 1):
        return {"ok": False, "error": err or f"check smoke exited {code}"}
    return {"ok": True, "passed": code == 0, "evidence": "check-smoke.out"}


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
        code, doc, err = _run_cli(ctx, argv(ctx, args) + ["--json"], f"hicache-{state}")
        if args.get("remote"):
            ctx.touched_hosts.update(g.host for g in ctx.groups(args))
        return {"ok": code == 0, "error": err} if code else {"ok": True, "hicache": state}

    def describe(ctx: RunContext, args: dict) -> list[str]:
        code, _, err = _run_cli(ctx, argv(ctx, args) + ["--dry-run"], f"hicache-{state}-dry-run")
        out = (ctx.run_dir / f"hicache-{state}-dry-run.out").read_text().splitlines()
        return [f"dsv4ctl {' '.join(argv(ctx, args))}"] + out[:40] + ([err] if code else [])
    return run, describe


def _patch(verb: str):
    def argv(ctx: RunContext, args: dict) -> list[str]:
        a = dict(args)
        tree = a.pop("tree", None)
        tree_p = Path(tree) if tree else ctx.deployment.sglang.tree
        if tree_p is None:
            raise InputError(f"patch.{verb}: no tree (args.tree or the profile's sglang.tree)")
        if not tree_p.is_absolute():
            tree_p = ctx.profile.base_dir / tree_p
        flags = {"series": "--series"} if verb == "apply" else {}
        pos = ("commits",) if verb == "revert" else ()
        return _cli_argv(ctx, ["patch", verb, str(tree_p)], a, flags, positional=pos)

    def run(ctx: RunContext, args: dict) -> dict:
        code, _, err = _run_cli(ctx, argv(ctx, args), f"patch-{verb}")
        return {"ok": code == 0, **({"error": err} if code else {})}

    def describe(ctx: RunContext, args: dict) -> list[str]:
        return [f"dsv4ctl {' '.join(argv(ctx, args))}"]
    return run, describe


def _restart_describe(ctx: RunContext, args: dict) -> list[str]:
    from ..hosts.layout import Paths
    dep = ctx.deployment
    return [f"{g.host}: restart group {g.name} in place ({Paths(dep.host_root(g.host)).pidfile(g.name)}), "
            f"wait for /health, audit" for g in ctx.groups(args)]


def _restart_run(ctx: RunContext, args: dict) -> dict:
    """Restart the groups in place on their hosts (the deploy launcher or systemd unit), wait for
    /health, and append an audit record per group."""
    from ..hosts.audit import audit_record
    from ..hosts.health import wait_health
    from ..hosts.lock import check_unlocked
    from ..hosts.service import run_restart
    from ..remote import append_jsonl, connect
    dep = ctx.deployment
    groups = ctx.groups(args)
    timeout = float(args.get("health_timeout", dep.deploy.health_timeout_s))
    py = dep.deploy.python
    urls = {g.name: dep.groups[g.name].url for g in groups}
    transports = {}
    try:
        done = {}
        for g in groups:
            host = ctx.profile.hosts[g.host]
            t = transports.get(host.name) or connect(host, hosts=ctx.profile.hosts)
            transports[host.name] = t
            root = dep.host_root(host.name)
            check_unlocked(t, root)
            done[g.name] = (t, root, run_restart(t, py, root, g.name))
            ctx.touched_hosts.add(host.name)
        health = wait_health({g.name: urls[g.name] for g in groups}, timeout)
        for g in groups:
            t, root, info = done[g.name]
            append_jsonl(t, f"{root}/audit.jsonl", audit_record(
                t.name, "service-restart", "ok" if health[g.name] is None else "unhealthy",
                health[g.name] or "", group=g.name))
    finally:
        for t in transports.values():
            t.close()
    bad = {k: v for k, v in health.items() if v}
    return {"ok": not bad, "groups": [g.name for g in groups],
            **({"error": "; ".join(f"{k}: {v}" for k, v in bad.items())} if bad else {})}


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
        code, _, err = _run_cli(ctx, argv(ctx, args) + ["--dry-run"], f"{verb}-dry-run")
        out = (ctx.run_dir / f"{verb}-dry-run.out").read_text().splitlines()
        return [f"dsv4ctl {' '.join(argv(ctx, args))}"] + out[:40] + ([err] if code else [])
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
                                lambda ctx, a: [f"dsv4ctl {' '.join(_check_load_argv(ctx, a))}"])
    acts["check.smoke"] = Action("check.smoke", False, _check_smoke_run,
                                 lambda ctx, a: [f"dsv4ctl check smoke --profile {ctx.profile.path}"])
    for state in ("on", "off"):
        run, describe = _hicache(state)
        acts[f"hicache.{state}"] = Action(f"hicache.{state}", True, run, describe)
    for verb in ("apply", "revert"):
        run, describe = _patch(verb)
        acts[f"patch.{verb}"] = Action(f"patch.{verb}", True, run, describe)
    acts["service.restart"] = Action("service.restart", True, _restart_run, _restart_describe)
    for verb in ("deploy", "rollback"):
        run, describe = _deploy_like(verb)
        acts[verb] = Action(verb, True, run, describe)
    acts.update(extra or {})
    return acts
