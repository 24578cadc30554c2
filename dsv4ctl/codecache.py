"""Start-up: the methods ``@dataclass`` generates, compiled once and kept in the cache.

Python's ``.pyc`` files hold a module's own code, not the methods ``dataclasses`` writes for each
dataclass (``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__`` ...): those are
generated as source text and compiled by ``exec(text)`` every time the defining module is imported
(CPython ``Lib/dataclasses.py``: ``_create_fn`` in 3.10-3.12, ``_FuncBuilder.add_fns_to_class``
in 3.13). ``dsv4ctl plan`` imports 28 dataclasses; compiling their methods was about half of its
import time (``benchmarks/startup.py``: 28 ms of imports, 11 ms with this cache, same run).
Each code object is kept marshalled on its own and unmarshalled when first used: the table holds
the methods of every command run so far (700 texts, 1 MB), a ``plan`` uses 160 of them, and
unmarshalling the whole table was 2.7 ms of its start (0.35 ms for the texts alone).

While :func:`dataclass_code_cache` is active, the name ``exec`` inside ``dataclasses`` is
:meth:`_Memo.exec`: it looks the exact text up in a table of code objects (``compile(text)`` of
that text, so the same text always runs the same code, as a ``.pyc`` does) and compiles only what
it does not hold; on exit new entries are written back. Any other caller of ``exec`` is untouched,
and any failure (unreadable, untrusted or corrupt table) means compiling as before.

The table: ``<cache>/code/dataclasses2-<python tag>-<hexversion>-m<marshal version>.marshal``, a
``marshal`` dump of ``{text: marshal.dumps(code)}``. It runs as this user's code, so it is read under the cache
folders' trust rules (:func:`dsv4ctl.resources.cache_folder`: the folder and ``code/`` belong to
this user and nobody else can write them; :func:`dsv4ctl.resources.open_cache_file`: no link is
followed, a regular file of this user), at most :data:`MAX_TABLE_BYTES`, and written 0600 under a
random ``O_EXCL`` name then renamed in place. At most :data:`MAX_ENTRIES` texts are kept (past it,
only those the run used)."""

from __future__ import annotations

import builtins
import os
import sys
from contextlib import contextmanager

MAX_TABLE_BYTES = 8 << 20
MAX_ENTRIES = 4096
_CODE = type(compile("0", "<string>", "eval"))
_active: list["_Memo"] = []


def table_name() -> str:
    """File name of this interpreter's table (code objects are specific to the Python version and
    the marshal format)."""
    import marshal
    return f"dataclasses2-{sys.implementation.cache_tag}-{sys.hexversion:x}-m{marshal.version}.marshal"


class _Memo:
    """The table of one run: ``table`` (loaded: text -> marshalled code), ``new`` (compiled this run:
    text -> code), ``used`` (hits)."""

    def __init__(self, table: dict) -> None:
        self.table = table
        self.new: dict = {}
        self.used: set = set()

    def exec(self, source, globals=None, locals=None, /, **kw):   # noqa: A002 - exec's own names
        """``exec`` for ``dataclasses``: a ``str`` source runs its cached code object."""
        if isinstance(source, str):
            raw = self.table.get(source)
            code = _unmarshal(raw) if raw is not None else None
            if code is not None:
                self.used.add(source)
            else:
                code = self.new.get(source)
                if code is None:
                    code = self.new[source] = compile(source, "<string>", "exec")
            source = code
        return builtins.exec(source, globals, locals, **kw)


def _load() -> dict:
    """The table of code objects, or {} (absent, untrusted folder, too large, not a table)."""
    import marshal

    from .resources import read_cache_entry
    raw = read_cache_entry("code", table_name(), MAX_TABLE_BYTES, planted="compiled code")
    if raw is None:
        return {}
    try:
        table = marshal.loads(raw)
    except (ValueError, EOFError, TypeError):
        return {}
    if not isinstance(table, dict) or not all(type(k) is str and type(v) is bytes for k, v in table.items()):
        return {}
    return table


def _unmarshal(raw: bytes):
    """The code object of one table value, or None (not a code object: compiled again)."""
    import marshal
    try:
        code = marshal.loads(raw)
    except (ValueError, EOFError, TypeError):
        return None
    return code if type(code) is _CODE else None


def _save(memo: _Memo) -> None:
    """Write the table back when the run compiled something (best effort: failures ignored)."""
    import marshal

    from .resources import write_cache_entry
    new = {k: marshal.dumps(v) for k, v in memo.new.items()}
    keep = {**memo.table, **new}
    if len(keep) > MAX_ENTRIES:
        keep = {k: memo.table[k] for k in memo.used} | new
    raw = marshal.dumps(keep)
    if len(raw) <= MAX_TABLE_BYTES and len(keep) <= MAX_ENTRIES:
        write_cache_entry("code", table_name(), raw, planted="compiled code")


@contextmanager
def dataclass_code_cache():
    """Compile dataclass methods through the cached table for the duration of the block (one
    command run); nested uses share the outer one. Yields the run's :class:`_Memo` (``new``:
    texts compiled in this run, ``used``: texts found in the table)."""
    import dataclasses
    if _active:
        yield _active[-1]
        return
    memo = _Memo(_load())
    had = "exec" in vars(dataclasses)
    before = vars(dataclasses).get("exec")
    dataclasses.exec = memo.exec
    _active.append(memo)
    try:
        yield memo
    finally:
        _active.pop()
        if had:
            dataclasses.exec = before
        else:
            del dataclasses.exec
        if memo.new:
            _save(memo)


__all__ = ["dataclass_code_cache", "table_name", "MAX_TABLE_BYTES", "MAX_ENTRIES"]
