"""Golden tests: pin the current JSON output (and exit code, and stderr) of the CLI so that a
refactor that moves modules around cannot change behaviour unnoticed.

Each test runs ``dsv4ctl.cli.main(argv)`` in-process (stdout/stderr captured, cwd and env
pinned), normalises the volatile values with the explicit :class:`Normaliser` below, and
compares the result with ``tests/data/golden/NAME.json``: ``{"argv", "exit_code", "stdout",
"stderr"}`` where ``stdout`` is the parsed ``--json`` document (``null`` when the command
printed nothing) and ``stderr`` its lines.

Covered: ``plan --json`` (default profile, a ``--set`` what-if that does not fit, one that does),
``config lint --json``, ``hicache on|off --dry-run --json`` on a temporary copy of the shipped
profile, and ``deploy [--promote] --dry-run --json`` / ``rollback --dry-run --json`` /
``promote ID --dry-run --json`` / ``releases --json`` on a fixture profile of three
``local: true`` hosts whose roots live under a temporary folder (two real deploys first: the
launcher starts ``tests.sshd.standin_sglang`` stand-ins, killed again by their pid files; the
second deploy waits for the next wall-clock second so the two releases never tie in time).

What is normalised (and nothing else):

* paths: the repository -> ``<REPO>``, the test's temporary folder -> ``<TMP>`` (also in the
  form with the leading ``/`` stripped), ``sys.executable`` -> ``<PYTHON>``;
* ports picked at random for the stand-ins -> ``<PORT:group>``;
* release ids (they hash a fresh git commit, the ports and the paths) -> ``<RELEASE:name>``
  (named by the test), any other ``r`` + 12 hex -> ``<RELEASE:?>``; 40-hex commits ->
  ``<COMMIT>``, 64-hex digests -> ``<SHA256>``;
* ISO-8601 UTC timestamps -> ``<TIME>``, evidence stamps -> ``<STAMP>``;
* in log lines: ``N,NNN bytes sent`` -> ``<BYTES> bytes sent``, ``in 0.2 s`` -> ``in <SECONDS> s``,
  the fixture tree's commit (also its 12-hex short form) -> ``<COMMIT>``;
* by JSON key: durations (``seconds``, ``*_seconds``) -> ``<SECONDS>``, byte counts that
  depend on path lengths (``bytes``, ``bytes_sent``, ``bytes_received``, ``total_size``) ->
  ``<BYTES>``, ``pid`` -> ``<PID>``, ``who``/``*_by`` (``user@machine``) -> ``<WHO>``.

Regenerate the goldens (after an intended behaviour change; review the diff!)::

    DSV4CTL_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_golden.py -q

With ``DSV4CTL_UPDATE_GOLDEN=1`` the files are written instead of compared (exit codes are
still asserted)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, loopback, worker_index
from tests.sshd.world import git, make_patch, make_tree

GOLDEN = Path(__file__).resolve().parent / "data" / "golden"
UPDATE = os.environ.get("DSV4CTL_UPDATE_GOLDEN") == "1"
PROFILE = "dsv4-flash-8xb200-pd"


# -- running the CLI in-process ----------------------------------------------------------------

@dataclass
class Run:
    argv: list[str]
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out) if self.out.strip() else None


@contextlib.contextmanager
def _env(overrides: dict[str, str]):
    old = {k: os.environ.get(k) for k in overrides}
    os.environ.update(overrides)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(*argv: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> Run:
    """``dsv4ctl ARGV`` through :func:`dsv4ctl.cli.main` in this process, with ``cwd`` and
    ``env`` set for the call only (deploy/rollback install a SIGTERM handler: put back)."""
    from dsv4ctl.cli import main
    out, err = io.StringIO(), io.StringIO()
    term = signal.getsignal(signal.SIGTERM)
    here = os.getcwd()
    try:
        os.chdir(cwd)
        with _env({"COLUMNS": "200", "NO_COLOR": "1", **(env or {})}), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(argv))
    finally:
        os.chdir(here)
        signal.signal(signal.SIGTERM, term)
    return Run(list(argv), code, out.getvalue(), err.getvalue())


# -- normalising -------------------------------------------------------------------------------

TIME_RE = re.compile(r"\b\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})\b")
STAMP_RE = re.compile(r"\b\d{8}T\d{6}Z\b")
SHA256_RE = re.compile(r"\b[0-9a-f]{64}\b")
COMMIT_RE = re.compile(r"\b[0-9a-f]{40}\b")
RELEASE_RE = re.compile(r"\br[0-9a-f]{12}\b")
DURATION_KEYS = re.compile(r"^(seconds|.*_seconds|duration_s)$")
BYTES_KEYS = {"bytes", "bytes_sent", "bytes_received", "total_size"}
WHO_KEYS = re.compile(r"^(who|.*_by)$")
#: In log lines (stderr): rsync byte counts (they depend on path lengths) and durations.
TEXT_RULES = [(re.compile(r"\b\d[\d,]* bytes sent"), "<BYTES> bytes sent"),
              (re.compile(r"\bin \d+(?:\.\d+)? s\b"), "in <SECONDS> s"),
              # inside the exact commands of a dry run (lock holder, audit record JSON)
              (re.compile(r'"who":"[^"]*"'), '"who":"<WHO>"'),
              (re.compile(r'"pid":\d+'), '"pid":<PID>'),
              # where the lock holder's pid runs (this machine: dsv4ctl.hosts.lock.machine_identity)
              (re.compile(r'"(hostname|machine|boot|pidns|pid_start)":(?:"[^"]*"|null)'), r'"\1":"<MACHINE>"')]


class Normaliser:
    """Literal replacements (longest first), then the regexes above, on every string (keys
    too); key-based replacement of values whose key says they are volatile."""

    def __init__(self, tmp: Path | None = None):
        self.literals: dict[str, str] = {str(REPO): "<REPO>", sys.executable: "<PYTHON>"}
        if worker_index():         # golden files name the addresses of a run without xdist
            self.literals.update({loopback(n): f"127.0.0.{n}" for n in (2, 3, 4)})
        if tmp is not None:
            t = str(tmp)
            self.literals[t] = "<TMP>"
            self.literals[t.lstrip("/")] = "<TMP>"     # hicache diff headers strip the leading "/"
        self.ports: dict[int, str] = {}

    def literal(self, text: str, placeholder: str) -> "Normaliser":
        self.literals[text] = placeholder
        return self

    def release(self, rid: str, name: str) -> "Normaliser":
        return self.literal(rid, f"<RELEASE:{name}>")

    def port(self, port: int, name: str) -> "Normaliser":
        self.ports[port] = f"<PORT:{name}>"
        return self

    def text(self, s: str) -> str:
        for k in sorted(self.literals, key=len, reverse=True):
            s = s.replace(k, self.literals[k])
        for rx, sub in TEXT_RULES:
            s = rx.sub(sub, s)
        s = TIME_RE.sub("<TIME>", s)
        s = STAMP_RE.sub("<STAMP>", s)
        s = SHA256_RE.sub("<SHA256>", s)
        s = COMMIT_RE.sub("<COMMIT>", s)
        s = RELEASE_RE.sub("<RELEASE:?>", s)
        for p, name in self.ports.items():      # last: never inside a hash, id or timestamp
            s = re.sub(rf"(?<![\w.]){p}(?!\d)", name, s)
        return s

    def doc(self, x, key: str = ""):
        if isinstance(x, dict):
            return {self.text(str(k)): self.doc(v, str(k)) for k, v in x.items()}
        if isinstance(x, list):
            return [self.doc(v, key) for v in x]
        if x is None or isinstance(x, bool):
            return x
        if DURATION_KEYS.match(key) and isinstance(x, (int, float)):
            return "<SECONDS>"
        if key in BYTES_KEYS and isinstance(x, int):
            return "<BYTES>"
        if key == "pid":
            return "<PID>"
        if key in ("hostname", "machine", "boot", "pidns", "pid_start"):
            return "<MACHINE>"
        if WHO_KEYS.match(key) and isinstance(x, str):
            return "<WHO>"
        if isinstance(x, int) and x in self.ports:
            return self.ports[x]
        if isinstance(x, str):
            return self.text(x)
        return x


def golden(name: str, r: Run, norm: Normaliser, code: int) -> dict:
    """Assert the exit code, then compare (or with DSV4CTL_UPDATE_GOLDEN=1 write) the golden."""
    assert r.code == code, f"exit {r.code} (expected {code}); stderr:\n{r.err}\nstdout:\n{r.out[:2000]}"
    actual = {"argv": [norm.text(a) for a in r.argv], "exit_code": r.code,
              "stdout": norm.doc(r.json()), "stderr": [norm.text(ln) for ln in r.err.splitlines()]}
    text = json.dumps(actual, indent=2, ensure_ascii=False) + "\n"
    path = GOLDEN / f"{name}.json"
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return actual
    assert path.exists(), f"{path} missing: run with DSV4CTL_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), f"{name}: output differs from {path}"
    return actual


@pytest.fixture(scope="session")
def cache_env(tmp_path_factory) -> dict[str, str]:
    """Keep dsv4ctl's caches (profile validation, releases) out of the user's ~/.cache."""
    d = tmp_path_factory.mktemp("golden-cache")
    return {"DSV4CTL_STATE_DIR": str(d / "state"), "DSV4CTL_CACHE": str(d / "cache")}


# -- 1. plan / 2. config lint on the embedded default profile -----------------------------------

def test_plan_default(cache_env):
    golden("plan_default", run("plan", "--json", env=cache_env), Normaliser(), 0)


def test_plan_set_does_not_fit(cache_env):
    r = run("plan", "--json", "--set", "mem_fraction_static=0.95", "-g", "decode", env=cache_env)
    golden("plan_set_mem_fraction_decode", r, Normaliser(), 1)


def test_plan_set_exact_accounting(cache_env):
    r = run("plan", "--json", "--set", "index_k_accounting=exact", "--set", "max_running_requests=128",
            env=cache_env)
    golden("plan_set_exact_accounting", r, Normaliser(), 0)


def test_config_lint_default(cache_env):
    golden("config_lint_default", run("config", "lint", "--json", env=cache_env), Normaliser(), 0)


# -- 3. hicache on / off --dry-run on a copy of the shipped profile -----------------------------

@pytest.fixture
def profile_copy(tmp_path) -> Path:
    """``<tmp>/profiles/{PROFILE}.yaml`` + folder and ``<tmp>/patches/`` (the profile's series is
    ``../patches/sglang-0.5.23``): the repository's layout, nothing in the repository touched."""
    (tmp_path / "profiles").mkdir()
    shutil.copy2(REPO / "profiles" / f"{PROFILE}.yaml", tmp_path / "profiles")
    shutil.copytree(REPO / "profiles" / PROFILE, tmp_path / "profiles" / PROFILE)
    shutil.copytree(REPO / "patches", tmp_path / "patches")
    return tmp_path


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("action,group,code", [("off", "prefill", 0), ("on", "prefill", 0), ("off", "decode", 0),
                                               ("on", "decode", 2)])
def test_hicache_dry_run(profile_copy, cache_env, action, group, code):
    """Run from the copy's root with the profile given relatively, as the README does."""
    before = _tree_bytes(profile_copy)
    r = run("hicache", action, f"profiles/{PROFILE}.yaml", "-g", group, "--dry-run", "--json",
            cwd=profile_copy, env=cache_env)
    golden(f"hicache_{action}_{group}_dry_run", r, Normaliser(profile_copy), code)
    assert _tree_bytes(profile_copy) == before


def test_hicache_on_dry_run_after_off(profile_copy, cache_env):
    """``on`` of a prefill config that ``off`` really wrote (the shipped one is already on)."""
    r = run("hicache", "off", f"profiles/{PROFILE}.yaml", "-g", "prefill", cwd=profile_copy, env=cache_env)
    assert r.code == 0, r.err
    before = _tree_bytes(profile_copy)
    r = run("hicache", "on", f"profiles/{PROFILE}.yaml", "-g", "prefill", "--dry-run", "--json",
            cwd=profile_copy, env=cache_env)
    golden("hicache_on_prefill_dry_run_after_off", r, Normaliser(profile_copy), 0)
    assert _tree_bytes(profile_copy) == before


# -- 4. deploy / rollback / promote / releases on local hosts -----------------------------------

STANDIN = f"env PYTHONPATH={REPO} {{python}} -m tests.sshd.standin_sglang"
SERVE = {"model-path": "deepseek-ai/DeepSeek-V4-Flash", "served-model-name": "deepseek-v4-flash",
         "host": "0.0.0.0", "tp-size": 8, "reasoning-parser": "deepseek-v4", "tool-call-parser": "deepseekv4"}
# this xdist worker's loopback addresses (127.0.W.n; 127.0.0.n without xdist): servers that two
# workers start at once never share an address, so fixed ports (the PD bootstrap port) cannot clash
ADDRESSES = (loopback(2), loopback(3), loopback(4))


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address if ":" not in address else "127.0.0.1", 0))   # IPv6: dry runs only
        return s.getsockname()[1]


def second_patch(tree: Path, out: Path) -> Path:
    """A patch changing another file of the tree than :func:`make_patch`'s."""
    f = tree / "python" / "sglang" / "srt" / "mod001.py"
    old = f.read_text()
    f.write_text(old + "y = 2\n")
    out.write_text(git(tree, "diff"))
    f.write_text(old)
    return out


class LocalWorld:
    """A PD profile on three ``local: true`` hosts h0 (prefill), h1 (decode), h2 (router), each
    with its root under ``tmp/roots/``; launch commands start the tests/sshd stand-in."""

    def __init__(self, tmp: Path, addresses=ADDRESSES, keep: int = 2, standin_router: bool = True):
        self.tmp = tmp
        self.addresses = addresses
        self.tree = make_tree(tmp / "sglang", files=8)
        self.patch1 = make_patch(self.tree, tmp / "0001-index-k.patch")
        self.patch2 = second_patch(self.tree, tmp / "0002-mod001.patch")
        self.cfgdir = tmp / "profile"
        self.cfgdir.mkdir()
        self.roots = {f"h{i}": tmp / "roots" / f"h{i}" for i in range(3)}
        self.ports = {"prefill": free_port(addresses[0]), "decode": free_port(addresses[1]),
                      "router": free_port(addresses[2])}
        for g in ("prefill", "decode"):
            cfg = dict(SERVE, port=self.ports[g], **{"disaggregation-mode": g, "disaggregation-bootstrap-port": 8998})
            (self.cfgdir / f"{g}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        decode_url = f"http://{addresses[1]}:{self.ports['decode']}"
        self.prof = {
            "version": 1, "name": "golden-local", "model": "deepseek-v4-flash",
            "sglang": {"version": "0.5.23", "tree": str(self.tree), "base_ref": "v0.5.23", "series": None},
            "deploy": {"root": "/srv/dsv4ctl", "keep_releases": keep, "service": "launcher", "health_timeout_s": 30,
                       "python": sys.executable,
                       "launch": {"server": STANDIN + " --config {config} --host {address} --port {port}",
                                  "router": STANDIN + " --host {address} --port {port} --router " + decode_url}},
            "check": {"concurrency": 40, "max_corruption": 0.01, "turns": 2},
            "hosts": [{"name": h, "address": addresses[i], "local": True, "root": str(self.roots[h]),
                       "gpus": {"model": "stand-in", "count": 8, "memory_mib": 183359}, "ram_gib": 2048}
                      for i, h in enumerate(self.roots)],
            "groups": [
                {"name": "prefill", "role": "prefill", "host": "h0", "gpus": list(range(8)), "tp": 8,
                 "serve_config": "prefill.yaml"},
                {"name": "decode", "role": "decode", "host": "h1", "gpus": list(range(8)), "tp": 8,
                 "serve_config": "decode.yaml"},
                {"name": "router", "role": "router", "host": "h2", "port": self.ports["router"],
                 "prefill": ["prefill"], "decode": ["decode"]},
            ],
        }
        if not standin_router:     # the built-in router template: {router_args} rendered by dsv4ctl
            del self.prof["deploy"]["launch"]["router"]
        self.profile = self.write_profile("profile.yaml", self.prof)
        self.commit = git(self.tree, "rev-parse", "HEAD").strip()
        self.env = {"DSV4CTL_CACHE": str(tmp / "cache"), "DSV4CTL_STATE_DIR": str(tmp / "state")}

    def write_profile(self, name: str, prof: dict) -> Path:
        p = self.cfgdir / name
        p.write_text(yaml.safe_dump(prof, sort_keys=False))
        return p

    def cli(self, *args: str, profile: Path | None = None) -> Run:
        return run(*args, str(profile or self.profile), env=self.env)

    def norm(self) -> Normaliser:
        n = Normaliser(self.tmp).literal(self.commit, "<COMMIT>").literal(self.commit[:12], "<COMMIT>")
        from dsv4ctl.profile.deployment import PROMETHEUS_PORT_OFFSET
        for g, p in self.ports.items():
            n.port(p, g)
            if g == "router":       # the router's derived Prometheus port
                n.port(p + PROMETHEUS_PORT_OFFSET if p + PROMETHEUS_PORT_OFFSET <= 65535 else p - PROMETHEUS_PORT_OFFSET,
                       "router-prometheus")
        return n

    def snapshot(self) -> dict:
        """Everything under the host roots and the release cache (names, link targets, bytes)."""
        out = {}
        for base in [*self.roots.values(), self.tmp / "cache"]:
            if not base.exists():
                continue
            for p in sorted(base.rglob("*")):
                if "logs" in p.relative_to(base).parts or \
                        set(p.relative_to(base).parts[:1]) & {"yaml", "code", "headers"}:
                    continue        # the stand-ins' own output; what dsv4ctl keeps parsed in its caches
                    #                 (YAML, compiled dataclass code, checkpoint headers): no state
                k = str(p)
                out[k] = ("link", os.readlink(p)) if p.is_symlink() else \
                    ("file", p.read_bytes()) if p.is_file() else ("dir",)
        return out

    def stop_services(self) -> None:
        from tests.standin.harness import kill_groups
        pids = []
        for r in self.roots.values():
            for pf in (r / "run").glob("*.pid") if (r / "run").exists() else []:
                try:
                    pids.append(int(pf.read_text()))
                except ValueError:
                    pass
        kill_groups(pids)


needs_rsync = pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not installed (scripts/test.sh installs it)")


@pytest.fixture
def fresh(tmp_path):
    return LocalWorld(tmp_path)


@needs_rsync
def test_deploy_dry_run_first(fresh):
    w = fresh
    r = w.cli("deploy", "--dry-run", "--json")
    golden("deploy_dry_run_first", r, w.norm().release(r.json()["release"], "new"), 0)
    assert not any(p.exists() for p in w.roots.values()) and not (w.tmp / "cache" / "releases").exists()


@needs_rsync
def test_deploy_promote_dry_run_first(fresh):
    w = fresh
    r = w.cli("deploy", "--promote", "--dry-run", "--json")
    golden("deploy_promote_dry_run_first", r, w.norm().release(r.json()["release"], "new"), 0)
    assert not any(p.exists() for p in w.roots.values()) and not (w.tmp / "cache" / "releases").exists()


def test_rollback_dry_run_nothing_deployed(fresh):
    golden("rollback_dry_run_nothing_deployed", fresh.cli("rollback", "--dry-run", "--json"), fresh.norm(), 2)


def test_promote_dry_run_nothing_deployed(fresh):
    golden("promote_dry_run_nothing_deployed", fresh.cli("promote", "r0123456789ab", "--dry-run", "--json"),
           fresh.norm().release("r0123456789ab", "unknown"), 2)


@needs_rsync
def test_deploy_dry_run_ipv6_address(tmp_path):
    """The decode host's address is an IPv6 literal (only URLs and launch commands use it); the
    router uses the built-in launch template, so its ``--prefill``/``--decode`` URLs are dsv4ctl's."""
    w = LocalWorld(tmp_path, addresses=(loopback(2), "::1", loopback(4)), standin_router=False)
    r = w.cli("deploy", "--dry-run", "--json")
    golden("deploy_dry_run_ipv6_address", r, w.norm().release(r.json()["release"], "new"), 0)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """Two real deploys on the local hosts: A (the plain tree), then B (``--patch`` 0001)."""
    if shutil.which("rsync") is None:
        pytest.skip("rsync is not installed (scripts/test.sh installs it)")
    w = LocalWorld(tmp_path_factory.mktemp("deployed"))
    try:
        ra = w.cli("deploy", "--json")
        assert ra.code == 0, ra.err
        # state.json times have 1-s resolution and ties are broken by release id (a hash): start
        # B in the next second so "newest" (releases order, rollback target, pruning) is B
        time.sleep(1.05 - time.time() % 1)
        rb = w.cli("deploy", "--json", "--patch", str(w.patch1))
        assert rb.code == 0, rb.err
        w.reports = {"A": ra, "B": rb}
        w.rid = {"A": ra.json()["release"], "B": rb.json()["release"]}
        assert w.rid["A"] != w.rid["B"]
        yield w
    finally:
        w.stop_services()


def _dnorm(w: LocalWorld, extra: dict[str, str] | None = None) -> Normaliser:
    n = w.norm()
    for name, rid in {**w.rid, **(extra or {})}.items():
        n.release(rid, name)
    return n


def test_deploy_reports(deployed):
    """The two real deploys' JSON reports (first deploy; delta push of one patched file)."""
    w = deployed
    golden("deploy_first", w.reports["A"], _dnorm(w), 0)
    golden("deploy_patch", w.reports["B"], _dnorm(w), 0)


def test_releases_after_two_deploys(deployed):
    golden("releases_after_two_deploys", deployed.cli("releases", "--json"), _dnorm(deployed), 0)


@pytest.mark.parametrize("name,args", [
    ("deploy_dry_run_new_release", ("deploy", "--dry-run", "--json", "--patch", "P2")),
    ("deploy_dry_run_active_release", ("deploy", "--dry-run", "--json", "--patch", "P1")),
    ("deploy_dry_run_older_release", ("deploy", "--dry-run", "--json")),
    ("deploy_promote_dry_run", ("deploy", "--promote", "--dry-run", "--json", "--patch", "P2")),
    ("deploy_promote_dry_run_canary_prefill", ("deploy", "--promote", "--dry-run", "--json", "--patch", "P2",
                                               "--canary", "prefill", "--concurrency", "7")),
    ("rollback_dry_run", ("rollback", "--dry-run", "--json")),
    ("rollback_dry_run_to_active", ("rollback", "--dry-run", "--json", "--to", "B")),
    ("promote_dry_run", ("promote", "B", "--dry-run", "--json")),
    ("promote_dry_run_not_active", ("promote", "A", "--dry-run", "--json")),
    # the lifecycle's step lists (issue 42 item 4): what start, stop and restart run on the active release
    ("start_dry_run", ("start", "--dry-run", "--json")),
    ("stop_dry_run", ("stop", "--dry-run", "--json")),
    ("restart_dry_run", ("restart", "--dry-run", "--json")),
])
def test_dry_runs_after_deploys(deployed, name, args):
    w = deployed
    sub = {"P1": str(w.patch1), "P2": str(w.patch2), **w.rid}
    before = w.snapshot()
    r = w.cli(*[sub.get(a, a) for a in args])
    # after two plain deploys no release is good (no promotion gate passed): a default rollback has none
    code = 2 if name.endswith("_not_active") else 0   # rollback_dry_run: A passed its gate when deployed
    doc = r.json() or {}
    extra = {"new": doc["release"]} if doc.get("release") not in (None, *w.rid.values()) else {}
    golden(name, r, _dnorm(w, extra), code)
    assert w.snapshot() == before


def test_the_message_is_in_every_close_record(deployed):
    """``-m`` of promote and rollback (issue 46.8) is in the audit record every host's close
    writes (the dry run's steps are the run's)."""
    w = deployed
    for args in (("promote", w.rid["B"]), ("rollback",)):
        r = w.cli(*args, "--dry-run", "--json", "-m", "canary soaked 2h")
        assert r.code == 0, r.err
        steps = r.json()["steps"] + r.json()["on_failure"]
        closes = [s for s in steps if s["phase"] == "close" and s["cmd"]]     # on_failure lines: a summary only
        assert closes and all("\"message\":\"canary soaked 2h\"" in s["cmd"] for s in closes), (args, closes)


def test_deploy_dry_run_group_removed(deployed):
    """The router group dropped from the profile: h2 still runs it from the active release."""
    w = deployed
    prof = json.loads(json.dumps(w.prof))
    prof["groups"] = [g for g in prof["groups"] if g["role"] != "router"]
    p = w.write_profile("no-router.yaml", prof)
    before = w.snapshot()
    r = w.cli("deploy", "--dry-run", "--json", profile=p)
    golden("deploy_dry_run_group_removed", r, _dnorm(w, {"no-router": r.json()["release"]}), 0)
    assert w.snapshot() == before
