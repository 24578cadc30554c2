#!/usr/bin/env python3
"""Extract SGLang 0.5.23's server-argument table from the real parser and ship it as JSON.

Run it with the oracle environment (the sglang 0.5.23 wheel, built by scripts/oracle-env.sh):

    .venv-oracle/bin/python scripts/gen_server_args.py            # rewrite dsv4ctl/data/server_args-0.5.23.json
    .venv-oracle/bin/python scripts/gen_server_args.py --check    # exit 1 when the shipped file differs
    .venv-oracle/bin/python scripts/gen_server_args.py --stdout   # print the table
    .venv-oracle/bin/python scripts/gen_server_args.py --version 0.5.20   # another supported release
                            # (its sources from .venv-oracle/versions/0.5.22, scripts/oracle-env.sh)

What it reads (sglang 0.5.23): ``srt/server_args.py`` builds the parser exactly as
``prepare_server_args`` does (``argparse.ArgumentParser`` + ``ServerArgs.add_cli_args``), and
``srt/utils/server_args_config_parser.py``'s ``ConfigArgumentMerger(parser)`` says how each key of a
``--config`` YAML file is treated: ``store_true`` (true → ``--flag``, false → omitted), ``value``
(``--key str(value)``; lists → ``--key a b``; mappings → JSON) or ``unsupported`` (ValueError at
start-up, e.g. BooleanOptionalAction flags). dsv4ctl never imports sglang at run time; it reads the
JSON this script writes. No torchvision stub is needed: ``add_cli_args`` does not import the model
configs (the stub of the capacity reference §5.2 is only needed for ``sglang.srt.configs``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
INSTALLED = "0.5.23"          # the oracle environment's own sglang


def out_path(version: str) -> Path:
    return REPO / "dsv4ctl" / "data" / f"server_args-{version}.json"


OUT = out_path(INSTALLED)
SCHEMA = "dsv4ctl.server_args/1"

# Environment switches that change the parser's choices; cleared so the table is reproducible.
_ENV_CLEARED = ("SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE",)


def _type_name(t) -> str | None:
    if t is None:
        return None
    if t in (str, int, float):
        return t.__name__
    mod = getattr(t, "__module__", "") or ""
    qual = getattr(t, "__qualname__", None) or type(t).__name__
    return f"{mod}.{qual}" if mod else qual


def _plain(v):
    """A JSON value for a default/choice/const; non-JSON values become {"repr": ...}."""
    if isinstance(v, (set, frozenset)):
        v = sorted(v, key=repr)
    if isinstance(v, tuple):
        v = list(v)
    try:
        json.dumps(v)
        return v
    except (TypeError, ValueError):
        return {"repr": repr(v)}


def _action_name(a: argparse.Action) -> str:
    names = {
        argparse._StoreAction: "store",
        argparse._StoreTrueAction: "store_true",
        argparse._StoreFalseAction: "store_false",
        argparse._StoreConstAction: "store_const",
        argparse._AppendAction: "append",
        argparse._CountAction: "count",
    }
    return names.get(type(a), type(a).__name__)


def use_version(version: str) -> None:
    """Import SGLang ``version`` instead of the installed one: its sources from
    ``.venv-oracle/versions/<version>`` first on ``sys.path`` (before anything imports sglang)."""
    if version != INSTALLED:
        src = REPO / ".venv-oracle" / "versions" / version
        if not (src / "sglang").is_dir():
            raise ImportError(f"{src}/sglang missing (bash scripts/oracle-env.sh fetches it)")
        sys.path.insert(0, str(src))
        sys.path.insert(1, str(REPO))
        from tests.oracle import tv_stub
        if tuple(int(x) for x in version.split(".")[:3]) < (0, 5, 21):
            # 0.5.18-0.5.20's server_args.py import FunctionCallParser and the model configs at
            # module level (0.5.21+: lazily), which pull in openai, partial_json_parser, xgrammar
            # and torchvision, not installed in the oracle environment: stubbed when missing (the
            # --tool-call-parser choices are FunctionCallParser's own names); 0.5.18/0.5.19
            # register configs the environment's transformers already has (tolerated).
            tv_stub.install(tv_stub.roots_for_sglang(
                ("torchvision",) if tv_stub.missing("torchvision") else ()))
            tv_stub.tolerate_config_reregistration()


def extract() -> dict:
    """The argument table of the sglang imported (see :func:`use_version`), as a JSON-ready dict."""
    for k in _ENV_CLEARED:
        os.environ.pop(k, None)
    import sglang
    from sglang.srt.server_args import ServerArgs
    try:
        from sglang.srt.utils import server_args_config_parser as cfg
    except ImportError:         # 0.5.18: sglang/srt/server_args_config_parser.py
        from sglang.srt import server_args_config_parser as cfg

    version = getattr(sglang, "__version__", None)
    if not version or version.startswith("0.0.0"):
        from importlib.metadata import version as dist_version
        version = dist_version("sglang")
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    merger = cfg.ConfigArgumentMerger(parser)
    store_true = set(merger.store_true_actions)
    unsupported = set(merger.unsupported_actions)

    args = []
    for a in parser._actions:
        if not a.option_strings or "--help" in a.option_strings or "--config" in a.option_strings:
            continue
        longs = [o[2:] for o in a.option_strings if o.startswith("--")]
        # 0.5.23 matches a YAML key against every long spelling; 0.5.21/0.5.22 against the dest only
        keys = cfg._config_keys(a) if hasattr(cfg, "_config_keys") else {a.dest}
        if keys & unsupported:
            config = "unsupported"
        elif keys & store_true:
            config = "store_true"
        else:
            config = "value"
        args.append({
            "name": longs[0],
            "aliases": longs[1:],
            "dest": a.dest,
            "action": _action_name(a),
            "type": _type_name(a.type),
            "choices": _plain(a.choices) if a.choices is not None else None,
            "default": _plain(a.default),
            "nargs": a.nargs,
            "const": _plain(a.const),
            "required": bool(a.required),
            "config": config,
        })
    args.sort(key=lambda x: x["name"])
    return {
        "schema": SCHEMA,
        "sglang_version": version,
        "source": "sglang/srt/server_args.py ServerArgs.add_cli_args + "
                  "sglang/srt/utils/server_args_config_parser.py ConfigArgumentMerger",
        "generator": "scripts/gen_server_args.py",
        "arguments": args,
    }


def dumps(doc: dict) -> str:
    return json.dumps(doc, indent=1, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the shipped file; exit 1 if it differs")
    ap.add_argument("--stdout", action="store_true", help="print instead of writing")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--version", default=INSTALLED, help="the SGLang release (default: the installed 0.5.23)")
    ns = ap.parse_args(argv)
    ns.out = ns.out or out_path(ns.version)
    try:
        use_version(ns.version)
        doc = extract()
    except ImportError as e:
        print(f"gen_server_args: cannot import sglang ({e}); run with .venv-oracle/bin/python "
              f"(bash scripts/oracle-env.sh builds it)", file=sys.stderr)
        return 2
    if doc["sglang_version"] != ns.version:
        print(f"gen_server_args: sglang {doc['sglang_version']} imported, {ns.version} expected", file=sys.stderr)
        return 2
    text = dumps(doc)
    if ns.stdout:
        sys.stdout.write(text)
        return 0
    if ns.check:
        old = ns.out.read_text() if ns.out.exists() else ""
        if old != text:
            print(f"gen_server_args: {ns.out} differs from the sglang {ns.version} parser; re-run without --check",
                  file=sys.stderr)
            return 1
        print(f"gen_server_args: {ns.out} matches ({len(doc['arguments'])} arguments)")
        return 0
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(text)
    print(f"gen_server_args: wrote {ns.out} ({len(doc['arguments'])} arguments)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
