"""Shared test helpers: run the real CLI in a subprocess, paths of shipped data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEFAULT_PROFILE = REPO / "profiles" / "dsv4-flash-8xb200-pd.yaml"
ORACLE_PY = REPO / ".venv-oracle" / "bin" / "python"


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, input: str | None = None,
            timeout: float = 120) -> Result:
    """Run ``dsv4ctl ARGS`` as a user would (a new process) and capture everything."""
    e = dict(os.environ, COLUMNS="200", NO_COLOR="1")
    e.update(env or {})
    p = subprocess.run([sys.executable, "-m", "dsv4ctl.cli", *args], cwd=cwd or REPO, env=e,
                       capture_output=True, text=True, timeout=timeout, input=input)
    return Result(p.returncode, p.stdout, p.stderr)


@pytest.fixture
def cli():
    return run_cli


def oracle_available() -> bool:
    return ORACLE_PY.exists()
