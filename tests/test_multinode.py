"""Issue 25: one SGLang server over several hosts (``--nnodes``) and replicas in the profile,
planned rank by rank on every node as SGLang places them; the serve config stays the one source
of topology (nnodes included)."""

from __future__ import annotations

import ast
import json
import shutil
import types
from pathlib import Path

import pytest

from dsv4ctl.errors import InputError
from dsv4ctl.plan.plan import node_placement, placement
from dsv4ctl.profile.model import load_profile
from tests.conftest import REPO, run_cli
from tests.oracle.fixtures import forked_oracle  # noqa: F401 - the oracle's fork servers
from tests.standin.served import DEFAULT_SGLANG_SRC

PRO = REPO / "profiles" / "dsv4-pro-4xh200-pd.yaml"


def copy_pro(tmp_path, edit=None, prefill=None, decode=None) -> Path:
    """The shipped V4-Pro 2-node PD profile and its serve configs under tmp_path, edited."""
    shutil.copytree(PRO.parent / PRO.stem, tmp_path / PRO.stem, dirs_exist_ok=True)
    p = tmp_path / PRO.name
    text = PRO.read_text()
    p.write_text(edit(text) if edit else text)
    for name, fn in (("prefill", prefill), ("decode", decode)):
        if fn:
            f = tmp_path / PRO.stem / f"{name}.yaml"
            f.write_text(fn(f.read_text()))
    return p


def line_of(path: Path, needle: str) -> int:
    return next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if needle in ln)


def env(tmp_path):
    return {"DSV4CTL_CACHE": str(tmp_path / "cache"), "DSV4CTL_STATE_DIR": str(tmp_path / "state")}


# -- the profile -------------------------------------------------------------------------------------

def test_nodes_and_replicas_load_in_node_rank_order(tmp_path):
    prof = load_profile(PRO)
    pre = prof.group("prefill")
    assert (pre.host, pre.gpus, pre.nnodes, pre.replicas) == ("h200-0", list(range(8)), 2, 1)
    assert [n.host for n in pre.nodes] == ["h200-0", "h200-1"]
    assert pre.server_gpus[8] == (1, "h200-1", 0) and len(pre.server_gpus) == 16
    assert pre.stated == frozenset() and pre.dist_init_port == 5000
    p = copy_pro(tmp_path, lambda t: t.replace(
        "    nodes: [h200-2, h200-3]\n    gpus: [0, 1, 2, 3, 4, 5, 6, 7]\n",
        "    gpus: [0, 1, 2, 3, 4, 5, 6, 7]\n    replicas:\n      - h200-2\n      - {host: h200-3, gpus: [0, 1, 2, 3, 4, 5, 6, 7]}\n"))
    dec = load_profile(p).group("decode")
    assert [[(n.host, n.gpus) for n in s] for s in dec.servers] == [[("h200-2", tuple(range(8)))],
                                                                    [("h200-3", tuple(range(8)))]]
    assert (dec.replicas, dec.nnodes, dec.hosts) == (2, 1, ["h200-2", "h200-3"])
    p = copy_pro(tmp_path, lambda t: t.replace(
        "    nodes: [h200-2, h200-3]\n",
        "    replicas:\n      - nodes: [h200-2, {host: h200-3, gpus: [0, 1, 2, 3, 4, 5, 6, 7]}]\n"))
    dec = load_profile(p).group("decode")
    assert (dec.replicas, dec.nnodes, [n.host for n in dec.nodes]) == (1, 2, ["h200-2", "h200-3"])


@pytest.mark.parametrize("old, new, needle, message", [
    ("    nodes: [h200-0, h200-1]         # node-rank", "    host: h200-0\n    nodes: [h200-0, h200-1]  # node-rank",
     "    nodes: [h200-0, h200-1]", "groups[0].nodes: a group runs on one of host, nodes or replicas (got host and nodes)"),
    ("nodes: [h200-0, h200-1]", "nodes: [h200-0, h200-9]", "nodes: [h200-0, h200-9]",
     "groups[0].nodes[1]: unknown host 'h200-9' (hosts: h200-0, h200-1, h200-2, h200-3)"),
    ("nodes: [h200-0, h200-1]", "nodes: [h200-0, h200-0]", "nodes: [h200-0, h200-0]",
     "groups[0].nodes[1]: host 'h200-0' is already node 0 of this server (one node per host)"),
    ("nodes: [h200-0, h200-1]", "nodes: [h200-0, {host: h200-1, gpus: [0, 1, 2, 3]}]", "gpus: [0, 1, 2, 3]}]",
     "groups[0].nodes[1]: node 1 (h200-1): GPUs 0,1,2,3, but node 0 has 0,1,2,3,4,5,6,7: every node runs the "
     "same serve config, which puts its ranks on the same GPU indices on each node"),
    ("nodes: [h200-2, h200-3]", "nodes: [h200-2, h200-1]", "nodes: [h200-2, h200-1]",
     "groups[1].nodes[1]: node 1 (h200-1): GPU 0 of h200-1 already used by group 'prefill'"),
    ("nodes: [h200-0, h200-1]", "nodes: [h200-0, {host: h200-1, gpus: [0, 1, 2, 3, 4, 5, 6, 8]}]", "gpus: [0, 1, 2, 3, 4, 5, 6, 8]",
     "groups[0].nodes[1]: node 1 (h200-1): GPU 8 outside host h200-1's 8 GPUs"),
    ("    dist_init_port: 5000\n    serve_config: dsv4-pro-4xh200-pd/prefill.yaml",
     "    dist_init_port: 5000\n    tp: 8\n    dp: 2\n    serve_config: dsv4-pro-4xh200-pd/prefill.yaml", "    dp: 2",
     "groups[0].dp: SGLang refuses data-parallel replicas across nodes (multi-node DP is not supported): use "
     "attention DP (dp_attention: true) or replicas"),
    ("    port: 8000\n", "    port: 8000\n    nodes: [h200-1]\n", "    nodes: [h200-1]",
     "groups[2].nodes: a group runs on one of host, nodes or replicas (got host and nodes)"),
    ("    dist_init_port: 5000\n    serve_config: dsv4-pro-4xh200-pd/prefill.yaml",
     "    dist_init_port: 5000\n    tp: 8\n    serve_config: dsv4-pro-4xh200-pd/prefill.yaml", "    tp: 8",
     "groups[0].tp: tp*pp = 8 does not match the 16 GPUs of the group (2 nodes x 8)"),
    ("nodes: [h200-0, h200-1]", "nodes: [{gpus: [0]}, h200-1]", "nodes: [{gpus: [0]}, h200-1]",
     "groups[0].nodes[0]: 'host' is required"),
    ("nodes: [h200-0, h200-1]", "nodes: [{host: h200-0, gpu: 1}, h200-1]", "nodes: [{host: h200-0, gpu: 1}",
     "groups[0].nodes[0].gpu: unknown field"),
    ("nodes: [h200-0, h200-1]", "nodes: [{host: h200-0, 1: a, b: c}, h200-1]", "nodes: [{host: h200-0, 1: a",
     "groups[0].nodes[0][1]: unknown field"),
    ("nodes: [h200-0, h200-1]", "nodes: [5, h200-1]", "nodes: [5, h200-1]",
     "groups[0].nodes[0]: expected a host name or {host: NAME, gpus: [...]}, got 5"),
])
def test_bad_nodes_are_one_line_with_file_and_line(tmp_path, old, new, needle, message):
    p = copy_pro(tmp_path, lambda t: t.replace(old, new, 1))
    assert p.read_text() != PRO.read_text()
    with pytest.raises(InputError) as e:
        load_profile(p)
    got = str(e.value)
    assert got == f"{p}:{line_of(p, needle)}: {message}"
    r = run_cli("plan", str(p), env=env(tmp_path))
    assert (r.code, r.out) == (2, "") and r.err == f"dsv4ctl: error: {got}\n"


def test_a_router_cannot_span_nodes(tmp_path):
    p = copy_pro(tmp_path, lambda t: t.replace("    host: h200-0\n    port: 8000\n",
                                               "    host: h200-0\n    dist_init_port: 6000\n    port: 8000\n"))
    with pytest.raises(InputError, match=r"groups\[2\]\.dist_init_port: dist_init_port is a server group's setting"):
        load_profile(p)


# -- where SGLang puts the ranks -------------------------------------------------------------------

def _sglang_rank_ranges():
    """SGLang 0.5.23's own ``_calculate_rank_ranges`` (srt/entrypoints/engine.py), compiled from
    the wheel's source with ``get_parallel`` bound to the arguments given."""
    src = (DEFAULT_SGLANG_SRC / "srt" / "entrypoints" / "engine.py").read_text()
    fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "_calculate_rank_ranges")
    # the GPU id formula this module mirrors (engine.py, the scheduler launch loop)
    assert ("+ ((pp_rank % pp_size_per_node) * tp_size_per_node)\n"
            "                        + (tp_rank % tp_size_per_node) * get_device().gpu_id_step") in src

    def ranges(tp, pp, nnodes, node_rank):
        class P:
            pass
        par = P()
        par.tp_size, par.pp_size, par.nnodes = tp, pp, nnodes
        ns = {"get_parallel": lambda: par, "Tuple": tuple, "range": range, "max": max}
        exec(compile(ast.Module([fn], []), "engine.py", "exec"), ns)
        return ns["_calculate_rank_ranges"](node_rank)
    return ranges


@pytest.mark.skipif(not (DEFAULT_SGLANG_SRC / "srt" / "entrypoints" / "engine.py").is_file(),
                    reason="the sglang 0.5.23 source (.venv-oracle) is not installed: bash scripts/oracle-env.sh")
@pytest.mark.parametrize("tp, pp, nnodes", [(16, 1, 2), (8, 2, 2), (4, 4, 2), (8, 1, 4), (16, 2, 4),
                                            (4, 2, 4), (8, 4, 4), (32, 1, 4), (2, 8, 4), (4, 1, 1)])
@pytest.mark.parametrize("base, step", [(0, 1), (4, 1), (0, 2)])
def test_node_placement_is_sglangs_rank_ranges(tp, pp, nnodes, base, step):
    ranges = _sglang_rank_ranges()
    got = node_placement(tp, pp, 1, nnodes, base, step)
    assert len(got) == tp * pp
    want = []
    for p_rank in range(pp):
        for t_rank in range(tp):
            node = next(n for n in range(nnodes) if p_rank in ranges(tp, pp, nnodes, n)[0]
                        and t_rank in ranges(tp, pp, nnodes, n)[1])
            _, _, pp_per_node, tp_per_node = ranges(tp, pp, nnodes, node)
            want.append((node, base + (p_rank % pp_per_node) * tp_per_node + (t_rank % tp_per_node) * step))
    assert got == want
    assert sorted({n for n, _ in got}) == list(range(nnodes))          # every node has ranks


def test_node_placement_refuses_what_sglang_cannot_split():
    with pytest.raises(ValueError, match="not a multiple of nnodes 3"):
        node_placement(4, 1, 1, 3)
    with pytest.raises(ValueError, match="need pp-size a multiple of nnodes"):
        node_placement(4, 3, 1, 2)
    assert placement(4, 1, 1, base=4) == [4, 5, 6, 7] == [g for _, g in node_placement(4, 1, 1, 1, 4)]


# -- plan -----------------------------------------------------------------------------------------------

def test_plan_lists_every_rank_on_its_node(tmp_path):
    r = run_cli("plan", str(PRO), "--json", env=env(tmp_path))
    assert r.code == 0, r.err
    doc = r.json()
    pre, dec = doc["groups"]
    assert (pre["nnodes"], pre["replicas"], pre["tp"], dec["tp"], dec["dp"], dec["dp_attention"]) == (2, 1, 16, 16, 16, True)
    assert [n["host"] for n in pre["nodes"]] == ["h200-0", "h200-1"]
    assert [(x["rank"], x["node"], x["host"], x["gpu"], x["tp_rank"]) for x in pre["ranks"]] == \
        [(i, i // 8, f"h200-{i // 8}", i % 8, i) for i in range(16)]
    assert [(x["node"], x["host"], x["dp_rank"]) for x in dec["ranks"]] == \
        [(i // 8, f"h200-{2 + i // 8}", i) for i in range(16)]
    # one rank set per group: every rank has the same pools, the table shows them per host
    r = run_cli("plan", str(PRO), env=env(tmp_path))
    assert r.code == 0, r.err
    assert "prefill ranks 0-15" in r.out and "decode ranks 0-15" in r.out
    head = next(ln for ln in r.out.splitlines() if ln.startswith("| GPUs"))
    assert "h200-0: 0-7 · h200-1: 0-7" in head and "h200-2: 0-7 · h200-3: 0-7" in head
    assert "0 / 0-15" in next(ln for ln in r.out.splitlines() if ln.startswith("| pp / dp rank"))
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((REPO / "dsv4ctl" / "data" / "schemas" / "plan.schema.json").read_text())
    jsonschema.validate(doc, schema)


def test_the_serve_config_says_nnodes_and_the_profile_must_agree(tmp_path):
    p = copy_pro(tmp_path, prefill=lambda t: t.replace("nnodes: 2 ", "# nnodes: 2 "))
    pre = tmp_path / PRO.stem / "prefill.yaml"
    r = run_cli("plan", str(p), env=env(tmp_path))
    assert r.code == 2
    assert r.err == (f"dsv4ctl: error: {pre}: no nnodes: SGLang runs nnodes 1 (its default), but the profile's group "
                     f"'prefill' says 2 node(s) ({p}:{line_of(p, 'nodes: [h200-0, h200-1]')}): put nnodes: 2 in the "
                     "serve config\n")
    r = run_cli("config", "lint", str(p), "--json", env=env(tmp_path))
    hit = next(f for f in r.json()["findings"] if f["rule"] == "DSV120")
    assert (r.code, hit["group"], hit["file"]) == (2, "prefill", str(pre))
    p = copy_pro(tmp_path, prefill=lambda t: t.replace("nnodes: 2 ", "nnodes: 4 "))
    r = run_cli("plan", str(p), env=env(tmp_path))
    assert r.code == 2 and r.err == (f"dsv4ctl: error: {pre}:{line_of(pre, 'nnodes: 4')}: nnodes: 4 disagrees with "
                                     "the profile's group 'prefill' (2 node(s))\n")


def test_gpus_a_node_does_not_run_on_are_named(tmp_path):
    p = copy_pro(tmp_path, prefill=lambda t: t + "base-gpu-id: 1\n")
    pre = tmp_path / PRO.stem / "prefill.yaml"
    r = run_cli("plan", str(p), env=env(tmp_path))
    assert r.code == 2
    assert r.err == (f"dsv4ctl: error: {pre}:{line_of(pre, 'base-gpu-id')}: SGLang puts group 'prefill' node 0 "
                     "(h200-0) on GPUs 1,2,3,4,5,6,7,8 (base-gpu-id 1, gpu-id-step 1, 8 rank(s) of 16 over 2 nodes), "
                     f"but the profile lists GPUs 0,1,2,3,4,5,6,7 ({p}:{line_of(p, 'nodes: [h200-0, h200-1]')}): "
                     "set base-gpu-id: 0 in the serve config\n")


def test_dist_init_addr_must_be_node_0(tmp_path):
    p = copy_pro(tmp_path, prefill=lambda t: t + "dist-init-addr: 127.0.1.2:5000\n")
    pre = tmp_path / PRO.stem / "prefill.yaml"
    r = run_cli("config", "lint", str(p), "--json", env=env(tmp_path))
    hit = next(f for f in r.json()["findings"] if f["rule"] == "DSV120")
    assert hit["line"] == line_of(pre, "dist-init-addr:")
    assert hit["message"] == ("dist-init-addr: 127.0.1.2:5000: node 0 of group 'prefill' is host h200-0 (127.0.1.1): "
                              "the other nodes would wait for a rendezvous that never comes")
    p = copy_pro(tmp_path, prefill=lambda t: t + "dist-init-addr: 127.0.1.1:5000\n")
    assert run_cli("plan", str(p), env=env(tmp_path)).code == 0


def test_what_if_more_nodes_plans_hypothetical_gpus(tmp_path):
    r = run_cli("plan", "-g", "prefill", "--set", "tp_size=8", "--set", "nnodes=2", "--json", env=env(tmp_path))
    assert r.code in (0, 1), r.err
    g = r.json()["groups"][0]
    assert (g["tp"], len(g["ranks"])) == (8, 8)
    assert all(x["gpu"] is None and x["host"] is None for x in g["ranks"])
    assert any("--set tp_size, nnodes plans 8 rank(s) on hypothetical GPUs" in w for w in g["warnings"])
    r = run_cli("plan", "-g", "prefill", "--set", "nnodes=3", env=env(tmp_path))
    assert r.code == 2 and r.err == ("dsv4ctl: error: --set: tp-size 4 x pp-size 1 is not a multiple of nnodes 3 "
                                     "(SGLang: tp_size must be divisible by number of nodes)\n")
    r = run_cli("plan", "-g", "prefill", "--set", "nnodes=2", "--set", "dp_size=2", env=env(tmp_path))
    assert r.code == 2 and "SGLang refuses data-parallel replicas across nodes" in r.err


REPLICAS = """\
version: 1
name: replicas
model: deepseek-v4-pro
hosts:
{hosts}
groups:
  - name: decode
    role: decode
    gpus: [0, 1, 2, 3, 4, 5, 6, 7]
    replicas:
      - nodes: [h0, h1]
      - nodes: [h2, h3]
    serve_config: dsv4-pro-4xh200-pd/decode.yaml
    memory:
      free_gib_before_load: [{free}]
"""


def test_replicas_plan_the_tightest_one(tmp_path):
    shutil.copytree(PRO.parent / PRO.stem, tmp_path / PRO.stem)
    hosts = "\n".join(f"  - {{name: h{i}, address: 127.0.1.{i + 1}, gpus: {{count: 8, memory_mib: 143771}}}}"
                      for i in range(4))
    free = ["138.3"] * 16 + ["138.3"] * 13 + ["131.0"] + ["138.3"] * 2       # replica 1, rank 13: h3 GPU 5
    p = tmp_path / "replicas.yaml"
    p.write_text(REPLICAS.format(hosts=hosts, free=", ".join(free)))
    r = run_cli("plan", str(p), "--json", env=env(tmp_path))
    assert r.code in (0, 1), r.err
    g = r.json()["groups"][0]
    assert (g["replicas"], g["replica"], [n["host"] for n in g["nodes"]]) == (2, 1, ["h2", "h3"])
    assert [x["host"] for x in g["ranks"]] == ["h2"] * 8 + ["h3"] * 8
    assert g["memory_inputs"]["free_gib_before_load"] == 131.0
    assert "replica 1 of 2 planned: the one with the least free GPU memory" in " ".join(g["warnings"])
    assert "(rank 13, GPU 5 of host h3 (node 1): the tightest of the group's per-GPU memory)" in g["verdict"]["message"]
    # a list for one server only applies to every replica; a wrong length is refused at load
    p.write_text(REPLICAS.format(hosts=hosts, free=", ".join(free[:20])))
    r = run_cli("plan", str(p), env=env(tmp_path))
    assert r.code == 2 and r.err.endswith("groups[0].memory.free_gib_before_load: 20 per-GPU values for the group's "
                                          "16 (one server) or 32 (all replicas) GPUs\n")
    # a runbook's service steps act on every replica and every node of each
    p.write_text(REPLICAS.format(hosts=hosts, free=", ".join(free)))
    r = run_cli("runbook", "run", "scheduler-stall", str(p), "--dry-run", env=env(tmp_path))
    # (its rollback step's own dry run reads the hosts, which do not exist here: exit 1, "would stop")
    assert r.code == 1 and "would stop at step rollback" in r.err, r.err
    assert "h0, h1: restart decode (one server over 2 nodes): stop every node, start every node" in r.out
    assert "h2, h3: restart decode#1 (one server over 2 nodes)" in r.out


# -- facts over every node (real sshd hosts) -----------------------------------------------------------

@pytest.fixture(scope="module")
def two_gpu_hosts(tmp_path_factory):
    """Two real sshd hosts, each with a fake ``nvidia-smi`` printing rows of the real H200
    capture (tests/data/gpus/h200-query.csv); host 1's GPU 3 has 10 GiB less free."""
    from tests.sshd import harness
    why = harness.available()
    if why:
        pytest.skip(why)
    base = tmp_path_factory.mktemp("facts-2")
    c = harness.start_cluster(base / "sshd", n=2)
    h200 = (REPO / "tests" / "data" / "gpus" / "h200-query.csv").read_text().splitlines()
    for k, h in enumerate(c.hosts):
        bin_ = base / f"bin{k}"
        bin_.mkdir()
        rows = [h200[0]]
        for i in range(8):
            row = h200[1].replace("0, NVIDIA", f"{i}, NVIDIA", 1).replace("-000000000000,", f"-00000000000{i},")
            if k == 1 and i == 3:
                row = row.replace(" 0 MiB, 143156 MiB", " 10240 MiB, 132916 MiB")
            rows.append(row)
        (bin_ / "gpus.csv").write_text("\n".join(rows) + "\n")
        (bin_ / "apps.csv").write_text("gpu_uuid, pid, process_name, used_memory [MiB]\n")
        smi = bin_ / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\ncase \"$*\" in *query-gpu*) cat {bin_}/gpus.csv ;; *) cat {bin_}/apps.csv ;; esac\n")
        smi.chmod(0o755)
        h.config.write_text(h.config.read_text().replace("SetEnv SHLVL=1", f"SetEnv SHLVL=1 PATH={bin_}:/usr/bin:/bin"))
        h.kill()
        h.start()
    yield c
    c.stop()


def test_facts_reads_every_node_of_a_server(tmp_path, two_gpu_hosts):
    from dsv4ctl.plan.facts import CONTEXT_GIB
    c = two_gpu_hosts

    def hosts(text):
        for k, name in enumerate(("h200-0", "h200-1")):
            h = c.hosts[k]
            text = text.replace(f"  - name: {name}\n    address: 127.0.1.{k + 1}\n    ssh: {{user: sglang, key: ~/.ssh/id_ed25519}}\n",
                                f"  - name: {name}\n    address: {h.address}\n    ssh: {{user: {c.user}, port: {h.port}, "
                                f"key: {c.user_key}, known_hosts: {c.known_hosts}}}\n")
        return text
    p = copy_pro(tmp_path, hosts)
    assert str(c.hosts[1].port) in p.read_text()
    r = run_cli("facts", str(p), "-g", "prefill", "--json", env=env(tmp_path))
    assert r.code == 0, r.err
    g = r.json()["groups"][0]
    full, less = round(143156 / 1024 - CONTEXT_GIB, 3), round(132916 / 1024 - CONTEXT_GIB, 3)
    assert g["hosts"] == ["h200-0", "h200-1"]
    assert [(x["host"], x["gpu"]) for x in g["places"]] == [("h200-0", i) for i in range(8)] + [("h200-1", i) for i in range(8)]
    assert g["memory"]["free_gib_before_load"] == [full] * 11 + [less] + [full] * 4
    r = run_cli("facts", str(p), "-g", "prefill", env=env(tmp_path))
    assert r.code == 0, r.err
    assert "GPU 3 of h200-1: NVIDIA H200: total 143771 MiB" in r.out
    # what it measured, written and planned: the tightest rank is node 1's GPU 3
    r = run_cli("facts", str(p), "-g", "prefill", "--write", env=env(tmp_path))
    assert r.code == 0, r.err
    assert load_profile(p).group("prefill").memory.free_gib_before_load == [full] * 11 + [less] + [full] * 4
    r = run_cli("plan", str(p), "-g", "prefill", "--json", env=env(tmp_path))
    assert r.code in (0, 1), r.err
    g = r.json()["groups"][0]
    assert g["memory_inputs"]["free_gib_before_load"] == less
    assert "(rank 11, GPU 3 of host h200-1 (node 1): the tightest of the group's per-GPU memory)" in g["verdict"]["message"]


# -- the shipped V4-Pro 2-node profile, proven by SGLang's own code (oracle) -------------------------

def _pool_case(g: dict, rank: dict) -> dict:
    """The oracle pool case of one planned rank: the plan's pool inputs under SGLang's names (the
    inverse of tests/oracle/twin.py:pool_inputs) and the rank's available bytes."""
    a = g["server_args"]
    sa = {"page_size": a["page_size"], "max_running_requests": a["max_running_requests"],
          "swa_full_tokens_ratio": a["swa_full_tokens_ratio"],
          "_swa_full_tokens_ratio_explicitly_set": a["swa_ratio_explicit"],
          "chunked_prefill_size": a["chunked_prefill_size"], "dsv4_attn_backend": a["attention_backend"],
          "disaggregation_mode": a["disaggregation_mode"],
          "disaggregation_decode_extra_slots": a["disaggregation_decode_extra_slots"]}
    assert a["max_total_tokens"] is None and a["speculative_algorithm"] is None and a["index_k_dtype"] == "fp8"
    return {"id": f"{g['name']}-rank{rank['rank']}", "kind": "pool", "model": "deepseek-v4-pro",
            "available_bytes": rank["available_bytes"], "pp_size": 1, "attn_dp_size": a["attn_dp_size"],
            "index_k": "fp8", "sm100": a["sm100"], "server_args": sa, "env": {}}


@pytest.mark.oracle
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("forked_oracle")
def test_pro_two_node_plan_is_sglangs_own_numbers(tmp_path):
    from tests.conftest import ORACLE_PY
    from tests.oracle.runner import run_cases
    if not ORACLE_PY.exists():
        pytest.skip(f"SGLang 0.5.23 CPU oracle not installed ({ORACLE_PY}): bash scripts/oracle-env.sh")
    r = run_cli("plan", str(PRO), "--json", env=env(tmp_path))
    assert r.code == 0, r.err
    groups = r.json()["groups"]
    cases, resolve = [], []
    for g in groups:
        sets = {json.dumps({k: v for k, v in x.items() if k not in ("rank", "gpu", "tp_rank", "dp_rank", "node", "host")},
                           sort_keys=True) for x in g["ranks"]}
        assert len(sets) == 1, "every rank of a node-uniform server has the same pools"
        cases.append(_pool_case(g, g["ranks"][0]))
        cases.append(_pool_case(g, g["ranks"][-1]))                  # node 1
        # what SGLang resolves from the serve config the group runs (tp 16 over nnodes 2)
        from dsv4ctl.profile.serveconfig import read_serve_config
        serve = read_serve_config(PRO.parent / PRO.stem / f"{g['name']}.yaml")
        sa = {"tp_size": 16, "nnodes": 2, "disaggregation_mode": g["name"]}
        for key in ("mem-fraction-static", "max-running-requests", "attn-dp-size", "ep-size", "moe-a2a-backend"):
            if serve.get(key) is not None:
                sa[key.replace("-", "_")] = serve.get(key)
        resolve.append({"id": f"{g['name']}-resolve", "kind": "resolve", "model": "deepseek-v4-pro",
                        "gpu_memory_mib": 143771, "server_args": sa})
    out = run_cases(cases + resolve, timeout=240)
    by_id = {x["id"]: x for x in out["results"]}
    fields = ("full_max_total_num_tokens", "swa_max_total_num_tokens", "c4_max_total_num_tokens",
              "c128_max_total_num_tokens", "c4_state_pool_size", "c128_state_pool_size", "max_running_requests",
              "bytes_per_full_token")
    for g in groups:
        for rank in (g["ranks"][0], g["ranks"][-1]):
            got = by_id[f"{g['name']}-rank{rank['rank']}"]
            assert "error" not in got, got
            (stage,) = got["stages"]
            assert {f: rank[f] for f in fields} == {f: stage[f] for f in fields}, (g["name"], rank["rank"])
        res = by_id[f"{g['name']}-resolve"]
        assert "error" not in res, res
        assert g["mem_fraction_static"] == res["mem_fraction_static"], g["name"]
        assert g["server_args"]["max_running_requests"] == res["max_running_requests"], g["name"]


def _lint(tmp_path, p):
    r = run_cli("config", "lint", str(p), "--json", env=env(tmp_path))
    return r, [f["message"] for f in r.json()["findings"] if f["rule"] in ("DSV120", "DSV121")]


def test_listeners_that_share_a_port_on_a_host_are_refused(tmp_path):
    # the router beside decode's node 0, inside decode's attention-DP ZMQ ports (5001-5006 after
    # its dist-init port 5000: server_args.py PortArgs)
    p = copy_pro(tmp_path, lambda t: t.replace("    host: h200-0\n    port: 8000\n", "    host: h200-2\n    port: 5003\n"))
    r, msgs = _lint(tmp_path, p)
    assert r.code == 2
    assert msgs == ["host h200-2: group 'router' port 5003 overlaps group 'decode' attention-DP ZMQ ports 5001-5006: "
                    "the second listener fails with 'Address already in use'"]
    hit = next(f for f in r.json()["findings"] if f["rule"] == "DSV121")
    assert (hit["file"], hit["line"], hit["group"]) == (str(p), line_of(p, "port: 5003"), "router")
    # prefill has no attention DP: only its dist-init port (the torch.distributed store) is bound
    p = copy_pro(tmp_path, lambda t: t.replace("    host: h200-0\n    port: 8000\n", "    host: h200-0\n    port: 5003\n"))
    assert _lint(tmp_path, p) == (_lint(tmp_path, p)[0], [])
    p = copy_pro(tmp_path, lambda t: t.replace("    host: h200-0\n    port: 8000\n", "    host: h200-0\n    port: 5000\n"))
    assert _lint(tmp_path, p)[1] == ["host h200-0: group 'router' port 5000 overlaps group 'prefill' dist-init port "
                                     "5000: the second listener fails with 'Address already in use'"]
    # near 65535 SGLang puts the ZMQ ports below the dist-init port (port_base = port - 7)
    p = copy_pro(tmp_path, lambda t: t.replace("    nodes: [h200-2, h200-3]\n    gpus: [0, 1, 2, 3, 4, 5, 6, 7]\n"
                                               "    dist_init_port: 5000\n",
                                               "    nodes: [h200-2, h200-3]\n    gpus: [0, 1, 2, 3, 4, 5, 6, 7]\n"
                                               "    dist_init_port: 65535\n")
                 .replace("    host: h200-0\n    port: 8000\n", "    host: h200-2\n    port: 65530\n"))
    assert _lint(tmp_path, p)[1] == ["host h200-2: group 'router' port 65530 overlaps group 'decode' attention-DP ZMQ "
                                     "ports 65528-65533: the second listener fails with 'Address already in use'"]


def test_replicas_on_one_host_clash_and_one_node_attention_dp_ports(tmp_path):
    hosts = "\n".join(f"  - {{name: h{i}, address: 127.0.1.{i + 1}, gpus: {{count: 8, memory_mib: 143771}}}}"
                      for i in range(2))
    cfg = tmp_path / "d.yaml"
    cfg.write_text("tp-size: 4\nattn-dp-size: 4\nport: 30000\ndisaggregation-mode: decode\n"
                   "tool-call-parser: deepseekv4\nreasoning-parser: deepseek-v4\n")
    p = tmp_path / "r.yaml"
    p.write_text(f"version: 1\nname: r\nmodel: deepseek-v4-pro\nhosts:\n{hosts}\ngroups:\n  - name: decode\n"
                 "    role: decode\n    gpus: [0, 1, 2, 3]\n    replicas: [h0, h1]\n    serve_config: d.yaml\n"
                 "  - name: router\n    role: router\n    host: h0\n    port: 30233\n    decode: [decode]\n")
    r, msgs = _lint(tmp_path, p)
    # one-node attention DP opens its ports from the HTTP port + 233 (ZMQ_TCP_PORT_DELTA)
    assert msgs == ["host h0: group 'router' port 30233 overlaps group 'decode' dist-init port 30233: the second "
                    "listener fails with 'Address already in use'"], r.out
    p.write_text(p.read_text().replace("replicas: [h0, h1]", "replicas: [{host: h0}, {host: h0}]")
                 .replace("    port: 30233\n", "    port: 8000\n"))
    r = run_cli("plan", str(p), env=env(tmp_path))
    assert r.code == 2 and "GPU 0 of h0 already used by group 'decode' replica 0" in r.err


def test_a_dist_init_addr_sglang_cannot_parse_is_refused(tmp_path):
    pre = tmp_path / PRO.stem / "prefill.yaml"
    for value, why in (("127.0.1.1", "missing port (host:port expected) in '127.0.1.1'"),
                       ("fd00::1:5000", "a bare IPv6 address is ambiguous: 'fd00::1:5000' (write [fd00::1]:5000)"),
                       ("127.0.1.1:abc", "port 'abc' is not a port number (1..65535)")):
        p = copy_pro(tmp_path, prefill=lambda t: t + f"dist-init-addr: \"{value}\"\n")
        r = run_cli("plan", str(p), env=env(tmp_path))
        assert r.code == 2 and r.err == (f"dsv4ctl: error: {pre}:{line_of(pre, 'dist-init-addr:')}: dist-init-addr: "
                                         f"{value}: SGLang cannot parse it ({why})\n"), r.err
    # an abbreviation is read as SGLang's argparse reads it, and node 0's profile name is fine
    p = copy_pro(tmp_path, prefill=lambda t: t + "dist-init: 127.0.1.2:5000\n")
    assert "node 0 of group 'prefill' is host h200-0" in run_cli("plan", str(p), env=env(tmp_path)).err
    p = copy_pro(tmp_path, prefill=lambda t: t + "dist-init-addr: h200-0:5000\n")
    assert run_cli("plan", str(p), env=env(tmp_path)).code == 0


def test_replica_shapes_and_machines_are_checked_at_load(tmp_path):
    for edit, message in (
            (lambda t: t.replace("    nodes: [h200-0, h200-1]         # node-rank = position: h200-0 is node 0 (HTTP, dist-init)\n",
                                 "    replicas: [{nodes: [h200-0, h200-1]}, h200-2]\n"),
             "replica 1 has 1 node(s), replica 0 has 2: replicas run one serve config, so they have one shape"),
            (lambda t: t.replace("  - name: h200-1\n    address: 127.0.1.2\n", "  - name: h200-1\n    address: 127.0.1.1\n"),
             "node 1 (h200-1): host h200-1 is the same machine as another node of this server (address 127.0.1.1): "
             "one node per machine"),
            (lambda t: t.replace("    memory_mib: 143771}\n", "    memory_mib: 143771}\n") +
             "", None)):
        p = copy_pro(tmp_path, edit)
        if message is None:
            continue
        with pytest.raises(InputError) as e:
            load_profile(p)
        assert str(e.value).endswith(message), str(e.value)


def test_no_serve_config_plans_the_profiles_topology_only_if_sglang_could_run_it(tmp_path):
    p = copy_pro(tmp_path, lambda t: t.replace("    dist_init_port: 5000\n    serve_config: dsv4-pro-4xh200-pd/prefill.yaml\n",
                                               "    dist_init_port: 5000\n"))
    with pytest.raises(InputError, match=r"tp\*pp = 1 does not match the 16 GPUs of the group \(2 nodes x 8\)"):
        load_profile(p)
    p.write_text(p.read_text().replace("    dist_init_port: 5000\n", "    dist_init_port: 5000\n    tp: 16\n", 1))
    assert run_cli("plan", str(p), "-g", "prefill", env=env(tmp_path)).code in (0, 1)


def test_mixed_per_gpu_list_lengths_are_refused(tmp_path):
    p = copy_pro(tmp_path, lambda t: t.replace(
        "    serve_config: dsv4-pro-4xh200-pd/prefill.yaml\n",
        "    serve_config: dsv4-pro-4xh200-pd/prefill.yaml\n    memory:\n"
        f"      free_gib_before_load: [{', '.join(['138.0'] * 16)}]\n"
        f"      other_gib: [{', '.join(['0.0'] * 15 + ['5.0'])}]\n", 1))
    load_profile(p)          # the same length: fine
    p.write_text(p.read_text().replace("      other_gib: [", "      other_gib: [9.0, "))
    p.write_text(p.read_text().replace("      free_gib_before_load: [", "      free_gib_before_load: [").replace(
        "      other_gib: [9.0, ", "      other_gib: [9.0, "))
    with pytest.raises(InputError, match=r"17 per-GPU values for the group's 16 GPUs"):
        load_profile(p)


def test_a_replica_sglang_would_refuse_is_the_one_planned(tmp_path):
    shutil.copytree(PRO.parent / PRO.stem, tmp_path / PRO.stem)
    hosts = "\n".join(f"  - {{name: h{i}, address: 127.0.1.{i + 1}, gpus: {{count: 8, memory_mib: 143771}}}}"
                      for i in range(4))
    # replica 0 has one GPU at 120 GiB beside 138 (below 0.9x: SGLang refuses); replica 1 is all 115
    free = ["138.0"] * 15 + ["120.0"] + ["115.0"] * 16
    p = tmp_path / "replicas.yaml"
    p.write_text(REPLICAS.format(hosts=hosts, free=", ".join(free)))
    r = run_cli("plan", str(p), "--json", env=env(tmp_path))
    assert r.code == 1, r.err
    g = r.json()["groups"][0]
    assert g["replica"] == 0 and "unbalanced" in g["verdict"]["message"].lower() + " ".join(g["errors"]).lower()


def test_facts_judges_balance_per_replica():
    from dsv4ctl.hosts.gpus import Gpu
    from dsv4ctl.plan.facts import server_facts

    def rows(free_mib):
        return [Gpu(index=i, name="NVIDIA H200", uuid=f"GPU-{i}", total_mib=143771, used_mib=143771 - free_mib,
                    free_mib=free_mib, processes=[]) for i in range(8)]
    places = [("a", i) for i in range(8)] + [("b", i) for i in range(8)]
    f = server_facts("decode", places, {"a": rows(143000), "b": rows(120000)}, tp=8, server_size=8)
    assert not [n for n in f.notes if n.startswith("unbalanced")]          # each replica is balanced
    f = server_facts("decode", places, {"a": rows(143000), "b": rows(120000)}, tp=16)
    assert [n.split(":")[0] for n in f.notes] == ["unbalanced"]              # one 16-GPU server is not


def test_check_targets_every_replica_at_its_node_0(tmp_path):
    from dsv4ctl.check.targets import from_profile
    from dsv4ctl.profile.deployment import load_deployment
    shutil.copytree(PRO.parent / PRO.stem, tmp_path / PRO.stem)
    hosts = "\n".join(f"  - {{name: h{i}, address: 127.0.1.{i + 1}, gpus: {{count: 8, memory_mib: 143771}}}}"
                      for i in range(4))
    p = tmp_path / "replicas.yaml"
    p.write_text(REPLICAS.format(hosts=hosts, free=", ".join(["138.0"] * 32)))
    t = from_profile(load_deployment(p))
    assert [(w.name, w.url) for w in t.workers] == [("decode", "http://127.0.1.1:30001"),
                                                    ("decode#1", "http://127.0.1.3:30001")]


def test_a_runbook_restarts_a_multi_node_server_whole(tmp_path):
    r = run_cli("runbook", "run", "transfer-wedge", str(PRO), "--dry-run", env=env(tmp_path))
    assert r.code == 0, r.err
    assert ("restart_decode   service.restart  only if drain.ran == true | h200-2, h200-3: restart decode (one "
            "server over 2 nodes): stop every node, start every node from the active release (its own "
            "--node-rank), wait for node 0's /health, audit") in r.out


# -- launch (issue 25 item 4): what each node runs, the gate, the canary --------------------------------

def _pro_site(tmp_path, edit=None):
    from dsv4ctl.deploy.site import Options, Site
    from dsv4ctl.hosts.layout import Paths
    from dsv4ctl.profile.deployment import load_deployment
    dep = load_deployment(copy_pro(tmp_path, edit))
    site = Site(dep, Options())
    for name in dep.hosts:
        site.paths[name] = Paths(dep.host_root(name))
        site.python[name] = "python3"
        # the run's hosts are its transports' (a limited deploy has fewer: the gate keeps to them);
        # these builders only read the names, nothing connects
        site.transports[name] = types.SimpleNamespace(name=name, close=lambda: None)
    return dep, site


def test_each_node_gets_its_rank_and_node_0s_dist_init_address(tmp_path):
    from dsv4ctl.deploy.release import launch_spec
    from dsv4ctl.deploy.site import NodeOf, host_groups, node_of, start_command
    dep, site = _pro_site(tmp_path)
    spec = launch_spec(dep)
    assert spec["prefill"]["servers"] == [["h200-0", "h200-1"]] and spec["prefill"]["dist_init_port"] == 5000
    assert spec["decode"]["servers"] == [["h200-2", "h200-3"]]
    assert "servers" not in spec["router"]
    assert [host_groups(spec, h) for h in ("h200-0", "h200-1", "h200-2", "h200-3")] == \
        [["prefill", "router"], ["prefill"], ["decode"], ["decode"]]
    assert node_of(spec["decode"], "h200-3") == NodeOf(replica=0, rank=1, nnodes=2, node0="h200-2")
    addr = {h: dep.hosts[h].address for h in dep.hosts}
    for host, rank in (("h200-0", 0), ("h200-1", 1)):
        cmd = start_command(site, host, "r1", "prefill", spec["prefill"])
        assert cmd.endswith(f"--config /srv/dsv4ctl/releases/r1/configs/prefill.yaml --port 30000 "
                            f"--nnodes 2 --node-rank {rank} --dist-init-addr {addr['h200-0']}:5000"), cmd
    # a template that places {node_args} gets them there, not again at the end
    spec["decode"]["cmd"] = "run-node {node_args} --config {config}"
    assert start_command(site, "h200-3", "r1", "decode", spec["decode"]) == \
        f"run-node --nnodes 2 --node-rank 1 --dist-init-addr {addr['h200-2']}:5000 " \
        "--config /srv/dsv4ctl/releases/r1/configs/decode.yaml"
    # the router reaches each server at its node 0 only
    args = spec["router"]["router_args"]
    assert args[:7] == ["--pd-disaggregation", "--prefill", f"http://{addr['h200-0']}:30000", "8998",
                        "--decode", f"http://{addr['h200-2']}:30001", "--prometheus-host"][:7]
    assert not any(addr["h200-1"] in a or addr["h200-3"] in a for a in args)


def test_one_host_groups_keep_their_launch_spec():
    """No ``servers`` key for a one-host group: its launch.json, hence its release id, is the same
    as before multi-node servers existed."""
    from dsv4ctl.deploy.release import launch_spec
    from dsv4ctl.profile.deployment import load_deployment
    from tests.conftest import DEFAULT_PROFILE
    spec = launch_spec(load_deployment(DEFAULT_PROFILE))
    assert all(set(s) <= {"role", "host", "port", "cmd", "env", "model", "router_args"} for s in spec.values())


def test_replicas_each_register_with_the_router_and_are_gated(tmp_path):
    from dsv4ctl.deploy.release import launch_spec
    from dsv4ctl.deploy.steps import gate_steps
    dep, site = _pro_site(tmp_path, lambda t: t.replace(
        "    nodes: [h200-2, h200-3]\n", "    replicas: [h200-2, h200-3]\n"))
    spec = launch_spec(dep)
    addr = {h: dep.hosts[h].address for h in dep.hosts}
    assert spec["decode"]["servers"] == [["h200-2"], ["h200-3"]] and "dist_init_port" not in spec["decode"]
    words = spec["router"]["router_args"]
    assert [words[i + 1] for i, w in enumerate(words) if w == "--decode"] == \
        [f"http://{addr['h200-2']}:30001", f"http://{addr['h200-3']}:30001"]
    steps = gate_steps(site, spec)
    health = [(s.host, s.extra["group"], s.extra["nodes"]) for s in steps if s.extra["kind"] == "health"]
    assert health == [("h200-0", "prefill", ["h200-1"]), ("h200-2", "decode", []), ("h200-3", "decode", [])]
    assert [s.host for s in steps if s.extra["kind"] == "chat"] == ["h200-0"]          # the router


def test_the_canary_takes_whole_servers(tmp_path):
    from dsv4ctl.deploy.promote import choose_canary
    dep, _ = _pro_site(tmp_path)
    assert choose_canary(dep) == ["h200-2", "h200-3"]                 # decode's node 0 brings node 1
    assert choose_canary(dep, "h200-1") == ["h200-1", "h200-0"]
    assert choose_canary(dep, "prefill") == ["h200-0", "h200-1"]
