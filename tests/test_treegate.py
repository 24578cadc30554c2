"""Index-K gating decided from real SGLang 0.5.23 source, and from patched copies of it."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import pytest

from dsv4ctl.serve.treegate import POOL_MODULE, READ_ATTRS, READ_METHODS, analyse, analyse_tree
from tests.conftest import REPO, oracle_available, run_cli

SGLANG = REPO / ".venv-oracle" / "lib" / "python3.11" / "site-packages" / "sglang"
pytestmark = pytest.mark.skipif(not (SGLANG / POOL_MODULE).is_file(),
                                reason="needs the sglang 0.5.23 source in .venv-oracle (bash scripts/oracle-env.sh)")

WAIT = ("    def get_index_k_with_scale_buffer(self, layer_id: int) -> torch.Tensor:\n"
        "        self.wait_layer_transfer(layer_id)\n")
BACKEND = "srt/layers/attention/deepseek_v4_backend.py"


@functools.lru_cache(maxsize=1)
def _index_k_files() -> tuple[Path, ...]:
    out = []
    for p in SGLANG.rglob("*.py"):
        text = p.read_text(errors="replace")
        if p.relative_to(SGLANG).as_posix() == POOL_MODULE or any(w in text for w in READ_METHODS + READ_ATTRS):
            out.append(p)
    return tuple(out)


def slim_copy(dst: Path) -> Path:
    """A copy of the real 0.5.23 package holding every file that names an index-K read (the
    files the analysis reads), as a git-checkout layout ``python/sglang/...``."""
    pkg = dst / "python" / "sglang"
    for p in _index_k_files():
        out = pkg / p.relative_to(SGLANG)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, out)
    return dst


def patch(tree: Path, rel: str, old: str, new: str) -> None:
    f = tree / "python" / "sglang" / rel
    text = f.read_text()
    assert text.count(old) == 1, f"{rel}: anchor not found once"
    f.write_text(text.replace(old, new))


def test_stock_0523_is_gated():
    v = analyse_tree(SGLANG)
    assert v.gated is True, v.problems
    assert "get_index_k_with_scale_buffer" in v.gated_accessors
    assert v.scanned_files >= 5          # attention backends, compressor, DSA indexer ...


def test_slim_copy_of_stock_is_gated(tmp_path):
    v = analyse_tree(slim_copy(tmp_path))
    assert v.gated is True and not v.problems


def test_patched_copy_without_the_wait_is_ungated(tmp_path):
    tree = slim_copy(tmp_path)
    patch(tree, POOL_MODULE, WAIT, WAIT.splitlines(keepends=True)[0])
    v = analyse_tree(tree)
    assert v.gated is False
    p = v.problems[0]
    assert p.file == POOL_MODULE
    assert "get_index_k_with_scale_buffer reaches the indexer pool" in p.what
    src = (tree / "python" / "sglang" / POOL_MODULE).read_text().splitlines()
    assert "_indexer_pool(compress_ratio).get_index_k_with_scale_buffer" in src[p.line - 1]


def test_reader_going_to_the_indexer_pool_directly_is_ungated(tmp_path):
    tree = slim_copy(tmp_path)
    patch(tree, BACKEND, "                pool.get_index_k_with_scale_buffer(layer_id),\n",
          "                pool.c4_indexer_kv_pool.get_index_k_with_scale_buffer(\n"
          "                    pool.layer_mapping[layer_id].compress_layer_id),\n")
    v = analyse_tree(tree)
    assert v.gated is False
    assert [p.file for p in v.problems] == [BACKEND]
    assert "reads the indexer pool directly (get_index_k_with_scale_buffer)" in v.problems[0].what


def test_alias_of_the_indexer_pool_is_followed():
    src = (SGLANG / POOL_MODULE).read_text()
    reader = ("def read(pool, layer_id):\n"
              "    ip = pool.index_pools[4]\n"
              "    return ip.index_k_with_scale_buffer[layer_id]\n"
              "def read_ok(pool, layer_id):\n"
              "    pool.wait_layer_transfer(layer_id)\n"
              "    ip = pool.index_pools[4]\n"
              "    return ip.index_k_with_scale_buffer[layer_id]\n")
    v = analyse(src, {"srt/x.py": reader})
    assert v.gated is False
    assert [(p.file, p.line) for p in v.problems] == [("srt/x.py", 3)]


def test_wait_layer_transfer_that_no_longer_waits_is_ungated():
    src = (SGLANG / POOL_MODULE).read_text()
    old = ("        if self.layer_transfer_counter is not None:\n"
           "            self.layer_transfer_counter.wait_until(layer_id - self.start_layer)\n")
    assert src.count(old) == 1
    v = analyse(src.replace(old, "        return None\n"), {})
    assert v.gated is False and "does not wait" in v.problems[0].what


def test_tree_without_dsv4_pool_is_undecided(tmp_path):
    (tmp_path / "sglang" / "srt").mkdir(parents=True)
    v = analyse_tree(tmp_path)
    assert v.gated is None


def _profile_with_tree(tmp_path: Path, tree: Path) -> Path:
    src = REPO / "profiles" / "dsv4-flash-8xb200-pd.yaml"
    shutil.copytree(REPO / "profiles" / "dsv4-flash-8xb200-pd", tmp_path / "dsv4-flash-8xb200-pd")
    text = src.read_text().replace("  tree: null ", f"  tree: {tree} ")
    text = text.replace("series: ../patches/sglang-0.5.23", "series: null")
    p = tmp_path / "p.yaml"
    p.write_text(text)
    return p


def test_cli_lint_flags_ungated_tree_exit_2(tmp_path):
    tree = slim_copy(tmp_path / "tree")
    patch(tree, POOL_MODULE, WAIT, WAIT.splitlines(keepends=True)[0])
    prof = _profile_with_tree(tmp_path, tree)
    r = run_cli("config", "lint", str(prof), "--json")
    assert r.code == 2, r.err
    doc = r.json()
    assert doc["gating"]["gated"] is False
    hits = [f for f in doc["findings"] if f["rule"] == "DSV111"]
    assert hits and hits[0]["group"] == "prefill" and hits[0]["line"] == 15
    assert r.err.startswith("dsv4ctl: error: config lint: 1 error(s); first: ") and "DSV111" in r.err
    # the stock tree passes through --tree (overrides the profile's)
    r2 = run_cli("config", "lint", str(prof), "--tree", str(SGLANG), "--json")
    assert r2.code == 0, r2.err
    assert r2.json()["gating"]["gated"] is True and r2.json()["findings"] == []
