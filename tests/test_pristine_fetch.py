"""The pristine SGLang wheel without pip: the index's JSON API + sha256 check, served here by a
fake index on 127.0.0.1 (no network). ``DSV4CTL_PYPI_URL`` points dsv4ctl at it."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import shutil
import socket
import threading
import zipfile
from pathlib import Path

import pytest

from dsv4ctl.errors import DsvError, InputError
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
    assert sorted(p.name for p in (tmp_path / "wheels").iterdir()) == ["sglang-0.5.23-py3-none-any.whl",
                                                                      "sglang-0.5.23-py3-none-any.whl.sha256"]
    # the index's hash is recorded beside it, checked at every later use
    assert (tmp_path / "wheels" / "sglang-0.5.23-py3-none-any.whl.sha256").read_text() == \
        f"{index.digest}  sglang-0.5.23-py3-none-any.whl\n"
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


# --- untrusted bytes stay data (issue 41 item 2) --------------------------------------------------

def _hostile(tmp_path, member: str, data: bytes = b"owned\n", mode: int | None = None) -> Path:
    """A wheel whose sources are fine but one member is ``member`` (unix mode ``mode``)."""
    w = tmp_path / "sglang-0.5.23-py3-none-any.whl"
    with zipfile.ZipFile(w, "w") as z:
        z.writestr("sglang/__init__.py", "__version__ = '0.5.23'\n")
        info = zipfile.ZipInfo(member)
        info.create_system = 3
        if mode is not None:
            info.external_attr = mode << 16
        z.writestr(info, data)
    return w


@pytest.mark.parametrize("member,mode,why", [
    ("sglang/../../../../escaped.txt", None, "a '..' component"),
    ("/tmp/dsv4ctl-absolute-{uniq}.txt", None, "an absolute path"),
    ("sglang/link.py", 0o120777, "a symbolic link"),
    ("sglang/fifo", 0o010644, "a special file"),
    ("sglang/.git/hooks/post-checkout", 0o100755, "a '.git' component"),
])
def test_a_hostile_wheel_member_is_refused_and_nothing_is_extracted(tmp_path, member, mode, why):
    """Before: ``sglang/../../..`` was written wherever it pointed (root in CI), an absolute
    member under ``python/``, a symlink member became a file holding its target."""
    member = member.replace("{uniq}", tmp_path.name)
    target = "/etc/passwd" if mode == 0o120777 else "owned"
    w = _hostile(tmp_path, member, target.encode(), mode)
    dest = tmp_path / "a" / "b" / "tree"
    with pytest.raises(DsvError) as e:
        pristine.build_tree(w, dest, "sglang", "0.5.23")
    assert str(e.value) == f"{w.name}: member {member!r} is {why}; nothing extracted (not a wheel to trust)"
    assert not dest.exists() and list((tmp_path / "a" / "b").iterdir()) == []      # no staging left
    assert not (tmp_path / "escaped.txt").exists() and not Path(f"/tmp/dsv4ctl-absolute-{tmp_path.name}.txt").exists()


def test_a_zip_bomb_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(pristine, "MAX_TREE_BYTES", 1 << 20)
    w = _hostile(tmp_path, "sglang/big.py", b"0" * (2 << 20))
    with pytest.raises(DsvError, match=r"unpacks to more than 0 GiB; nothing extracted"):
        pristine.build_tree(w, tmp_path / "tree", "sglang", "0.5.23")
    assert not (tmp_path / "tree").exists()


def _plant(cache: Path, name: str = "sglang-0.5.23-py3-none-any.whl") -> Path:
    """A wheel an attacker put where dsv4ctl looks: its sources say ``PLANTED``."""
    (cache / "wheels").mkdir(parents=True, exist_ok=True)
    w = cache / "wheels" / name
    with zipfile.ZipFile(w, "w") as z:
        z.writestr("sglang/__init__.py", "PLANTED = True\n")
    return w


@pytest.mark.parametrize("how", ["other-owner", "world-writable", "cache-root-other-owner"])
def test_a_wheel_planted_in_a_folder_others_can_write_is_never_used(tmp_path, monkeypatch, said, how):
    """Before: a wheel in a ``wheels/`` folder another user owns was built into the pristine tree
    without a hash check."""
    if how != "world-writable" and os.geteuid() != 0:
        pytest.skip("chown to a second uid needs root")
    cache = tmp_path / "cache"
    _plant(cache)
    where = {"other-owner": cache / "wheels", "world-writable": cache / "wheels", "cache-root-other-owner": cache}[how]
    if how == "world-writable":
        os.chmod(where, 0o777)
    else:
        os.chown(where, 65534, 65534)
    monkeypatch.setenv("DSV4CTL_PYPI_URL", "http://127.0.0.1:9/pypi")      # never reached
    with pytest.raises(InputError) as e:
        pristine.pristine_tree("sglang", "0.5.23", tmp_path / "tree", cache=cache)
    st = os.stat(where)
    assert str(e.value) == (f"cache folder {where} is not yours alone (owner uid {st.st_uid}, mode "
                            f"{st.st_mode & 0o777:o}): another user could plant a "
                            f"{'wheel' if where.name == 'wheels' else 'pristine tree'} there; make it yours "
                            "with mode 700, or point DSV4CTL_CACHE at a private folder")
    assert not (tmp_path / "tree").exists() and not (cache / "trees" / "sglang-0.5.23").exists()


def test_the_cli_refuses_a_shared_wheel_folder_in_one_line(tmp_path):
    cache = tmp_path / "cache"
    _plant(cache)
    os.chmod(cache / "wheels", 0o777)
    from tests.conftest import run_cli
    for argv in (["patch", "check", "--json"], ["patch", "check", "--dry-run", "--json"]):
        r = run_cli(*argv, env={"DSV4CTL_PYPI_URL": "http://127.0.0.1:9/pypi", "DSV4CTL_CACHE": str(cache)})
        assert r.code == 2 and r.out == "", (argv, r.err)
        assert r.err == (f"dsv4ctl: error: cache folder {cache / 'wheels'} is not yours alone (owner uid "
                         f"{os.getuid()}, mode 777): another user could plant a wheel there; make it yours with "
                         "mode 700, or point DSV4CTL_CACHE at a private folder\n")


def test_a_planted_wheel_in_our_own_folder_must_match_a_known_hash(index, tmp_path, monkeypatch, said):
    """A wheel nobody recorded is checked against the index (and recorded when it matches); one
    that differs from the recorded or pinned sha256 is never unpacked."""
    monkeypatch.setenv("DSV4CTL_PYPI_URL", index.url)
    cache = tmp_path / "cache"
    w = _plant(cache)
    with pytest.raises(DsvError) as e:
        pristine.pristine_tree("sglang", "0.5.23", tmp_path / "tree", cache=cache)
    got = hashlib.sha256(w.read_bytes()).hexdigest()
    assert str(e.value) == (f"{w}: sha256 {got} does not match the index's {index.digest}; not used "
                            "(remove it to download it again)")
    assert not (cache / "trees" / "sglang-0.5.23").exists()
    # the real one put there by hand: checked against the index, recorded, used
    w.write_bytes(index.wheel)
    pristine.pristine_tree("sglang", "0.5.23", tmp_path / "tree", cache=cache)
    assert (cache / "wheels" / (w.name + ".sha256")).read_text().startswith(index.digest)
    # swapped afterwards (another tool, a disk error): the record catches it, no index needed
    shutil.rmtree(cache / "trees")
    _plant(cache)
    index.close()
    with pytest.raises(DsvError, match=r"does not match recorded " + index.digest):
        pristine.fetch_wheel("sglang", "0.5.23", cache / "wheels")


def test_a_pinned_release_wheel_must_match_the_pinned_hash(tmp_path, said):
    """sglang 0.5.18-0.5.23 wheels are checked against the sha256 dsv4ctl ships, offline."""
    name = "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl"
    w = _plant(tmp_path / "cache", name)
    with pytest.raises(DsvError) as e:
        pristine.fetch_wheel("sglang", "0.5.23", w.parent)
    assert str(e.value).endswith("does not match dsv4ctl's pinned "
                                 "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937; not used "
                                 "(remove it to download it again)")


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_planted_lock_is_refused_and_its_target_kept(tmp_path, monkeypatch, said, kind):
    """Before: ``trees/sglang-0.5.23.lock`` was opened with ``open(..., "w")``: a symlink there
    truncated the file it pointed to (a 0600 key, a profile) to 0 bytes."""
    cache = tmp_path / "cache"
    (cache / "trees").mkdir(parents=True)
    lock = cache / "trees" / "sglang-0.5.23.lock"
    secret = tmp_path / "id_ed25519"
    secret.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----\n")
    secret.chmod(0o600)
    if kind == "symlink":
        lock.symlink_to(secret)
    else:
        os.mkfifo(lock)
    monkeypatch.setenv("DSV4CTL_PYPI_URL", "http://127.0.0.1:9/pypi")
    with pytest.raises(InputError) as e:
        pristine.pristine_tree("sglang", "0.5.23", tmp_path / "tree", cache=cache)
    assert str(e.value) == (f"{lock}: not a lock file of yours ({'a symbolic link' if kind == 'symlink' else 'a pipe'}); "
                            "remove it")
    assert secret.read_bytes() == b"-----BEGIN OPENSSH PRIVATE KEY-----\n" and secret.stat().st_mode & 0o777 == 0o600
