"""Reading side of ``config lint`` / ``hicache``: serve-config text → :class:`dsv4ctl.lint.ServeConfig`,
and a profile → :class:`dsv4ctl.lint.LintInput` (serve configs, plan device pool GiB per rank,
index-K gating of the SGLang tree). The rules themselves are pure, in :mod:`dsv4ctl.lint`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from .errors import InputError
from .lint import GroupInput, LintInput, ServeConfig
from .profile import Group, Profile

HICACHE_KEYS = ("enable-hierarchical-cache", "enable-hicache")


def parse_config_text(text: str, label: str) -> ServeConfig:
    """Parse serve-config ``text`` as sglang 0.5.23 does (PyYAML ``safe_load``) with key lines.

    Raises InputError (exit 2): YAML syntax error (``label:line``), duplicate key, non-mapping root."""
    import yaml
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        raise InputError(f"{label}:{mark.line + 1 if mark else 1}: YAML syntax error: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise InputError(f"{label}: YAML error: {str(e).splitlines()[0]}") from None
    if data is None:
        return ServeConfig(path=label, data={})
    if not isinstance(data, dict) or not isinstance(node, yaml.MappingNode):
        raise InputError(f"{label}:1: a serve config must be a mapping of server arguments")
    lines: dict[str, int] = {}
    for k, _ in node.value:
        key = str(k.value)
        if key in lines:
            raise InputError(f"{label}:{k.start_mark.line + 1}: {key}: duplicate key")
        lines[key] = k.start_mark.line + 1
    return ServeConfig(path=label, data={str(k): v for k, v in data.items()}, lines=lines)


def check_suffix(path: Path) -> None:
    """SGLang only accepts ``--config`` files ending in .yaml/.yml (ops §1.2)."""
    if Path(path).suffix.lower() not in (".yaml", ".yml"):
        raise InputError(f"{path}: SGLang only accepts --config files ending in .yaml or .yml")


def read_config_text(path: Path) -> str:
    """The text of a local serve config; InputError for a missing/unreadable file or bad suffix."""
    path = Path(path)
    check_suffix(path)
    try:
        return path.read_text()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read ({e})") from None


def hicache_enabled(cfg: ServeConfig) -> bool:
    """True when the file turns HiCache on (``enable-hierarchical-cache``/``enable-hicache: true``)."""
    return any(cfg.data.get(k) is True for k in HICACHE_KEYS)


def pairs_of(profile: Profile) -> list[tuple[str, str]]:
    """(prefill, decode) group pairs behind each router of the profile."""
    out = []
    for g in profile.groups:
        if g.role == "router":
            out += [(p, d) for p in g.prefill for d in g.decode]
    return out


def tree_path(profile: Profile, tree: Optional[str]) -> Optional[Path]:
    """``--tree`` (as given) else the profile's ``sglang.tree`` (relative to the profile)."""
    if tree:
        p = Path(tree).expanduser()
    elif profile.sglang.get("tree"):
        p = Path(str(profile.sglang["tree"])).expanduser()
        if not p.is_absolute():
            p = profile.base_dir / p
    else:
        return None
    if not p.is_dir():
        raise InputError(f"{p}: SGLang tree not found (sglang.tree / --tree)")
    return p


def device_pool_gib(profile: Profile) -> tuple[dict[str, list[float]], Optional[str]]:
    """Per server group, each rank's device KV pool GiB as allocated (``dsv4ctl plan``'s
    ``allocated_gib``). Returns ({}, reason) when the plan cannot be built."""
    from .plan import build_plan
    try:
        report = build_plan(profile)
    except InputError as e:
        return {}, str(e)
    return {gp.group.name: [r["allocated_gib"] for r in gp.ranks()] for gp in report.groups if gp.stages}, None


def is_dsv4(profile: Profile) -> bool:
    from .models import load_model
    try:
        model, _ = load_model(profile.model, profile.base_dir)
    except InputError:
        return True
    return str(getattr(model, "model_type", "deepseek_v4")).startswith("deepseek_v4")


def build_input(profile: Profile, groups: Optional[list[Group]] = None, tree: Optional[str] = None,
                texts: Optional[dict[str, str]] = None, with_plan: bool = True) -> LintInput:
    """Assemble the lint input for ``groups`` (default: every server group) of ``profile``.

    ``texts`` maps group names to serve-config text to lint instead of the file on disk (an edit
    not yet written). Raises InputError for a missing file or a YAML error."""
    texts = texts or {}
    servers = profile.servers()
    selected = {g.name for g in (groups or servers)}
    # Pairs and host totals need the partner groups too: read every server group.
    ginputs = []
    for g in servers:
        cfg = None
        if g.serve_config is not None:
            text = texts.get(g.name)
            if text is None:
                if g.name not in selected and not g.serve_config.exists():
                    text = None
                else:
                    text = read_config_text(g.serve_config)
            if text is not None:
                cfg = parse_config_text(text, str(g.serve_config))
        ginputs.append(GroupInput(name=g.name, role=g.role, host=g.host, config=cfg, env=dict(g.env)))
    inp = LintInput(groups=ginputs, pairs=pairs_of(profile),
                    host_ram_gib={h.name: h.ram_gib for h in profile.hosts.values()},
                    index_k_dtype=profile.index_k_dtype, dsv4=is_dsv4(profile))
    any_hicache = any(gi.config is not None and hicache_enabled(gi.config) for gi in ginputs)
    if with_plan and any_hicache:
        pools, err = device_pool_gib(profile)
        inp.plan_error = err
        for gi in ginputs:
            gi.rank_device_gib = pools.get(gi.name)
    tp = tree_path(profile, tree)
    inp.tree = str(tp) if tp else None
    if tp is not None and any_hicache and inp.index_k_dtype == "bf16":
        from .treegate import analyse_tree
        inp.gating = analyse_tree(tp)
    return inp


def restrict(findings, inp: LintInput, groups: Optional[list[Group]]):
    """Findings of the selected groups only (pair and host findings name the group they sit on)."""
    if not groups:
        return findings
    names = {g.name for g in groups}
    files = {gi.config.path for gi in inp.groups if gi.name in names and gi.config is not None}
    return [f for f in findings if f.group in names or f.file in files]
