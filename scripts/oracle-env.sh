#!/usr/bin/env bash
# Build .venv-oracle: CPU torch 2.13.0 + sglang 0.5.23 (no deps) + the 47 pinned packages the
# configurator and argument pipeline import (tests/oracle/requirements.txt). Python 3.11 only.
# Idempotent: a complete environment is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
V=.venv-oracle
# Other SGLang releases dsv4ctl supports (dsv4ctl/plan/versions.py): each wheel's sglang/ package
# under $V/versions/<version>/, put first on the oracle's path by tests/oracle/runner.py (their
# configurator and argument pipeline run on this environment's torch and packages). About 60 MB
# of wheels, fetched once with pip's own configuration.
OTHER_VERSIONS="0.5.18 0.5.19 0.5.20 0.5.21 0.5.22"
# The wheels stay in .cache/wheels, where the patch tests' pristine trees (dsv4ctl's own
# dsv4ctl.patches.pristine, DSV4CTL_CACHE=.cache) find them: `patch check` of each shipped series.
WHEELS=.cache/wheels
other_versions() {
  local v
  mkdir -p "$WHEELS"
  for v in $OTHER_VERSIONS; do
    if ! ls "$WHEELS"/sglang-"$v"-*.whl >/dev/null 2>&1; then
      "$V/bin/python" -m pip download -q --no-deps --only-binary=:all: "sglang==$v" -d "$WHEELS" 2>&1 \
        | grep -v '^WARNING: Location' || true
    fi
    [ -f "$V/versions/$v/.complete" ] && continue
    rm -rf "$V/versions/$v"
    mkdir -p "$V/versions/$v"
    "$V/bin/python" - "$WHEELS" "$v" "$V/versions/$v" <<'PY'
import glob, sys, zipfile
whl, = glob.glob(f"{sys.argv[1]}/sglang-{sys.argv[2]}-*.whl")
with zipfile.ZipFile(whl) as z:
    z.extractall(sys.argv[3], [n for n in z.namelist() if n.startswith("sglang/") or ".dist-info/" in n])
PY
    touch "$V/versions/$v/.complete"
  done
}
if [ -f "$V/.complete" ]; then other_versions; exit 0; fi
PY=$(command -v python3.11 || true)
if [ -z "$PY" ]; then echo "oracle-env.sh: python3.11 is required for the sglang 0.5.23 wheel" >&2; exit 2; fi
rm -rf "$V"
. scripts/pyinstall.sh
pyvenv "$V" "$PY"
# No bytecode compiled for every file (torch's alone: 70 CPU-s here): the imports the tests use
# write theirs at the end.
q() { PYINSTALL_COMPILE=0 pyinstall "$V/bin/python" "$@" 2>&1 | grep -v '^WARNING: Location' || true; }
q "torch==2.13.0"
q --no-deps "sglang==0.5.23" -r tests/oracle/requirements.txt
# the bytecode of what the tests import, written once here instead of by every test process
env -u PYTHONDONTWRITEBYTECODE PYTHONPATH=. "$V/bin/python" -W ignore -c 'import torch, sglang, tests.oracle.driver
import sglang.srt.server_args, sglang.srt.arg_groups.memory_hook, sglang.srt.arg_groups.overrides' >/dev/null
touch "$V/.complete"
other_versions
