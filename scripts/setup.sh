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
stamp="$VENV/.gpumon-installed-$(cat "$ROOT/setup.cfg" "$ROOT/pyproject.toml" | cksum | cut -d' ' -f1)-${extras:-none}"
if [ ! -e "$stamp" ]; then
  echo "setup: installing gpumon${extras:+[$extras]} into $VENV" >&2
  log="$VENV/pip-install.log"
  if ! { "$VENV/bin/python" -m pip install --disable-pip-version-check --upgrade pip &&
         "$VENV/bin/python" -m pip install --disable-pip-version-check -e "$spec"; } >"$log" 2>&1 ||
     ! "$VENV/bin/python" -c 'import gpumon, pynvml, psutil, prometheus_client' 2>>"$log"; then
    tail -n 30 "$log" >&2
    echo "setup: installing into $VENV failed; pip's whole output is in $log" >&2
    exit 1
  fi
  if [[ ",$extras," == *",bench,"* ]] && ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
    # Keras's backend: torch 2.13.0, the CPU build that these machines hold on disk (a GPU
    # machine that has torch already keeps its own CUDA build: this step is skipped there).
    echo "setup: installing torch==2.13.0 for the Keras benchmark job" >&2
    "$VENV/bin/python" -m pip install --disable-pip-version-check "torch==2.13.0" >>"$log" 2>&1 \
      || { tail -n 30 "$log" >&2; echo "setup: installing torch failed; see $log" >&2; exit 1; }
  fi
  rm -f "$VENV"/.gpumon-installed-*
  touch "$stamp"
fi
export PATH="$VENV/bin:$PATH"
