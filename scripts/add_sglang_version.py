#!/usr/bin/env python3
"""Add an SGLang release to dsv4ctl: the evidence a reviewer needs, in one run.

    .venv/bin/python scripts/add_sglang_version.py 0.5.24 [--against 0.5.23]

1. fetches the wheel (pip's own configuration, ``--no-deps``) and extracts its ``sglang/`` package
   into ``.venv-oracle/versions/<version>/`` (where tests/oracle/runner.py finds it);
2. writes its server-argument table ``dsv4ctl/data/server_args-<version>.json`` from its own
   parser (scripts/gen_server_args.py --version) and prints the options added and removed;
3. prints the diff of the files dsv4ctl's models follow (the DeepSeek-V4 pool configurator, the
   memory hook, the DeepSeek-V4 memory pool) against ``--against`` (default: the newest supported);
4. runs the versions oracle matrix (tests/test_versions_oracle.py CASES) on both releases and
   prints every case whose answer differs.

Then, by hand: a :class:`dsv4ctl.plan.versions.VersionRules` entry for the release (what the diff
and the differing cases say), the release in ``OTHER_VERSIONS`` of scripts/oracle-env.sh, and the
suite (tests/test_versions_oracle.py proves the new rules with the release's own code). Exit 2 when
the wheel cannot be fetched or does not import.
"""

from __future__ import annotations

import argparse
import difflib
import glob
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
ORACLE = REPO / ".venv-oracle" / "bin" / "python"
FOLLOWED = ("srt/model_executor/pool_configurator.py", "srt/arg_groups/memory_hook.py",
            "srt/mem_cache/deepseek_v4_memory_pool.py")


def sources(version: str) -> Path:
    """The ``sglang`` package folder of ``version`` (the installed one for 0.5.23)."""
    if version == "0.5.23":
        return Path(glob.glob(str(REPO / ".venv-oracle" / "lib" / "python*" / "site-packages" / "sglang"))[0])
    return REPO / ".venv-oracle" / "versions" / version / "sglang"


def fetch(version: str) -> None:
    dest = REPO / ".venv-oracle" / "versions" / version
    if (dest / ".complete").exists():
        return
    with tempfile.TemporaryDirectory() as tmp:
        p = subprocess.run([str(ORACLE), "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                            f"sglang=={version}", "-d", tmp], capture_output=True, text=True)
        wheels = glob.glob(f"{tmp}/sglang-*.whl")
        if p.returncode != 0 or not wheels:
            sys.exit(f"add_sglang_version: cannot fetch sglang=={version}: "
                     + (p.stderr.strip().splitlines() or ["no wheel"])[-1])
        shutil.rmtree(dest, ignore_errors=True)
        with zipfile.ZipFile(wheels[0]) as z:
            z.extractall(dest, [n for n in z.namelist() if n.startswith("sglang/") or ".dist-info/" in n])
    (dest / ".complete").touch()


def flat(result: dict) -> dict:
    """An oracle result with each PP stage's fields as ``stage0.FIELD`` keys."""
    out = {k: v for k, v in result.items() if k != "stages"}
    for i, st in enumerate(result.get("stages") or []):
        out.update({f"stage{i}.{k}": v for k, v in st.items()})
    return out


def table_diff(new: str, old: str) -> list[str]:
    def names(v):
        return {a["name"] for a in json.loads((REPO / "dsv4ctl" / "data" / f"server_args-{v}.json").read_text())["arguments"]}
    a, b = names(old), names(new)
    return [f"+ --{n}" for n in sorted(b - a)] + [f"- --{n}" for n in sorted(a - b)]


def main(argv: list[str] | None = None) -> int:
    from dsv4ctl.plan.versions import VERSIONS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("version", help="the SGLang release to add (X.Y.Z, on the package index)")
    ap.add_argument("--against", default=list(VERSIONS)[-1],
                    help=f"the supported release to compare with (default: the newest, {list(VERSIONS)[-1]})")
    ns = ap.parse_args(argv)
    if not ORACLE.exists():
        sys.exit("add_sglang_version: .venv-oracle missing: run bash scripts/oracle-env.sh first")
    fetch(ns.version)
    r = subprocess.run([str(ORACLE), "-W", "ignore", str(REPO / "scripts" / "gen_server_args.py"), "--version", ns.version],
                       cwd=REPO, capture_output=True, text=True)
    print(r.stdout.strip() or r.stderr.strip())
    if r.returncode != 0:
        return 2
    print(f"\n== server options, {ns.against} -> {ns.version}")
    print("\n".join(table_diff(ns.version, ns.against)) or "(none)")
    for rel in FOLLOWED:
        a, b = sources(ns.against) / rel, sources(ns.version) / rel
        old = a.read_text().splitlines() if a.exists() else []
        new = b.read_text().splitlines() if b.exists() else []
        print(f"\n== {rel}")
        print("\n".join(difflib.unified_diff(old, new, f"{ns.against}/{rel}", f"{ns.version}/{rel}", lineterm="", n=2))
              or "(same)")
    from tests.oracle.runner import run_cases
    from tests.test_versions_oracle import CASES
    ans = {}
    for v in (ns.against, ns.version):
        out = run_cases(CASES, version=None if v == "0.5.23" else v, timeout=600)
        ans[v] = {x["id"]: x for x in out["results"]}
    print(f"\n== oracle matrix ({len(CASES)} cases): answers that differ")
    diff = [c["id"] for c in CASES if ans[ns.against][c["id"]] != ans[ns.version][c["id"]]]
    for cid in diff:
        a, b = flat(ans[ns.against][cid]), flat(ans[ns.version][cid])
        keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        print(f"{cid}: " + "; ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in keys)[:600])
    if not diff:
        print("(none)")
    print(f"\nnext: a VersionRules entry for {ns.version} in dsv4ctl/plan/versions.py, {ns.version} in OTHER_VERSIONS "
          "of scripts/oracle-env.sh, then the suite (tests/test_versions_oracle.py)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
