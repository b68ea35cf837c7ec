"""Tokens per second of the night's training step per optimizer, on this machine, side by side in one process.

Rows: AdamW (fused), Muon with torch's bf16 Newton-Schulz, Muon with it in fp32, and what `--optimizer muon` runs
here (the device plan's dtype). Every row is the loop's own `train_step` (forward, backward, clip, update) on the
same random batches, in the run's precision; the rows alternate within each round so machine drift hits all.

A CPU without native bf16 (AVX2 only) can be imitated on one that has it: oneDNN and MKL limited to AVX2, and the
device plan told so:

    python benchmarks/bench_optim.py                                   # this CPU as it is
    ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 HITOBAN_CPU_BF16=0 python benchmarks/bench_optim.py
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import provenance
import torch

from hitoban.modeling import HitobanConfig, HitobanForCausalLM
from hitoban.training.hardware import cpu_model, plan_for
from hitoban.training.optim import build_optimizer
from hitoban.training.step import reset_accelerate_state, train_step

ROWS = {"adamw": ("adamw", "float32"), "muon, bf16 Newton-Schulz (torch's)": ("muon", "bfloat16"),
        "muon, fp32 Newton-Schulz": ("muon", "float32")}


def tok_s(preset: str, batch: int, context: int, vocab: int, steps: int, optimizer: str, muon_dtype: str,
          precision: str) -> float:
    from accelerate import Accelerator

    reset_accelerate_state(cpu=True)
    accelerator = Accelerator(cpu=True, mixed_precision=precision)
    torch.manual_seed(0)
    model = HitobanForCausalLM(HitobanConfig.from_preset(preset, vocab_size=vocab)).train()
    opt = build_optimizer(model, optimizer, 1e-3, muon_dtype=muon_dtype)
    model, opt = accelerator.prepare(model, opt)
    rng = np.random.default_rng(0)
    for step in range(steps + 2):
        if step == 2:
            start = time.perf_counter()
        train_step(model, opt, accelerator, rng.integers(0, vocab, (batch, context + 1)), 1, 1.0)
    seconds = time.perf_counter() - start
    reset_accelerate_state()
    return steps * batch * context / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--precision", default=None, help="default: the device plan's (--precision auto)")
    args = parser.parse_args()
    plan = plan_for("cpu")
    precision = args.precision or plan.precision
    print(f"CPU: {cpu_model() or platform.processor()}, {torch.get_num_threads()} threads; "
          f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', '-')}, "
          f"MKL_ENABLE_INSTRUCTIONS={os.environ.get('MKL_ENABLE_INSTRUCTIONS', '-')}")
    print(f"device plan: {plan.why}; precision {precision}, Muon's Newton-Schulz in {plan.muon_dtype}")
    print(f"{args.preset}, batch {args.batch} x {args.context}, vocab {args.vocab:,}, {args.steps} timed steps x "
          f"{args.rounds} rounds (best of rounds)")
    best = {name: 0.0 for name in ROWS}
    for _ in range(args.rounds):
        for name, (optimizer, dtype) in ROWS.items():
            best[name] = max(best[name], tok_s(args.preset, args.batch, args.context, args.vocab, args.steps,
                                               optimizer, dtype, precision))
    default = "muon, bf16 Newton-Schulz (torch's)" if plan.muon_dtype == "bfloat16" else "muon, fp32 Newton-Schulz"
    for name, value in best.items():
        mark = "  <- --optimizer muon here (the default)" if name == default else ""
        print(f"  {name:<38} {value:>9,.0f} tok/s   {value / best['adamw']:.2f}x AdamW{mark}")
    muon = [f"{'**' if name == default else ''}{best[name]:,.0f} ({best[name] / best['adamw']:.2f}x)"
            f"{'**' if name == default else ''}" for name in list(ROWS)[1:]]
    print("\nFor docs/benchmarks.md (bold: the default here):\n")
    print("\n".join(provenance.table(["machine's plan", "AdamW tok/s", *list(ROWS)[1:]],
                                     [[precision, f"{best['adamw']:,.0f}", *muon]])))


if __name__ == "__main__":
    main()
