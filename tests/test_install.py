"""Install test: build the wheel, install it into a fresh venv, run dsv4ctl from a folder outside
the checkout (what `pipx install .` / `uv tool install .` give an operator).

No network: the wheel is built with ``pip wheel --no-deps --no-build-isolation`` by the project
venv when its setuptools can build it (>= 77: PEP 639 license string, bdist_wheel built in; the
``test`` extra asks for it), else by ``.venv-oracle`` (setuptools 84), else with pip's build
isolation from the configured package index (a local mirror on CI machines); if none works the
test skips and says why. The fresh venv gets dsv4ctl with ``--no-deps``; its
dependencies come from the project venv's site-packages, added as one path entry by a ``.pth``
file (not processed as a site dir, so the checkout's editable-install hook stays inactive and
``dsv4ctl`` can only be imported from the wheel)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.install


# the test process's PYTHONPATH (the checkout) must not leak into the builds and the venv
CLEAN = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}


def _run(argv, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("env", CLEAN)
    return subprocess.run(argv, capture_output=True, text=True, **kw)


def _setuptools_version(py: str) -> tuple[int, ...]:
    p = _run([py, "-c", "import setuptools; print(setuptools.__version__)"])
    try:
        return tuple(int(x) for x in p.stdout.strip().split(".")[:2])
    except ValueError:
        return (0,)


def build_wheel(out: Path) -> Path:
    """The dsv4ctl wheel built from the checkout into ``out`` (see the module docstring)."""
    src = out / "src"                    # a clean copy: no build/ or egg-info of the checkout involved
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", ".venv*", ".cache", "build", "*.egg-info",
                                                             "__pycache__", ".pytest_cache", ".hypothesis", "tests"))
    # a frontend whose setuptools builds it without isolation: the project venv (test extra
    # setuptools>=77), else the oracle venv scripts/test.sh builds; else pip's build isolation
    tries = [(py, ["--no-build-isolation"]) for py in (sys.executable, str(REPO / ".venv-oracle/bin/python"))
             if Path(py).exists() and _setuptools_version(py) >= (77,)][:1]
    tries.append((sys.executable, []))
    errors = []
    for py, extra in tries:
        p = _run([py, "-m", "pip", "wheel", "-q", "--no-deps", *extra, "-w", str(out / "dist"), str(src)],
                 env=dict(CLEAN, PIP_DISABLE_PIP_VERSION_CHECK="1"), timeout=300)
        wheels = sorted((out / "dist").glob("dsv4ctl-*.whl"))
        if p.returncode == 0 and wheels:
            return wheels[0]
        errors.append(f"pip wheel {' '.join(extra) or '(build isolation)'}: {(p.stderr.strip().splitlines() or ['?'])[-1]}")
    pytest.skip("cannot build the wheel offline here: " + "; ".join(errors))


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(wheel, venv bin folder, a work folder outside the checkout, env, seconds taken)."""
    t0 = time.monotonic()
    tmp = tmp_path_factory.mktemp("install")
    wheel = build_wheel(tmp)
    built = time.monotonic() - t0
    venv = tmp / "venv"
    p = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    assert p.returncode == 0, p.stderr
    vpy = venv / "bin" / "python"
    p = _run([sys.executable, "-m", "pip", "--python", str(vpy), "install", "-q", "--no-deps", "--no-index",
              str(wheel)], timeout=300)
    assert p.returncode == 0, p.stderr
    site = Path(_run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "_project_venv_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp / "elsewhere"
    work.mkdir()
    home = tmp / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DSV4CTL_", "XDG_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(HOME=str(home), PATH=f"{venv / 'bin'}:{env.get('PATH', '')}", NO_COLOR="1", COLUMNS="200",
               DSV4CTL_PYPI_URL="http://127.0.0.1:9/pypi")   # nothing may be fetched: a dead local port
    print(f"\nwheel {wheel.name}: {wheel.stat().st_size / 1024:.0f} KiB; built in {built:.1f} s, "
          f"installed in {time.monotonic() - t0 - built:.1f} s")
    yield wheel, venv, work, env, site, time.monotonic() - t0


def dsv4ctl(installed, *args, input=None):
    _, venv, work, env, _, _ = installed
    return _run([str(venv / "bin" / "dsv4ctl"), *args], cwd=work, env=env, input=input, timeout=120)


def test_the_wheel_carries_what_dsv4ctl_ships(installed):
    wheel = installed[0]
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in ("dsv4ctl/_shipped/profiles/dsv4-flash-8xb200-pd.yaml",
              "dsv4ctl/_shipped/profiles/dsv4-flash-8xb200-pd/prefill.yaml",
              "dsv4ctl/_shipped/profiles/dsv4-flash-8xb200-pd/decode.yaml",
              "dsv4ctl/_shipped/patches/sglang-0.5.23/series",
              "dsv4ctl/_shipped/patches/sglang-0.5.23/0001-dsv4-bf16-index-k-exact-accounting.patch",
              "dsv4ctl/_shipped/patches/sglang-0.5.23/0002-dsv4-log-pool-plan.patch",
              "dsv4ctl/_shipped/completions/dsv4ctl.bash", "dsv4ctl/_shipped/completions/_dsv4ctl",
              "dsv4ctl/_shipped/completions/dsv4ctl.fish",
              "dsv4ctl/data/server_args-0.5.23.json", "dsv4ctl/data/models/deepseek-v4-flash.json",
              "dsv4ctl/data/models/deepseek-v4-pro.json", "dsv4ctl/data/schemas/profile.schema.json",
              "dsv4ctl/data/schemas/plan.schema.json"):
        assert f in names, f
    assert {n.rsplit("/", 1)[1] for n in names if n.startswith("dsv4ctl/_shipped/playbooks/")} == \
        {p.name for p in (REPO / "playbooks").glob("*.yaml")}
    assert not any(n.startswith(("tests/", "dsv4ctl/_shipped/profiles/my")) for n in names)
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    for line in ("License-Expression: Apache-2.0", "Requires-Python: >=3.11",
                 "Classifier: Programming Language :: Python :: 3.13"):
        assert line in meta.splitlines(), line


def test_runs_from_the_wheel_outside_the_checkout(installed):
    _, venv, work, env, site, _ = installed
    r = dsv4ctl(installed, "--version", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["dsv4ctl"] == "0.1.0"
    assert Path(doc["shipped"]) == site / "dsv4ctl" / "_shipped"
    # the embedded default plan
    r = dsv4ctl(installed, "plan", "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["ok"] is True and plan["profile"] == "dsv4-flash-8xb200-pd"
    assert plan["profile_path"] == str(site / "dsv4ctl/_shipped/profiles/dsv4-flash-8xb200-pd.yaml")
    assert [g["name"] for g in plan["groups"]] == ["prefill", "decode"]
    r = dsv4ctl(installed, "plan")
    assert r.returncode == 0 and "prefill" in r.stdout and "Traceback" not in r.stderr
    # runbooks
    r = dsv4ctl(installed, "runbook", "list")
    assert r.returncode == 0, r.stderr
    for name in ("toolcall-corruption", "oom-at-startup", "transfer-wedge", "bad-release"):
        assert name in r.stdout
    r = dsv4ctl(installed, "runbook", "show", "toolcall-corruption")
    assert r.returncode == 0 and "check.load" in r.stdout, r.stderr
    # patch check, no network: the shipped series is found, nothing is fetched
    r = dsv4ctl(installed, "patch", "check", "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["series"] == str(site / "dsv4ctl/_shipped/patches/sglang-0.5.23")
    assert len(doc["patches"]) == 2
    # completions from the tool itself
    r = dsv4ctl(installed, "completion", "bash")
    assert r.returncode == 0 and r.stdout == (REPO / "completions" / "dsv4ctl.bash").read_text()
    # ... and the values they ask the tool for (the embedded default profile's groups)
    r = dsv4ctl(installed, "__complete", "groups")
    assert (r.returncode, r.stdout.split(), r.stderr) == (0, ["prefill", "decode", "router"], "")
    r = dsv4ctl(installed, "schema", "profile")
    assert r.returncode == 0 and json.loads(r.stdout) == json.loads(
        (REPO / "dsv4ctl/data/schemas/profile.schema.json").read_text())
    assert not (work / ".cache").exists() and os.listdir(work) == []


def test_patch_check_without_pip_names_the_index(installed):
    """With DSV4CTL_PYPI_URL (and in a pipx / uv tool venv, which has no pip) the pristine wheel
    comes from the index JSON API — here a dead local port — and the failure is one line naming
    it and what to do."""
    r = dsv4ctl(installed, "patch", "check")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.strip().splitlines()[-1].startswith(
        "dsv4ctl: error: cannot fetch http://127.0.0.1:9/pypi/sglang/0.5.23/json (connection refused)")
    assert "Traceback" not in r.stderr


def test_start_a_profile_and_never_edit_the_installed_one(installed):
    _, venv, work, env, site, _ = installed
    shipped = site / "dsv4ctl/_shipped/profiles/dsv4-flash-8xb200-pd/prefill.yaml"
    before = shipped.read_bytes()
    r = dsv4ctl(installed, "hicache", "off", "dsv4-flash-8xb200-pd", "-g", "prefill")
    assert r.returncode == 2
    assert r.stderr.strip() == (f"dsv4ctl: error: {shipped}: shipped with dsv4ctl, not edited; start from your "
                                "own copy: dsv4ctl profile init my-profile.yaml")
    assert shipped.read_bytes() == before
    r = dsv4ctl(installed, "profile", "init", "my.yaml")
    assert r.returncode == 0, r.stderr
    # portable: the schema copied beside it, the series by its shipped name, no install path
    text = (work / "my.yaml").read_text()
    assert text.startswith("# yaml-language-server: $schema=my/profile.schema.json\n") and str(site) not in text
    assert sorted(p.name for p in (work / "my").iterdir()) == ["decode.yaml", "prefill.yaml", "profile.schema.json"]
    r = dsv4ctl(installed, "plan", "my.yaml", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["profile"] == "my"
    r = dsv4ctl(installed, "hicache", "off", "my.yaml", "-g", "prefill")
    assert r.returncode == 0, r.stderr
    assert "enable-hierarchical-cache: false\n" in (work / "my/prefill.yaml").read_text()
    assert shipped.read_bytes() == before


def test_constraints_pin_every_runtime_dependency_inside_its_range():
    """constraints.txt: one exact pin per runtime dependency (direct ones inside pyproject's
    ranges), matching what the project venv runs."""
    import tomllib
    from importlib.metadata import version

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, ver = line.partition("==")
            assert ver, f"constraints.txt: {line!r} is not an exact pin"
            pins[canonicalize_name(name)] = ver
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for d in deps:
        req = Requirement(d)
        name = canonicalize_name(req.name)
        assert name in pins, f"constraints.txt does not pin {req.name}"
        assert req.specifier.contains(pins[name]), f"{req.name}=={pins[name]} is outside {req.specifier}"
        assert version(req.name) == pins[name], f"the project venv runs {req.name} {version(req.name)}"
