#!/usr/bin/env bash
# Sourced by run.sh and test.sh: a virtual environment in .venv with gpumon installed in it.
# Idempotent and quiet when everything is already there. Set GPUMON_EXTRAS to add extras
# (e.g. "dev" for the tests).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "gpumon needs Python >= 3.11; found: $("$PY" --version 2>&1). Set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
VENV="$ROOT/.venv"
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
extras="${GPUMON_EXTRAS:-}"
spec="$ROOT"
[ -n "$extras" ] && spec="$ROOT[$extras]"
# The install mode is part of the stamp: a venv installed another way is installed again.
mode="editable_mode=compat"
sum=$( (cat "$ROOT/setup.cfg" "$ROOT/pyproject.toml"; echo "$mode") | cksum | cut -d' ' -f1)
stamp="$VENV/.gpumon-installed-$sum-${extras:-none}"
if [ ! -e "$stamp" ]; then
  log="$VENV/pip-install.log"
  : >"$log"
  pip_install() { "$VENV/bin/python" -m pip install --disable-pip-version-check "$@" >>"$log" 2>&1; }
  fail() { tail -n 30 "$log" >&2; echo "setup: $1; pip's whole output is in $log" >&2; exit 1; }
  pip_install --upgrade pip || fail "upgrading pip in $VENV failed"
  if [[ ",$extras," == *",bench,"* || ",$extras," == *",dev,"* ]] && ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
    # Keras's backend (and Lightning's, for the tests): torch 2.13.0, installed before the extras
    # so that nothing pulls a newer CUDA build. Where this machine holds the CPU build (these
    # machines do), it is about 1.2 GB in .venv and takes a minute or two; elsewhere pip may
    # download a CUDA build of several GB. A GPU machine that has torch keeps its own build.
    echo "setup: installing torch==2.13.0 for the Keras job (CPU build: ~1.2 GB in .venv, 1-3 min; a CUDA build from PyPI is several GB)" >&2
    pip_install "torch==2.13.0" || fail "installing torch failed"
  fi
  echo "setup: installing gpumon${extras:+[$extras]} into $VENV" >&2
  # Editable, as a path in a .pth file (compat) rather than setuptools' default import hook: the
  # hook's module and what it imports (pathlib, importlib.util: ~10 ms) would be loaded at every
  # start of every gpumon command, which an installed wheel never pays (the daemon's first sample,
  # docs/benchmarks.md). The cost: the repository's root is on sys.path, as with `setup.py develop`.
  pip_install -e "$spec" --config-settings "$mode" || fail "installing into $VENV failed"
  "$VENV/bin/python" -c 'import gpumon, pynvml, psutil, h11' 2>>"$log" || fail "gpumon does not import in $VENV"
  # Stamps of other package definitions are stale; those of other extras stay true (run.sh sets
  # up "plot" and then "plot,bench": neither undoes the other).
  for old in "$VENV"/.gpumon-installed-*; do
    if [[ -e "$old" && "$old" != "$VENV/.gpumon-installed-$sum-"* ]]; then rm -f "$old"; fi
  done
  touch "$stamp"
fi
export PATH="$VENV/bin:$PATH"
