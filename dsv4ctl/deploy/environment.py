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

Pure core here (no I/O but :func:`read_lock_file`): :func:`parse_lock`, :func:`env_digest`,
:func:`requirement_pins`, :func:`pin_conflicts`, :func:`env_problems`; builders:
:func:`build_command`."""

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

_NAME = re.compile(r"^([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)(\[[A-Za-z0-9._,\s-]*\])?\s*==\s*([^\s;]+)\s*(?:;(.*))?$")
_HASH = re.compile(r"^(sha256|sha384|sha512):([0-9a-fA-F]+)$")
_HASH_HEX = {"sha256": 64, "sha384": 96, "sha512": 128}


def normalize(name: str) -> str:
    """A distribution name in PEP 503 normal form (``Flash_Infer.python`` → ``flash-infer-python``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def marker_env(machine: str = "x86_64", python: str = "3.11") -> dict[str, str]:
    """A PEP 508 marker environment of a Linux host of CPU ``machine`` running Python ``python``
    (``X.Y`` or ``X.Y.Z``)."""
    full = python if python.count(".") >= 2 else python + ".0"
    return {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix", "platform_machine": machine,
            "python_version": ".".join(python.split(".")[:2]), "python_full_version": full,
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


@dataclass(frozen=True)
class Pin:
    """One locked distribution: PEP 503 ``name``, exact ``version``, ``hashes`` (``algo:hex``)."""

    name: str
    version: str
    hashes: tuple[str, ...]


def _logical_lines(text: str, where: str) -> list[tuple[int, str]]:
    """(first physical line number, text) of every non-empty logical line of a lock: a UTF-8 BOM
    and CRLF dropped, comments (a line starting ``#``, or ``#`` after whitespace) cut, line
    continuations (``\\``) joined. InputError for a continuation with nothing after it."""
    text = text.lstrip("\ufeff")
    logical, cur, start = [], "", 0
    lines = text.split("\n")
    for n, raw in enumerate(lines, 1):
        raw = raw.rstrip("\r")
        line = "" if raw.lstrip().startswith("#") else re.split(r"\s#", raw, maxsplit=1)[0].strip()
        if not cur:
            start = n
        if line.endswith("\\"):
            if n == len(lines) or (n == len(lines) - 1 and not lines[-1].strip()):
                raise InputError(f"{where}:{n}: a line continuation (\\) with nothing after it")
            cur += line[:-1] + " "
            continue
        cur += line
        if cur.strip():
            logical.append((start, cur.strip()))
        cur = ""
    return logical


def _split_hashes(line: str, where: str, n: int) -> tuple[str, list[str]]:
    """(requirement text, raw ``--hash`` values) of one logical line (``--hash X`` and
    ``--hash=X`` both). InputError for a word after the hashes (two requirements in one entry)."""
    words = line.split()
    req, hashes = [], []
    k = 0
    while k < len(words):
        w = words[k]
        if w == "--hash" and k + 1 < len(words):
            hashes.append(words[k + 1])
            k += 2
            continue
        if w.startswith("--hash="):
            hashes.append(w[len("--hash="):])
        elif hashes:
            raise InputError(f"{where}:{n}: '{w}' after the hashes: one requirement per entry")
        else:
            req.append(w)
        k += 1
    return " ".join(req), hashes


def _parse_entry(line: str, where: str, n: int) -> tuple[Pin, str]:
    """(Pin, environment marker text or "") of one logical lock line, checked in this order: the
    hashes' place, an option line, an exact ``NAME==VERSION`` pin, a PEP 440 version, full-length
    hashes, at least one hash (each a one-line InputError naming ``where`` and line ``n``)."""
    from packaging.version import InvalidVersion, Version
    req_text, hashes = _split_hashes(line, where, n)
    if not req_text or req_text.startswith("-"):
        raise InputError(f"{where}:{n}: '{line[:60]}': options are not part of a lock (put index settings "
                         "in sglang.environment.uv_args)")
    m = _NAME.match(req_text)
    if m is None:
        raise InputError(f"{where}:{n}: '{req_text[:60]}' is not an exact pin (NAME==VERSION); write the lock "
                         "with uv pip compile --generate-hashes")
    try:
        Version(m.group(3))
    except InvalidVersion:
        raise InputError(f"{where}:{n}: '{m.group(3)}' is not a version (PEP 440)") from None
    hs = []
    for h in hashes:
        hm = _HASH.match(h)
        if hm is None or len(hm.group(2)) != _HASH_HEX[hm.group(1)]:
            raise InputError(f"{where}:{n}: '--hash={h[:80]}' is not a full --hash=sha256:HEX")
        hs.append(f"{hm.group(1)}:{hm.group(2).lower()}")
    name = normalize(m.group(1))
    if not hs:
        raise InputError(f"{where}:{n}: {name}=={m.group(3)} has no --hash: a lock pins content, not only "
                         "versions (uv pip compile --generate-hashes)")
    return Pin(name, m.group(3), tuple(hs)), (m.group(4) or "").strip()


def parse_lock(text: str, where: str = "environment lock", env: dict | None = None) -> dict[str, Pin]:
    """{normalized name: Pin} of a hashed requirements lock for one host (pure): the pins whose
    environment marker (after ``;``, as ``uv pip compile --universal`` writes them) holds for
    ``env`` (:func:`marker_env`; default Linux x86_64, Python 3.11). Comments (``#`` after
    whitespace), blank lines, CRLF, a UTF-8 BOM and line continuations (``\\``) are understood.

    Raises InputError (one line naming ``where`` and the line) for anything that is not an
    exact pin with at least one full-length hash: a range, a URL or path, ``-e``, an option line
    (``--index-url``: how hosts reach packages belongs to ``sglang.environment.uv_args``), a bad
    marker or version, a continuation at the end, a distribution locked twice for one host, or a
    lock that pins nothing."""
    from packaging.markers import InvalidMarker, Marker
    env = env or marker_env()
    pins: dict[str, Pin] = {}
    seen = 0
    for n, line in _logical_lines(text, where):
        pin, marker = _parse_entry(line, where, n)
        seen += 1
        if marker:
            try:
                applies = Marker(marker).evaluate(env)
            except InvalidMarker as e:
                raise InputError(f"{where}:{n}: bad environment marker: {str(e).splitlines()[0][:120]}") from None
            if not applies:
                continue
        if pin.name in pins:
            raise InputError(f"{where}:{n}: {pin.name} is locked twice for the same host")
        pins[pin.name] = pin
    if not seen:
        raise InputError(f"{where}: the lock pins no distribution")
    return pins


MAX_LOCK_BYTES = 8 << 20
"""The largest environment lock read (8 MiB). ``uv pip compile --universal --generate-hashes`` of
``sglang==0.5.23`` (every platform's wheel hashes of its 221 distributions) is 0.42 MB: a file
past this is not a lock (a log, an image, ``/dev/zero``) and is never read into memory."""

def read_lock_file(path, where: str) -> bytes:
    """The bytes of the environment lock at ``path`` (symlinks followed), at most
    :data:`MAX_LOCK_BYTES`, through the one reader of operator files
    (:func:`dsv4ctl.resources.read_regular`). InputError (exit 2, one line naming ``where``)
    when it cannot be opened, is no regular file (a FIFO is never waited on, a device never read)
    or is larger than the cap."""
    from ..resources import FileTooLarge, NotRegularFile, read_regular
    try:
        return read_regular(path, MAX_LOCK_BYTES)
    except NotRegularFile as e:
        raise InputError(f"{where}: {e.kind}, not a regular file: a lock is a text file") from None
    except FileTooLarge:
        raise InputError(f"{where}: larger than {MAX_LOCK_BYTES >> 20} MiB: not an environment lock "
                         "(SGLang's are under 1 MB)") from None
    except OSError as e:
        raise InputError(f"{where}: cannot read ({e.strerror or e})") from None


def decode_lock(data: bytes, where: str) -> str:
    """The lock's text: UTF-8 (InputError naming the byte offset otherwise: uv refuses it too)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{where}: not UTF-8 (byte {e.start}): a lock is a UTF-8 text file") from None


def same_version(a: str, b: str) -> bool:
    """PEP 440 equality (``1.0`` = ``1.00`` = ``v1.0``; a local label counts: ``2.9.1+cu128``
    differs from ``2.9.1``); plain string equality for what is not a version."""
    from packaging.version import InvalidVersion, Version
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def env_digest(lock: bytes, python: str) -> str:
    """``e`` + 12 hex digits of sha256 over the lock's bytes and the interpreter the environment
    is made with (``deploy.python``: ``LOCK + "\\n# python: " + PYTHON``): the environment's
    folder name on every host. Two releases with the same lock and interpreter share one
    environment; another interpreter is another environment (and another release id)."""
    return "e" + hashlib.sha256(lock + identity_suffix(python)).hexdigest()[:12]


def identity_suffix(python: str) -> bytes:
    """What :func:`env_digest` adds to the lock's bytes (the host command adds the same)."""
    return f"\n# python: {python}".encode()


def requirement_pins(requirements: list[str], machine: str = "x86_64", python: str = "3.11") -> dict[str, str]:
    """{normalized name: version} of the exact (``==``) pins among PEP 508 requirement strings
    (``Requires-Dist`` values of a wheel's METADATA, or ``[project] dependencies`` of SGLang's
    ``python/pyproject.toml``; pure), parsed and their markers evaluated by ``packaging`` for a
    Linux host of CPU ``machine`` (``x86_64``, ``aarch64``) and Python ``python``: a pin only for
    another platform or only for an extra (``; extra == "..."``) is left out, and so are ranges
    (only an exact pin can be contradicted). Unparseable strings are skipped."""
    from packaging.requirements import InvalidRequirement, Requirement
    env = marker_env(machine, python)
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
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version
    out = []
    for name, want in sorted(pins.items()):
        have = lock.get(name)
        if have is None:
            out.append(f"{name}: not in the lock, SGLang {sglang_version} pins =={want}")
            continue
        try:        # PEP 440: ==2.9.1 admits 2.9.1+cu128 (a CUDA index's build), ==2.0 admits 2.0.0
            ok = SpecifierSet(f"=={want}").contains(Version(have.version), prereleases=True)
        except (InvalidSpecifier, InvalidVersion):
            ok = have.version == want
        if not ok:
            out.append(f"{name}: the lock has {have.version}, SGLang {sglang_version} pins =={want}")
    return out


def env_problems(lock: dict[str, Pin], report: dict) -> list[str]:
    """Problems of a built environment (pure) from the host's report (:data:`dsv4ctl.deploy.verify.SCRIPT`):
    ``report`` = {"present": bool, "python": bool, "dists": {name: version}, "bad": [path, ...]}.
    ``env not built``, ``env python`` (its interpreter is gone), ``env missing NAME==V``,
    ``env version NAME V (lock V')`` (PEP 440 equality), ``env extra NAME==V`` (installed by
    hand), ``env hash PATH`` (a file differs from its RECORD: edited or replaced in place), ``env
    unclaimed PATH`` (a file no RECORD lists: a ``sitecustomize.py``, a ``.pth``, a package
    dropped in), ``env pyvenv.cfg`` (changed since the build: another interpreter, system
    site-packages switched on)."""
    if not report.get("present"):
        return ["env not built"]
    out = [] if report.get("python", True) else ["env python"]
    dists = {normalize(k): v for k, v in (report.get("dists") or {}).items()}
    for name, p in sorted(lock.items()):
        if name not in dists:
            out.append(f"env missing {name}=={p.version}")
        elif not same_version(dists[name], p.version):
            out.append(f"env version {name} {dists[name]} (lock {p.version})")
    out += [f"env extra {n}=={v}" for n, v in sorted(dists.items()) if n not in lock]
    out += [f"env {p}" if p.startswith("unclaimed ") or p == "pyvenv.cfg" else f"env hash {p}"
            for p in report.get("bad", [])]
    return out


# -- builders ----------------------------------------------------------------------------------

def build_command(root: str, digest: str, lock_path: str, *, uv: str, python: str, uv_args: tuple[str, ...] = ()) -> str:
    """Shell command building environment ``digest`` on a host (idempotent; run under the host
    lock, so this run is the only builder of ``ROOT/envs``): first the staging folders of
    interrupted builds (``ROOT/envs/.tmp-*``, any digest) are removed, also when the environment
    is there already; nothing more when ``ROOT/envs/<digest>/ENV.json`` exists (prints ``@env
    present``); else ``uv venv`` with the host's ``python`` into ``ROOT/envs/.tmp-<digest>-$$``,
    ``uv pip sync --require-hashes`` of ``lock_path`` (exactly the lock; ``uv_args`` say how
    packages are reached), ``ENV.json``, every write bit dropped, then one rename into place
    (prints ``@env built``). uv runs in the background while the shell waits for it, so a signal
    (SIGTERM from a stopped run) is acted on at once, whatever uv does: uv is killed and the
    staging folder removed; a build killed outright leaves one that the next build sweeps. A
    host never has a half-built environment under its name. Exit 127 when ``uv`` is not found."""
    envs = f"{root}/envs"
    final = f"{envs}/{digest}"
    extra = " ".join(q(a) for a in uv_args)
    suffix = identity_suffix(python).decode()[1:]      # after the newline printf writes
    return (f"E={q(envs)}; if [ -d \"$E\" ]; then for d in \"$E\"/.tmp-*; do "
            "if [ -e \"$d\" ]; then chmod -R u+w \"$d\"; rm -rf \"$d\"; fi; done; fi; "
            f"if [ -f {q(final + '/' + ENV_MARK)} ]; then echo '@env present'; exit 0; fi; "
            f"command -v {q(uv)} >/dev/null 2>&1 || {{ echo 'uv not found: '{q(uv)} >&2; exit 127; }}; "
            # the lock is the release's (verified later): it must still be what the digest names
            f"h=$({{ cat {q(lock_path)} && printf '\\n%s' {q(suffix)}; }} | sha256sum | cut -c1-12); "
            f"if [ \"e$h\" != {q(digest)} ]; then echo {q(lock_path)}': does not match environment {digest} "
            f"(edited on the host?): not built' >&2; exit 1; fi; "
            f"set -e; T=\"$E/.tmp-{digest}-$$\"; U=; mkdir -p \"$E\"; "
            # uv in the background: `wait` returns at once on a trapped signal (a foreground child
            # would be waited for first); the EXIT trap kills uv, then removes the staging folder
            # (further signals are ignored meanwhile: the stop's second SIGTERM would cut it short)
            "trap 'trap \"\" INT TERM HUP; set +e; if [ -n \"$U\" ]; then kill -KILL \"$U\" 2>/dev/null; "
            "wait \"$U\" 2>/dev/null; fi; chmod -R u+w \"$T\" 2>/dev/null; rm -rf \"$T\"' EXIT; "
            "trap 'trap \"\" INT TERM HUP; exit 130' INT TERM HUP; "
            f"{q(uv)} venv --quiet --python {q(python)} \"$T\" & U=$!; wait \"$U\"; U=; "
            f"{q(uv)} pip sync --quiet --python \"$T/bin/python\" --require-hashes {extra} {q(lock_path)} & U=$!; "
            "wait \"$U\"; U=; "
            f"printf '{{\"schema\": \"dsv4ctl.env/1\", \"digest\": \"{digest}\", \"built_at\": \"%s\", "
            f"\"pyvenv_cfg_sha256\": \"%s\"}}\\n' \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\" "
            f"\"$(sha256sum < \"$T/pyvenv.cfg\" | cut -d' ' -f1)\" > \"$T/{ENV_MARK}\"; "
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
