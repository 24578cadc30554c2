"""Absurd what-if topologies are input errors, not runaway allocations."""

import pytest


@pytest.mark.parametrize("item", ["tp_size=99999999999999999999", "pp_size=2000", "dp_size=0"])
def test_topology_bounds(cli, item):
    r = cli("plan", "--set", item, timeout=30)
    assert r.code == 2
    assert "must be within 1..1024" in r.err and r.err.count("\n") == 1


def test_what_if_topology_ignores_the_measured_weights(cli):
    import json
    r = cli("plan", "--json", "-g", "decode", "--set", "tp_size=2", "--set", "dp_size=2")
    g = json.loads(r.out)["groups"][0]
    # the published Flash checkpoint at TP2 (dsv4ctl/plan/weights.py): routed experts 137.06 GiB / 2,
    # attention wq_b/wo_a/wo_b, shared expert, embedding and head / 2, 1.226 GiB replicated, + 2.6 GiB
    # load overhead, instead of the TP4 measurement 43.66
    assert g["memory_inputs"]["weights_gib_per_rank"] == round(73.264 + 2.6, 3) == 75.864
    assert any("measured weights_gib_per_rank (43.66) ignored" in w for w in g["warnings"])


def test_pro_on_tp4_b200_does_not_fit_and_says_why(cli):
    r = cli("plan", "-g", "prefill", "--set", "model=deepseek-v4-pro")
    assert r.code == 1
    assert "do not fit in 177.0 GiB free per GPU" in r.err and "above 1." not in r.err


@pytest.mark.parametrize("sets,gib", [
    (["index_k_accounting=exact", "max_running_requests=4096", "mem_fraction_static=0.95"], "-7.449"),
    (["index_k_dtype=fp8", "context_length=100000000", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"], "-28.152"),
])
def test_negative_headroom_without_index_k_overshoot_does_not_fit(cli, sets, gib):
    args = ["plan", "-g", "decode"]
    for s in sets:
        args += ["--set", s]
    r = cli(*args)
    assert r.code == 1
    assert f"left after weights: headroom {gib} GiB" in r.err
    assert "fix decode: set " in r.out
