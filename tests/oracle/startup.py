"""The start-up matrix: serve configs run through each SGLang release's own ``--config`` reader,
argparse and argument resolution (``driver.run_startup_case``), against dsv4ctl's one start-up
rule set (:mod:`dsv4ctl.plan.startup`). Stdlib + dsv4ctl only (the oracle runs in its own venv).

Re-run the live oracle and store its answers (repository root)::

    .venv/bin/python -m tests.oracle.startup --write tests/data/startup_matrix.json

The matrix is generated: every value of every dimension alone, then a seeded sample of their
combinations (topology × attention backend × PD role × speculative decoding × one more key ×
SM100 or not), the same configs for every release (a key a release lacks is part of the test).
"""

from __future__ import annotations

import itertools
import json
import random
import sys
from pathlib import Path

VERSIONS = ("0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
B200_MIB, H200_MIB = 183359, 143771

TOPOLOGY = ({}, {"tp-size": 8}, {"tp-size": 8, "attn-dp-size": 8}, {"tp-size": 8, "attn-dp-size": 3},
            {"tp-size": 8, "dp-size": 8, "enable-dp-attention": True},
            {"tp-size": 8, "dp-size": 3, "enable-dp-attention": True}, {"tp-size": 8, "dp-size": 2},
            {"tp-size": 8, "dp-size": 2, "attn-dp-size": 8}, {"tp": 4})
BACKEND = ({}, {"dsv4-attn-backend": "flashmla"}, {"dsv4-attn-backend": "trtllm"})
ROLE = ({}, {"disaggregation-mode": "prefill"}, {"disaggregation-mode": "decode"})
SPEC = ({}, {"speculative-algorithm": "EAGLE", "speculative-num-steps": 3, "speculative-eagle-topk": 1,
             "speculative-num-draft-tokens": 4},
        {"speculative-algorithm": "EAGLE", "speculative-num-steps": 3, "speculative-num-draft-tokens": 4},
        {"speculative-algorithm": "EAGLE", "speculative-num-steps": 3, "speculative-eagle-topk": 2,
         "speculative-num-draft-tokens": 4},
        {"speculative-algorithm": "EAGLE", "speculative-eagle-topk": 1},
        {"speculative-algorithm": "NEXTN", "speculative-num-steps": 3, "speculative-eagle-topk": 1,
         "speculative-num-draft-tokens": 4})
OTHER = ({}, {"kv-cache-dtype": "bfloat16"}, {"kv-cache-dtype": "fp8_e5m2"}, {"chunked-prefill-size": -1},
         {"enable-hierarchical-cache": True, "hicache-ratio": 2},
         {"enable-hierarchical-cache": True, "hicache-ratio": 2, "disable-radix-cache": True},
         {"bogus-key": 1}, {"enable-dp-lm-head": True}, {"max-running-requests": 64},
         {"mem-fraction-static": 0.8}, {"cuda-graph-max-bs": 8})
DIMENSIONS = (TOPOLOGY, BACKEND, ROLE, SPEC, OTHER)
SAMPLE = 110
SEED = 44


def configs() -> list[dict]:
    """[{config, sm100}]: each value alone (B200), then :data:`SAMPLE` seeded combinations."""
    out = [{"config": v, "sm100": True} for dim in DIMENSIONS for v in dim[1:]]
    out.append({"config": {"dsv4-attn-backend": "trtllm"}, "sm100": False})
    combos = list(itertools.product(*DIMENSIONS, (True, False)))
    for *parts, sm in random.Random(SEED).sample(combos, SAMPLE):
        cfg = {}
        for p in parts:
            cfg.update(p)
        out.append({"config": cfg, "sm100": sm})
    return out


def cases() -> list[dict]:
    """The oracle cases (``kind: startup``) of :func:`configs`."""
    return [{"kind": "startup", "id": f"s{i}", "model": "deepseek-v4-flash", "config": c["config"],
             "sm100": c["sm100"], "gpu_memory_mib": B200_MIB if c["sm100"] else H200_MIB}
            for i, c in enumerate(configs())]


def dsv4ctl_refusals(case: dict, version: str) -> list:
    """dsv4ctl's errors for ``case`` on ``version`` (:func:`dsv4ctl.plan.startup.validate`)."""
    from dsv4ctl.plan.argtable import load_table
    from dsv4ctl.plan.startup import validate
    refusals, _ = validate(case["config"], load_table(version=version), sm100=case["sm100"])
    return [r for r in refusals if r.severity == "error"]


def disagreements(stored: dict) -> list[str]:
    """Every case where dsv4ctl and the stored oracle answer differ: accept vs refuse, or a
    refusal whose SGLang message dsv4ctl does not give (argparse's unrecognized keys must each be
    refused; an assertion with a message must be found in one of dsv4ctl's messages)."""
    bad = []
    for version, results in stored["results"].items():
        for case, res in zip(stored["cases"], results):
            mine = dsv4ctl_refusals(case, version)
            err = res.get("error")
            where = f"{version} {case['id']} {json.dumps(case['config'])} sm100={case['sm100']}"
            if bool(err) != bool(mine):
                bad.append(f"{where}: SGLang {'refuses: ' + err if err else 'accepts'}; dsv4ctl "
                           f"{'refuses: ' + mine[0].message if mine else 'accepts'}")
                continue
            if not err:
                continue
            text = " ".join(m.message for m in mine)
            if err.startswith("argparse: unrecognized arguments:"):
                named = [w[2:] for w in err.split(":", 2)[2].split() if w.startswith("--")]
                missing = [k for k in named if not any(m.key == k and m.rule == "SGL001" for m in mine)]
                if missing:
                    bad.append(f"{where}: SGLang refuses {missing}; dsv4ctl: {text}")
                continue
            said = err.split(": ", 1)[1] if ": " in err else ""
            said = said.split(" (")[0].split(". ")[0].rstrip(". ")   # its first sentence
            if said and said not in text and not err.startswith(("argparse: ambiguous", "ValueError: Unsupported")):
                bad.append(f"{where}: SGLang says {err!r}; dsv4ctl says {text!r}")
    return bad


def run_live(versions=VERSIONS, subset=None) -> dict:
    """The oracle's answers, one run per release: {"cases", "results": {version: [result]}}."""
    from tests.oracle.runner import run_cases
    cs = cases() if subset is None else [c for i, c in enumerate(cases()) if i in subset]
    out = {"cases": cs, "results": {}}
    for v in versions:
        res = run_cases(cs, version=None if v == "0.5.23" else v, timeout=600)
        out["results"][v] = [{k: x for k, x in r.items() if k != "id"} for r in res["results"]]
    return out


def main(argv: list[str]) -> int:
    """``--write PATH``: run every release and store; ``--check PATH``: compare dsv4ctl with the
    stored answers (exit 1 naming each disagreement)."""
    if argv[:1] == ["--write"]:
        Path(argv[1]).write_text(json.dumps(run_live(), indent=1, sort_keys=True) + "\n")
        return 0
    if argv[:1] == ["--check"]:
        bad = disagreements(json.loads(Path(argv[1]).read_text()))
        print("\n".join(bad) or "dsv4ctl agrees with every stored answer")
        return 1 if bad else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
