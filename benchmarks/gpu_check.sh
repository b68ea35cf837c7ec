#!/usr/bin/env bash
# The GPU check on an offline GPU machine with its own Python and CUDA torch (see benchmarks/gpu_check.py):
# a virtualenv that sees the machine's torch, hitoban and the wheels it lacks from gpu-wheels/ (--no-index: nothing
# is downloaded), then every stage, each with its time limit. Results: OUT/gpu_check.md (+ a log per stage).
#
#     bash benchmarks/gpu_check.sh OUT [STAGE ...]      # stages: env doctor pretrain killtest model night
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu-out}}"
shift || true
wheels="${HITOBAN_WHEELS:-gpu-wheels}"
mkdir -p "$out"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())" \
    | tee "$out/torch.txt"
if python3 -c 'import sys; sys.exit(sys.prefix != sys.base_prefix)'; then
    # a system or conda Python: a virtualenv that still sees the machine's torch and whatever else it has
    [ -d .gpu-venv ] || python3 -m venv --system-site-packages .gpu-venv
    . .gpu-venv/bin/activate
fi  # (already in a virtualenv: install beside its torch)
started=$(date +%s)
# only what is missing or too old: the machine's own packages (torch above all) stay
pip install --quiet --no-index --find-links "$wheels" setuptools "transformers==5.24.*" "accelerate>=1.10" "tokenizers>=0.22" \
    "safetensors>=0.5" "sentencepiece>=0.2" "protobuf>=4" "huggingface_hub>=1.0" "tqdm>=4.66" psutil \
    > "$out/install.log" 2>&1 || { echo "install failed: see $out/install.log"; tail -20 "$out/install.log"; }
pip install --quiet --no-index --no-deps --no-build-isolation -e . >> "$out/install.log" 2>&1 \
    || { echo "hitoban install failed: see $out/install.log"; tail -20 "$out/install.log"; }
echo "install: $(( $(date +%s) - started )) s" | tee -a "$out/install.log"
if [ "$#" -gt 0 ]; then
    python benchmarks/gpu_check.py --out "$out" --stages "$@"
else
    python benchmarks/gpu_check.py --out "$out"
fi
