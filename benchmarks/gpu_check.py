"""The GPU check: every device path a night uses, run for real on one CUDA GPU (or a Mac), in two short commands.

A lent GPU gives 15 minutes in all and 10 a command, so the check is two parts of at most 8 minutes each
(`--seconds`, install included: gpu_check.sh passes what its install left), the most important first:

  first    env       torch, CUDA, the device, its compute capability, the device plan hitoban derives from them
           data      corpus -> tokenizer (vocab 32,000) -> shards from tests/corpus (no near-duplicate filter:
                     mmh3 is not carried)
           doctor    `hitoban doctor`: kill and resume, compile auto, memory estimate vs measured peak, bits/char,
                     KV cache
           pretrain  a `3lm`-shape night (35.7M parameters, vocab 32,000, context 512, batch 32), --precision auto,
                     a few hundred steps with --compile auto: tok/s and MFU
  second   data      (again on a fresh machine; kept where it is there)
           killtest  `hitoban killtest`'s harness at the 3lm shape (eager: six runs would spend their time compiling)
           model     benchmarks/bench_model.py --preset 3lm --batch 32 --ctx 512 --compile --no-space
           night     benchmarks/bench_night.py at GPU scale, the Trainer beside hitoban's defaults (--runs same)

Each stage runs in its own process under its own limit, cut to what is left of the part's seconds; a stage that
fails does not stop the others, and OUT/gpu_check.md and .json are rewritten as each stage ends, so a command cut
short still returns what ran. `--rehearsal`: the same stages on the CPU at small sizes, to find a missing import
here rather than on the GPU (benchmarks/gpu_rehearsal.py runs it in an environment of torch and the carried wheels
alone).

    bash benchmarks/gpu_check.sh OUT first           # installs, then runs this script
    python benchmarks/gpu_check.py --out OUT --part first [--seconds 450] [--rehearsal]
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
PARTS = {"first": ("env", "data", "doctor", "pretrain"), "second": ("data", "killtest", "model", "night")}
LIMITS = {"env": 45, "data": 90, "doctor": 210, "pretrain": 150, "killtest": 180, "model": 150, "night": 150}
MIN_STAGE_SECONDS = 15  # a stage with less than this left is reported as not run, not started to be killed

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
result = run_killtest(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), steps=int(sys.argv[4]), kills=2)
print(json.dumps({k: result[k] for k in ("passed", "mode", "noise", "killed_diff", "control_diff", "checks")}))
sys.exit(0 if result["passed"] else 1)
"""


def sizes(rehearsal: bool) -> dict:
    """The night's shape and the stages' lengths: the GPU's, or the CPU rehearsal's (the same code, small)."""
    if rehearsal:
        return {"shape": ["--preset", "tiny", "--batch-size", "8", "--context", "64"], "steps": 10,
                "doctor_steps": 30, "kill_steps": 30, "model": ["--preset", "tiny", "--batch", "2", "--ctx", "64",
                                                                "--repeats", "1", "--new-tokens", "8",
                                                                "--memory-samples", "1"],
                "night_tokens": 16384, "night": ["--heldout-chars", "10000"]}
    return {"shape": ["--preset", "3lm", "--batch-size", "32", "--context", "512"], "steps": 300,
            "doctor_steps": None, "kill_steps": 60,
            "model": ["--preset", "3lm", "--batch", "32", "--ctx", "512", "--compile"], "night_tokens": 4_915_200,
            "night": []}


def commands(out: Path, corpus: str, rehearsal: bool) -> dict[str, list[str]]:
    py, cli = sys.executable, [sys.executable, "-m", "hitoban.cli"]
    size, shards = sizes(rehearsal), str(out / "data" / "shards")
    pretrain_args = ["--data", shards, *size["shape"], "--no-progress"]
    doctor_steps = ["--steps", str(size["doctor_steps"])] if size["doctor_steps"] else []
    return {
        "env": [py, "-c", ENV],
        "data": [py, "-c", DATA, corpus, str(out / "data")],
        "doctor": cli + ["doctor", "--out", str(out / "doctor"), *doctor_steps],
        "pretrain": cli + ["pretrain", *pretrain_args, "--out", str(out / "night"), "--steps", str(size["steps"]),
                           "--eval-every", str(size["steps"]), "--log-every", str(max(1, size["steps"] // 6)),
                           "--resume", "never"],
        "killtest": [py, "-c", KILLTEST, shards, str(out / "killtest"),
                     json.dumps([*size["shape"], "--compile", "off"]), str(size["kill_steps"])],
        "model": [py, "benchmarks/bench_model.py", *size["model"], "--no-space", "--json",
                  str(out / "bench_model.json")],
        "night": [py, "benchmarks/bench_night.py", "--out", str(out / "bench-night"), "--corpus", corpus,
                  "--tokens", str(size["night_tokens"]), "--runs", "same", "--near-dup", "0", *size["night"]],
    }


def run_stage(name: str, command: list[str], out: Path, limit: float) -> dict:
    started = time.time()
    log = out / f"{name}.log"
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=limit,
                              env={**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"})
        output, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as error:
        output = "".join(part.decode(errors="replace") if isinstance(part, bytes) else (part or "")
                         for part in (error.stdout, error.stderr))
        output, code = output + f"\n[timed out after {limit:.0f} s]", 124
    log.write_text(output, encoding="utf-8")
    return {"stage": name, "exit": code, "seconds": round(time.time() - started, 1), "limit": round(limit),
            "tail": output[-1500:]}


def summarise(name: str, row: dict, out: Path) -> str:
    """One line of what the stage measured, read from what it wrote."""
    try:
        if name == "env":
            env = json.loads(row["tail"].strip().splitlines()[-1])
            return (f"torch {env['torch']} (CUDA {env['cuda']}), {env['facts']['name'] or env['device']}, compute "
                    f"capability {env['facts']['capability']}; plan: {env['plan']['why']}")
        if name == "doctor":
            report = json.loads((out / "doctor" / "doctor.json").read_text())
            return "; ".join(f"{c['name']} {'ok' if c['passed'] else 'n/a' if c['passed'] is None else 'FAIL'}: "
                             f"{c['detail'][:160]}" for c in report["checks"])
        if name == "pretrain":
            summary = json.loads((out / "night" / "summary.json").read_text())
            records = [json.loads(line) for line in (out / "night" / "log.jsonl").read_text().splitlines()]
            train = [r for r in records if r["type"] == "train"]
            mfu = f"{summary['mfu']:.1%}" if summary.get("mfu") is not None else "n/a"
            # Val loss after many passes over a small corpus measures memorising, not the night: say how many.
            return (f"{summary['steps']} steps, {train[-1]['tok_per_sec']:,.0f} tok/s (last window), MFU {mfu} "
                    f"median ({summary['mfu_peak']}), compiled {summary['compiled']}; val loss "
                    f"{summary['best_val']:.3f} after {summary['passes']:.1f} passes over the training text")
        if name == "killtest":
            result = json.loads((out / "killtest" / "killtest.json").read_text())
            return (f"passed {result['passed']} ({result['mode']}): noise {result['noise']:.2e}, killed diff "
                    f"{result['killed_diff']:.2e}, control {result['control_diff']:.2e}")
        if name == "model":
            rows = json.loads((out / "bench_model.json").read_text())["rows"]
            return "; ".join(f"{r['row']} {r['hitoban']:,.0f} vs {r['llama']:,.0f} {r['unit']} (x{r['ratio']:.2f})"
                             for r in rows if r["row"].startswith(("train step", "hitoban default")))
        if name == "night":
            rows = json.loads((out / "bench-night" / "bench_night.json").read_text())["rows"]
            return "; ".join(f"{r['run']}: {r['seconds']} s, {r['bpc_literature']:.3f}/{r['bpc_web']:.3f} bits/char "
                             "(literature/web)" for r in rows)
    except (OSError, ValueError, KeyError, IndexError, TypeError) as error:
        return f"(no result to read: {type(error).__name__})"
    return row["tail"].strip().splitlines()[-1][:300] if row["tail"].strip() else ""


def write_report(rows: list[dict], out: Path, part: str, install_seconds: float | None) -> str:
    lines = [f"GPU check, part {part}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
             + (f"; install {install_seconds:.0f} s" if install_seconds is not None else ""), "",
             "| stage | exit | seconds (limit) | result |", "|---|---:|---:|---|"]
    lines += [f"| {r['stage']} | {r['exit']} | {r['seconds']} ({r['limit']}) | "
              f"{r.get('result', '').replace('|', '/')} |" for r in rows]
    text = "\n".join(lines) + "\n"
    (out / "gpu_check.md").write_text(text, encoding="utf-8")
    (out / "gpu_check.json").write_text(json.dumps({"part": part, "install_seconds": install_seconds,
                                                    "stages": rows}, indent=2, ensure_ascii=False),
                                        encoding="utf-8")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-out"))
    parser.add_argument("--part", choices=list(PARTS), required=True)
    parser.add_argument("--stages", nargs="+", choices=list(LIMITS), help="only these stages of the part")
    parser.add_argument("--seconds", type=float, default=450, help="the part's whole time (default: 450)")
    parser.add_argument("--install-seconds", type=float, default=None, help="reported beside the stages")
    parser.add_argument("--rehearsal", action="store_true", help="the CPU at small sizes (see above)")
    parser.add_argument("--corpus", default=str(REPO / "tests" / "corpus"), help="text for the shards")
    args = parser.parse_args()
    deadline = time.time() + args.seconds
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.rehearsal:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the CPU, even on a machine with a GPU
    todo = commands(out, args.corpus, args.rehearsal)
    rows = []
    for name in PARTS[args.part]:
        if args.stages and name not in args.stages:
            continue
        left = deadline - time.time()
        if left < MIN_STAGE_SECONDS:
            row = {"stage": name, "exit": None, "seconds": 0, "limit": 0, "tail": "",
                   "result": f"not run: {left:.0f} s left of the part's {args.seconds:.0f}"}
        else:
            row = run_stage(name, todo[name], out, min(LIMITS[name], left))
            row["result"] = summarise(name, row, out)
        rows.append(row)
        print(f"{name:<9} exit {row['exit']!s:>4}  {row['seconds']:>6.1f} s  {row['result']}", flush=True)
        write_report(rows, out, args.part, args.install_seconds)
    print(write_report(rows, out, args.part, args.install_seconds))
    sys.exit(0 if all(r["exit"] == 0 for r in rows) else 1)


if __name__ == "__main__":
    main()
