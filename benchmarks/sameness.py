#!/usr/bin/env python3
"""Sameness guard for refactors (issue 42 item 4): ``dsv4ctl plan --json`` is byte-identical on
every shipped profile and on the recipe corpus before and after a change.

What is planned (one row each, named):

* ``profile:<default>``: ``dsv4ctl plan --json`` (the embedded default profile);
* ``profile:<name>``: ``dsv4ctl plan profiles/<name>.yaml --json`` for every shipped profile;
* ``recipes:<id>``, ``field_serves:<id>``, ``known_failures:<id>``: every entry of
  ``tests/data/recipes/corpus.json``, turned into a profile and serve config the way
  ``tests/test_recipes.py`` does (:func:`tests.test_recipes.write_profile`, its ``--set`` items).

A row's digest is the SHA-256 of its exit code, stdout and stderr, with the row's temporary
directory replaced by ``<tmp>`` (profiles written for corpus entries live there). The baseline,
``benchmarks/sameness_baseline.json``, is written from main before a refactor:

    .venv/bin/python benchmarks/sameness.py --write     # (re)write the baseline from this tree
    .venv/bin/python benchmarks/sameness.py             # compare; exit 1 and list every row that differs

Run the baseline from a clean tree of a commit (``git archive HEAD | tar -x -C DIR``, then
``.venv/bin/python DIR/benchmarks/sameness.py --write --baseline FILE``): this checkout's own
tree is imported (the script puts its repository first on ``sys.path``)."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import dsv4ctl  # noqa: E402
from tests import test_recipes as R  # noqa: E402
from tests.conftest import run_cli  # noqa: E402

BASELINE = Path(__file__).with_name("sameness_baseline.json")
CORPUS_KINDS = ("recipes", "field_serves", "known_failures")


def corpus_args(tmp: Path, e: dict) -> list[str]:
    """``plan`` arguments for corpus entry ``e`` (profile written into ``tmp``), as
    :func:`tests.test_recipes.plan` builds them, ``--json`` included."""
    args = [e["profile"], "-g", e["group"]] if e.get("profile") else [str(R.write_profile(tmp, e))]
    fmt = e.get("checkpoint_format", "fp4")
    sets = (*e.get("set", []), *([f"checkpoint_format={fmt}"] if fmt != "fp4" else []))
    return ["plan", *args, "--json", *[x for s in sets for x in ("--set", s)]]


def rows() -> list[tuple[str, object]]:
    """(row name, argument builder ``tmp -> argv``) of every row, in a fixed order."""
    out: list[tuple[str, object]] = [("profile:<default>", lambda tmp: ["plan", "--json"])]
    for p in sorted((REPO / "profiles").glob("*.yaml")):
        out.append((f"profile:{p.stem}", lambda tmp, p=p: ["plan", str(p), "--json"]))
    for kind in CORPUS_KINDS:
        for e in R.CORPUS[kind]:
            out.append((f"{kind}:{e['id']}", lambda tmp, e=e: corpus_args(tmp, e)))
    return out


def digest(name: str, build, codes: dict) -> str:
    """SHA-256 of one row's exit code, stdout and stderr (its temporary directory as ``<tmp>``,
    this checkout as ``<repo>``); the exit code is counted in ``codes``."""
    with tempfile.TemporaryDirectory(prefix="dsv4ctl-same-") as d:
        tmp = Path(d)
        r = run_cli(*build(tmp), env={"DSV4CTL_CACHE": str(tmp / "cache"), "DSV4CTL_STATE_DIR": str(tmp / "state")})
        codes[r.code] = codes.get(r.code, 0) + 1
        text = f"{r.code}\n{r.out}\n--stderr--\n{r.err}".replace(str(tmp), "<tmp>").replace(str(REPO), "<repo>")
    return hashlib.sha256(text.encode()).hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write the baseline instead of comparing")
    ap.add_argument("--baseline", type=Path, default=BASELINE, help=f"baseline file (default {BASELINE.name})")
    a = ap.parse_args()
    t0 = time.monotonic()
    codes: dict = {}
    now = {name: digest(name, build, codes) for name, build in rows()}
    print(f"{len(now)} rows planned in {time.monotonic() - t0:.1f} s with {Path(dsv4ctl.__file__).parent}; "
          f"exit codes {dict(sorted(codes.items()))}")
    if a.write:
        a.baseline.write_text(json.dumps(now, indent=1) + "\n")
        print(f"baseline written: {a.baseline}")
        return 0
    base = json.loads(a.baseline.read_text())
    differ = [n for n in now if base.get(n) != now[n]]
    missing = [n for n in base if n not in now]
    for n in differ:
        print(f"DIFFERS: {n}" if n in base else f"NEW (not in the baseline): {n}")
    for n in missing:
        print(f"MISSING (in the baseline only): {n}")
    same = len(now) - len(differ)
    print(f"byte-identical: {same}/{len(now)} rows; differing {len(differ)}, missing {len(missing)}")
    return 1 if differ or missing else 0


if __name__ == "__main__":
    sys.exit(main())
