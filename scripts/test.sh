#!/usr/bin/env bash
# The test command (README, and CI's .ci/run): sets up everything on a fresh Debian 12 machine,
# then runs the linter, the type checker and the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests run for real: gcc builds the stand-in libnvidia-ml.so.1; a real
# Prometheus server and promtool check the exporter, its alert rules and the dashboard;
# systemd-analyze rates the unit; openssl makes throwaway certificates for the TLS tests;
# Performance Co-Pilot (pmcd, its openmetrics PMDA, pcp-dstat) runs `dstat --gpu` the PCP way.
need=()
# Python with venv (Debian keeps venv's ensurepip in python3-venv), and git (the packaging test
# lists the tracked files the wheel must hold)
if [ -z "${PYTHON:-}" ]; then
  command -v python3 >/dev/null || need+=(python3)
  python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
fi
command -v git >/dev/null || need+=(git)
command -v gcc >/dev/null || need+=(gcc libc6-dev)
command -v prometheus >/dev/null && command -v promtool >/dev/null || need+=(prometheus)
command -v systemd-analyze >/dev/null || need+=(systemd)
command -v openssl >/dev/null || need+=(openssl)
# pcp Provides/Conflicts/Replaces dstat: /usr/bin/dstat is pcp-dstat here, and Debian's original
# dstat 0.7.4 runs from its extracted .deb below (tests/test_dstat.py, tests/test_pcp.py)
{ [ -x /usr/lib/pcp/bin/pcp-dstat ] && [ -x /usr/lib/pcp/bin/pmcd ]; } || need+=(pcp)
/usr/bin/python3 -c 'import pcp, requests, six' 2>/dev/null || need+=(python3-pcp python3-requests python3-six)
# a real single-node Slurm runs jobs through gpumon's prolog and epilog (tests/test_slurm.py)
{ [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && command -v sbatch >/dev/null; } || need+=(slurm-wlm)
[ -x /usr/sbin/munged ] || need+=(munge)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "test: missing ${need[*]}: install them (apt-get install ${need[*]}) and run again" >&2
    exit 1
  fi
  echo "test: apt-get install ${need[*]}" >&2
  apt-get update -qq >/dev/null
  # Install without starting anything: the tests start the daemons they need (pmcd, munged,
  # slurmctld, slurmd) themselves, on their own ports. policy-rc.d is Debian's switch for that
  # (invoke-rc.d and deb-systemd-invoke ask it). pcp's postinst calls systemctl itself, which
  # fails where no systemd runs (a container, a chroot); apt runs maintainer scripts with its own
  # PATH (DPkg::Path), so the shim that answers in systemctl's place goes first in that PATH.
  hold=$(mktemp -d)
  printf '#!/bin/sh\nexit 0\n' >"$hold/systemctl"
  chmod +x "$hold/systemctl"
  dpkg_path=/usr/sbin:/usr/bin:/sbin:/bin
  [ -d /run/systemd/system ] || dpkg_path="$hold:$dpkg_path"
  policy=/usr/sbin/policy-rc.d
  own_policy=""
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# gpumon scripts/test.sh: no service starts during this install\nexit 101\n' >"$policy"
    chmod +x "$policy"
    own_policy=1
  fi
  status=0
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Path="$dpkg_path" "${need[@]}" >/dev/null \
    || status=$?
  [ -z "$own_policy" ] || rm -f "$policy"
  rm -rf "$hold"
  if [ "$status" -ne 0 ]; then
    echo "test: apt-get install ${need[*]} failed (exit $status)" >&2
    exit 1
  fi
fi
dstat074=tests/.dstat-0.7.4
if [ ! -x "$dstat074/usr/bin/dstat" ]; then
  echo "test: extracting Debian's dstat 0.7.4 into $dstat074 (it conflicts with pcp)" >&2
  dl=$(mktemp -d)
  (cd "$dl" && apt-get download -qq dstat 2>/dev/null) \
    || { apt-get update -qq >/dev/null && (cd "$dl" && apt-get download -qq dstat 2>/dev/null); }
  dpkg-deb -x "$dl"/dstat_*.deb "$dstat074"
  rm -rf "$dl"
fi

GPUMON_EXTRAS=dev,bench source scripts/setup.sh
echo "== building the stand-in libnvidia-ml.so.1" >&2
python -c 'from tests.fakenvml.driver import build; print(build())' >&2
echo "== ruff" >&2
ruff check gpumon tests benchmarks
ruff format --check gpumon tests benchmarks
echo "== mypy (strict, gpumon/)" >&2
mypy
echo "== pytest" >&2
# Three workers, a module at a time on each (loadfile): most of the suite waits on real daemons and
# real jobs, so it runs beside itself; tests/test_real_jobs.py (every real training job) goes first
# and stays on one worker, so two jobs never share the two cores. -n 0 runs it in one process.
exec python -m pytest -q -n "${GPUMON_TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder "$@"
