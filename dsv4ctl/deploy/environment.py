"""Release environments: the Python environment a release runs on (torch, sglang-kernel,
flashinfer, deepseek-recipe, ...), pinned by a lock that ships inside the release.

The lock is a requirements file of exact pins with hashes, as ``uv pip compile --generate-hashes``
writes it::

    torch==2.14.1 \\
        --hash=sha256:...

It is part of the release (``environment.lock``, in MANIFEST.json; the launch spec names its
digest, so the release id covers it). Each host builds the environment once per lock under
``ROOT/envs/<digest>`` with uv (``uv venv`` + ``uv pip sync --require-hashes``: exactly the
lock, nothing else; with uv's cache on the host a second environment of the same packages is
hard links, not a download), in a staging folder renamed into place when complete, then made
read-only. Releases with the same lock share it; a rollback switches to the target release, whose
launch command runs its own environment's ``bin/python``. ``verify`` compares what is installed
(every ``*.dist-info``: name, version, and each file against its RECORD hash) with the lock.

Pure core here (no I/O): :func:`parse_lock`, :func:`env_digest`, :func:`requirement_pins`,
:func:`pin_conflicts`, :func:`env_problems`; builders: :func:`build_command`."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from ..errors import InputError
from ..remote import q

LOCK_NAME = "environment.lock"
"""The lock's file name inside a release folder."""

ENV_MARK = "ENV.json"
"""Written last into a complete environment (before it is renamed into place)."""

_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[A-Za-z0-9._,\s-]*\])?\s*==\s*([A-Za-z0-9.+!_-]+)\s*(;.*)?$")
_HASH = re.compile(r"^--hash[=\s]+(sha256|sha384|sha512):([0-9a-fA-F]+)$")


def normalize(name: str) -> str:
    """A distribution name in PEP 503 normal form (``Flash_Infer.python`` → ``flash-infer-python``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Pin:
    """One locked distribution: PEP 503 ``name``, exact ``version``, ``hashes`` (``algo:hex``)."""

    name: str
    version: str
    hashes: tuple[str, ...]


def parse_lock(text: str, where: str = "environment lock") -> dict[str, Pin]:
    """{normalized name: Pin} of a hashed requirements lock (pure). Comments, blank lines and
    line continuations (``\\``) are understood; an environment marker after ``;`` is kept out of
    the version. Raises InputError (one line naming ``where`` and the line) for anything that is
    not an exact pin with at least one hash: a range, a URL or path, ``-e``, an option line
    (``--index-url``: how hosts reach packages belongs to ``sglang.environment.uv_args``), a
    distribution locked twice, or an empty lock."""
    logical, cur, start = [], "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not cur:
            start = n
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        if cur.strip():
            logical.append((start, cur.strip()))
        cur = ""
    if cur.strip():
        logical.append((start, cur.strip()))
    pins: dict[str, Pin] = {}
    for n, line in logical:
        words = line.split()
        req, hashes = [], []
        for w in words:
            if w.startswith("--hash"):
                hashes.append(w)
            elif hashes:
                raise InputError(f"{where}:{n}: '{w}' after the hashes: one requirement per entry")
            else:
                req.append(w)
        req_text = " ".join(req)
        if not req_text or req_text.startswith("-"):
            raise InputError(f"{where}:{n}: '{line[:60]}': options are not part of a lock (put index settings "
                             "in sglang.environment.uv_args)")
        m = _NAME.match(req_text)
        if m is None:
            raise InputError(f"{where}:{n}: '{req_text[:60]}' is not an exact pin (NAME==VERSION); write the lock "
                             "with uv pip compile --generate-hashes")
        hs = []
        for h in hashes:
            hm = _HASH.match(h.replace("--hash ", "--hash="))
            if hm is None:
                raise InputError(f"{where}:{n}: '{h}' is not a --hash=sha256:HEX")
            hs.append(f"{hm.group(1)}:{hm.group(2).lower()}")
        name = normalize(m.group(1))
        if not hs:
            raise InputError(f"{where}:{n}: {name}=={m.group(3)} has no --hash: a lock pins content, not only "
                             "versions (uv pip compile --generate-hashes)")
        if name in pins:
            raise InputError(f"{where}:{n}: {name} is locked twice")
        pins[name] = Pin(name, m.group(3), tuple(hs))
    if not pins:
        raise InputError(f"{where}: the lock pins no distribution")
    return pins


def env_digest(lock: bytes) -> str:
    """``e`` + 12 hex digits of sha256 over the lock's bytes: the environment's folder name on
    every host (two releases with the same lock share one environment)."""
    return "e" + hashlib.sha256(lock).hexdigest()[:12]


def requirement_pins(requirements: list[str], machine: str = "x86_64", python: str = "3.11") -> dict[str, str]:
    """{normalized name: version} of the exact (``==``) pins among PEP 508 requirement strings
    (``Requires-Dist`` values of a wheel's METADATA, or ``[project] dependencies`` of SGLang's
    ``python/pyproject.toml``; pure), parsed and their markers evaluated by ``packaging`` for a
    Linux host of CPU ``machine`` (``x86_64``, ``aarch64``) and Python ``python``: a pin only for
    another platform or only for an extra (``; extra == "..."``) is left out, and so are ranges
    (only an exact pin can be contradicted). Unparseable strings are skipped."""
    from packaging.requirements import InvalidRequirement, Requirement
    env = {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix", "platform_machine": machine,
           "python_version": python, "python_full_version": python + ".0", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "extra": ""}
    out = {}
    for r in requirements:
        try:
            req = Requirement(r)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        exact = [s.version for s in req.specifier if s.operator in ("==", "===") and "*" not in s.version]
        if len(exact) == 1:
            out[normalize(req.name)] = exact[0]
    return out


def sglang_requirements(pyproject: str) -> tuple[str | None, list[str]]:
    """(version, [requirement strings]) of SGLang's ``python/pyproject.toml`` text (pure):
    ``[project] version`` and ``dependencies``. InputError when it is not TOML."""
    import tomllib
    try:
        proj = tomllib.loads(pyproject).get("project") or {}
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"python/pyproject.toml of the SGLang tree is not TOML: {e}") from None
    deps = proj.get("dependencies") or []
    return (str(proj["version"]) if proj.get("version") else None), [d for d in deps if isinstance(d, str)]


def pin_conflicts(lock: dict[str, Pin], pins: dict[str, str], sglang_version: str) -> list[str]:
    """One line per distribution the lock pins at another version than SGLang ``sglang_version``
    pins it (pure): ``torch: the lock has 2.9.0, SGLang 0.5.23 pins ==2.14.1``. A pinned
    distribution the lock lacks is a conflict too (the release would run whatever the host has,
    or fail at import)."""
    out = []
    for name, want in sorted(pins.items()):
        have = lock.get(name)
        if have is None:
            out.append(f"{name}: not in the lock, SGLang {sglang_version} pins =={want}")
        elif have.version != want:
            out.append(f"{name}: the lock has {have.version}, SGLang {sglang_version} pins =={want}")
    return out


def env_problems(lock: dict[str, Pin], report: dict) -> list[str]:
    """Problems of a built environment (pure) from the host's report (:data:`dsv4ctl.deploy.verify.SCRIPT`):
    ``report`` = {"present": bool, "python": bool, "dists": {name: version}, "bad": [path, ...]}.
    ``env not built``, ``env python`` (its interpreter is gone), ``env missing NAME==V``,
    ``env version NAME V (lock V')``, ``env extra NAME==V`` (installed by hand), ``env hash
    PATH`` (a file differs from its RECORD: edited or replaced in place)."""
    if not report.get("present"):
        return ["env not built"]
    out = [] if report.get("python", True) else ["env python"]
    dists = {normalize(k): v for k, v in (report.get("dists") or {}).items()}
    for name, p in sorted(lock.items()):
        if name not in dists:
            out.append(f"env missing {name}=={p.version}")
        elif dists[name] != p.version:
            out.append(f"env version {name} {dists[name]} (lock {p.version})")
    out += [f"env extra {n}=={v}" for n, v in sorted(dists.items()) if n not in lock]
    out += [f"env hash {p}" for p in report.get("bad", [])]
    return out


# -- builders ----------------------------------------------------------------------------------

def build_command(root: str, digest: str, lock_path: str, *, uv: str, python: str, uv_args: tuple[str, ...] = ()) -> str:
    """Shell command building environment ``digest`` on a host (idempotent): nothing when
    ``ROOT/envs/<digest>/ENV.json`` exists (prints ``@env present``); else stale staging folders
    of this digest are removed (the host lock makes this run the only builder), ``uv venv`` with
    the host's ``python`` into ``ROOT/envs/.tmp-<digest>-$$``, ``uv pip sync --require-hashes``
    of ``lock_path`` (exactly the lock; ``uv_args`` say how packages are reached), ``ENV.json``,
    every write bit dropped, then one rename into place (prints ``@env built``). A failure or a
    signal removes the staging folder: a host never has a half-built environment under its name.
    Exit 127 when ``uv`` is not found."""
    envs = f"{root}/envs"
    final = f"{envs}/{digest}"
    extra = " ".join(q(a) for a in uv_args)
    return (f"if [ -f {q(final + '/' + ENV_MARK)} ]; then echo '@env present'; exit 0; fi; "
            f"command -v {q(uv)} >/dev/null 2>&1 || {{ echo 'uv not found: '{q(uv)} >&2; exit 127; }}; "
            f"set -e; E={q(envs)}; T=\"$E/.tmp-{digest}-$$\"; mkdir -p \"$E\"; "
            f"for d in \"$E\"/.tmp-{digest}-*; do if [ -e \"$d\" ]; then chmod -R u+w \"$d\"; rm -rf \"$d\"; fi; done; "
            "trap 'chmod -R u+w \"$T\" 2>/dev/null; rm -rf \"$T\"' EXIT; trap 'exit 130' INT TERM HUP; "
            f"{q(uv)} venv --quiet --python {q(python)} \"$T\"; "
            f"{q(uv)} pip sync --quiet --python \"$T/bin/python\" --require-hashes {extra} {q(lock_path)}; "
            f"printf '{{\"schema\": \"dsv4ctl.env/1\", \"digest\": \"{digest}\", \"built_at\": \"%s\"}}\\n' "
            f"\"$(date -u +%Y-%m-%dT%H:%M:%SZ)\" > \"$T/{ENV_MARK}\"; "
            f"chmod -R a-w \"$T\"; if [ -e {q(final)} ]; then chmod -R u+w {q(final)}; rm -rf {q(final)}; fi; "
            f"mv -T \"$T\" {q(final)}; trap - EXIT; echo '@env built'")


def gc_command(root: str) -> str:
    """Shell command removing every environment under ``ROOT/envs`` that no release folder on
    the host names in its ``launch.json`` (``"python_env": "<digest>"``), and staging folders
    of interrupted builds (run under the host lock, after pruning releases). Never fails."""
    r = q(root)
    return (f"for e in {r}/envs/e* {r}/envs/.tmp-*; do [ -d \"$e\" ] || continue; d=$(basename \"$e\"); "
            f"case $d in .tmp-*) ;; *) if grep -qs \"\\\"python_env\\\": \\\"$d\\\"\" {r}/releases/r*/launch.json; "
            f"then continue; fi;; esac; chmod -R u+w \"$e\" 2>/dev/null; rm -rf \"$e\"; done; true")
