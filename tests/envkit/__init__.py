"""Real wheels and hashed locks for release-environment tests: tiny pure-Python distributions
written as real wheel files (zip, METADATA, WHEEL, RECORD with sha256 entries) into a folder
that uv reads with ``--no-index --find-links DIR``: real uv, no network."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """Write ``name-version-py3-none-any.whl`` (module ``name`` with ``__version__``) into
    ``folder``; returns its path. Deterministic bytes (fixed zip times)."""
    mod = name.replace("-", "_")
    di = f"{mod}-{version}.dist-info"
    files = {
        f"{mod}/__init__.py": f'__version__ = "{version}"\n'.encode(),
        f"{di}/METADATA": ("Metadata-Version: 2.1\n" f"Name: {name}\n" f"Version: {version}\n"
                           + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode(),
        f"{di}/WHEEL": b"Wheel-Version: 1.0\nGenerator: dsv4ctl-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{p},sha256={_b64(b)},{len(b)}\n" for p, b in files.items()) + f"{di}/RECORD,,\n"
    files[f"{di}/RECORD"] = record.encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{mod}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for p, b in files.items():
            z.writestr(zipfile.ZipInfo(p, (2020, 1, 1, 0, 0, 0)), b)
    return path


def lock_text(wheels: list[Path], comment: str = "") -> str:
    """A hashed requirements lock (``uv pip compile --generate-hashes`` shape) of ``wheels``."""
    out = [f"# {comment}"] if comment else []
    for w in sorted(wheels):
        name, version = w.name.split("-")[:2]
        out.append(f"{name.replace('_', '-')}=={version} \\\n    --hash=sha256:{hashlib.sha256(w.read_bytes()).hexdigest()}")
    return "\n".join(out) + "\n"
