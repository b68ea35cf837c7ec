"""Warmup across run lengths: does the best warmup stay a number of steps (the product's floor, `--warmup-steps`
100) or a share of the run (`--warmup-frac` 2%)? The product's rule is the larger of the two, so a sweep run of 200
steps warms up for half its length and a night of 22,460 steps for 449 steps; which term should govern is measured
here, at one width, at each `--steps`, in the night's regime (under one pass over the training text; the passes are
printed).

Every run is run_lengths.py's (`hitoban pretrain` at the `small` shape with the width replaced, Muon and AdamW's group
at their lr rules, the default weight decay) with `--warmup-frac 0`, so the warmup is exactly `--warmup-steps`, from
2% of the peak. At 2% of the run (4 steps of 200, 16 of 800) a run is the same schedule as bench_wd.py's run at the
default decay. Scored by the mean of held-out literature and web bits/char; the optimum is the vertex of a parabola in
log2(steps) through the best grid point and its neighbours (the grid widens by 4x past an edge that wins, from 1
step to half the run).

    python benchmarks/bench_warmup.py --width 256 --steps 200 800 --grid 1 4 16 64 --out bench-warmup
    python benchmarks/bench_warmup.py --from benchmarks/results/warmup-steps-2026-12-06/bench_warmup.json --out /tmp/wu
"""

from __future__ import annotations

import run_lengths
from run_lengths import Knob

from hitoban.training.schedule import ScheduleOptions

WARMUP = Knob("--warmup-steps", "wu", fixed={"--warmup-frac": 0}, factor=4, bounds=lambda steps: (1, steps // 2))


def product_warmup(steps: int) -> int:
    """The warmup the product's defaults give a run of `steps` (max(100 steps, 2%), below the run's length)."""
    return ScheduleOptions().schedule_for(1.0, steps).warmup


def report(saved: dict) -> list[str]:
    return run_lengths.report(
        saved, "Warmup", "warmup", ["warmup steps tried: mean (literature, web)", "its share of the run",
                                    "the product's warmup"],
        lambda row: [f"{row['optimum'] / row['steps']:.1%}", str(product_warmup(row["steps"]))],
        "a fixed number of steps is steps ^ 0, a fixed share of the run steps ^ 1")


def main() -> None:
    run_lengths.main(__doc__, WARMUP, "bench_warmup", [1, 4, 16, 64],
                     "warmup steps tried at every length (widened by 4x past an edge that wins, up to half the run)",
                     report)


if __name__ == "__main__":
    main()
