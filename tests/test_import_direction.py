"""Imports point one way (``docs/architecture.md``: its floors, and the seam where servers run): a
module may import its own layer or the layers below it, never above, and the module graph has no
cycle. Function-local imports count.

Layers, lowest first: errors/render/resources/codecache <- profile <- remote <- hosts <- patches <- plan <-
check <- serve <- deploy <- diagnose <- runbook <- report <- watch <- commands <- cli."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PKG = REPO / "dsv4ctl"
LAYERS = (("", "errors", "render", "resources", "data", "signals", "codecache"), ("profile",), ("remote",), ("hosts",), ("patches",),
          ("plan",), ("check",), ("serve",), ("deploy",), ("diagnose",), ("runbook",), ("report",), ("watch",), ("commands",), ("cli", "__main__"))
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    """``dsv4ctl/hosts/lock.py`` -> ``dsv4ctl.hosts.lock``; a package's ``__init__`` is the package."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _exists(mod: str) -> bool:
    p = REPO / mod.replace(".", "/")
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def import_graph() -> dict[str, set[str]]:
    """Every dsv4ctl module -> the dsv4ctl modules it imports anywhere in its body (an imported
    name that is itself a module counts as that module)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PKG.rglob("*.py")):
        mod = module_name(path)
        pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] != "dsv4ctl":
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    deps.add(sub if _exists(sub) else target)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.split(".")[0] == "dsv4ctl"}
        deps.discard(mod)
        graph[mod] = deps
    return graph


def layer(mod: str) -> int:
    """The layer index of a dsv4ctl module (its first component under ``dsv4ctl``)."""
    parts = mod.split(".")
    return LAYER_OF[parts[1] if len(parts) > 1 else ""]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_layer():
    unknown = [m for m in import_graph() if m.count(".") >= 1 and m.split(".")[1] not in LAYER_OF]
    assert unknown == []


def test_imports_point_down():
    graph = import_graph()
    wrong = sorted(f"{m} (layer {layer(m)}) imports {d} (layer {layer(d)})"
                   for m, deps in graph.items() for d in deps if layer(d) > layer(m))
    assert wrong == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_checker_sees_a_wrong_way_import_and_a_cycle():
    graph = {"dsv4ctl.profile.model": {"dsv4ctl.deploy.engine"}, "dsv4ctl.deploy.engine": {"dsv4ctl.deploy.promote"},
             "dsv4ctl.deploy.promote": {"dsv4ctl.deploy.engine"}}
    assert layer("dsv4ctl.deploy.engine") > layer("dsv4ctl.profile.model")
    assert cycles(graph) == [["dsv4ctl.deploy.engine", "dsv4ctl.deploy.promote"]]
    # the real graph knows function-local imports: commands/plan.py imports plan.plan inside a function
    assert "dsv4ctl.plan.plan" in import_graph()["dsv4ctl.commands.plan"]
