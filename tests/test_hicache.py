"""``dsv4ctl hicache on|off|status`` on local serve configs; status against stand-in servers over real HTTP."""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli
from tests.standin.harness import free_port, standin

SRC = REPO / "profiles" / "dsv4-flash-8xb200-pd"


@pytest.fixture
def site(tmp_path):
    """A copy of the default profile: host 127.0.0.1, groups on free ports, configs in tmp."""
    shutil.copytree(SRC, tmp_path / "cfg")
    ports = {"prefill": free_port(), "decode": free_port()}
    text = (REPO / "profiles" / "dsv4-flash-8xb200-pd.yaml").read_text()
    text = (text.replace("series: ../patches/sglang-0.5.23", "series: null")
                .replace("address: 10.0.0.10", "address: 127.0.0.1")
                .replace("dsv4-flash-8xb200-pd/", "cfg/")
                .replace("    serve_config: cfg/prefill.yaml\n", f"    serve_config: cfg/prefill.yaml\n    port: {ports['prefill']}\n")
                .replace("    serve_config: cfg/decode.yaml\n", f"    serve_config: cfg/decode.yaml\n    port: {ports['decode']}\n"))
    p = tmp_path / "p.yaml"
    p.write_text(text)
    return dict(profile=p, prefill=tmp_path / "cfg" / "prefill.yaml", decode=tmp_path / "cfg" / "decode.yaml",
                ports=ports)


def test_off_then_on_restores_the_file_byte_for_byte(site):
    orig = site["prefill"].read_bytes()
    r = run_cli("hicache", "off", str(site["profile"]))
    assert r.code == 0, r.err
    assert "-enable-hierarchical-cache: true\n+enable-hierarchical-cache: false\n" in r.out
    after_off = site["prefill"].read_bytes()
    assert after_off == orig.replace(b"enable-hierarchical-cache: true", b"enable-hierarchical-cache: false")
    assert site["decode"].read_bytes() == (SRC / "decode.yaml").read_bytes()
    r = run_cli("hicache", "on", str(site["profile"]))
    assert r.code == 0, r.err
    assert "-enable-hierarchical-cache: false\n+enable-hierarchical-cache: true\n" in r.out
    assert site["prefill"].read_bytes() == orig
    r = run_cli("hicache", "on", str(site["profile"]))
    assert r.code == 0 and "HiCache already on, unchanged" in r.out


def test_on_with_options_edits_in_place_and_keeps_comments(site):
    r = run_cli("hicache", "on", str(site["profile"]), "-g", "prefill", "--ratio", "1.5",
                "--write-policy", "write_back", "--storage-backend", "file", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["schema"] == "dsv4ctl.hicache-edit/1" and doc["groups"][0]["written"] is True
    new = site["prefill"].read_text()
    assert ("hicache-ratio: 1.5             # required explicitly for DSV4 (no auto-sizing, no --hicache-size)\n"
            "hicache-write-policy: write_back\nhicache-io-backend: kernel\nhicache-mem-layout: page_first\n"
            "hicache-storage-backend: file\nreasoning-parser: deepseek-v4\n") in new
    old_lines = (SRC / "prefill.yaml").read_text().splitlines()
    new_lines = new.splitlines()
    assert [l for l in old_lines if not l.startswith(("hicache-ratio", "hicache-write-policy"))] == \
           [l for l in new_lines if not l.startswith(("hicache-ratio", "hicache-write-policy", "hicache-storage-backend"))]


def test_on_for_a_file_without_hicache_appends_explicit_ratio(site):
    # a colocated-style config without any HiCache key: decode file with the role changed is a lint
    # error, so use a prefill file stripped of its HiCache lines
    text = "".join(l for l in (SRC / "prefill.yaml").read_text().splitlines(keepends=True)
                   if not l.startswith(("enable-hierarchical-cache", "hicache-")))
    site["prefill"].write_text(text)
    r = run_cli("hicache", "on", str(site["profile"]), "-g", "prefill")
    assert r.code == 0, r.err
    assert site["prefill"].read_text() == text + "enable-hierarchical-cache: true\nhicache-ratio: 2.0\n"
    r = run_cli("hicache", "off", str(site["profile"]), "-g", "prefill")
    assert site["prefill"].read_text() == text + "enable-hierarchical-cache: false\nhicache-ratio: 2.0\n"


def test_dry_run_writes_nothing(site):
    before = site["prefill"].read_bytes(), site["prefill"].stat().st_mtime_ns
    r = run_cli("hicache", "off", str(site["profile"]), "--dry-run")
    assert r.code == 0
    assert "+enable-hierarchical-cache: false" in r.out and "dry run: would write 1 file(s)" in r.out
    assert (site["prefill"].read_bytes(), site["prefill"].stat().st_mtime_ns) == before


@pytest.mark.parametrize("args,msg", [
    (["on", "-g", "decode"], "error DSV106 hicache-on-decode"),
    (["on", "--mem-layout", "page_head"], "error DSV104 hicache-layout"),
    (["on", "--mem-layout", "diagonal"], "--mem-layout: invalid choice: 'diagonal'"),
    (["on", "--ratio", "1", "--storage-backend", "nfs"], "--storage-backend: invalid choice: 'nfs'"),
    (["on", "--ratio", "-1"], "--ratio: hicache-ratio must be > 0 (host pool = ratio x device pool), got -1"),
    (["on", "--ratio", "0"], "--ratio: hicache-ratio must be > 0 (host pool = ratio x device pool), got 0"),
    (["on", "--ratio", "inf"], "--ratio: hicache-ratio must be > 0"),
    (["on", "--ratio", "nan"], "--ratio: hicache-ratio must be > 0"),
    # before: 1e300 failed on the YAML round trip ("would not parse to the intended values"), and
    # without a plan or ram_gib any finite ratio was written
    (["on", "--ratio", "1e300"], "--ratio: hicache-ratio 1e+300 is over 100 (SGLang 0.5.23 sizes each host pool as "
     "hicache-ratio x its device pool and refuses to start when the host pools exceed the host's free RAM minus a "
     "10 GiB reserve; DSV4 device pools are tens of GiB per rank, so no host fits that)"),
    (["on", "--ratio", "100.5"], "--ratio: hicache-ratio 100.5 is over 100 (SGLang 0.5.23 sizes"),
    # under the cap, the plan's device pools against hosts[].ram_gib (2,048 GiB): DSV109
    (["on", "--ratio", "50"], "error DSV109 hicache-host-ram: host b200-0: HiCache host pools "),
    (["on", "-g", "router"], "router"),
    (["on", "-g", "nope"], "no group 'nope'"),
])
def test_rejected_edits_exit_2_and_touch_nothing(site, args, msg):
    snap = {k: site[k].read_bytes() for k in ("prefill", "decode")}
    r = run_cli("hicache", *args[:1], str(site["profile"]), *args[1:])
    assert r.code == 2, (r.out, r.err)
    assert r.err.startswith("dsv4ctl: error: ") and r.err.count("\n") == 1
    if msg:
        assert msg in r.err
    assert {k: site[k].read_bytes() for k in ("prefill", "decode")} == snap


def test_bad_files_exit_2(site):
    site["prefill"].write_text(site["prefill"].read_text() + "hicache-ratio: [2\n")
    r = run_cli("hicache", "off", str(site["profile"]))
    assert r.code == 2 and f"{site['prefill']}:" in r.err and "YAML syntax error" in r.err
    site["prefill"].write_text((SRC / "prefill.yaml").read_text() + "hicache-ratoi: 2\n")
    snap = site["prefill"].read_bytes()
    r = run_cli("hicache", "off", str(site["profile"]))
    assert r.code == 2 and "SGL001 unknown-key: hicache-ratoi" in r.err
    assert site["prefill"].read_bytes() == snap
    site["prefill"].unlink()
    r = run_cli("hicache", "off", str(site["profile"]))
    assert r.code == 2 and r.err.strip().endswith(f"groups[0].serve_config: no such file {site['prefill']}")


def test_ungated_tree_blocks_on_but_not_off(site, tmp_path):
    sgl = REPO / ".venv-oracle" / "lib" / "python3.11" / "site-packages" / "sglang"
    pool = sgl / "srt" / "mem_cache" / "deepseek_v4_memory_pool.py"
    if not pool.is_file():
        pytest.skip("needs the sglang 0.5.23 source in .venv-oracle")
    tree = tmp_path / "tree" / "sglang" / "srt" / "mem_cache"
    tree.mkdir(parents=True)
    wait = ("    def get_index_k_with_scale_buffer(self, layer_id: int) -> torch.Tensor:\n"
            "        self.wait_layer_transfer(layer_id)\n")
    (tree / pool.name).write_text(pool.read_text().replace(wait, wait.splitlines(keepends=True)[0]))
    r = run_cli("hicache", "off", str(site["profile"]), "--tree", str(tmp_path / "tree"))
    assert r.code == 0, r.err
    r = run_cli("hicache", "on", str(site["profile"]), "--tree", str(tmp_path / "tree"))
    assert r.code == 2 and "DSV111 index-k-ungated" in r.err
    assert b"enable-hierarchical-cache: false" in site["prefill"].read_bytes()
    r = run_cli("hicache", "on", str(site["profile"]), "--tree", str(sgl))
    assert r.code == 0, r.err


def _info(url):
    with urllib.request.urlopen(url + "/server_info", timeout=5) as r:
        return json.load(r)


def own_bootstrap_port(site) -> None:
    """Both serve configs on a free KV bootstrap port: the stand-in binds it, and the shipped 8998
    collides with another worker's stand-in."""
    boot = free_port()
    for g in ("prefill", "decode"):
        f = site[g]
        f.write_text(f.read_text().replace("disaggregation-bootstrap-port: 8998", f"disaggregation-bootstrap-port: {boot}"))


def test_status_against_running_standin_servers(site):
    p, d = site["ports"]["prefill"], site["ports"]["decode"]
    own_bootstrap_port(site)
    with standin(site["prefill"], port=p) as purl, standin(site["decode"], port=d) as durl:
        assert _info(purl)["enable_hierarchical_cache"] is True and _info(durl)["enable_hierarchical_cache"] is False
        r = run_cli("hicache", "status", str(site["profile"]), "--json")
        assert r.code == 0, r.err
        doc = r.json()
        assert doc["schema"] == "dsv4ctl.hicache-status/1"
        pre, dec = doc["groups"]
        assert pre["url"] == purl and pre["match"] is True
        assert pre["file_says"] == {"enable_hierarchical_cache": True, "hicache_ratio": 2.0,
                                    "hicache_write_policy": "write_through", "hicache_io_backend": "kernel",
                                    "hicache_mem_layout": "page_first", "hicache_storage_backend": None}
        assert pre["server_says"] == pre["file_says"]
        assert dec["file_says"]["enable_hierarchical_cache"] is False and dec["match"] is True
        # the file changes, the server is not restarted: flagged, exit 1
        assert run_cli("hicache", "off", str(site["profile"]), "-g", "prefill").code == 0
        r = run_cli("hicache", "status", str(site["profile"]))
        assert r.code == 1
        assert "DIFFERS: HiCache: file off, server on" in r.out
        assert r.err.startswith("dsv4ctl: differs: hicache status: 1 group(s) differ")
        r = run_cli("hicache", "on", str(site["profile"]), "-g", "prefill", "--ratio", "3")
        r = run_cli("hicache", "status", str(site["profile"]), "--json")
        assert r.code == 1
        assert r.json()["groups"][0]["differences"] == ["hicache-ratio: file 3.0, server 2.0"]
    # servers gone: exit 3, the table still printed
    r = run_cli("hicache", "status", str(site["profile"]), "--timeout", "2", "--json")
    assert r.code == 3 and r.err.startswith("dsv4ctl: error: hicache status: prefill")
    # issue 18: operator words, not "ClientConnectorError: ... ssl:default [Connect call failed ...]"
    assert "unreachable: cannot connect to 127.0.0.1:" in r.out and "(connection refused)" in r.out
    assert "ClientConnectorError" not in r.out + r.err and "ssl:default" not in r.out + r.err
    r = run_cli("hicache", "status", str(site["profile"]), "--no-server", "--markdown")
    assert r.code == 0 and "| prefill | prefill | b200-0 | on ratio 3.0 write_through page_first/kernel | - | not queried |" in r.out


# --- adversarial-review fixes: secrets, all-or-nothing writes, symlinks, exact bytes -------------

SECRETS = ("SUPERSECRET1", "ADMINSECRET2", "S3SECRETKEY", "PWSECRET4")


def _add_secrets(path: Path) -> None:
    """Secret keys around the enable line, so they are diff context lines."""
    on = "enable-hierarchical-cache: true\n"
    path.write_text(path.read_text().replace(on, "ssl-keyfile-password: PWSECRET4\n" + on
                    + "api-key: SUPERSECRET1\nadmin-api-key: 'ADMINSECRET2'   # rotate monthly\n"
                    + "hicache-storage-backend-extra-config: '{\"master_server_address\": \"10.0.0.5:50051\", "
                    + "\"secret_key\": \"S3SECRETKEY\"}'\n"))


@pytest.mark.parametrize("extra", [["--dry-run"], ["--dry-run", "--json"], [], ["--json"]])
def test_secrets_never_appear_in_output_but_stay_in_the_file(site, extra):
    _add_secrets(site["prefill"])
    r = run_cli("hicache", "off", str(site["profile"]), *extra)
    assert r.code == 0, r.err
    for s in SECRETS:
        assert s not in r.out and s not in r.err
    diff = r.json()["groups"][0]["diff"] if "--json" in extra else r.out
    assert " api-key: ***\n" in diff and " admin-api-key: ***\n" in diff
    assert '"master_server_address": "10.0.0.5:50051", "secret_key": "***"' in diff
    assert " ssl-keyfile-password: ***\n" in diff
    text = site["prefill"].read_text()
    assert all(s in text for s in SECRETS)       # the file keeps the real values
    assert ("enable-hierarchical-cache: false" in text) == ("--dry-run" not in extra)


def test_secret_in_a_lint_error_message_is_masked(site):
    _add_secrets(site["prefill"])
    r = run_cli("hicache", "on", str(site["profile"]), "-g", "prefill", "--mem-layout", "page_head")
    assert r.code == 2 and "DSV104" in r.err
    for s in SECRETS:
        assert s not in r.out and s not in r.err


def _two_folder_site(site, tmp_path):
    """decode.yaml moved to its own folder and given HiCache keys, so `off` must change both files."""
    d2 = tmp_path / "dec"
    d2.mkdir()
    dec = d2 / "decode.yaml"
    dec.write_text(site["decode"].read_text() + "enable-hicache: true\nhicache-ratio: 1.0\n"
                   + "# " + "x" * 6000 + "\n")
    site["decode"].unlink()
    site["profile"].write_text(site["profile"].read_text().replace("serve_config: cfg/decode.yaml",
                                                                   f"serve_config: {dec}"))
    return dec


def test_off_is_all_or_nothing_when_one_file_cannot_be_written(site, tmp_path):
    """A write that fails for the second file (here: the file-size limit makes writing decode.yaml's
    6 kB temp file fail with EFBIG, which works as root too) leaves both files untouched."""
    import os
    import resource
    import subprocess
    import sys
    dec = _two_folder_site(site, tmp_path)
    before = {p: p.read_bytes() for p in (site["prefill"], dec)}

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    p = subprocess.run([sys.executable, "-m", "dsv4ctl.cli", "hicache", "off", str(site["profile"])], cwd=REPO,
                       env=dict(os.environ, COLUMNS="200", NO_COLOR="1"), capture_output=True, text=True,
                       preexec_fn=limit, timeout=120)
    assert p.returncode == 3, (p.stdout, p.stderr)
    assert p.stderr.startswith("dsv4ctl: error: ") and p.stderr.count("\n") == 1, p.stderr
    assert "Traceback" not in p.stderr and "no file was changed" in p.stderr and "decode.yaml" in p.stderr
    assert {p_: p_.read_bytes() for p_ in before} == before
    assert sorted(x.name for x in site["prefill"].parent.iterdir()) == ["prefill.yaml"]   # no temp left
    assert sorted(x.name for x in dec.parent.iterdir()) == ["decode.yaml"]
    r = run_cli("hicache", "off", str(site["profile"]))        # without the limit both are written
    assert r.code == 0, r.err
    assert b"enable-hierarchical-cache: false" in site["prefill"].read_bytes()
    assert b"enable-hicache: false" in dec.read_bytes()


@pytest.mark.skipif(__import__("os").geteuid() == 0, reason="root ignores folder permissions")
def test_off_is_all_or_nothing_with_a_read_only_folder(site, tmp_path):
    dec = _two_folder_site(site, tmp_path)
    before = {p: p.read_bytes() for p in (site["prefill"], dec)}
    dec.parent.chmod(0o555)
    try:
        r = run_cli("hicache", "off", str(site["profile"]))
    finally:
        dec.parent.chmod(0o755)
    assert r.code == 3 and "Traceback" not in r.err and "no file was changed" in r.err
    assert {p: p.read_bytes() for p in before} == before


def test_symlinked_config_is_written_through_to_its_target(site, tmp_path):
    real = tmp_path / "real" / "prefill.yaml"
    real.parent.mkdir()
    site["prefill"].rename(real)
    real.chmod(0o640)
    site["prefill"].symlink_to(real)
    orig = real.read_bytes()
    r = run_cli("hicache", "off", str(site["profile"]), "-g", "prefill")
    assert r.code == 0, r.err
    assert site["prefill"].is_symlink() and site["prefill"].resolve() == real
    assert real.read_bytes() == orig.replace(b"enable-hierarchical-cache: true", b"enable-hierarchical-cache: false")
    assert real.stat().st_mode & 0o777 == 0o640
    assert sorted(x.name for x in real.parent.iterdir()) == ["prefill.yaml"]


def test_off_then_on_keeps_crlf_and_a_missing_final_newline_byte_for_byte(site):
    orig = (SRC / "prefill.yaml").read_bytes().replace(b"\n", b"\r\n").rstrip(b"\r\n")
    site["prefill"].write_bytes(orig)
    r = run_cli("hicache", "off", str(site["profile"]), "-g", "prefill")
    assert r.code == 0, r.err
    off = site["prefill"].read_bytes()
    assert off == orig.replace(b"enable-hierarchical-cache: true\r\n", b"enable-hierarchical-cache: false\r\n")
    assert off.count(b"\r\n") == orig.count(b"\r\n") and off.count(b"\n") == off.count(b"\r\n")
    r = run_cli("hicache", "on", str(site["profile"]), "-g", "prefill")
    assert r.code == 0, r.err
    assert site["prefill"].read_bytes() == orig


def test_alias_flag_is_refused_with_one_line_and_nothing_written(site):
    text = site["prefill"].read_text().replace("enable-hierarchical-cache: true",
                                               "x-on: &on true\nenable-hierarchical-cache: *on")
    site["prefill"].write_text(text)
    r = run_cli("hicache", "off", str(site["profile"]), "-g", "prefill")
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    assert "enable-hierarchical-cache is an alias (*on); refusing to edit it" in r.err
    assert site["prefill"].read_text() == text


@pytest.mark.parametrize("bad", ["0", "-1.5", "0.0"])
def test_on_refuses_a_file_ratio_that_is_not_positive_unless_replaced(site, bad):
    text = site["prefill"].read_text().replace("enable-hierarchical-cache: true", "enable-hierarchical-cache: false")
    text = text.replace("hicache-ratio: 2.0 ", f"hicache-ratio: {bad}".ljust(len("hicache-ratio: 2.0 ")))
    site["prefill"].write_text(text)
    r = run_cli("hicache", "on", str(site["profile"]), "-g", "prefill")
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    assert "prefill.yaml: hicache-ratio: " in r.err and "must be > 0 (host pool = ratio x device pool); pass --ratio" in r.err
    assert site["prefill"].read_text() == text
    r = run_cli("hicache", "on", str(site["profile"]), "-g", "prefill", "--ratio", "1.5")
    assert r.code == 0, r.err
    assert "enable-hierarchical-cache: true\nhicache-ratio: 1.5 " in site["prefill"].read_text()


def test_absurd_ratio_is_refused_without_a_plan_or_host_ram(site):
    # no ram_gib: the host-RAM rule cannot run, the cap still holds (before: written)
    text = site["profile"].read_text()
    assert "ram_gib:" in text
    site["profile"].write_text("\n".join(ln for ln in text.splitlines() if "ram_gib:" not in ln) + "\n")
    snap = site["prefill"].read_bytes()
    r = run_cli("hicache", "on", str(site["profile"]), "-g", "prefill", "--ratio", "1e6")
    assert r.code == 2 and r.err.count("\n") == 1 and "--ratio: hicache-ratio 1e+06 is over 100 (" in r.err, r.err
    assert site["prefill"].read_bytes() == snap
    r = run_cli("hicache", "on", str(site["profile"]), "-g", "prefill", "--ratio", "50", "--dry-run")
    assert r.code == 0, r.err       # no RAM known: 50 is not refused
    text = site["prefill"].read_text().replace("hicache-ratio: 2.0 ", "hicache-ratio: 1.0e+9 ")
    site["prefill"].write_text(text.replace("enable-hierarchical-cache: true", "enable-hierarchical-cache: false"))
    r = run_cli("hicache", "on", str(site["profile"]), "-g", "prefill")
    assert r.code == 2 and "prefill.yaml: hicache-ratio: 1e+09 is over 100 (" in r.err and r.err.strip().endswith(
        "; pass --ratio"), r.err


def test_a_held_lock_names_no_option_the_command_lacks(tmp_path):
    """``hicache --remote`` / ``config set --remote`` have no --break-lock: the held-lock error
    must not recommend it (deploy's does)."""
    from tests.test_golden import LocalWorld
    w = LocalWorld(tmp_path)
    lock = w.roots["h0"] / ".lock"
    lock.mkdir(parents=True)
    (lock / "holder.json").write_text('{"who": "ops@ctl", "what": "deploy r1", "pid": 7, "since": "2026-12-03T09:00:00Z"}')
    for argv in (["hicache", "off", str(w.profile), "-g", "prefill", "--remote"],
                 ["config", "set", str(w.profile), "kv-canary=log", "-g", "prefill", "--remote"]):
        r = run_cli(*argv, env=w.env)
        assert r.code == 3, r.err
        assert "held by ops@ctl (deploy r1, pid 7" in r.err and "try again when it is done" in r.err
        assert "--break-lock" not in r.err
    r = run_cli("deploy", str(w.profile), "--no-preflight", env=w.env)
    assert r.code == 3 and "--break-lock" in r.err
