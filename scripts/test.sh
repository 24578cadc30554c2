#!/usr/bin/env bash
# The whole test suite on a fresh machine, set-up included:
#   system packages (openssh-server/-client, rsync, git, zsh, fish, systemd, util-linux, chromium, procps, prometheus,
#   prometheus-alertmanager, slurm-wlm,
#   podman, runc, catatonit, pythonX-venv) when missing, the .venv with dsv4ctl and
#   its test extras, the SGLang 0.5.23 CPU oracle environment (.venv-oracle) used as a source of
#   SGLang's own DeepSeek-V4 output parser (the stand-in server serves through it) and as a
#   reference by the oracle, patch and argument-table tests, and the real PD gateways
#   (.venv-router, scripts/router-env.sh). Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null 2>&1 || need+=(openssh-client)
command -v ssh-keygen >/dev/null 2>&1 || need+=(openssh-client)
command -v rsync >/dev/null 2>&1 || need+=(rsync)
command -v git >/dev/null 2>&1 || need+=(git)
command -v zsh >/dev/null 2>&1 || need+=(zsh)     # completion syntax/behaviour tests (~8 s apt)
command -v fish >/dev/null 2>&1 || need+=(fish)
[ -x /lib/systemd/systemd ] || need+=(systemd)      # tests/test_systemd.py boots it in a namespace
{ command -v unshare && command -v nsenter; } >/dev/null 2>&1 || need+=(util-linux)
command -v chromium >/dev/null 2>&1 || need+=(chromium)   # tests/test_report_browser.py renders the report
{ command -v ps && command -v pgrep; } >/dev/null 2>&1 || need+=(procps)   # process checks of the signal tests
{ command -v slurmctld && command -v sbatch && command -v munged; } >/dev/null 2>&1 || need+=(slurm-wlm)   # tests/slurm/lab.py: slurmctld + slurmd on this machine (~6 s apt)
command -v podman >/dev/null 2>&1 || need+=(podman)     # tests/test_image_deploy.py: release images (rootful, ~25 s apt)
command -v runc >/dev/null 2>&1 || need+=(runc)         # crun refuses to start containers on this machine kind
command -v catatonit >/dev/null 2>&1 || need+=(catatonit)   # podman run --init (a Recommends, not installed with --no-install-recommends)
command -v docker-registry >/dev/null 2>&1 || need+=(docker-registry)   # tests/test_image_deploy.py: sglang.image.registry against a real registry (distribution)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)   # tests/test_watch_rules.py runs promtool on the shipped rules (its postinst may try to start a service: harmless without systemd)
{ command -v prometheus-alertmanager || command -v alertmanager; } >/dev/null 2>&1 || need+=(prometheus-alertmanager)   # tests/test_watch_alertmanager.py: the shipped Alertmanager example (0.25 on Debian 12; its service is not started without systemd)
PYV=$(command -v python3.11 || command -v python3)
"$PYV" -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=("$(basename "$PYV")-venv")   # Debian/Ubuntu split venv out
if [ ${#need[@]} -gt 0 ]; then
  echo "test.sh: installing ${need[*]}" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

PY=$(command -v python3.11 || command -v python3)
t0=$(date +%s)
# uv installs the environments (scripts/pyinstall.sh: about 3x faster than pip here, with pip's
# configuration); it is bootstrapped into .venv with pip, and pip does everything when that fails.
if [ ! -x .venv/bin/python ]; then "$PY" -m venv .venv; fi
export PIPCFG_PY=$PWD/.venv/bin/python
if [ -x .venv/bin/uv ] || .venv/bin/pip install -q "uv==0.13.9" >/dev/null 2>&1; then
  export UV=$PWD/.venv/bin/uv
else
  echo "test.sh: uv could not be installed: pip builds the environments" >&2
fi
. scripts/pyinstall.sh
# The three Python environments are independent: built side by side (each is idempotent; a
# complete one is left as it is, so a second run of the same checkout starts pytest at once).
setup_venv() {
  # the installer's own exit status decides (this machine's pip prints a "Location ... is
  # ignored" warning per missing find-links folder: filtered from the output only)
  local rc=0 out
  out=$(pyinstall .venv/bin/python -e '.[test]' 2>&1) || rc=$?
  printf '%s\n' "$out" | grep -v -e '^WARNING: Location' -e '^$' >&2 || true
  [ "$rc" = 0 ] || { echo "test.sh: install -e '.[test]' failed (exit $rc)" >&2; return "$rc"; }
  .venv/bin/python -c 'import dsv4ctl, pytest, xdist' >/dev/null
}
setup_venv & venv_pid=$!
oracle_pid=""
if [ -z "${DSV4CTL_SKIP_ORACLE:-}" ]; then
  bash scripts/oracle-env.sh & oracle_pid=$!
fi
# the real PD gateways (sglang-router 0.3.2, smg 1.13.0) for tests/test_gateway.py and the PD
# promote tests; without the registry the script fails and those tests skip, saying why
router_pid=""
if [ -z "${DSV4CTL_SKIP_ROUTER:-}" ]; then
  bash scripts/router-env.sh & router_pid=$!
fi
wait "$venv_pid" || exit $?
if [ -n "$oracle_pid" ]; then wait "$oracle_pid" || exit $?; fi
if [ -n "$router_pid" ]; then
  wait "$router_pid" || echo "test.sh: .venv-router not built: the gateway tests will skip" >&2
fi
echo "test.sh: set-up took $(( $(date +%s) - t0 )) s" >&2

# Parallel workers (pytest-xdist; docs/testing.md): most of the suite waits on real servers,
# sshd hosts and subprocesses, so 6 workers keep 2 cores busy (measured in the checkout: pytest
# 14 min 23 s with 4 workers, 11 min 37 s with 6). DSV4CTL_TEST_WORKERS=0 runs in this process;
# each worker has its own loopback addresses (tests/conftest.py: loopback).
workers=${DSV4CTL_TEST_WORKERS:-6}
par=()
if [ "$workers" != 0 ]; then par=(-n "$workers" --dist loadscope --no-loadscope-reorder); fi
# Bytecode is written (a machine may set PYTHONDONTWRITEBYTECODE=1): the SGLang trees, the oracle
# environment and dsv4ctl are imported by hundreds of processes, each compiling them again
# otherwise (tests/test_patch_oracle.py: 73 s -> 35 s wall measured on this machine).
unset PYTHONDONTWRITEBYTECODE
exec .venv/bin/python -m pytest "${par[@]}" --durations=25 "$@"
