"""Is the DSV4 index-K read path of an SGLang tree gated on the HiCache layer transfer?

Decided from the tree's Python source, never from a flag. In stock sglang 0.5.23,
``srt/mem_cache/deepseek_v4_memory_pool.py``:

* ``DeepSeekV4TokenToKVPool.wait_layer_transfer(layer_id)`` blocks on
  ``self.layer_transfer_counter.wait_until(...)`` until HiCache has loaded that layer back;
* ``DeepSeekV4TokenToKVPool.get_index_k_with_scale_buffer(layer_id)`` (and the other index-K
  accessors) call ``self.wait_layer_transfer(layer_id)`` *before* delegating to the
  ``DeepSeekV4IndexerPool`` behind ``self._indexer_pool(ratio)``;
* attention code reads index-K only through the token-to-KV pool's accessors.

A tree is **ungated** when any of these is broken: ``wait_layer_transfer`` no longer waits, an
accessor of the token-to-KV pool reaches the indexer pool without waiting first, the accessor is
gone, or code outside the pools reads the indexer pool directly (``pool.c4_indexer_kv_pool
.get_index_k_with_scale_buffer(...)``, ``pool.index_pools[4].index_k_with_scale_buffer``, …)
in a function that does not wait first. Then a bf16 index-K read can race the HiCache load-back.

HiCache/PD transfer machinery (``srt/mem_cache/``, ``srt/disaggregation/``) moves the buffers
itself and the NPU pools (``srt/hardware_backend/npu/``) are a different storage layout; they are
not index-K *readers* and are not scanned (the DSV4 pool module itself is always checked).

:func:`analyse` is pure (sources in, verdict out); :func:`analyse_tree` reads a tree."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

POOL_MODULE = "srt/mem_cache/deepseek_v4_memory_pool.py"
POOL_CLASS = "DeepSeekV4TokenToKVPool"
INDEXER_CLASS = "DeepSeekV4IndexerPool"
ACCESSOR = "get_index_k_with_scale_buffer"
READ_METHODS = ("get_index_k_with_scale_buffer", "get_index_k_fp4_payload_buffer",
                "get_index_k_fp4_scale_buffer", "get_index_k_scale_buffer", "get_index_k_fp4",
                "get_index_k_dequant")
READ_ATTRS = ("index_k_with_scale_buffer", "index_k_payload_buffer", "index_k_scale_buffer")
# Handles of the indexer pool inside the token-to-KV pool (0.5.23); more are derived from source.
BASE_HANDLES = ("_indexer_pool", "index_pools", "c4_indexer_kv_pool")
NOT_READERS = ("srt/mem_cache/", "srt/disaggregation/", "srt/hardware_backend/npu/")


@dataclass(frozen=True)
class Site:
    """A place in the tree: package-relative file, 1-based line, what is wrong there."""

    file: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.what}"


@dataclass
class GatingVerdict:
    """``gated`` is True/False, or None when the tree has no DSV4 pool to judge."""

    gated: Optional[bool]
    pool_file: str
    scanned_files: int = 0
    problems: list[Site] = field(default_factory=list)
    gated_accessors: list[str] = field(default_factory=list)

    def summary(self) -> str:
        if self.gated is None:
            return self.problems[0].what if self.problems else "no DSV4 token-to-KV pool found"
        if self.gated:
            return (f"gated: {', '.join(self.gated_accessors)} wait for the HiCache layer transfer "
                    f"({self.pool_file}; {self.scanned_files} reader files scanned)")
        return "ungated: " + "; ".join(str(p) for p in self.problems[:3])


def _calls_wait(node: ast.AST) -> list[int]:
    """Source offsets (line*10000+col) of ``*.wait_layer_transfer(...)`` calls inside ``node``."""
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "wait_layer_transfer":
            out.append(n.lineno * 10000 + n.col_offset)
    return out


def _mentions(expr: ast.AST, handles: set[str]) -> bool:
    for n in ast.walk(expr):
        if isinstance(n, ast.Attribute) and n.attr in handles:
            return True
        if isinstance(n, ast.Name) and n.id in handles:
            return True
    return False


def _direct_reads(fn: ast.AST, handles: set[str]) -> list[tuple[int, str]]:
    """Index-K reads in function ``fn`` whose receiver is the indexer pool (or a local alias)."""
    local = set(handles)
    # local aliases: x = <expr mentioning a handle>  (iterate to a fixed point, twice is enough)
    for _ in range(2):
        for n in ast.walk(fn):
            if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None and _mentions(n.value, local):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                for t in targets:
                    for m in ast.walk(t):
                        if isinstance(m, ast.Name):
                            local.add(m.id)
            if isinstance(n, (ast.For, ast.comprehension)) and _mentions(n.iter, local):
                for m in ast.walk(n.target):
                    if isinstance(m, ast.Name):
                        local.add(m.id)
    out = []
    for n in ast.walk(fn):
        if isinstance(n, ast.Attribute) and n.attr in READ_METHODS + READ_ATTRS and _mentions(n.value, local):
            out.append((n.lineno * 10000 + n.col_offset, n.attr))
    return sorted(out)


def _functions(tree: ast.AST):
    """(class name or None, function node) for every function, outermost first."""
    def walk(node, cls):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                yield from walk(child, child.name)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield cls, child
                yield from walk(child, cls)
            else:
                yield from walk(child, cls)
    yield from walk(tree, None)


def _pool_handles(cls: ast.ClassDef) -> set[str]:
    """Attribute names the pool class binds to its indexer pools (``self.c4_indexer_kv_pool = ...``)."""
    handles = set(BASE_HANDLES)
    for _ in range(2):
        for n in ast.walk(cls):
            if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None:
                val_mentions = _mentions(n.value, handles) or any(
                    isinstance(m, ast.Attribute) and m.attr == "_make_indexer_pool" for m in ast.walk(n.value))
                if not val_mentions:
                    continue
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                for t in targets:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        handles.add(t.attr)
    return handles


def _unguarded(fn: ast.AST, handles: set[str]) -> list[tuple[int, str]]:
    waits = _calls_wait(fn)
    first_wait = min(waits) if waits else None
    return [(pos, what) for pos, what in _direct_reads(fn, handles) if first_wait is None or pos < first_wait]


def analyse(pool_source: str, readers: dict[str, str], pool_file: str = POOL_MODULE) -> GatingVerdict:
    """Decide gating from the DSV4 pool module's source and the reader modules' sources.

    ``readers`` maps package-relative paths to source text (modules that may read index-K).
    Returns a GatingVerdict; ``problems`` name file:line of each ungated read."""
    v = GatingVerdict(gated=None, pool_file=pool_file, scanned_files=len(readers))
    try:
        tree = ast.parse(pool_source)
    except SyntaxError as e:
        v.problems.append(Site(pool_file, e.lineno or 1, f"cannot parse: {e.msg}"))
        return v
    cls = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == POOL_CLASS), None)
    if cls is None:
        v.problems.append(Site(pool_file, 1, f"no class {POOL_CLASS} in the tree: not a DSV4-capable SGLang"))
        return v
    handles = _pool_handles(cls)
    methods = {f.name: f for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    problems: list[Site] = []
    wait = methods.get("wait_layer_transfer")
    if wait is None:
        problems.append(Site(pool_file, cls.lineno, f"{POOL_CLASS}.wait_layer_transfer is missing"))
    elif not any(isinstance(n, ast.Attribute) and n.attr == "wait_until" for n in ast.walk(wait)):
        problems.append(Site(pool_file, wait.lineno,
                             f"{POOL_CLASS}.wait_layer_transfer does not wait on the layer transfer counter"))
    acc = methods.get(ACCESSOR)
    if acc is None:
        problems.append(Site(pool_file, cls.lineno, f"{POOL_CLASS}.{ACCESSOR} is missing"))
    for name, fn in methods.items():
        for pos, what in _unguarded(fn, handles):
            problems.append(Site(pool_file, pos // 10000,
                                 f"{POOL_CLASS}.{name} reaches the indexer pool ({what}) without "
                                 f"wait_layer_transfer(layer_id) first"))
        if name.startswith(("get_index_k", "get_low_ratio_index_k")) and _direct_reads(fn, handles) \
                and not _unguarded(fn, handles):
            v.gated_accessors.append(name)
    # other classes/functions in the pool module (not the two pools themselves) and the readers
    sources = dict(readers)
    sources.setdefault(pool_file, pool_source)
    for path, text in sorted(sources.items()):
        if not any(w in text for w in READ_METHODS + READ_ATTRS):
            continue
        try:
            mod = tree if path == pool_file else ast.parse(text)
        except SyntaxError:
            continue
        for owner, fn in _functions(mod):
            if path == pool_file and owner in (POOL_CLASS, INDEXER_CLASS):
                continue
            for pos, what in _unguarded(fn, handles):
                problems.append(Site(path, pos // 10000,
                                     f"{fn.name} reads the indexer pool directly ({what}) without "
                                     f"wait_layer_transfer(layer_id)"))
    v.problems = problems
    v.gated = not problems
    return v


def find_package(tree: Path) -> Optional[Path]:
    """The ``sglang`` package directory inside ``tree`` (a git checkout with ``python/sglang``,
    a folder holding ``sglang/``, or the package itself); None when there is none."""
    tree = Path(tree)
    for cand in (tree / "python" / "sglang", tree / "sglang", tree):
        if (cand / POOL_MODULE).is_file() or (cand / "srt").is_dir():
            return cand
    return None


def analyse_tree(tree: Path) -> GatingVerdict:
    """Read ``tree`` and decide gating. Only files mentioning an index-K read name are parsed.

    A tree without an sglang package or without the DSV4 pool module gives ``gated=None``."""
    pkg = find_package(tree)
    if pkg is None or not (pkg / POOL_MODULE).is_file():
        v = GatingVerdict(gated=None, pool_file=str(Path(tree) / POOL_MODULE))
        v.problems.append(Site(str(tree), 1, f"no sglang/{POOL_MODULE} under {tree}"))
        return v
    pool_source = (pkg / POOL_MODULE).read_text(errors="replace")
    readers: dict[str, str] = {}
    for p in pkg.rglob("*.py"):
        rel = p.relative_to(pkg).as_posix()
        if rel == POOL_MODULE or rel.startswith(NOT_READERS):
            continue
        try:
            text = p.read_text(errors="replace")
        except OSError:
            continue
        if any(w in text for w in READ_METHODS + READ_ATTRS):
            readers[rel] = text
    v = analyse(pool_source, readers, POOL_MODULE)
    v.scanned_files = len(readers)
    return v
