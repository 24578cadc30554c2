"""YAML loading that remembers where every value came from (for ``file:line: field`` errors).

A document parsed once is kept in the local cache (``<cache>/yaml/``, the exact text with its data
and lines), so the next command that reads the same bytes does not import PyYAML (27 ms on this
machine kind, a fifth of ``import typer``; benchmarks/startup.py): an entry is used only when its
stored text equals the file's, and only documents made of JSON types are kept. The cache is an
optimisation that cannot be trusted into harm: used only in a folder of this user's that nobody
else can write, entries read without following links and bounded in size, documents that may
hold a secret never stored."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import InputError

_CACHE_VERSION = 3     # 2: merge-key paths (Positions.merged) stored; 3: merges as PyYAML 6.0 orders them
CACHE_MAX = 512     # parsed-YAML cache entries before a prune (each is one distinct file text)
CACHE_KEEP = 256    # entries a prune keeps: the most recently used

# Largest YAML file read (bytes): profiles and serve configs are a few KiB.
MAX_YAML_BYTES = 16 * 1024 * 1024
# Alias uses (``*name``) allowed per document: a few are normal (shared env blocks); a
# "billion laughs" document needs thousands to expand exponentially.
MAX_ALIASES = 100
# Values (scalars, mappings, sequences) built per document after alias expansion.
MAX_NODES = 200_000


class Positions:
    """Line numbers (1-based) of YAML values, keyed by their path tuple (``("groups", 0, "tp")``)."""

    def __init__(self, file: str):
        self.file = file
        self.lines: dict[tuple, int] = {}
        self.merged: set[tuple] = set()       # paths whose value comes from a merge key (``<<``)

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


class _Budget:
    """Alias/recursion bookkeeping of one :func:`load_yaml` call."""

    def __init__(self) -> None:
        self.seen: set[int] = set()      # ids of collection nodes already constructed
        self.active: set[int] = set()    # ids of the collection nodes being constructed (ancestors)
        self.aliases = 0
        self.nodes = 0


def _construct(node, path: tuple, pos: Positions, loader,
               budget: _Budget) -> Any:
    import yaml
    line = node.start_mark.line + 1
    pos.lines[path] = line
    budget.nodes += 1
    if budget.nodes > MAX_NODES:
        raise InputError(f"{pos.file}:{line}: {dotted(path)}: document expands to more than "
                         f"{MAX_NODES} values (YAML aliases?)")
    if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
        nid = id(node)
        if nid in budget.active:
            raise InputError(f"{pos.file}:{line}: {dotted(path)}: recursive YAML alias")
        if nid in budget.seen:
            budget.aliases += 1
            if budget.aliases > MAX_ALIASES:
                raise InputError(f"{pos.file}:{line}: {dotted(path)}: more than {MAX_ALIASES} "
                                 "YAML alias uses (billion-laughs guard)")
        budget.seen.add(nid)
        budget.active.add(nid)
        try:
            return _construct_collection(node, path, pos, loader, budget)
        finally:
            budget.active.discard(nid)
    return loader.construct_object(node, deep=True)


def _construct_collection(node, path: tuple, pos: Positions, loader,
                          budget: _Budget) -> Any:
    import yaml
    if isinstance(node, yaml.MappingNode):
        out: dict = {}
        merged: dict = {}
        seen: set = set()
        for knode, vnode in node.value:
            if knode.tag == "tag:yaml.org,2002:merge":
                _merge(knode, vnode, path, pos, loader, budget, merged, seen)
                continue
            if not isinstance(knode, yaml.ScalarNode):
                raise InputError(f"{pos.file}:{knode.start_mark.line + 1}: mapping keys must be scalars")
            key = loader.construct_object(knode, deep=True)
            if not isinstance(key, (str, int, float, bool)) or key is None:
                raise InputError(f"{pos.file}:{knode.start_mark.line + 1}: mapping keys must be scalars")
            if key in out:
                raise InputError(f"{pos.file}:{knode.start_mark.line + 1}: {dotted(path + (key,))}: duplicate key")
            out[key] = _construct(vnode, path + (key,), pos, loader, budget)
            pos.lines[path + (key,)] = knode.start_mark.line + 1
        if merged:
            # PyYAML's flatten_mapping: merged keys come first, a key written in the mapping wins
            res = {k: v for k, (v, _line) in merged.items()}
            for k, (_v, line) in merged.items():
                if k not in out:
                    pos.lines[path + (k,)] = line
                    pos.merged.add(path + (k,))
            res.update(out)
            return res
        return out
    return [_construct(v, path + (i,), pos, loader, budget) for i, v in enumerate(node.value)]


def _merge(knode, vnode, path: tuple, pos: Positions, loader, budget: _Budget, merged: dict,
           seen: set | None = None) -> None:
    """A merge key (``<<: *base`` or ``<<: [*a, *b]``) as PyYAML 6.0's ``safe_load`` reads it
    (SGLang reads ``--config`` so; ``SafeConstructor.flatten_mapping``): the merged pairs in the
    order written, a pair skipped only when its key is the very string object of one already
    taken (an alias of the same node; CPython's one-character strings), then the mapping built
    in that order — so for distinct keys the *last* mapping naming a key wins (``<<: [{tp-size:
    4}, {tp-size: 8}]`` is tp-size 8), and a key written in the mapping wins over every merged
    one. ``merged``: key -> (value, line of the ``<<``); ``seen``: the ids of the key objects
    taken (shared by every ``<<`` of one mapping). InputError when the value is no mapping or
    list of mappings (PyYAML refuses that too)."""
    import yaml
    seen = set() if seen is None else seen
    line = knode.start_mark.line + 1
    sources = vnode.value if isinstance(vnode, yaml.SequenceNode) else [vnode]
    for i, src in enumerate(sources):
        if not isinstance(src, yaml.MappingNode):
            raise InputError(f"{pos.file}:{line}: {dotted(path + ('<<',))}: a merge key takes a mapping "
                             "or a list of mappings")
        part = _construct(src, path + ("<<", i), pos, loader, budget)
        for k, v in part.items():
            if id(k) in seen:
                continue
            seen.add(id(k))
            merged[k] = (v, line)


def read_yaml_bytes(path: Path | str) -> bytes:
    """The bytes of a YAML file, at most MAX_YAML_BYTES (:func:`dsv4ctl.resources.read_regular`).

    Raises InputError (exit 2): a missing file, a folder, device or pipe ("not a regular file"),
    an unreadable file, a file over the limit."""
    from ..resources import FileTooLarge, NotRegularFile, read_regular
    try:
        return read_regular(path, MAX_YAML_BYTES)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except NotRegularFile as e:
        raise InputError(f"{path}: not a regular file ({e.kind})") from None
    except FileTooLarge:
        raise InputError(f"{path}:1: file larger than {MAX_YAML_BYTES // (1024 * 1024)} MiB") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror or e})") from None


def parse_yaml(raw: bytes | str, label: str) -> tuple[Any, Positions]:
    """Parse YAML ``raw`` (safe constructors, as PyYAML's ``safe_load``) into ``(data, positions)``;
    ``label`` names the source in errors (a path, or ``host:path``).

    Raises InputError (exit 2) with ``label:line`` for bytes that are not UTF-8, a syntax error, a
    duplicate key, more than MAX_ALIASES alias uses, more than MAX_NODES values after alias
    expansion or a recursive alias (``a: &a [*a]``)."""
    pos = Positions(label)
    if isinstance(raw, bytes):
        if len(raw) > MAX_YAML_BYTES:
            raise InputError(f"{label}:1: file larger than {MAX_YAML_BYTES // (1024 * 1024)} MiB")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"{label}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    else:
        text = raw
    hit = _cache_get(text, label)
    if hit is not None:
        return hit
    import yaml
    # libyaml's loader when built (5-8x faster; same nodes, marks and safe constructors).
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, pos
        data = _construct(node, (), pos, loader, _Budget())
        _cache_put(text, data, pos)
        return data, pos
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 1
        raise InputError(f"{label}:{line}: YAML syntax error: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise InputError(f"{label}: YAML error: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    except RecursionError:
        raise InputError(f"{label}:1: YAML nesting too deep") from None
    finally:
        loader.dispose()


def _cache_file(text: str) -> Path:
    """Where the entry of ``text`` lives: ``<cache>/yaml/<crc32>-<bytes>.json``."""
    import zlib
    from ..resources import cache_root
    b = text.encode("utf-8", "surrogatepass")
    return cache_root() / "yaml" / f"{zlib.crc32(b):08x}-{len(b)}.json"


# An entry larger than this is never read (a document of MAX_CACHED_TEXT characters stores its text,
# its data and its lines: about three times its size).
MAX_CACHED_TEXT = 256 * 1024
MAX_ENTRY_BYTES = 4 * MAX_CACHED_TEXT
_warned: set[str] = set()


def _trusted(create: bool) -> bool:
    """True when ``<cache>/yaml`` can be trusted by the cache folders' one rule
    (:func:`dsv4ctl.resources.cache_folder`: both the cache folder and ``yaml/`` belong to this
    user and are writable by nobody else, checked on the opened descriptors; another user who
    can write there could plant an entry whose data differs from its text). An untrusted folder
    gets one warning line on stderr per process."""
    from ..resources import UntrustedFolder, cache_folder, cache_root
    try:
        os.close(cache_folder(cache_root() / "yaml", create))
        return True
    except UntrustedFolder as e:
        if str(e.where) not in _warned:
            _warned.add(str(e.where))
            import sys
            print(f"dsv4ctl: warning: cache folder {e.where} is not yours alone (owner uid {e.uid}, "
                  f"mode {e.mode:o}): parsed-YAML cache not used", file=sys.stderr)
        return False
    except OSError:
        return False


def _may_hold_secret(text: str, data: Any = None) -> bool:
    """True when any word of ``text`` (keys, ``--flags`` in launch templates, words in comments)
    or of a string in its parsed ``data`` (a flag spelled with a YAML escape, ``--api\\x2dkey``)
    is secret-looking by :func:`dsv4ctl.profile.secrets.is_secret_key`: such a document is never
    cached, whatever its parsed values hold."""
    import re
    from .secrets import is_secret_key
    words = set(re.findall(r"[A-Za-z0-9_.-]{3,}", text))

    def walk(x) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                walk(k)
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
        elif isinstance(x, str):
            words.update(re.findall(r"[A-Za-z0-9_.-]{3,}", x))
    walk(data)
    return any(is_secret_key(w) for w in words)


def _jsonable(x: Any) -> bool:
    """True for data made of JSON types only (str keys), which round-trips through JSON."""
    if isinstance(x, dict):
        return all(isinstance(k, str) and _jsonable(v) for k, v in x.items())
    if isinstance(x, list):
        return all(_jsonable(v) for v in x)
    return x is None or isinstance(x, (str, bool, int, float))


def _cache_get(text: str, label: str) -> tuple[Any, Positions] | None:
    """(data, positions) of ``text`` from the cache, or None (absent, untrusted folder, not a
    regular file of this user, too large, too deep, unreadable, not this text): the cache
    folders' one reader (:func:`dsv4ctl.resources.read_cache_entry`: links refused, a FIFO
    opened non-blocking and refused, a hit keeps the entry from the prune)."""
    from ..resources import read_cache_entry
    if len(text) > MAX_CACHED_TEXT or not _trusted(create=False):
        return None
    raw = read_cache_entry("yaml", _cache_file(text).name, MAX_ENTRY_BYTES)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("v") != _CACHE_VERSION or doc.get("text") != text:
            return None
        pos = Positions(label)
        pos.lines = {tuple(p): ln for p, ln in doc["lines"]}
        pos.merged = {tuple(p) for p in doc.get("merged", [])}
        return doc["data"], pos
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None


def _cache_put(text: str, data: Any, pos: Positions) -> None:
    """Keep a parsed document (best effort: any failure is ignored). Never kept: a document with a
    secret-looking word anywhere in its text (:func:`_may_hold_secret`) or a value under a secret
    key, one larger than MAX_CACHED_TEXT, one not made of JSON types. Entries are 0600 in a 0700
    folder that must be trusted (:func:`_trusted`), written by the cache folders' one writer
    (:func:`dsv4ctl.resources.write_cache_entry`: O_EXCL and O_NOFOLLOW under a random name,
    renamed in place; a planted link is never written through)."""
    from ..resources import write_cache_entry
    from .secrets import secret_strings
    if len(text) > MAX_CACHED_TEXT or not _jsonable(data) or _may_hold_secret(text, data) or secret_strings(data) or not all(
            isinstance(k, (str, int)) and not isinstance(k, bool) for p in pos.lines for k in p):
        return
    if not _trusted(create=True):
        return
    try:
        doc = json.dumps({"v": _CACHE_VERSION, "text": text, "data": data,
                          "lines": [[list(p), ln] for p, ln in pos.lines.items()],
                          "merged": [list(p) for p in sorted(pos.merged, key=str)]})
    except (ValueError, TypeError):
        return
    if write_cache_entry("yaml", _cache_file(text).name, doc.encode("utf-8", "surrogatepass")):
        _maybe_prune(_cache_file(text).parent)


def _maybe_prune(folder: Path) -> None:
    """Keep the parsed-YAML cache bounded: past CACHE_MAX entries, the least recently used are
    deleted down to CACHE_KEEP (a hit refreshes an entry's mtime). The legacy validated-profile
    markers (``<cache>/valid-profiles/``, no longer read) are removed at the same time."""
    try:
        if sum(1 for _ in os.scandir(folder)) <= CACHE_MAX:
            return
    except OSError:
        return
    from ..resources import prune_files
    prune_files(folder, CACHE_KEEP, "*.json")
    import shutil
    shutil.rmtree(folder.parent / "valid-profiles", ignore_errors=True)


def load_yaml(path: Path) -> tuple[Any, Positions]:
    """Read and parse the YAML file ``path``: :func:`read_yaml_bytes` then :func:`parse_yaml`."""
    return parse_yaml(read_yaml_bytes(path), str(path))
