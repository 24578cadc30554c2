"""The pristine SGLang wheel without pip: the index's JSON API + sha256 check, served here by a
fake index on 127.0.0.1 (no network). ``DSV4CTL_PYPI_URL`` points dsv4ctl at it."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import socket
import threading
import zipfile
from pathlib import Path

import pytest

from dsv4ctl.errors import DsvError
from dsv4ctl.patches import pristine


def _wheel_bytes() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("sglang/__init__.py", "__version__ = '0.5.23'\n")
        z.writestr("sglang/srt/mem.py", "X = 1\n")
        z.writestr("sglang/__pycache__/x.cpython-311.pyc", b"\0")
        z.writestr("sglang-0.5.23.dist-info/METADATA", "Name: sglang\n")
    return buf.getvalue()


class FakeIndex:
    """A JSON API index with one release of sglang 0.5.23 (a py3-none-any wheel and an sdist)."""

    def __init__(self, wheel: bytes, digest: str | None = None):
        self.wheel, self.hits = wheel, []
        self.digest = digest or hashlib.sha256(wheel).hexdigest()
        owner = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                owner.hits.append(self.path)
                if self.path == "/pypi/sglang/0.5.23/json":
                    base = f"http://127.0.0.1:{owner.port}/files"
                    body = json.dumps({"info": {"name": "sglang", "version": "0.5.23"}, "urls": [
                        {"packagetype": "sdist", "filename": "sglang-0.5.23.tar.gz", "url": f"{base}/sglang-0.5.23.tar.gz",
                         "digests": {"sha256": "0" * 64}},
                        {"packagetype": "bdist_wheel", "filename": "sglang-0.5.23-py3-none-any.whl", "size": len(owner.wheel),
                         "url": f"{base}/sglang-0.5.23-py3-none-any.whl", "digests": {"sha256": owner.digest}}]}).encode()
                elif self.path == "/files/sglang-0.5.23-py3-none-any.whl":
                    body = owner.wheel
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/pypi"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def index():
    idx = FakeIndex(_wheel_bytes())
    yield idx
    idx.close()


@pytest.fixture
def said(monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr(pristine, "say", lines.append)
    return lines


def test_download_checks_the_hash_and_says_what_and_where(index, tmp_path, monkeypatch, said):
    monkeypatch.setenv("DSV4CTL_PYPI_URL", index.url)
    w = pristine.fetch_wheel("sglang", "0.5.23", tmp_path / "wheels")
    assert w == tmp_path / "wheels" / "sglang-0.5.23-py3-none-any.whl"
    assert w.read_bytes() == index.wheel
    assert index.hits == ["/pypi/sglang/0.5.23/json", "/files/sglang-0.5.23-py3-none-any.whl"]
    assert said[0] == (f"downloading http://127.0.0.1:{index.port}/files/sglang-0.5.23-py3-none-any.whl "
                       f"({len(index.wheel) / 1e6:.1f} MB) into {tmp_path / 'wheels'}")
    assert said[1] == f"sha256 ok: {w}"
    assert sorted(p.name for p in (tmp_path / "wheels").iterdir()) == ["sglang-0.5.23-py3-none-any.whl"]
    # cached: no second request
    assert pristine.fetch_wheel("sglang", "0.5.23", tmp_path / "wheels") == w
    assert len(index.hits) == 2


def test_a_hash_mismatch_keeps_nothing(tmp_path, monkeypatch, said):
    idx = FakeIndex(_wheel_bytes(), digest="ab" * 32)
    try:
        monkeypatch.setenv("DSV4CTL_PYPI_URL", idx.url)
        with pytest.raises(DsvError) as e:
            pristine.fetch_wheel("sglang", "0.5.23", tmp_path / "wheels")
        assert f"does not match the index's {'ab' * 32}; not kept" in str(e.value)
        assert list((tmp_path / "wheels").iterdir()) == []
    finally:
        idx.close()


def test_unknown_version_and_refused_connection_are_one_line_errors(index, tmp_path, monkeypatch, said):
    monkeypatch.setenv("DSV4CTL_PYPI_URL", index.url)
    with pytest.raises(DsvError) as e:
        pristine.fetch_wheel("sglang", "9.9.9", tmp_path / "w")
    assert str(e.value) == (f"cannot fetch {index.url}/sglang/9.9.9/json (HTTP 404): put sglang-9.9.9-*.whl in "
                            f"{tmp_path / 'w'} or set DSV4CTL_PYPI_URL to a reachable index")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                      # nothing listens there now
    monkeypatch.setenv("DSV4CTL_PYPI_URL", f"http://127.0.0.1:{port}/pypi")
    with pytest.raises(DsvError) as e:
        pristine.fetch_wheel("sglang", "0.5.23", tmp_path / "w")
    assert str(e.value).startswith(f"cannot fetch http://127.0.0.1:{port}/pypi/sglang/0.5.23/json (connection refused)")


def test_pristine_tree_from_the_downloaded_wheel(index, tmp_path, monkeypatch, said):
    monkeypatch.setenv("DSV4CTL_PYPI_URL", index.url)
    tree = pristine.pristine_tree("sglang", "0.5.23", tmp_path / "tree", cache=tmp_path / "cache")
    assert (tree / "python/sglang/srt/mem.py").read_text() == "X = 1\n"
    assert not (tree / "python/sglang/__pycache__").exists()
    assert said[-1] == (f"building the pristine sglang 0.5.23 tree from sglang-0.5.23-py3-none-any.whl in "
                        f"{tmp_path / 'cache/trees/sglang-0.5.23'}")


def test_without_pip_the_index_is_used(monkeypatch, tmp_path):
    """A pipx / uv tool environment has no pip: the JSON API route is taken."""
    monkeypatch.delenv("DSV4CTL_PYPI_URL", raising=False)
    monkeypatch.setattr(pristine.importlib.util, "find_spec", lambda name: None)
    assert pristine.fetch_plan("sglang", "0.5.23", tmp_path) == (
        f"wheel not cached: https://pypi.org/pypi/sglang/0.5.23/json -> {tmp_path}")


def test_patch_check_dry_run_names_series_and_source(index, tmp_path):
    from tests.conftest import run_cli
    r = run_cli("patch", "check", "--dry-run", "--json",
                env={"DSV4CTL_PYPI_URL": index.url, "DSV4CTL_CACHE": str(tmp_path / "c")})
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["dry_run"] is True and doc["base"] == "sglang==0.5.23"
    assert doc["patches"] == ["0001-dsv4-bf16-index-k-exact-accounting.patch", "0002-dsv4-log-pool-plan.patch"]
    assert doc["wheel"] == f"wheel not cached: {index.url}/sglang/0.5.23/json -> {tmp_path / 'c' / 'wheels'}"
    assert index.hits == []          # a dry run fetches nothing
    assert Path(doc["series"]).name == "sglang-0.5.23"
