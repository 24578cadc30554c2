# Sourced by scripts/test.sh, oracle-env.sh and router-env.sh: `pyinstall VENV_PYTHON ARGS...`
# installs into a virtual environment with uv when scripts/test.sh bootstrapped it (UV=path),
# else with pip; uv compiles bytecode as pip does unless PYINSTALL_COMPILE=0. uv installs the three test environments about 3x faster than pip (measured on
# this 2-core machine kind: the SGLang oracle environment 140 s -> 47 s, bytecode compiled by
# both), and is given pip's own configuration so both resolve the same files: find-links,
# index and extra index URLs, the constraint file and the CA bundle (`pip config`, PIP_* env).

_uv_args=()
_uv_config() {
  # pip's settings, read once through pip itself (config files and PIP_* variables; PIPCFG_PY is
  # a python with pip, scripts/test.sh sets it to .venv's)
  local py=${PIPCFG_PY:-python3} v u
  get() { "$py" -m pip config get "global.$1" 2>/dev/null || true; }
  v=${PIP_INDEX_URL:-$(get index-url)}
  _uv_args=(--index-strategy unsafe-best-match --index-url "${v:-https://pypi.org/simple}")
  v=${PIP_EXTRA_INDEX_URL:-$(get extra-index-url)}
  for u in $v; do _uv_args+=(--extra-index-url "$u"); done
  v=${PIP_FIND_LINKS:-$(get find-links)}
  for u in $v; do [ -e "$u" ] && _uv_args+=(--find-links "$u"); done
  v=${PIP_CONSTRAINT:-$(get constraint)}
  for u in $v; do [ -e "$u" ] && _uv_args+=(--constraint "$u"); done
  v=${PIP_CERT:-$(get cert)}
  if [ -n "$v" ] && [ -z "${SSL_CERT_FILE:-}" ]; then export SSL_CERT_FILE=$v; fi
  return 0
}

pyinstall() {
  local py=$1; shift
  if [ -n "${UV:-}" ] && [ -x "$UV" ]; then
    [ ${#_uv_args[@]} -gt 0 ] || _uv_config
    local compile=(--compile-bytecode)
    [ "${PYINSTALL_COMPILE:-1}" = 1 ] || compile=()
    "$UV" pip install -q "${compile[@]}" --python "$py" "${_uv_args[@]}" "$@"
  else
    "$py" -m pip install -q "$@"
  fi
}

# `pyvenv DIR PYTHON`: a new virtual environment (uv's when available, with pip seeded)
pyvenv() {
  local dir=$1 py=$2
  if [ -n "${UV:-}" ] && [ -x "$UV" ]; then
    "$UV" venv -q --seed --python "$py" "$dir"
  else
    "$py" -m venv "$dir"
  fi
}
