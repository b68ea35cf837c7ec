"""Batch size at a fixed token budget: for the tokens a night can read, is a step of more sequences (fewer, larger
steps; more tokens a second on most hardware) or of fewer (more updates) the better model, and does the best batch
follow the budget (the critical-batch view: it grows as the loss falls) or stay a number?

`--steps` names each token budget as steps of this benchmark's reference batch, 16 x 256 tokens (200 is 819,200
tokens); a grid point of batch B trains `--steps` x 16 / B steps of B x 256, so every point of a budget reads the
same tokens, under one pass over the training text (the passes are printed). The learning rates stay at the
product's width rules, as they do when a user changes `--batch-size` (no batch rule in the product), and
`--warmup-steps 0` makes the warmup 2% of each run, as in a night. Every run is run_lengths.py's (`hitoban pretrain`
at the `small` shape with the width replaced), scored by the mean of held-out literature and web bits/char; the
optimum is the vertex of a parabola in log2(batch) through the best point and its neighbours (the grid widens by 2x
past an edge that wins, from 2 sequences up to runs of 25 steps). Each point's seconds are printed too: on this
machine a larger batch is also a faster one per token, and a night is a wall-clock budget.

At the 16-sequence point a budget's run is the same run as bench_wd.py's at the default decay (its flags are those
of bench_wd's run), so a sweep may reuse those runs (copy the run folders: `w256-s200-wd0.1` to `w256-s200-b16`).

    python benchmarks/bench_batch.py --width 256 --seeds 1234 7 --steps 200 --grid 8 16 32 64 --out bench-batch
    python benchmarks/bench_batch.py --width 256 --steps 800 --grid 16 32 64 --no-widen --out bench-batch   # adds
    python benchmarks/bench_batch.py --from benchmarks/results/batch-tokens-2026-12-06/bench_batch.json --out /tmp/bb
    python benchmarks/bench_batch.py --width 256 --seeds 1234 7 --steps 200 --grid 16 32 64 --no-widen \
        --lr-scaling sqrt --out bench-batch-sqrt   # the lrs scaled with the batch (a sweep of its own)
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

import run_lengths
from bench_lr import BATCH
from run_lengths import Knob

from hitoban.training.optimizer import adamw_group_lr_for_width, lr_for_width
from hitoban.training.pretrain.options import TrainingOptions

DEFAULT_BATCH = TrainingOptions.__dataclass_fields__["batch_size"].default  # the product's
MIN_STEPS = 25  # the shortest run a grid may widen to


def steps_at(batch: float, steps: int) -> int:
    """Steps of `batch` sequences that read the tokens of `steps` reference steps (16 sequences); refuses a batch
    that does not divide that budget, where two points would read different tokens."""
    sequences = steps * BATCH
    if sequences % batch:
        raise SystemExit(f"batch {batch:g} does not divide a budget of {sequences} sequences: pick a grid of "
                         f"divisors of {sequences}")
    return int(sequences // batch)


BATCH_SIZE = Knob("--batch-size", "b", fixed={"--warmup-steps": 0}, factor=2,
                  bounds=lambda steps: (2, steps * BATCH / MIN_STEPS), steps_for=steps_at)


def sqrt_rates(batch: float, width: int) -> dict:
    """Both groups' lrs at their width rules (fitted at 16 sequences a step) times sqrt(batch / 16): nanochat's
    scaling of its rates with the batch."""
    scale = math.sqrt(batch / BATCH)
    return {"--lr": lr_for_width(width) * scale, "--adamw-lr": adamw_group_lr_for_width(width) * scale}


SQRT_SCALED = replace(BATCH_SIZE, tag="bsq", flags_for=sqrt_rates,
                      note="Muon and AdamW's group at their rules x sqrt(batch / 16)")


def knob_for(args: argparse.Namespace) -> Knob:
    return SQRT_SCALED if args.lr_scaling == "sqrt" else BATCH_SIZE


def lr_scaling(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lr-scaling", choices=["none", "sqrt"], default="none",
                        help="none: the lrs stay at their width rules whatever the batch, as in the product (default); "
                             "sqrt: both groups' lrs times sqrt(batch / 16), nanochat's scaling (its own run folders)")


def seconds(row: dict) -> str:
    return "; ".join(f"{value}: {point['seconds']:.0f} s" for value, point in row["grid"].items())


def behind_best(row: dict) -> str:
    """How far the product's default batch scored behind the best point of the row ("not tried" where it was not)."""
    default = row["grid"].get(f"{DEFAULT_BATCH:g}")
    if default is None:
        return "not tried"
    return f"{default['mean'] - min(point['mean'] for point in row['grid'].values()):+.3f}"


def report(saved: dict) -> list[str]:
    return run_lengths.report(
        saved, "Batch size at a fixed token budget", "batch",
        ["batch tried: mean (literature, web)", "seconds per run", f"the default {DEFAULT_BATCH}'s gap to the best"],
        lambda row: [seconds(row), behind_best(row)],
        "a fixed batch is steps ^ 0; a batch that grows with the budget, as the critical-batch view has it, "
        "steps ^ k with k > 0")


def main() -> None:
    run_lengths.main(__doc__, knob_for, "bench_batch", [8, 16, 32, 64],
                     "sequences a step tried at every budget (widened by 2x past an edge that wins)", report,
                     lr_scaling)


if __name__ == "__main__":
    main()
