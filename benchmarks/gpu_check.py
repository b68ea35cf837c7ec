"""The GPU check: every device path a night uses, run for real on one CUDA GPU (or a Mac), in a few minutes.

Stages (each in its own process, each with its own time limit, each a row of OUT/gpu_check.md with its output kept
in OUT/<stage>.log; a stage that fails does not stop the others):
  env        torch, CUDA, the device, its compute capability, and the device plan hitoban derives from them
  doctor     `hitoban doctor`: kill and resume, compile auto, memory estimate vs measured peak, bits/char, KV cache
  pretrain   a `3lm`-shape night (35.7M parameters, vocab 32,000, context 512, batch 32) in --precision auto, a few
             hundred steps with --compile auto: tok/s and MFU (target >= 40% on an H100-class GPU, nanochat's)
  killtest   `hitoban killtest` at that shape (eager: six runs would spend their minutes compiling)
  model      benchmarks/bench_model.py --preset 3lm --batch 32 --ctx 512 --compile: hitoban vs Llama, side by side
  night      benchmarks/bench_night.py at GPU scale: time to the HF Trainer's bits/char

On the GPU machine, from the repository root (offline; the wheels it lacks come from --wheels, see
benchmarks/gpu_wheels.sh):

    bash benchmarks/gpu_check.sh OUT [STAGE ...]        # installs, then runs this script
    python benchmarks/gpu_check.py --out OUT [--stages doctor pretrain] [--steps 300]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGES = {"env": 60, "doctor": 240, "pretrain": 240, "killtest": 300, "model": 180, "night": 420}  # seconds

ENV = r"""
import json, platform, torch
from hitoban.training.hardware import device_facts, plan_device
from hitoban.modeling.loading import device_for
device = device_for()
facts = device_facts(device)
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "device": str(device),
                  "facts": facts.__dict__, "plan": plan_device(facts).record(), "python": platform.python_version(),
                  "memory_gb": (torch.cuda.get_device_properties(device).total_memory / 2**30
                                if device.type == "cuda" else None)}, default=str))
"""

DATA = r"""
import sys
from pathlib import Path
from hitoban.training.data.corpus import build_corpus, local_source
from hitoban.training.data.filters import FilterSettings
from hitoban.training.data.shards import build_shards
from hitoban.training.data.tokenizer import train_tokenizer_from_corpus
corpus, out = Path(sys.argv[1]), Path(sys.argv[2])
if not (out / "shards" / "shards_index.json").exists():
    books = [str(p) for p in sorted((corpus / "literature").glob("*.txt"))]
    build_corpus([local_source(books, name="literature", doc_per_file=True, license="public domain")],
                 out / "corpus", settings=FilterSettings(near_dup_threshold=None), progress=False)
    train_tokenizer_from_corpus(out / "corpus", out / "tok", vocab_size=32000, hard_vocab_limit=False)
    build_shards(out / "corpus", out / "tok", out / "shards", shard_tokens=2_000_000, val_every=50, context=512,
                 progress=False)
print(out / "shards")
"""

# `hitoban killtest`'s harness without its figure (matplotlib is not among the carried wheels)
KILLTEST = r"""
import json, sys
from hitoban.training.pretrain.killtest import run_killtest
options = ["--preset", "3lm", "--batch-size", "32", "--context", "512", "--compile", "off"]
result = run_killtest(sys.argv[1], sys.argv[2], options, steps=60, kills=2)
print(json.dumps({k: result[k] for k in ("passed", "mode", "noise", "killed_diff", "control_diff", "checks")}))
sys.exit(0 if result["passed"] else 1)
"""


def run_stage(name: str, command: list[str], out: Path, limit: int) -> dict:
    started = time.time()
    log = out / f"{name}.log"
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=limit,
                              env={**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"})
        output, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as error:
        output = (error.stdout or b"").decode(errors="replace") if isinstance(error.stdout, bytes) else (
            error.stdout or "")
        output, code = output + f"\n[timed out after {limit} s]", 124
    log.write_text(output, encoding="utf-8")
    return {"stage": name, "exit": code, "seconds": round(time.time() - started, 1), "tail": output[-1500:]}


def summarise(name: str, row: dict, out: Path) -> str:
    """One line of what the stage measured, read from what it wrote."""
    try:
        if name == "env":
            env = json.loads(row["tail"].strip().splitlines()[-1])
            return (f"torch {env['torch']} (CUDA {env['cuda']}), {env['facts']['name']}, compute capability "
                    f"{env['facts']['capability']}; plan: {env['plan']['why']}")
        if name == "doctor":
            report = json.loads((out / "doctor" / "doctor.json").read_text())
            return "; ".join(f"{c['name']} {'ok' if c['passed'] else 'n/a' if c['passed'] is None else 'FAIL'}"
                             for c in report["checks"])
        if name == "pretrain":
            summary = json.loads((out / "night" / "summary.json").read_text())
            records = [json.loads(line) for line in (out / "night" / "log.jsonl").read_text().splitlines()]
            train = [r for r in records if r["type"] == "train"]
            return (f"{summary['steps']} steps, {train[-1]['tok_per_sec']:,.0f} tok/s (last window), MFU "
                    f"{summary['mfu']:.1%} median ({summary['mfu_peak']}), compiled {summary['compiled']}")
        if name == "killtest":
            result = json.loads((out / "killtest" / "killtest.json").read_text())
            return (f"passed {result['passed']} ({result['mode']}): noise {result['noise']:.2e}, killed diff "
                    f"{result['killed_diff']:.2e}, control {result['control_diff']:.2e}")
    except (OSError, ValueError, KeyError, IndexError) as error:
        return f"(no result to read: {type(error).__name__})"
    return row["tail"].strip().splitlines()[-1][:300] if row["tail"].strip() else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-out"))
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=list(STAGES))
    parser.add_argument("--steps", type=int, default=300, help="pretrain stage: steps of the 3lm-shape night")
    parser.add_argument("--corpus", default=str(REPO / "tests" / "corpus"), help="text for the 3lm-shape shards")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    py, cli = sys.executable, [sys.executable, "-m", "hitoban.cli"]
    data = out / "data"
    needs_data = {"pretrain", "killtest"} & set(args.stages)
    rows = []
    if needs_data:
        rows.append(run_stage("data", [py, "-c", DATA, args.corpus, str(data)], out, 300))
    shards = str(data / "shards")
    night = ["--data", shards, "--preset", "3lm", "--batch-size", "32", "--context", "512", "--no-progress"]
    commands = {
        "env": [py, "-c", ENV],
        "doctor": cli + ["doctor", "--out", str(out / "doctor")],
        "pretrain": cli + ["pretrain", *night, "--out", str(out / "night"), "--steps", str(args.steps),
                           "--eval-every", str(args.steps), "--log-every", "50", "--resume", "never"],
        "killtest": [py, "-c", KILLTEST, shards, str(out / "killtest")],
        "model": [py, "benchmarks/bench_model.py", "--preset", "3lm", "--batch", "32", "--ctx", "512", "--compile",
                  "--json", str(out / "bench_model.json")],
        "night": [py, "benchmarks/bench_night.py", "--out", str(out / "bench-night"), "--tokens", "9830400"],
    }
    for name in args.stages:
        row = run_stage(name, commands[name], out, STAGES[name])
        row["result"] = summarise(name, row, out)
        rows.append(row)
        print(f"{name:<9} exit {row['exit']:>3}  {row['seconds']:>6.1f} s  {row.get('result', '')}", flush=True)
    lines = [f"GPU check, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             "| stage | exit | seconds | result |", "|---|---:|---:|---|"]
    lines += [f"| {r['stage']} | {r['exit']} | {r['seconds']} | {r.get('result', '').replace('|', '/')} |"
              for r in rows]
    (out / "gpu_check.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out / "gpu_check.json").write_text(json.dumps(rows, indent=2, ensure_ascii=False), encoding="utf-8")
    print("\n".join(lines))
    sys.exit(0 if all(r["exit"] == 0 for r in rows) else 1)


if __name__ == "__main__":
    main()
