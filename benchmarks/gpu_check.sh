#!/usr/bin/env bash
# The GPU check, in two commands of at most 8 minutes each (a lent GPU gives 10 minutes a command, 15 in all):
#
#     bash benchmarks/gpu_check.sh OUT first     # install, env, data, doctor, a 3lm-shape night: tok/s and MFU
#     bash benchmarks/gpu_check.sh OUT second    # install (already there: seconds), the 3lm kill test,
#                                                # bench_model --compile, bench_night
#
# The install is offline: a virtualenv that sees the machine's own Python packages (its CUDA torch above all) gets
# benchmarks/gpu_requirements.txt from the wheels in $HITOBAN_WHEELS (default gpu-wheels/, made by
# benchmarks/gpu_wheels.sh) with --no-index, and hitoban from this checkout. Every stage writes OUT/gpu_check.md and
# .json as it ends, so a command cut short still returns what ran. `--rehearsal` (after the part) runs the same
# stages on the CPU at small sizes: benchmarks/gpu_rehearsal.py does that in an environment holding nothing but
# torch and these wheels.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: gpu_check.sh OUT first|second [--rehearsal]}"
part="${2:?usage: gpu_check.sh OUT first|second [--rehearsal]}"
shift 2
begun=$(date +%s)
budget="${HITOBAN_GPU_CHECK_SECONDS:-480}"  # the whole command, install included
wheels="${HITOBAN_WHEELS:-gpu-wheels}"
mkdir -p "$out"
if ! python3 -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
    # not in a virtualenv: one that still sees the machine's torch and whatever else it has
    [ -d .gpu-venv ] || python3 -m venv --system-site-packages .gpu-venv
    . .gpu-venv/bin/activate
fi
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())" \
    | tee "$out/torch.txt" || { echo "no torch in $(command -v python)"; exit 1; }
if ! python3 -m pip install --no-index --find-links "$wheels" -r benchmarks/gpu_requirements.txt > "$out/install.log" 2>&1 \
    || ! python3 -m pip install --no-index --no-deps --no-build-isolation -e . >> "$out/install.log" 2>&1; then
    echo "install failed (wheels from $wheels): see $out/install.log"
    tail -20 "$out/install.log"
    exit 1
fi
installed=$(( $(date +%s) - begun ))
echo "install: $installed s" | tee -a "$out/install.log"
exec python3 benchmarks/gpu_check.py --out "$out" --part "$part" --install-seconds "$installed" \
    --seconds "$(( budget - installed ))" "$@"
