#!/usr/bin/env bash
# The test command (README, and CI's .ci/run): sets up everything on a fresh Debian 12 machine,
# then runs the linter and the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
GPUMON_EXTRAS=dev source scripts/setup.sh
echo "== ruff" >&2
ruff check gpumon tests benchmarks
ruff format --check gpumon tests benchmarks
echo "== pytest" >&2
exec python -m pytest -q "$@"
