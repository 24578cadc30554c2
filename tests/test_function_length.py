"""No function over 80 lines anywhere in the ``dsv4ctl`` package (issue 42 item 3: every module, new
ones included) nor in ``benchmarks/startup.py``. A function's length is ``end_lineno - lineno + 1``
(nested functions count in their parent too); a typer command (decorated ``@app.command(...)``) is
measured from the first line of its body, so its option list may stay long."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

MAX_LINES = 80
SCOPE = ("dsv4ctl", "benchmarks/startup.py")
"""Files, or folders (every ``*.py`` below them), held to :data:`MAX_LINES`."""


def _is_command(fn: ast.AST) -> bool:
    return any(isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "command"
               for d in fn.decorator_list)


def long_functions(source: str, limit: int = MAX_LINES) -> list[tuple[str, int, int]]:
    """(name, first line, length) of every function of ``source`` longer than ``limit`` lines."""
    out = []
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = fn.body[0].lineno if _is_command(fn) else fn.lineno
            n = fn.end_lineno - start + 1
            if n > limit:
                out.append((fn.name, fn.lineno, n))
    return out


def scoped_files() -> list[Path]:
    """Every file of :data:`SCOPE`."""
    files: list[Path] = []
    for s in SCOPE:
        p = REPO / s
        files += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return files


def test_no_function_over_80_lines_in_scope():
    found = [f"{p.relative_to(REPO)}:{line}: {name} has {n} lines (at most {MAX_LINES})"
             for p in scoped_files() for name, line, n in long_functions(p.read_text())]
    assert not found, "\n".join(found)
    files = {p.relative_to(REPO).as_posix() for p in scoped_files()}
    assert len(files) >= 150 and {"dsv4ctl/cli.py", "dsv4ctl/deploy/engine.py",
                                  "dsv4ctl/check/classify/__init__.py"} <= files    # the whole package is read


def test_length_is_measured_from_the_body_for_commands_only():
    body = "".join(f"    x{i} = {i}\n" for i in range(80))
    params = "".join(f"    p{i}: int = 0,\n" for i in range(30))
    plain = f"def f(\n{params}) -> None:\n{body}"
    command = f"@app.command('c')\ndef c(\n{params}) -> None:\n{body}"
    assert long_functions(plain) == [("f", 1, 112)]
    assert long_functions(command) == []
    assert long_functions(command + "    x = 1\n") == [("c", 2, 81)]
    assert long_functions("async def g():\n" + body + "    return 1\n") == [("g", 1, 82)]
