#!/usr/bin/env bash
# Prepare the GPU check's wheels on a machine that reaches PyPI, for a GPU machine that does not.
# The GPU machine brings its own Python and CUDA torch; this fetches what hitoban's night needs beside them, as
# binary wheels for CPython 3.11-3.13 on Linux x86_64 (pure-Python ones once), into gpu-wheels/ (git-ignored):
#
#     bash benchmarks/gpu_wheels.sh [gpu-wheels]
#
# gpu_check.sh installs from that folder with --no-index. numpy comes with the machine's torch. Not fetched (the
# night does not need them, and they are large): gradio, datasets/pyarrow, matplotlib, scipy/datasketch, hyperscan.
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-gpu-wheels}"
mkdir -p "$dest"
# what `hitoban doctor`, `pretrain`, `killtest`, the evaluation and the benchmarks import, with their own needs, listed
# out (--no-deps: a resolve would pull torch and CUDA wheels, which the GPU machine has; so have numpy, jinja2,
# sympy and networkx, torch's own dependencies)
packages=(
  "transformers==5.24.*" "accelerate>=1.10" "tokenizers>=0.22" "safetensors>=0.5" "sentencepiece>=0.2"
  "protobuf>=4" "huggingface_hub>=1.0" hf-xet "tqdm>=4.66" psutil pyyaml regex packaging filelock fsspec
  typing-extensions httpx httpcore h11 httpx2 httpcore2 truststore anyio sniffio idna certifi typer click rich
  markdown-it-py mdurl pygments shellingham annotated-doc pydantic pydantic-core annotated-types typing-inspection
  setuptools wheel
)
for version in 3.11 3.12 3.13; do  # transformers 5.24 needs 3.11
  pip download --quiet --no-deps --dest "$dest" --only-binary=:all: --platform manylinux2014_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --python-version "$version" \
      "${packages[@]}"
done
du -sh "$dest"
ls "$dest" | wc -l
