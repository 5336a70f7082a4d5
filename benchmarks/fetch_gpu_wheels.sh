#!/usr/bin/env bash
# Fetch, here, the wheels that benchmarks/gpu_check.sh needs on the lent GPU machine (Python 3.12,
# x86-64, no network). Puts them in .whl/ (ignored by git). Only what its image lacks (the device
# tool's KINDS.md lists its packages: torch, numpy, h5py, rich, absl-py, ml-dtypes, psutil, h11,
# PyYAML, Pillow, prometheus-client are there), and nvidia-ml-py: the newest, as a fresh venv's tests
# get it, rather than the image's. Carrying a second build of
# a compiled package the image has (h5py, ml-dtypes) would put two beside its numpy.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
for pkg in nvidia-ml-py bcrypt keras namex optree nvitop nvitop-exporter==1.7.2; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${plat[@]}" -d .whl "$pkg" || python3 -m pip download -q --no-deps -d .whl "$pkg"
done
ls -la .whl
