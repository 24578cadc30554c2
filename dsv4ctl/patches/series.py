"""Patch series files: parsing, validation and identity (pure: no I/O beyond what the caller reads).

A series directory (e.g. ``patches/sglang-0.5.23/``) holds git-format patches and a ``series`` file
listing them in application order::

    # comment lines and blank lines are ignored
    base sglang==0.5.23
    0001-dsv4-bf16-index-k.patch  index_k_dtype=bf16 index_k_accounting=exact when=SGLANG_DSV4_INDEX_K_DTYPE=bf16  # why
    0002-dsv4-pool-plan-log.patch log_line=DSV4_POOL_PLAN

* ``base PKG==VERSION`` (optional, once, before any patch): the pristine release the series is cut
  against. Without it the directory name ``sglang-VERSION`` gives the base.
* A patch line: the file name (relative to the series directory, ``.patch``/``.diff``), then
  ``key=value`` facts, then an optional ``# comment``.

Facts dsv4ctl reads (others are kept and shown):

* ``index_k_dtype`` (``fp8``/``bf16``/``fp4``): what the tree's C4 index-K buffer stores once the
  patch is applied; ``index_k_accounting`` (``fp8``/``exact``): what the tree's pool configurator
  budgets for it (``dsv4ctl.capacity``, ``PoolInputs``).
* ``when=ENV=VALUE``: the facts hold only when the server runs with that env switch (a patch that
  adds an opt-in switch). ``dsv4ctl plan`` checks it against a group's ``env``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Optional

from ..errors import InputError

FACT_VALUES = {
    "index_k_dtype": ("fp8", "bf16", "fp4"),
    "index_k_accounting": ("fp8", "exact"),
}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*\.(patch|diff)$")
_KEY_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_BASE_RE = re.compile(r"^([A-Za-z0-9_.-]+)==([0-9][A-Za-z0-9.+-]*)$")
_DIR_RE = re.compile(r"^([A-Za-z0-9_.]+)-([0-9][A-Za-z0-9.+]*)$")


@dataclass(frozen=True)
class Entry:
    """One patch of a series: file ``name``, ``facts`` (str → str), ``comment``, 1-based ``line``."""

    name: str
    facts: dict = field(default_factory=dict)
    comment: str = ""
    line: int = 0

    @property
    def when(self) -> Optional[tuple[str, str]]:
        """The ``when=ENV=VALUE`` condition as ``(ENV, VALUE)``, or None."""
        w = self.facts.get("when")
        if not w:
            return None
        env, _, value = w.partition("=")
        return env, value


@dataclass(frozen=True)
class Series:
    """A parsed series: ``package`` and ``version`` of the base, ordered ``entries``."""

    path: str                     # the series file (for messages)
    package: str
    version: str
    entries: tuple[Entry, ...]

    @property
    def base(self) -> str:
        """``package==version``, e.g. ``sglang==0.5.23``."""
        return f"{self.package}=={self.version}"

    def entry(self, name: str) -> Entry:
        for e in self.entries:
            if e.name == name:
                return e
        raise InputError(f"{self.path}: no patch named {name!r} in the series")


def parse_base(spec: str, where: str = "base") -> tuple[str, str]:
    """``"sglang==0.5.23"`` → ``("sglang", "0.5.23")``; the package name as PyPI normalises it
    (``SGLang`` is ``sglang``, PEP 503); InputError otherwise."""
    m = _BASE_RE.match(spec.strip())
    if not m:
        raise InputError(f"{where}: expected PACKAGE==VERSION (e.g. sglang==0.5.23), got {spec!r}")
    return re.sub(r"[-_.]+", "-", m.group(1)).lower(), m.group(2)


def parse_series(text: str, path: str = "series", dirname: str = "") -> Series:
    """Parse a ``series`` file. ``dirname`` (e.g. ``sglang-0.5.23``) supplies the base when the file
    has no ``base`` line.

    Raises InputError ``path:line: message`` for: a bad patch file name, a duplicate patch, a fact
    without ``=``, an unknown value of a known fact, a ``when`` fact not of the form ENV=VALUE,
    a second or late ``base`` line, and a series whose base cannot be determined."""
    base: Optional[tuple[str, str]] = None
    entries: list[Entry] = []
    seen: set[str] = set()
    for no, raw in enumerate(text.splitlines(), 1):
        where = f"{path}:{no}"
        body, _, comment = raw.partition("#")
        words = body.split()
        if not words:
            continue
        if words[0] == "base":
            if base is not None or entries:
                raise InputError(f"{where}: 'base' must come once, before the first patch")
            if len(words) != 2:
                raise InputError(f"{where}: expected 'base PACKAGE==VERSION'")
            base = parse_base(words[1], where)
            continue
        name = words[0]
        if not _NAME_RE.match(name) or "/" in name:
            raise InputError(f"{where}: {name!r} is not a patch file name (NAME.patch in the series directory)")
        if name in seen:
            raise InputError(f"{where}: {name} is listed twice")
        seen.add(name)
        facts: dict[str, str] = {}
        for w in words[1:]:
            key, eq, value = w.partition("=")
            if not eq or not _KEY_RE.match(key) or not value:
                raise InputError(f"{where}: fact {w!r}: expected key=value (lower-case key)")
            if key in facts:
                raise InputError(f"{where}: fact {key!r} given twice")
            allowed = FACT_VALUES.get(key)
            if allowed and value not in allowed:
                raise InputError(f"{where}: {key}={value}: expected one of {', '.join(allowed)}")
            if key == "when" and not re.match(r"^[A-Z][A-Z0-9_]*=\S+$", value):
                raise InputError(f"{where}: when={value}: expected when=ENV_NAME=VALUE")
            facts[key] = value
        entries.append(Entry(name=name, facts=facts, comment=comment.strip(), line=no))
    if base is None:
        m = _DIR_RE.match(dirname)
        if not m:
            raise InputError(f"{path}: no 'base PACKAGE==VERSION' line and the directory name "
                             f"{dirname!r} is not PACKAGE-VERSION")
        base = (m.group(1), m.group(2))
    return Series(path=path, package=base[0], version=base[1], entries=tuple(entries))


def format_entry(name: str, facts: dict, comment: str = "") -> str:
    """One series line for ``name`` with ``facts`` and ``comment`` (inverse of the parser)."""
    parts = [name] + [f"{k}={v}" for k, v in facts.items()]
    line = "  ".join([parts[0], " ".join(parts[1:])]) if len(parts) > 1 else parts[0]
    return f"{line}  # {comment}" if comment else line


def series_identity(series: Series, patch_ids: dict[str, str]) -> str:
    """A stable identity of what a series does to a tree: ``sha256:`` of the base, each patch's
    name, ``git patch-id --stable`` and facts, in order. Comments and whitespace do not count;
    re-exporting a patch with other context lines does not change it either (patch-id ignores
    line numbers). ``patch_ids`` maps entry name → patch-id."""
    h = hashlib.sha256(f"base {series.base}\n".encode())
    for e in series.entries:
        facts = " ".join(f"{k}={v}" for k, v in sorted(e.facts.items()))
        h.update(f"{e.name} {patch_ids.get(e.name, '-')} {facts}\n".encode())
    return "sha256:" + h.hexdigest()


def index_k_facts(series: Series, applied: list[str], env: dict[str, str]) -> tuple[dict, list[str]]:
    """The ``index_k_dtype`` / ``index_k_accounting`` a tree runs with, from its applied patches.

    ``applied``: names of applied entries (in series order); ``env``: the server's env switches.
    Later patches override earlier ones. Returns ``(facts, notes)``; a patch whose ``when``
    condition is not met by ``env`` contributes nothing and adds a note."""
    facts: dict[str, str] = {}
    notes: list[str] = []
    for e in series.entries:
        if e.name not in applied:
            continue
        keys = {k: v for k, v in e.facts.items() if k in FACT_VALUES}
        if not keys:
            continue
        cond = e.when
        if cond is not None and str(env.get(cond[0], "")).strip().lower() != cond[1].lower():
            notes.append(f"{e.name} is applied but {cond[0]}={cond[1]} is not set: "
                         f"its {', '.join(f'{k}={v}' for k, v in keys.items())} does not hold")
            continue
        facts.update(keys)
    return facts, notes
