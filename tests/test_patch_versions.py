"""The patch series is keyed by SGLang release (issue 27): ``patches/sglang-VERSION`` for every
release dsv4ctl supports, each proven on a pristine tree of that release's real wheel
(``patch check --base sglang==VERSION`` picks that release's series), read back by ``patch
status`` through the tree's own version, and run with the release's own configurator on CPU: a
bf16 index-K is budgeted at 256 B/slot exactly as dsv4ctl's capacity model predicts, the switch
off is the stock fp8 figure (132 B/slot). 0.5.23's series is covered by test_patch_tree.py and
test_patch_oracle.py."""

from __future__ import annotations

import pytest

from dsv4ctl.patches.ops import load_series
from dsv4ctl.plan.versions import VERSIONS
from tests.conftest import run_cli
from tests.oracle.fixtures import forked_oracle  # noqa: F401 - the oracle's fork servers
from tests.patchoracle.fixtures import BF16, FLASH_BYTES, drive, model_config
from tests.patchoracle.trees import ENV, ORACLE_PY, REPO
from tests.test_patch_oracle import as_pools, predicted

OLDER = [v for v in VERSIONS if v != "0.5.23"]
POOL = "python/sglang/srt/mem_cache/deepseek_v4_memory_pool.py"
CONF = "python/sglang/srt/model_executor/pool_configurator.py"


def test_every_supported_release_has_a_series_cut_against_it():
    for v in VERSIONS:
        ls = load_series(REPO / "patches" / f"sglang-{v}")
        assert ls.series.base == f"sglang=={v}"
        assert [e.name for e in ls.series.entries] == ["0001-dsv4-bf16-index-k-exact-accounting.patch",
                                                       "0002-dsv4-log-pool-plan.patch"]
        assert ls.series.entries[0].facts == {"index_k_dtype": "bf16", "index_k_accounting": "exact",
                                              "when": "SGLANG_DSV4_INDEX_K_DTYPE=bf16"}


@pytest.mark.oracle
@pytest.mark.skipif(not ORACLE_PY.exists(), reason="needs .venv-oracle (bash scripts/oracle-env.sh)")
@pytest.mark.parametrize("version", OLDER)
@pytest.mark.usefixtures("forked_oracle")
def test_series_proven_on_its_release_and_its_configurator_budgets_bf16(version, tmp_path):
    keep = tmp_path / "k"
    r = run_cli("patch", "check", "--base", f"sglang=={version}", "--keep", str(keep), "--json", env=ENV, timeout=300)
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["ok"] and doc["errors"] == [] and doc["base"] == f"sglang=={version}"
    assert doc["series"].endswith(f"patches/sglang-{version}")
    assert [(p["state"], p["compiled"]) for p in doc["patches"]] == [
        ("applied", ["python/sglang/srt/environ.py", POOL, CONF]), ("applied", [CONF])]
    tree = keep / f"sglang-{version}"

    # the tree says which release it is: status picks that release's series by itself
    st = run_cli("patch", "status", str(tree), "--json", env=ENV, timeout=120)
    assert st.code == 0, st.err
    sd = st.json()
    assert sd["version"] == version and sd["series_base"] == f"sglang=={version}"
    assert [p["state"] for p in sd["patches"]] == ["applied", "applied"]

    # the release's own configurator, patched: bf16 at its real size, off = stock fp8
    bf16, off = drive(f"{tree}/python:{REPO}", [
        dict(config=model_config("deepseek-v4-flash"), available_bytes=FLASH_BYTES, env=BF16),
        dict(config=model_config("deepseek-v4-flash"), available_bytes=FLASH_BYTES, env={})])
    assert bf16["sglang_file"] == f"{tree}/python/sglang/__init__.py"
    assert (bf16["indexer_bytes_per_token"], off["indexer_bytes_per_token"]) == (256, 132)
    flags = VERSIONS[version].pool_flags()      # 0.5.20's configurator is another generation
    want_bf16 = predicted("deepseek-v4-flash", FLASH_BYTES, index_k_dtype="bf16", index_k_accounting="exact",
                          **flags)
    want_off = predicted("deepseek-v4-flash", FLASH_BYTES, **flags)
    assert {k: bf16[k] for k in as_pools(want_bf16)} == as_pools(want_bf16)
    assert {k: off[k] for k in as_pools(want_off)} == as_pools(want_off)
    # capacity reference §4 (0.5.21+); 0.5.18-0.5.20 price 584-byte slots and twice the C4 state
    assert (bf16["full"], off["full"]) == ((16_247_040, 17_619_712) if version in ("0.5.18", "0.5.19", "0.5.20")
                                           else (17_546_240, 19_158_016))


def test_the_023_series_does_not_apply_to_022_which_is_why_it_is_keyed(tmp_path):
    """The reason for one series per release: 0.5.23's patch (a) does not apply to 0.5.22's
    sources (its hunks sit elsewhere), and ``patch check`` says so as a verdict (exit 1)."""
    r = run_cli("patch", "check", "--base", "sglang==0.5.22", "--series", str(REPO / "patches" / "sglang-0.5.23"),
                env=ENV, timeout=300)
    assert r.code == 1, (r.out, r.err)
    assert "note: series is cut for sglang==0.5.23; checking against sglang==0.5.22" in r.out
    assert "0001-dsv4-bf16-index-k-exact-accounting.patch" in r.err


def test_two_checks_at_once_share_one_pristine_build(tmp_path):
    """Two ``patch check`` runs of one release at once (CI workers or operators sharing a cache):
    one builds the pristine tree under the cache's lock while the other waits, both prove the
    series, and the cached tree holds every source file of the wheel (breaker's finding: they built
    into one staging folder, the cache kept a half tree and every later check failed)."""
    import os
    import subprocess
    import sys
    import zipfile
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "wheels").symlink_to(REPO / ".cache" / "wheels")
    wheel = next((REPO / ".cache" / "wheels").glob("sglang-0.5.22-*.whl"), None)
    if wheel is None:
        pytest.skip("the 0.5.22 wheel is fetched by scripts/oracle-env.sh")
    env = {**os.environ, **ENV, "DSV4CTL_CACHE": str(cache)}
    argv = [sys.executable, "-m", "dsv4ctl", "patch", "check", "--base", "sglang==0.5.22", "--json"]
    runs = [subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in runs]
    assert [p.returncode for p in runs] == [0, 0], [o[1] for o in outs]
    with zipfile.ZipFile(wheel) as z:
        want = sum(1 for i in z.infolist() if not i.is_dir() and i.filename.startswith("sglang/")
                   and "__pycache__/" not in i.filename and not i.filename.endswith((".pyc", ".pyo")))
    files = subprocess.run(["git", "-C", str(cache / "trees" / "sglang-0.5.22"), "ls-files"], capture_output=True,
                           text=True).stdout.splitlines()
    assert len(files) == want
    assert not list((cache / "trees").glob("*.partial*"))


def test_the_base_package_name_is_normalised_as_pypi_does():
    """``--base SGLang==0.5.22`` is sglang 0.5.22: its own series and cached wheel (it picked the
    0.5.23 series and went to pip before)."""
    r = run_cli("patch", "check", "--base", "SGLang==0.5.22", "--dry-run", "--json", env=ENV, timeout=60)
    assert r.code == 0, r.err
    d = r.json()
    assert d["base"] == "sglang==0.5.22" and d["series"].endswith("patches/sglang-0.5.22")
