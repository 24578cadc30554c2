"""Hypothesis fuzz of what operators hand dsv4ctl (issue 13, item 7): profiles, serve configs,
playbooks and ``plan --from-log`` input. Whatever the input: no traceback (nothing but a DsvError
or a click usage error leaves ``dsv4ctl.cli.main``), the exit code is a documented one, an error is
one ``dsv4ctl: error:`` line, and on exit 2 no file was changed.

In-process against the CLI entry (``dsv4ctl.cli.main``), bounded: 40-200 examples per test (the
whole file runs in under a minute; ``DSV4CTL_FUZZ_EXAMPLES=N`` sets N for every test, for a long
hunt), no example database written, no deadline. Marker ``fuzz``: ``pytest -m fuzz`` runs only these, ``-m 'not fuzz'`` skips
them."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import shutil
import tempfile
import traceback
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsv4ctl.cli import main
from tests.conftest import REPO

pytestmark = pytest.mark.fuzz

def fuzz(examples: int):
    """Hypothesis settings: ``examples`` per test (``DSV4CTL_FUZZ_EXAMPLES`` overrides: e.g. 2000 for a
    long hunt), no deadline, no example database written into the checkout."""
    n = int(os.environ.get("DSV4CTL_FUZZ_EXAMPLES", examples))
    return settings(max_examples=n, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

PROFILE = REPO / "profiles" / "dsv4-flash-8xb200-pd.yaml"
SERVE_DIR = REPO / "profiles" / "dsv4-flash-8xb200-pd"
PLAYBOOK = REPO / "playbooks" / "bad-release.yaml"
BASE_PROFILE = yaml.safe_load(PROFILE.read_text())
BASE_PREFILL = yaml.safe_load((SERVE_DIR / "prefill.yaml").read_text())
BASE_PLAYBOOK = yaml.safe_load(PLAYBOOK.read_text())


def cli(*args: str) -> tuple[int, str, str]:
    """``dsv4ctl ARGS`` in this process: (exit code, stdout, stderr). An exception leaving main()
    is a traceback the operator would see: the test fails with it."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:             # pragma: no cover - main() returns codes
            code = e.code
        except BaseException as exc:
            frames = "".join(traceback.format_tb(exc.__traceback__)[-8:])
            pytest.fail(f"dsv4ctl {' '.join(a[:80] for a in args)}: traceback:\n{frames}"
                        f"{type(exc).__name__}: {str(exc)[:300]}")
    e = err.getvalue()
    assert "Traceback" not in e, e[-2000:]
    assert code in (0, 1, 2, 3), (code, e[-500:])
    if code != 0:
        errors = [ln for ln in e.splitlines() if ln.startswith("dsv4ctl: error:")]
        assert len(errors) <= 1, e[-2000:]
    if code == 2:
        assert e.rstrip("\n").splitlines()[-1].startswith("dsv4ctl: error: "), e[-500:]
    return code, out.getvalue(), e


# -- values an operator (or an attacker) can put anywhere in a YAML document ---------------------
LEAF = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
    st.sampled_from([0, -1, 1, 2 ** 31, 2 ** 63, 10 ** 30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=8),
    st.builds(lambda c, n: c * n, st.sampled_from(["a", "/", "é", "\x1b[31m", "../"]), st.integers(200, 6000)),
    st.sampled_from(["nan", ".inf", "-.inf", "1e400", "0x10", "4.0", "yes", "off", "~", "*", "&a", "!!python/object:os.system",
                     "/dev/zero", "/proc/self/mem", "/etc/shadow", "..", "", " ", "\x00", "deepseek-v4-pro"]),
    st.lists(st.integers(min_value=-5, max_value=20), max_size=4),
    st.dictionaries(st.text(max_size=6), st.integers(min_value=-3, max_value=3), max_size=2),
)


def leaf_paths(doc, prefix=()) -> list[tuple]:
    """Every path (keys / indices) to a leaf or a container of ``doc``."""
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += leaf_paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += leaf_paths(v, prefix + (i,))
    return out


@st.composite
def mutated(draw, base):
    """``base`` with 1..3 mutations: a value replaced, a key deleted or an unknown key added."""
    doc = copy.deepcopy(base)
    paths = leaf_paths(doc)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths))
        parent = doc
        try:
            for k in path[:-1]:
                parent = parent[k]
            kind = draw(st.sampled_from(["replace", "replace", "nudge", "nudge", "delete", "add"]))
            old = parent[path[-1]]
            if kind == "nudge" and isinstance(old, (int, float)) and not isinstance(old, bool):
                # a plausible number near the shipped one: reaches the planning, not only validation
                if isinstance(old, int):
                    parent[path[-1]] = draw(st.integers(min_value=-1, max_value=max(2 * old, 8)))
                else:
                    parent[path[-1]] = draw(st.floats(min_value=0.0, max_value=2 * old + 1))
            elif kind in ("replace", "nudge"):
                parent[path[-1]] = draw(LEAF)
            elif kind == "delete" and isinstance(parent, dict):
                parent.pop(path[-1], None)
            elif kind == "add" and isinstance(parent, dict):
                parent[draw(st.text(min_size=1, max_size=12))] = draw(LEAF)
        except (KeyError, IndexError, TypeError):
            continue        # an earlier mutation removed or retyped the path
    return doc


def dump(doc) -> str:
    return yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)


@st.composite
def text_edit(draw, text: str) -> str:
    """``text`` with a random slice replaced by random characters (broken YAML, tabs, NULs)."""
    i = draw(st.integers(0, len(text)))
    j = draw(st.integers(i, min(len(text), i + 40)))
    return text[:i] + draw(st.text(max_size=30)) + text[j:]


@contextlib.contextmanager
def workspace():
    """A copy of the shipped profile, its serve configs and series in a temp folder."""
    with tempfile.TemporaryDirectory(prefix="dsv4ctl-fuzz-") as d:
        root = Path(d)
        (root / "profiles").mkdir()
        shutil.copy(PROFILE, root / "profiles" / PROFILE.name)
        shutil.copytree(SERVE_DIR, root / "profiles" / SERVE_DIR.name)
        (root / "patches").symlink_to(REPO / "patches")
        yield root


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mode) for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def run_on(root: Path, profile: Path) -> None:
    """plan, config lint and a local hicache edit on the profile; every exit 2 leaves every file
    as it was."""
    for args in (("plan", str(profile), "--json"), ("config", "lint", str(profile)),
                 ("hicache", "off", str(profile), "-g", "prefill")):
        before = snapshot(root)
        code, out, err = cli(*args)
        if code == 2:
            assert snapshot(root) == before, (args, err)
        if args[0] == "plan" and code in (0, 1):
            doc = json.loads(out)           # a plan that ran is a JSON document with finite numbers
            assert doc["schema"] == "dsv4ctl.plan/2"
            json.dumps(doc, allow_nan=False)


@fuzz(50)
@given(mutated(BASE_PROFILE))
def test_fuzzed_profiles(doc):
    with workspace() as root:
        p = root / "profiles" / PROFILE.name
        p.write_text(dump(doc))
        run_on(root, p)


@fuzz(40)
@given(st.one_of(text_edit(PROFILE.read_text()), st.binary(max_size=200).map(lambda b: b.decode("latin-1"))))
def test_fuzzed_profile_text(text):
    with workspace() as root:
        p = root / "profiles" / PROFILE.name
        p.write_text(text, encoding="utf-8", errors="surrogateescape")
        run_on(root, p)


@fuzz(40)
@given(st.one_of(mutated(BASE_PREFILL).map(dump), text_edit((SERVE_DIR / "prefill.yaml").read_text())))
def test_fuzzed_serve_configs(text):
    with workspace() as root:
        (root / "profiles" / SERVE_DIR.name / "prefill.yaml").write_text(text, encoding="utf-8",
                                                                         errors="surrogateescape")
        run_on(root, root / "profiles" / PROFILE.name)


@fuzz(200)
@given(st.one_of(mutated(BASE_PLAYBOOK).map(dump), text_edit(PLAYBOOK.read_text())))
def test_fuzzed_playbooks(text):
    with tempfile.TemporaryDirectory(prefix="dsv4ctl-fuzz-") as d:
        p = Path(d) / "pb.yaml"
        p.write_text(text, encoding="utf-8", errors="surrogateescape")
        before = p.read_bytes()
        code, out, err = cli("runbook", "show", str(p))
        assert code in (0, 2), (code, err)
        assert p.read_bytes() == before and sorted(os.listdir(d)) == ["pb.yaml"]


POOL_KEYS = ["full_max_total_num_tokens", "swa_max_total_num_tokens", "c4_max_total_num_tokens",
             "c128_max_total_num_tokens", "c4_state_pool_size", "c128_state_pool_size"]
NUM = st.one_of(st.integers(min_value=-(2 ** 70), max_value=2 ** 70), st.floats(allow_nan=True, allow_infinity=True),
                st.text(max_size=8), st.none(), st.booleans(), st.lists(st.integers(), max_size=2))


def _json_value(v):
    """JSON text of ``v`` as a server could print it (NaN / Infinity literals allowed)."""
    return json.dumps(v, allow_nan=True)


@st.composite
def log_line(draw) -> str:
    kind = draw(st.sampled_from(["plan", "plan", "calc", "noise", "deep", "rank"]))
    rank = draw(st.sampled_from(["", "[2026-12-01 10:00:00 TP0] ", "[TP3 PP1 DP2] ", "[TP99999999999999999999] "]))
    if kind == "plan":
        doc = {k: draw(st.one_of(st.integers(min_value=0, max_value=2 ** 40), NUM)) for k in POOL_KEYS
               if draw(st.booleans()) or draw(st.booleans())}
        for k in ("available_bytes", "max_running_requests", "bytes_per_full_token"):
            if draw(st.booleans()):
                doc[k] = draw(NUM)
        body = "{" + ", ".join(f"{json.dumps(k)}: {_json_value(v)}" for k, v in doc.items()) + "}"
        return f"{rank}DSV4_POOL_PLAN {body}"
    if kind == "calc":
        parts = [f"{k}={draw(st.one_of(st.text(max_size=12), NUM.map(str)))}"
                 for k in ("unified", "bytes_per_full_token", "available_bytes", "full_token") if draw(st.booleans())]
        return f"{rank}DSV4 memory calculation: " + ", ".join(parts)
    if kind == "deep":
        n = draw(st.integers(1, 200_000))
        return f"{rank}DSV4_POOL_PLAN " + "{\"a\": " + "[" * n + "]" * n + "}"
    if kind == "rank":
        return f"{rank}DSV4 pool sizes: " + draw(st.text(max_size=60))
    return draw(st.text(max_size=120))


@fuzz(150)
@given(st.lists(log_line(), min_size=1, max_size=12), st.sampled_from(["decode", "prefill"]))
def test_fuzzed_from_log(lines, group):
    with tempfile.TemporaryDirectory(prefix="dsv4ctl-fuzz-") as d:
        log = Path(d) / "server.log"
        log.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogateescape")
        code, out, err = cli("plan", str(PROFILE), "-g", group, "--from-log", str(log))
        assert code in (0, 1, 2), (code, err)


def test_the_fuzz_can_fail():
    """The harness itself: an input that breaks main() is reported, not swallowed."""
    import dsv4ctl.cli as C
    real = C.build_app

    def broken(*a, **k):
        raise ZeroDivisionError("boom")
    C.build_app = broken
    try:
        with pytest.raises(pytest.fail.Exception, match="traceback"):
            cli("plan")
    finally:
        C.build_app = real
