"""`dsv4ctl diagnose` input errors and an unreachable host: one-line errors with the documented
exit codes, never a traceback (the shipped default profile's host is 127.0.0.1 without sshd)."""

import json


def test_unreachable_host_exit_3_with_the_document(cli):
    r = cli("diagnose", "dsv4-flash-8xb200-pd", "--window", "0", "--json", timeout=120)
    assert r.code == 3 and "Traceback" not in r.err
    assert r.err.startswith("dsv4ctl: error: diagnose: 1 host(s) could not be read: b200-0: cannot connect to 127.0.0.1:22")
    doc = json.loads(r.out)
    assert doc["schema"] == "dsv4ctl.diagnose/1" and doc["ok"] is False
    assert doc["hosts"]["b200-0"]["error"].startswith("b200-0: cannot connect")
    assert {g: d["findings"][0]["rule"] for g, d in doc["groups"].items()} == {"prefill": "unknown", "decode": "unknown"}
    assert doc["groups"]["prefill"]["health"] == "cannot connect to 127.0.0.1:30000 (connection refused)"


def test_bad_inputs_exit_2(cli):
    for args, msg in ((["--window", "nan"], "--window 'nan': expected a duration such as 500ms, 90s, 15m, 2h or 1d"),
                      (["--lines", "0"], "--lines 0: expected 1..100000"),
                      (["--since", "yesterday"], "--since 'yesterday': expected a duration"),
                      (["-g", "nope"], "--group 'nope': not a server group of dsv4-flash-8xb200-pd (decode, prefill)")):
        r = cli("diagnose", "dsv4-flash-8xb200-pd", *args)
        assert r.code == 2 and msg in r.err and "Traceback" not in r.err, (args, r.err)
    r = cli("diagnose", env={"DSV4CTL_PROFILE": ""})
    assert r.code == 2 and "give the profile" in r.err
