#!/usr/bin/env bash
# The GPU check's wheels, fetched on a machine that reaches PyPI for a GPU machine that does not: exactly
# benchmarks/gpu_requirements.txt (every package pinned, no resolve: a resolve would pull torch and CUDA, which the
# GPU machine has), as binary wheels for one CPython on Linux x86_64, into DEST (git-ignored). About 45 MB.
#
#     bash benchmarks/gpu_wheels.sh [DEST] [PYTHON_VERSION]     # default: gpu-wheels 3.12 (the lent H200's Python)
#
# Carry DEST to the GPU machine; gpu_check.sh installs from it with --no-index. The CPU rehearsal
# (benchmarks/gpu_rehearsal.py) fetches the same list for this machine's Python.
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-gpu-wheels}"
version="${2:-3.12}"
mkdir -p "$dest"
pip download --quiet --no-deps --dest "$dest" --only-binary=:all: --implementation cp --python-version "$version" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_34_x86_64 -r benchmarks/gpu_requirements.txt
echo "$(ls "$dest" | wc -l) wheels, $(du -sh "$dest" | cut -f1) in $dest (CPython $version)"
