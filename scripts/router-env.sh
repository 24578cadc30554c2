#!/usr/bin/env bash
# Build .venv-router: the two real SGLang PD gateways from PyPI, used by the gateway tests
# (tests/test_gateway.py): sglang-router 0.3.2 (python -m sglang_router.launch_router) and
# smg 1.13.0 (python -m smg.launch_router, the gateway SGLang 0.5.23's README points to).
# Idempotent: a complete environment is left as it is. Exit 3 when the registry cannot be
# reached (the gateway tests then skip, saying so); exit 2 without a usable python.
set -euo pipefail
cd "$(dirname "$0")/.."
V=.venv-router
if [ -f "$V/.complete" ]; then exit 0; fi
PY=$(command -v python3.11 || command -v python3 || true)
if [ -z "$PY" ]; then echo "router-env.sh: python3 is required" >&2; exit 2; fi
rm -rf "$V"
. scripts/pyinstall.sh
pyvenv "$V" "$PY"
if ! pyinstall "$V/bin/python" "sglang-router==0.3.2" "smg==1.13.0" 2>"$V/pip.err"; then
  echo "router-env.sh: cannot install sglang-router==0.3.2 / smg==1.13.0 (registry unreachable?): $(tail -1 "$V/pip.err")" >&2
  exit 3
fi
"$V/bin/python" -c 'import sglang_router.launch_router, smg.launch_router' >/dev/null
touch "$V/.complete"
