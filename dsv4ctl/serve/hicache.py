"""HiCache toggles of serve configs (pure core) and the file-vs-server status comparison.

``hicache off`` sets ``enable-hierarchical-cache: false`` on the line that holds it, and keeps the
other ``hicache-*`` keys as they are: a store_true ``false`` is omitted by sglang 0.5.23's
``--config`` reader (ops §1.2), and ``handle_hicache`` skips every HiCache normalisation when
HiCache is off (``srt/arg_groups/hicache_hook.py``), so the kept keys are inert and remember the
settings. ``hicache on`` sets it back to ``true``; off then on restores the file byte for byte.
A file without HiCache keys gets ``enable-hierarchical-cache: true`` and an explicit
``hicache-ratio`` (DSV4 has no auto-sizing, ops §2.3) appended after its last entry."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .argtable import ConvertError, Table, convert
from ..errors import InputError
from .lint import normalised_hicache
from .edit import Change

ENABLE = "enable-hierarchical-cache"
DEFAULT_RATIO = 2.0   # SGLang 0.5.23's resolved default in cache mode (hicache_hook.py handle_hicache_ratio_default)
MAX_RATIO = 100.0
"""The largest ``hicache-ratio`` taken without a plan to check it against: SGLang 0.5.23 sizes every
DeepSeek-V4 host pool as int(device pages x hicache_ratio) (``hybrid_pool_assembler.py``
``_deepseek_v4_num_host_pages``) and refuses to start when a host pool is over the host's free RAM
minus a 10 GiB reserve, split over the ranks of the host (``pool_host/base.py``
``host_memory_budget_bytes``). DSV4 device pools are tens of GiB per rank, so 100x is terabytes per
rank: no host has that. Below it, ``config lint`` DSV109 checks the ratio against ``hosts[].ram_gib``
and the plan's device pools."""
SGLANG_RULE = ("SGLang 0.5.23 sizes each host pool as hicache-ratio x its device pool and refuses to start when "
               "the host pools exceed the host's free RAM minus a 10 GiB reserve")
OPTION_KEYS = (        # (option attribute, serve-config key)
    ("ratio", "hicache-ratio"),
    ("write_policy", "hicache-write-policy"),
    ("io_backend", "hicache-io-backend"),
    ("mem_layout", "hicache-mem-layout"),
    ("storage_backend", "hicache-storage-backend"),
)
STATUS_FIELDS = ("enable_hierarchical_cache", "hicache_ratio", "hicache_write_policy", "hicache_io_backend",
                 "hicache_mem_layout", "hicache_storage_backend")


@dataclass
class Options:
    """``hicache on`` options; None = leave the file's value (or SGLang's default) alone."""

    ratio: Optional[float] = None
    write_policy: Optional[str] = None
    io_backend: Optional[str] = None
    mem_layout: Optional[str] = None
    storage_backend: Optional[str] = None

    def given(self) -> list[tuple[str, Any]]:
        return [(key, getattr(self, attr)) for attr, key in OPTION_KEYS if getattr(self, attr) is not None]


def _anchors(table: Table) -> tuple[str, ...]:
    return (ENABLE,) + table.get(ENABLE).aliases + tuple(k for _, k in OPTION_KEYS)


def changes_for(action: str, data: dict, opts: Options, table: Table, label: str) -> list[Change]:
    """The edits that turn HiCache ``on``/``off`` in a serve config whose raw mapping is ``data``.

    Option values are checked against the 0.5.23 argument table (InputError, exit 2). ``off``
    accepts no options. Returns [] when the file already says what was asked."""
    enable = table.get(ENABLE)
    spellings = enable.spellings
    present = [k for k in data if k in spellings]
    anchors = _anchors(table)
    if action == "off":
        if opts.given():
            raise InputError("hicache off takes no --ratio/--write-policy/--io-backend/--mem-layout/--storage-backend")
        if not any(data.get(k) is True for k in present):
            return []
        return [Change(ENABLE, False, spellings=spellings, after=anchors)]
    if action != "on":
        raise InputError(f"unknown hicache action {action!r}")
    out: list[Change] = []
    if not any(data.get(k) is True for k in present):
        out.append(Change(ENABLE, True, spellings=spellings, after=anchors))
    wanted = dict(opts.given())
    if "hicache-ratio" not in wanted and data.get("hicache-ratio") is None:
        wanted["hicache-ratio"] = DEFAULT_RATIO
    ratio = wanted.get("hicache-ratio", data.get("hicache-ratio"))
    if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and not 0 < ratio < float("inf"):
        if "hicache-ratio" not in wanted:
            raise InputError(f"{label}: hicache-ratio: {ratio:g} must be > 0 (host pool = ratio x device pool); "
                             f"pass --ratio")
        # SGLang 0.5.23 does not check the ratio itself (srt/arg_groups/hicache_hook.py
        # handle_hicache_ratio_default only checks --hicache-host-memory-fraction in (0, 1]); the host
        # pool is sized int(device_capacity_tokens * hicache_ratio) (srt/mem_cache/pool_host/base.py),
        # so a ratio <= 0 gives an empty or negative host pool: refuse it here.
        raise InputError(f"--ratio: hicache-ratio must be > 0 (host pool = ratio x device pool), got {ratio:g}")
    if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and ratio > MAX_RATIO:
        where = "--ratio: hicache-ratio" if "hicache-ratio" in wanted else f"{label}: hicache-ratio:"
        raise InputError(f"{where} {ratio:g} is over {MAX_RATIO:g} ({SGLANG_RULE}; DSV4 device pools are tens of GiB "
                         f"per rank, so no host fits that)" + ("" if "hicache-ratio" in wanted else "; pass --ratio"))
    for key, value in wanted.items():
        arg = table.get(key)
        try:
            convert(arg, value)
        except ConvertError as e:
            raise InputError(f"--{key.removeprefix('hicache-')}: {e}") from None
        if data.get(key) != value or key not in data:
            out.append(Change(key, value, spellings=arg.spellings, after=anchors))
    return out


@dataclass
class GroupStatus:
    """One group's HiCache as its file says (resolved like SGLang) and as its server reports."""

    group: str
    role: str
    host: str
    file: str
    url: Optional[str]
    file_says: dict
    server_says: Optional[dict] = None
    error: Optional[str] = None
    differences: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return dict(group=self.group, role=self.role, host=self.host, file=self.file, url=self.url,
                    file_says=self.file_says, server_says=self.server_says, error=self.error,
                    differences=self.differences, match=self.error is None and not self.differences)


def file_view(args: dict) -> dict:
    """The HiCache settings a serve config resolves to (``args`` by dest, defaults filled in by
    :func:`dsv4ctl.lint.check_keys`), with SGLang's layout/io normalisation applied when on."""
    on = bool(args.get("enable_hierarchical_cache"))
    view = {f: args.get(f) for f in STATUS_FIELDS}
    view["enable_hierarchical_cache"] = on
    if on:
        layout, io, _ = normalised_hicache(args)
        view["hicache_mem_layout"], view["hicache_io_backend"] = layout, io
    return view


def compare(file_says: dict, server_says: dict) -> list[str]:
    """Differences worth flagging: the on/off state always; the other settings when both are on.
    ``hicache_ratio`` None in the file means SGLang's resolved default, so it is not compared then."""
    out = []
    f_on = bool(file_says.get("enable_hierarchical_cache"))
    s_on = bool(server_says.get("enable_hierarchical_cache"))
    if f_on != s_on:
        # what applies the file is the caller's to say: a restart starts the running release's
        # copy again, a deploy (or --remote) applies the profile's file
        out.append(f"HiCache: file {'on' if f_on else 'off'}, server {'on' if s_on else 'off'}")
        return out
    if not f_on:
        return out
    for k in STATUS_FIELDS[1:]:
        fv, sv = file_says.get(k), server_says.get(k)
        if k == "hicache_ratio":
            if fv is None:
                continue
            same = sv is not None and abs(float(fv) - float(sv)) < 1e-9
        else:
            same = fv == sv
        if not same:
            out.append(f"{k.replace('_', '-')}: file {fv!r}, server {sv!r}")
    return out
