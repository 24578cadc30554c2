"""Number and timeout options of every command (dsv4ctl/commands/options.py, issue 13 "Inputs"):
finite and in range, else one line and exit 2 before anything is read or changed. In-process
(dsv4ctl.cli.main): a few ms per case."""

from __future__ import annotations

import pytest

from dsv4ctl.cli import main
from dsv4ctl.commands import options as O
from dsv4ctl.errors import InputError

NOPE = "/nonexistent/profile.yaml"     # the option check comes first: no profile is read


def run(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, err


SECONDS = "expected a duration such as 500ms, 90s, 15m, 2h or 1d"
CASES = [
    # before: accepted. (deploy/rollback/hicache --health-timeout: the release branch checks them)
    # before: a traceback (OverflowError) for inf, a query with a negative timeout for -5
    (("hicache", "status", "--timeout", "inf"), f"--timeout 'inf': {SECONDS}"),
    (("hicache", "status", "--timeout", "-5"), f"--timeout '-5': {SECONDS}"),
    (("status", NOPE, "--timeout", "nan"), f"--timeout 'nan': {SECONDS}"),
    (("status", NOPE, "--timeout", "7200"), "--timeout '7200': expected more than 0s, at most 1h"),
    (("status", NOPE, "--timeout", "2h"), "--timeout '2h': expected more than 0s, at most 1h"),
    (("logs", "decode", NOPE, "--interval", "0.01"), "--interval '0.01': expected 50ms..1h"),
    (("logs", "decode", NOPE, "-n", "0"), "-n/--lines must be in 1..100,000"),
    (("check", "smoke", "http://127.0.0.1:9", "--timeout", "1e300"), f"--timeout '1e300': {SECONDS}"),
    (("check", "load", "http://127.0.0.1:9", "--turn-timeout", "2d"), "--turn-timeout '2d': expected more than 0s, at most 1d"),
    (("diagnose", NOPE, "--window", "6m"), "--window '6m': expected 0s..5m"),
    (("audit", NOPE, "--since", "90"), "--since '90': expected a duration (15m, 2h) or an ISO time (2026-12-01T21:00:00Z) "
                                       "(a plain number needs a unit: 90s, 15m)"),
    (("check", "load", "http://127.0.0.1:9", "--answer-words", "99999999999"), "--answer-words must be in 1..100,000"),
    (("check", "load", "http://127.0.0.1:9", "--max-corruption", "nan"), "--max-corruption must be in [0, 1)"),
    (("deploy", NOPE, "--promote", "--turns", "99999999999"), "--turns must be in 1..10000"),
    (("deploy", NOPE, "--promote", "--min-requests", "-1"), "--min-requests must be in 0..10,000,000"),
    (("deploy", NOPE, "--promote", "--concurrency", "60000"), "--concurrency '60000': at most 64 levels of at most 4096 sessions"),
    (("deploy", NOPE, "--promote", "--max-corruption", "inf"), "--max-corruption must be in [0, 1)"),
    (("promote", "r1", NOPE, "--concurrency", "99999999999"), "--concurrency '99999999999': at most 64 levels of at most 4096 sessions"),
]


@pytest.mark.parametrize("args,msg", CASES, ids=[" ".join(a[:1] + a[-2:]) for a, _ in CASES])
def test_number_options_are_checked_before_anything(capsys, args, msg):
    code, err = run(capsys, *args)
    assert (code, err) == (2, f"dsv4ctl: error: {msg}\n")


def test_checker_functions():
    assert O.duration(None, "--x") is None and O.duration(5, "--x") == 5.0 == O.duration("5", "--x")
    assert O.duration(0.05, "--x", lo=0.05) == 0.05 == O.duration("50ms", "--x", lo=0.05)
    assert [O.duration(v, "--x") for v in ("500ms", "90s", "15m", "2h", "1d", "2.5", " 3 m ")] == \
        [0.5, 90.0, 900.0, 7200.0, 86400.0, 2.5, 180.0]
    assert O.duration("0", "--w", zero=True) == 0.0
    for bad in (float("nan"), float("inf"), float("-inf"), -1e-9, True, "-5", "nan", "1e3", "5 min", "1h30m", ""):
        with pytest.raises(InputError, match="expected a duration such as 500ms, 90s, 15m, 2h or 1d"):
            O.duration(bad, "--x")
    for bad in (0, "0", "0s"):
        with pytest.raises(InputError, match="expected more than 0s, at most 1d"):
            O.duration(bad, "--x")
    with pytest.raises(InputError, match=r"^--x 86401.0: expected more than 0s, at most 1d$"):
        O.duration(86401.0, "--x")
    with pytest.raises(InputError, match=r"^--x '25h': expected 1s..1d$"):
        O.duration("25h", "--x", lo=1)
    assert O.integer(1, "--n", 1, 3) == 1 and O.integer(None, "--n", 1, 3) is None
    for bad in (0, 4, True, 2.0):
        with pytest.raises(InputError, match=r"^--n must be in 1..3$"):
            O.integer(bad, "--n", 1, 3)
    assert O.fraction(0, "--f") == 0.0
    for bad in (1, 1.0, -0.1, float("nan"), float("inf")):
        with pytest.raises(InputError, match=r"^--f must be in \[0, 1\)$"):
            O.fraction(bad, "--f")
    assert O.positive(2, "--r", 10) == 2.0
    for bad in (0, -1, float("nan"), float("inf"), 11):
        with pytest.raises(InputError, match="expected a finite number > 0 and <= 10"):
            O.positive(bad, "--r", 10)
    assert O.concurrency_levels("1, 20,40") == [1, 20, 40] and O.concurrency_levels(None) is None
    for bad in ("0", "x", "", "1,,-2", "4097", ",".join(["1"] * 65)):
        with pytest.raises(InputError, match="--concurrency"):
            O.concurrency_levels(bad)


def test_a_local_write_put_back_keeps_mode_and_owner(tmp_path, monkeypatch):
    # hicache on|off writes several serve configs as one step; when a rename fails half-way the
    # files already replaced are put back. Before: put back as 0600 files of the user running
    # dsv4ctl (root), not with their mode and owner.
    import os

    from dsv4ctl.errors import DsvError
    from dsv4ctl.serve import hicache_local as H
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("a: 1\n")
    b.write_text("b: 1\n")
    os.chmod(a, 0o644)
    owner = (1234, 1234) if os.geteuid() == 0 else (os.getuid(), os.getgid())
    os.chown(a, *owner)
    real, calls = os.replace, []

    def flaky(src, dst):
        calls.append(dst)
        if len(calls) == 2:                     # the second target's rename fails
            raise OSError(5, "Input/output error", str(dst))
        return real(src, dst)
    monkeypatch.setattr(H.os, "replace", flaky)
    with pytest.raises(DsvError, match="files put back"):
        H.write_all([(a, "a: 2\n"), (b, "b: 2\n")])
    st = a.stat()
    assert a.read_text() == "a: 1\n" and b.read_text() == "b: 1\n"
    assert (oct(st.st_mode & 0o7777), (st.st_uid, st.st_gid)) == ("0o644", owner)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.yaml", "b.yaml"]     # no temp left


def test_a_local_write_keeps_mode_and_owner(tmp_path):
    import os

    from dsv4ctl.serve import hicache_local as H
    a = tmp_path / "a.yaml"
    a.write_text("a: 1\n")
    os.chmod(a, 0o640)
    owner = (1234, 4321) if os.geteuid() == 0 else (os.getuid(), os.getgid())
    os.chown(a, *owner)
    H.write_all([(a, "a: 2\n")])
    st = a.stat()
    assert (a.read_text(), oct(st.st_mode & 0o7777), (st.st_uid, st.st_gid)) == ("a: 2\n", "0o640", owner)


def test_tracebacks_of_the_issue_are_one_line(capsys, tmp_path):
    # a 5,000-character model path (ENAMETOOLONG) and a 100,000-deep JSON in a --from-log line
    long = "/tmp/" + "a" * 5000
    code, err = run(capsys, "plan", "--set", f"model={long}")
    assert code == 2 and err.startswith("dsv4ctl: error: --set model: unknown model '" + long[:60])
    assert err.endswith("... (5005 characters)': not a shipped model (deepseek-v4-flash, deepseek-v4-pro) and not a "
                        "readable path (file name too long)\n") and err.count("\n") == 1
    log = tmp_path / "deep.log"
    log.write_text('DSV4_POOL_PLAN {"a": ' + "[" * 100000 + "]" * 100000 + "}\n")
    code, err = run(capsys, "plan", "-g", "decode", "--from-log", str(log))
    assert code == 2 and err == (f"dsv4ctl: error: {log}: no 'DSV4 pool sizes' or 'DSV4_POOL_PLAN' line, nor "
                                 "SGLang's 'max_total_num_tokens=' line (SGLang 0.5.23 logs them at start-up)\n")


@pytest.mark.parametrize("field,path", [
    ("groups[0].serve_config", ("groups", 0, "serve_config")),
    ("sglang.tree", ("sglang", "tree")),
])
def test_a_path_the_system_refuses_is_a_profile_error(capsys, tmp_path, field, path):
    # found by tests/test_fuzz_inputs.py: a path field with a name over 255 bytes escaped as an
    # OSError (ENAMETOOLONG) traceback from Path.is_file()
    import shutil

    import yaml

    from tests.conftest import REPO
    src = REPO / "profiles" / "dsv4-flash-8xb200-pd.yaml"
    shutil.copytree(REPO / "profiles" / "dsv4-flash-8xb200-pd", tmp_path / "dsv4-flash-8xb200-pd")
    doc = yaml.safe_load(src.read_text())
    node = doc
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = "x" * 300 + ".yaml"
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump(doc, sort_keys=False))
    code, err = run(capsys, "plan", str(prof))
    assert code == 2 and err.startswith(f"dsv4ctl: error: {prof}:") and err.endswith(
        f": {field}: not a usable path (a name over 255 bytes)\n"), err


def test_health_timeout_is_checked_by_the_one_seconds_rule(capsys):
    # before: check_health_timeout repeated the rule with its own wording ("in (0, 86400]")
    from dsv4ctl.commands.deploy import MAX_HEALTH_TIMEOUT, check_health_timeout
    for v in (float("nan"), -5.0, float("inf"), 0, 86401.0, True):
        with pytest.raises(InputError) as want:
            O.duration(v, "--health-timeout", hi=MAX_HEALTH_TIMEOUT)
        with pytest.raises(InputError) as got:
            check_health_timeout(v)
        assert str(got.value) == str(want.value)
    assert check_health_timeout(None) is None and check_health_timeout(30) == 30.0
    code, err = run(capsys, "deploy", NOPE, "--health-timeout", "90000", "--dry-run")
    assert code == 2 and err.strip() == "dsv4ctl: error: --health-timeout '90000': expected more than 0s, at most 1d"


def test_capped_file_reads_have_one_home(tmp_path, monkeypatch):
    # before: report inputs and plan --from-log each opened, read and size-checked the file
    from dsv4ctl import resources
    from dsv4ctl.commands import planlog
    from dsv4ctl.report import inputs
    big = tmp_path / "big"
    big.write_bytes(b"x" * 2048)
    with pytest.raises(InputError, match=r"^L: larger than 0 MiB; hint$"):
        resources.read_file_capped(big, 1024, "L", "; hint")
    with pytest.raises(InputError, match=r"^L: No such file or directory$"):
        resources.read_file_capped(tmp_path / "none", 1024, "L")
    assert resources.read_file_capped(big, 2048, "L") == b"x" * 2048
    seen = []
    real = resources.read_file_capped

    def spy(path, limit, label, hint=""):
        seen.append((limit, label))
        return real(path, limit, label, hint)
    monkeypatch.setattr(resources, "read_file_capped", spy)
    with pytest.raises(InputError):
        inputs.load_input(str(big))
    with pytest.raises(InputError):
        planlog.from_log({}, str(big), False, False)
    assert seen == [(inputs.MAX_INPUT_BYTES, str(big)), (planlog.MAX_LOG_BYTES, f"--from-log {big}")]


def test_client_errors_are_worded_from_one_table():
    # before: one if/return per aiohttp exception class; now CLIENT_ERROR_TEXTS, first match wins
    import errno

    import aiohttp

    from dsv4ctl.check import driver as D
    url = "http://127.0.0.1:9/v1/models"
    reset = aiohttp.ClientOSError(errno.ECONNRESET, "Connection reset by peer")
    other = aiohttp.ClientOSError(errno.EPIPE, "Broken pipe")
    assert D.describe_client_error(reset, url) == ("connect", "127.0.0.1:9 reset the connection (GET /v1/models)")
    assert D.describe_client_error(other, url) == ("connect", "127.0.0.1:9: GET /v1/models: broken pipe")
    assert D.describe_client_error(aiohttp.ServerDisconnectedError(), url, "POST") == (
        "connect", "127.0.0.1:9 closed the connection without an HTTP answer (POST /v1/models)")
    assert D.describe_client_error(aiohttp.ClientPayloadError("Response payload is not completed"), url) == (
        "protocol", "127.0.0.1:9: GET /v1/models: broken HTTP body (Response payload is not completed)")
    assert [row[0] for row in D.CLIENT_ERROR_TEXTS][:2] == [aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError]


def test_since_takes_the_duration_spellings_and_iso_times():
    """Issue 31: ``--since`` (audit, diagnose) is a duration back from now in the one duration
    rule's spellings (500ms..1d, at most a year) or an ISO date or time, the forms any command took."""
    from datetime import datetime, timezone
    now = datetime(2026, 12, 4, 12, 0, 0, tzinfo=timezone.utc)
    assert O.since("90m", now) == O.since("1.5h", now) == datetime(2026, 12, 4, 10, 30, tzinfo=timezone.utc)
    assert O.since("500ms", now) == datetime(2026, 12, 4, 11, 59, 59, 500000, tzinfo=timezone.utc)
    for iso in ("2026-12-01", "20261201", "2026-12-01T00", "2026-12-01 00:00", "2026-12-01T00:00:00Z"):
        assert O.since(iso, now) == datetime(2026, 12, 1, tzinfo=timezone.utc), iso
    for bad, msg in (("90", "a plain number needs a unit"), ("367d", "at most a year back"), ("-1h", "expected a duration"),
                     ("yesterday", "expected a duration")):
        with pytest.raises(InputError, match=msg):
            O.since(bad, now)
