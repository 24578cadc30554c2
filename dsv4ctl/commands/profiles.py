"""``dsv4ctl profile list|show|init|import``: the shipped profiles, a starting profile of your own
(written outside the installation, so commands that edit serve configs can edit it), and a profile
imported from an NVIDIA srt-slurm SGLang recipe."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import Optional

import typer

profile_app = typer.Typer(help="Shipped profiles: list, show, init (a starting profile of your own), import (from srt-slurm).",
                          no_args_is_help=True)

SCHEMA_LINE = "# yaml-language-server: $schema="


def _source(name: Optional[str]) -> Path:
    """The profile file of NAME (a shipped name or a path; None: the embedded default)."""
    from ..errors import InputError
    from ..resources import resolve_profile, shipped_profile_names
    p = resolve_profile(name)
    if not p.is_file():
        raise InputError(f"{name}: no such profile (shipped: {', '.join(shipped_profile_names())})")
    return p


@profile_app.command("list")
def list_cmd(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """The shipped profiles, with their files."""
    from ..render import dump_json
    from ..resources import shipped_dir, shipped_profile_names
    rows = [(n, str(shipped_dir("profiles") / f"{n}.yaml")) for n in shipped_profile_names()]
    if as_json:
        print(dump_json({"schema": "dsv4ctl.profiles/1", "profiles": [{"name": n, "path": p} for n, p in rows]}))
        return
    for n, p in rows:
        print(f"{n}  {p}")


@profile_app.command("show")
def show(name: Optional[str] = typer.Argument(None, metavar="NAME", help="Shipped name or path (default: the embedded dsv4-flash-8xb200-pd)."),
         as_json: bool = typer.Option(False, "--json", help="Print JSON: path, serve configs, the parsed profile.")) -> None:
    """Print a profile's YAML followed by the paths of its serve configs."""
    from ..profile.model import load_profile
    from ..profile.yamlpos import read_yaml_bytes
    from ..render import dump_json
    src = _source(name)
    prof = load_profile(src)
    configs = {g.name: str(g.serve_config) for g in prof.groups if g.serve_config}
    if as_json:
        print(dump_json({"schema": "dsv4ctl.profile-show/1", "name": prof.name, "path": str(src), "serve_configs": configs, "profile": prof.raw}))
        return
    text = read_yaml_bytes(src).decode()
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    for g, c in configs.items():
        print(f"# serve config of {g}: {c}")


def starting_profile(src: Path, dest: Path) -> dict[Path, str]:
    """The files ``profile init`` writes for a copy of profile ``src`` at ``dest``: the profile
    text with a header (schema line, what to edit next), serve configs moved to ``<dest stem>/``
    and a relative ``sglang.series`` made absolute; and each serve config's text. Reads ``src``
    and its serve configs, writes nothing."""
    from ..errors import InputError
    from ..profile.model import load_profile
    from ..profile.yamlpos import read_yaml_bytes
    from ..resources import schema_path
    from .. import __version__
    prof = load_profile(src)
    text = read_yaml_bytes(src).decode()
    lines = [ln for ln in text.splitlines(keepends=True) if not ln.startswith(SCHEMA_LINE)]
    text = "".join(lines)
    out: dict[Path, str] = {}
    used: set[str] = set()
    for raw_g, g in zip(prof.raw.get("groups", []), prof.groups):
        rel = raw_g.get("serve_config")
        if not rel or g.serve_config is None:
            continue
        base = Path(rel).name
        if base in used:
            base = f"{g.name}-{base}"
        used.add(base)
        new_rel = f"{dest.stem}/{base}"
        pat = re.compile(r"(serve_config:\s*)" + re.escape(rel) + r"(?=\s|$)")
        text, n = pat.subn(lambda m: m.group(1) + new_rel, text, count=1)
        if n != 1:
            raise InputError(f"{src}: group {g.name}: cannot rewrite serve_config {rel!r} (write it as a plain value)")
        try:
            out[dest.parent / new_rel] = read_yaml_bytes(g.serve_config).decode()
        except OSError as e:
            raise InputError(f"{g.serve_config}: {e.strerror or e}") from None
    series = (prof.raw.get("sglang") or {}).get("series")
    shipped_series = None
    if isinstance(series, str):
        from ..profile.deployment import series_path
        from ..resources import shipped_dir
        real = series_path(src.parent, series).resolve()
        if real.parent == shipped_dir("patches").resolve() and real.is_dir():
            shipped_series = real.name
    if shipped_series is not None:      # by its shipped name: the profile survives a reinstall
        pat = re.compile(r"^(\s*series:\s*)" + re.escape(series) + r"(\s*#.*)?$", re.M)
        text = pat.sub(lambda m: f"{m.group(1)}{shipped_series}  # the shipped series, by name; copy the folder "
                                 "and give its path to change it", text, count=1)
    elif isinstance(series, str) and not Path(series).expanduser().is_absolute():
        absolute = str((src.parent / series).resolve())
        pat = re.compile(r"^(\s*series:\s*)" + re.escape(series) + r"(\s*#.*)?$", re.M)
        if not _is_utf8(absolute):
            raise InputError(f"{_shown(absolute)}: {_shown(src.name)}'s sglang.series: the path is not "
                             "valid UTF-8 and cannot be written into the new profile: give the series as a UTF-8 path")
        text = pat.sub(lambda m: f"{m.group(1)}{absolute}  # {_shown(src.name)}'s series; copy it to change it",
                       text, count=1)
    text = re.sub(r"^name:\s*" + re.escape(prof.name) + r"(?=\s|$)", lambda m: f"name: {dest.stem}", text,
                  count=1, flags=re.M)
    # the schema beside the profile, referenced relatively (an install path breaks on reinstall)
    schema_rel = f"{dest.stem}/profile.schema.json"
    out[dest.parent / schema_rel] = schema_path("profile").read_text()
    header = (f"{SCHEMA_LINE}{schema_rel}\n"
              f"# Written by `dsv4ctl profile init` (dsv4ctl {__version__}) from {_shown(src.name)}.\n"
              f"# Edit hosts[] (address, ssh, root), sglang.tree/base_ref, groups[].memory (measured GiB),\n"
              f"# then: dsv4ctl plan {dest}   dsv4ctl config lint {dest}   dsv4ctl deploy {dest} --dry-run\n"
              f"# Every key: `dsv4ctl schema profile` and the README's Profiles table.\n")
    out = {dest: header + text, **out}
    return out


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shown(path: str) -> str:
    """``path`` with bytes that are not UTF-8 written as ``\\xNN`` (for messages and comments)."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _utf8(path: str) -> None:
    """InputError (exit 2) when ``path`` holds bytes that are not UTF-8 (the file system allows
    them; Python carries them as lone surrogates): the profile names itself after the file and
    its serve configs by path, and a YAML file is UTF-8 text, so such a name cannot be written."""
    from ..errors import InputError
    if not _is_utf8(path):
        raise InputError(f"{_shown(path)}: the path is not valid UTF-8; a profile names its file and serve configs "
                         "in UTF-8 text: choose a UTF-8 path")


def profile_dest(path: str) -> Path:
    """The profile file PATH names (``prod`` -> ``prod.yaml``); InputError (exit 2) when it is not
    valid UTF-8, does not end in .yaml/.yml or its stem is no profile name."""
    from ..errors import InputError
    dest = Path(path).expanduser()
    _utf8(str(dest))
    if dest.suffix == "" and dest.name not in ("", ".", ".."):
        dest = dest.with_name(dest.name + ".yaml")      # `profile init prod` writes prod.yaml
    if dest.suffix.lower() not in (".yaml", ".yml"):
        raise InputError(f"{path}: a profile file ends in .yaml or .yml")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", dest.stem):
        # the stem becomes the profile's name and its serve-config folder (profile schema: name)
        raise InputError(f"{_shown(path)}: the file name before .yaml becomes the profile's name: use letters, "
                         "digits, '.', '_' and '-' only")
    return dest


def check_writable(files: dict[Path, str], force: bool) -> None:
    """InputError (exit 2) unless every file of ``files`` can be written: UTF-8 text, outside the
    installation, not there yet (or a regular file, with ``force``), under folders, not files."""
    from ..errors import InputError
    from ..resources import is_shipped
    for f, text in files.items():
        if not _is_utf8(text):          # a path taken into the text that is not UTF-8: nothing written
            raise InputError(f"{_shown(str(f))}: its text would hold a path that is not valid UTF-8; "
                             "rename it (or the files it names) to UTF-8")
    for f in files:
        if is_shipped(f):
            raise InputError(f"{f}: inside dsv4ctl's shipped data; write your profile elsewhere")
        if f.exists() and not force:
            raise InputError(f"{f}: already exists (--force overwrites)")
        if f.exists() and not f.is_file():
            raise InputError(f"{f}: not a regular file")
        blocked = next((a for a in f.parents if a.exists() or a.is_symlink()), None)
        if blocked is not None and not blocked.is_dir():
            raise InputError(f"{blocked}: not a folder, and {f} would go inside it (move it or choose another PATH)")


def write_profile_files(files: dict[Path, str], dest: Path, force: bool) -> None:
    """Write ``files`` (each atomically: a temporary file renamed over it), then load the profile
    ``dest`` among them; a failed write or a profile that does not load removes what was written
    (with ``force``, files it replaced stay replaced). InputError (exit 2)."""
    from ..errors import InputError
    from ..profile.model import load_profile
    written: list[Path] = []
    for f, text in files.items():
        tmp = f.with_name(f".{f.name}.tmp")
        try:
            f.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(f)
            written.append(f)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            if not force:               # nothing half-made stays behind (with --force: files it replaced)
                for w in written:
                    w.unlink(missing_ok=True)
            raise InputError(f"{f}: cannot write ({e.strerror or e})") from None
    try:
        load_profile(dest)          # what was written loads
    except InputError:
        for f in files:             # nothing half-made stays behind
            f.unlink(missing_ok=True)
        raise


@profile_app.command("init")
def init(path: str = typer.Argument(..., metavar="PATH", help="The new profile file (.yaml); its serve configs go to PATH's folder/<stem>/."),
         from_: Optional[str] = typer.Option(None, "--from", metavar="NAME", help="Shipped profile name or path to start from (default: dsv4-flash-8xb200-pd)."),
         force: bool = typer.Option(False, "--force", help="Overwrite existing files."),
         dry_run: bool = typer.Option(False, "--dry-run", help="Say which files would be written; write nothing."),
         as_json: bool = typer.Option(False, "--json", help="Print the dsv4ctl.profile-init/1 JSON document (the profile, the files, the next command).")) -> None:
    """Write a commented starting profile and its serve configs (outside the installation, so
    hicache on/off and deploy can use and edit them). Exit 2 when a file exists (without
    --force), PATH is inside the installation or is not valid UTF-8."""
    dest = profile_dest(path)
    files = starting_profile(_source(from_), dest)
    check_writable(files, force)
    from ..render import dump_json
    doc = {"schema": "dsv4ctl.profile-init/1", "profile": str(dest), "dry_run": dry_run,
           "files": [str(f) for f in files], "next": f"dsv4ctl plan {dest}"}
    if dry_run:
        if as_json:
            print(dump_json(doc))
            return
        for f in files:
            print(f"dry run: would write {f}")
        return
    write_profile_files(files, dest, force)
    if as_json:
        print(dump_json(doc))
        return
    for f in files:
        print(f"wrote {f}")
    print(f"next: edit hosts and sglang.tree, then: dsv4ctl plan {shlex.quote(str(dest))}")


import_app = typer.Typer(help="Import another tool's deployment description as a profile and serve configs.",
                         no_args_is_help=True)
profile_app.add_typer(import_app, name="import")


def imported_files(rec, dest: Path) -> dict[Path, str]:
    """The files ``profile import srt-slurm`` writes for recipe ``rec`` at ``dest``: the profile
    (schema line and header first), one serve config per group and the schema, in ``<dest stem>/``."""
    from ..profile import srtslurm
    from ..resources import schema_path
    from .. import __version__
    rel = {g.name: f"{dest.stem}/{g.name}.yaml" for g in rec.groups}
    schema_rel = f"{dest.stem}/profile.schema.json"
    header = (f"{SCHEMA_LINE}{schema_rel}\n"
              f"# Written by `dsv4ctl profile import srt-slurm` (dsv4ctl {__version__}).\n"
              f"# then: dsv4ctl plan {dest}   dsv4ctl config lint {dest}\n")
    out = {dest: header + srtslurm.profile_text(rec, dest.stem, rel)}
    for g in rec.groups:
        out[dest.parent / rel[g.name]] = srtslurm.serve_text(rec, g)
    out[dest.parent / schema_rel] = schema_path("profile").read_text()
    return out


def _import_doc(rec, dest: Path, files: dict[Path, str], dry_run: bool) -> dict:
    """The dsv4ctl.profile-import/1 document: files, the groups' placement and topology, warnings, notes."""
    groups = [{"name": g.name, "role": g.role, "replicas": len(g.servers), "nnodes": len(g.servers[0]),
               "hosts": g.servers, "gpus": g.gpus, "tp": g.topology["tp"], "dp": g.topology["dp"],
               "ep": g.topology["ep"], "pp": g.topology["pp"], "attn_dp_size": g.topology["attn_dp"],
               "env": sorted(g.env), "serve_config": str(dest.parent / dest.stem / f"{g.name}.yaml")}
              for g in rec.groups]
    return {"schema": "dsv4ctl.profile-import/1", "source": "srt-slurm", "recipe": str(rec.path),
            "recipe_name": rec.name, "profile": str(dest), "dry_run": dry_run, "model": rec.model,
            "gpu_type": rec.gpu_type, "gpus_per_node": rec.gpus_per_node, "container": rec.container,
            "slurm": rec.slurm, "groups": groups, "files": [str(f) for f in files],
            "warnings": rec.warnings, "notes": rec.notes, "next": f"dsv4ctl plan {dest}"}


@import_app.command("srt-slurm")
def import_srt_slurm(
        recipe: str = typer.Argument(..., metavar="RECIPE", help="An srt-slurm SGLang recipe (.yaml)."),
        out: Optional[str] = typer.Option(None, "--out", "-o", metavar="PATH", help="The new profile file (default: RECIPE's name, .yaml, in this folder; NAME-profile.yaml in the recipe's own folder); serve configs go to PATH's folder/<stem>/."),
        model: Optional[str] = typer.Option(None, "--model", metavar="MODEL", help="deepseek-v4-pro or deepseek-v4-flash, when the recipe names its model by a cluster alias."),
        force: bool = typer.Option(False, "--force", help="Overwrite existing files."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Say which files would be written; write nothing."),
        as_json: bool = typer.Option(False, "--json", help="Print the dsv4ctl.profile-import/1 JSON document (groups, files, warnings, notes).")) -> None:
    """Turn an NVIDIA srt-slurm SGLang recipe (model, resources, backend.sglang_config, per-role
    environment) into a profile with placeholder hosts and one serve config per group, for plan and
    config lint. Keys it does not import are listed (warnings, notes). Exit 2 for a recipe that is
    not YAML, another backend or model, no sglang_config, or a file that exists (without --force)."""
    from ..errors import InputError
    from ..profile.srtslurm import read_recipe
    from ..render import dump_json
    _utf8(recipe)
    rec = read_recipe(Path(recipe).expanduser(), model)
    stem = re.sub(r"[^A-Za-z0-9_.-]", "-", Path(recipe).stem)
    dest = profile_dest(out if out is not None else stem + ".yaml")
    if out is None and _same_file(dest, recipe):        # run in the recipe's folder: never over the recipe
        dest = profile_dest(stem + "-profile.yaml")
    if _same_file(dest, recipe):
        raise InputError(f"{dest}: that is the recipe itself: give --out another path")
    files = imported_files(rec, dest)
    if any(_same_file(f, recipe) for f in files):
        raise InputError(f"{recipe}: the import would write over the recipe itself: give --out another path")
    check_writable(files, force)
    if not dry_run:
        write_profile_files(files, dest, force)
    doc = _import_doc(rec, dest, files, dry_run)
    if as_json:
        print(dump_json(doc))
        return
    for f in files:
        print(f"{'dry run: would write' if dry_run else 'wrote'} {f}")
    for g in doc["groups"]:
        print(f"{g['name']}: {g['role']}, {g['replicas']} server(s) x {g['nnodes']} node(s) x {len(g['gpus'])} GPUs, "
              f"tp {g['tp']} dp {g['dp']} attn-dp {g['attn_dp_size']} ep {g['ep']} pp {g['pp']}")
    for w in rec.warnings:
        print(f"warning: {w}")
    for n in rec.notes:
        print(f"note: {n}")
    q = shlex.quote(str(dest))
    print(f"next: set the hosts' addresses, then: dsv4ctl plan {q}   dsv4ctl config lint {q}")


def _same_file(a, b) -> bool:
    """True when paths ``a`` and ``b`` name one file (resolved; False when either is missing)."""
    try:
        return Path(a).resolve() == Path(b).resolve() or Path(a).samefile(b)
    except OSError:
        return False


def register(app: typer.Typer) -> None:
    """Add ``profile``."""
    app.add_typer(profile_app, name="profile")
