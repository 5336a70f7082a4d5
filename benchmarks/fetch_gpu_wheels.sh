#!/usr/bin/env bash
# Fetch, here, the wheels that benchmarks/gpu_check.sh needs on the lent GPU machine (Python 3.12,
# x86-64, no network; torch is there already). Puts them in .whl/ (ignored by git).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
for pkg in nvidia-ml-py psutil prometheus-client PyYAML bcrypt keras absl-py rich namex h5py optree \
           ml-dtypes markdown-it-py mdurl pygments; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${plat[@]}" -d .whl "$pkg" || python3 -m pip download -q --no-deps -d .whl "$pkg"
done
ls -la .whl
