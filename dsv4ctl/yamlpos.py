"""YAML loading that remembers where every value came from (for ``file:line: field`` errors)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .errors import InputError


class Positions:
    """Line numbers (1-based) of YAML values, keyed by their path tuple (``("groups", 0, "tp")``)."""

    def __init__(self, file: str):
        self.file = file
        self.lines: dict[tuple, int] = {}

    def line(self, path: tuple) -> int:
        """Line of ``path``, or of its nearest parent that has one (1 when unknown)."""
        p = tuple(path)
        while p:
            if p in self.lines:
                return self.lines[p]
            p = p[:-1]
        return self.lines.get((), 1)

    def where(self, path: tuple) -> str:
        """``file:line`` for ``path``."""
        return f"{self.file}:{self.line(path)}"


def dotted(path: tuple) -> str:
    """``groups[0].tp`` for ``("groups", 0, "tp")``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(root)"


def _construct(node: yaml.Node, path: tuple, pos: Positions, loader: yaml.SafeLoader) -> Any:
    pos.lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict = {}
        for knode, vnode in node.value:
            key = loader.construct_object(knode, deep=True)
            if not isinstance(key, (str, int, float, bool)) or key is None:
                raise InputError(f"{pos.file}:{knode.start_mark.line + 1}: mapping keys must be scalars")
            if key in out:
                raise InputError(f"{pos.file}:{knode.start_mark.line + 1}: {dotted(path + (key,))}: duplicate key")
            out[key] = _construct(vnode, path + (key,), pos, loader)
            pos.lines[path + (key,)] = knode.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(v, path + (i,), pos, loader) for i, v in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def load_yaml(path: Path) -> tuple[Any, Positions]:
    """Parse ``path`` (safe YAML) and return ``(data, positions)``.

    Raises InputError (exit 2) with ``file:line`` for a missing file, a syntax error or a
    duplicate key."""
    pos = Positions(str(path))
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read ({e})") from None
    # libyaml's loader when built (5-8x faster; same nodes, marks and safe constructors).
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, pos
        return _construct(node, (), pos, loader), pos
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 1
        raise InputError(f"{path}:{line}: YAML syntax error: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise InputError(f"{path}: YAML error: {e}") from None
    finally:
        loader.dispose()
