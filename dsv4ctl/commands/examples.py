"""One or two examples per command, shown at the end of its ``--help`` (one table, applied by
:func:`apply` where cli.py registers the commands; tests/test_conventions.py checks every
command has an entry). An example exits 0 unless its comment says ``exit N``:
tests/test_examples.py runs each one that needs no host, server, SGLang tree or network and
parses every one."""

from __future__ import annotations

EXAMPLES: dict[str, tuple[str, ...]] = {
    "plan": ("dsv4ctl plan",
             "dsv4ctl plan profiles/my.yaml -g decode --set mem_fraction_static=0.9 --json"),
    "facts": ("dsv4ctl facts profiles/my.yaml          # nvidia-smi on every host: per-GPU memory for the plan",
              "dsv4ctl facts profiles/my.yaml --write --dry-run   # the profile diff; --write writes it"),
    "patch status": ("dsv4ctl patch status ~/src/sglang",),
    "patch apply": ("dsv4ctl patch apply ~/src/sglang --dry-run",),
    "patch revert": ("dsv4ctl patch revert ~/src/sglang 1a2b3c4d",),
    "patch check": ("dsv4ctl patch check --base sglang==0.5.23",
                    "dsv4ctl patch check --dry-run          # what it would fetch; no network"),
    "patch export": ("dsv4ctl patch export v0.5.23..HEAD --tree ~/src/sglang --series patches/sglang-0.5.23",),
    "deploy": ("dsv4ctl deploy profiles/my.yaml --dry-run -v",
               "dsv4ctl deploy profiles/my.yaml --promote"),
    "rollback": ("dsv4ctl rollback profiles/my.yaml --dry-run",),
    "releases": ("dsv4ctl releases profiles/my.yaml",),
    "promote": ("dsv4ctl promote ID profiles/my.yaml",),
    "lock status": ("dsv4ctl lock status profiles/my.yaml",),
    "lock acquire": ("dsv4ctl lock acquire profiles/my.yaml -m 'upgrading NVIDIA drivers'",),
    "lock release": ("dsv4ctl lock release profiles/my.yaml",
                     "dsv4ctl lock release profiles/my.yaml --force   # a lock whose run is gone"),
    "start": ("dsv4ctl start profiles/my.yaml --dry-run",
              "dsv4ctl start profiles/my.yaml -g decode"),
    "stop": ("dsv4ctl stop profiles/my.yaml -g decode --dry-run",),
    "restart": ("dsv4ctl restart profiles/my.yaml --batch 1",
                "dsv4ctl restart profiles/my.yaml --host h200-1"),
    "status": ("dsv4ctl status profiles/my.yaml",),
    "logs": ("dsv4ctl logs decode profiles/my.yaml -n 100 --grep 'OOM|Traceback'",),
    "verify": ("dsv4ctl verify profiles/my.yaml          # every release on every host against its manifest",
               "dsv4ctl verify profiles/my.yaml -r ID --json"),
    "audit": ("dsv4ctl audit profiles/my.yaml --since 2026-12-01",),
    "exec": ("dsv4ctl exec decode profiles/my.yaml -- nvidia-smi --query-gpu=memory.used --format=csv",
             "dsv4ctl exec decode profiles/my.yaml --host h200-1 -m 'disk check' -- df -h .   # one host"),
    "config lint": ("dsv4ctl config lint",
                    "dsv4ctl config lint profiles/my.yaml --tree ~/src/sglang"),
    "config set": ("dsv4ctl config set profiles/my.yaml kv-canary=log -g prefill --dry-run",
                   "dsv4ctl config set profiles/my.yaml kv-canary=log -g prefill --remote   # a release; only prefill restarts"),
    "hicache on": ("dsv4ctl hicache on profiles/my.yaml -g prefill --dry-run",),
    "hicache off": ("dsv4ctl hicache off profiles/my.yaml -g prefill --dry-run",),
    "hicache status": ("dsv4ctl hicache status profiles/my.yaml",),
    "check smoke": ("dsv4ctl check smoke http://127.0.0.1:30000",),
    "check load": ("dsv4ctl check load http://127.0.0.1:8000 -c 1,20,40 --records turns.jsonl",),
    "diagnose": ("dsv4ctl diagnose profiles/my.yaml",
                 "dsv4ctl diagnose profiles/my.yaml -g decode --since 30m --json"),
    "watch": ("dsv4ctl watch profiles/my.yaml --listen 0.0.0.0:9477 --on-alert toolcall-corruption",
              "dsv4ctl watch profiles/my.yaml --once --json"),
    "report": ("dsv4ctl plan --json > plan.json && dsv4ctl report plan.json -o report.html",
               "dsv4ctl report plan.json sweep.json ~/.local/state/dsv4ctl/runs/RUN_ID -o incident.html"),
    "runbook list": ("dsv4ctl runbook list",),
    "runbook show": ("dsv4ctl runbook show toolcall-corruption",),
    "runbook run": ("dsv4ctl runbook run toolcall-corruption profiles/my.yaml --dry-run   # exit 1 if a step would stop",
                    "dsv4ctl runbook run scheduler-stall profiles/my.yaml --yes"),
    "profile list": ("dsv4ctl profile list",),
    "profile show": ("dsv4ctl profile show dsv4-flash-8xb200-pd",),
    "profile init": ("dsv4ctl profile init profiles/my.yaml",
                     "dsv4ctl profile init --from dsv4-flash-8xb200-pd ~/dsv4/prod.yaml"),
    "profile import srt-slurm": ("dsv4ctl profile import srt-slurm disagg-1p1d-dep4-dep8.yaml --out dsv4/b300.yaml",
                                 "dsv4ctl profile import srt-slurm recipe.yaml --model deepseek-v4-pro --dry-run --json"),
    "schema": ("dsv4ctl schema profile > profile.schema.json",
               "dsv4ctl schema              # list the schemas"),
    "completion": ("dsv4ctl completion bash > ~/.local/share/bash-completion/completions/dsv4ctl",
                   "dsv4ctl completion zsh > ~/.zfunc/_dsv4ctl"),
}


def epilog(path: str) -> str | None:
    """The ``Examples:`` block of command ``path`` (``"patch check"``), or None. The ``\\b`` line
    keeps click from re-wrapping it."""
    ex = EXAMPLES.get(path)
    if not ex:
        return None
    return "\b\nExamples:\n" + "\n".join(f"  {e}" for e in ex)


def apply(app, prefix: str = "") -> None:
    """Set the epilog of every command registered on the typer ``app`` (and its sub-apps) that
    has examples in :data:`EXAMPLES`."""
    for info in app.registered_commands:
        name = info.name or (info.callback.__name__.replace("_", "-") if info.callback else "")
        text = epilog(f"{prefix}{name}")
        if text and not info.epilog:
            info.epilog = text
    for grp in app.registered_groups:
        if grp.typer_instance is not None and grp.name:
            apply(grp.typer_instance, f"{prefix}{grp.name} ")
