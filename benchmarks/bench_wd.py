"""Weight decay across run lengths: does the best `--weight-decay` stay one number, or follow the AdamW timescale
rule (the product lr x wd x steps held constant: Wang & Aitchison 2024, "How to set AdamW's weight decay as you
scale model and dataset size")?

Why it matters: the decay is coupled to the lr (each step multiplies a weight by 1 - lr x wd), so over a run it
shrinks a weight by about exp(-steps x lr x wd x the schedule's mean). With the default 0.1 at width 256 that exponent
is small over a 200-step sweep run and large over a night of tens of thousands of steps: a decay chosen on short runs
is not the decay a night gets. This benchmark measures which of the two rules the optimum follows, at one width, at
each `--steps`, in the night's regime (under one pass over the training text; the passes are printed).

Every run is `hitoban pretrain` at the `small` shape with the width replaced (bench_lr.py's runs), Muon at its lr
rule and AdamW's group at its own, and `--warmup-steps 0`: the warmup is then 2% of the steps at every length, as
in a night of more than 5,000 steps (the default's 100-step floor would be half of a 200-step run). Scored by the mean
of held-out literature and web bits/char; the optimum is the vertex of a parabola in log2(wd) through the best grid
point and its neighbours (the grid widens by 4x past an edge that wins).

    python benchmarks/bench_wd.py --width 256 --steps 200 800 --grid 0.025 0.1 0.4 1.6 --out bench-wd
    python benchmarks/bench_wd.py --width 256 --steps 800 --grid 0.1 0.4 1.6 --out bench-wd   # adds a length
    python benchmarks/bench_wd.py --from benchmarks/results/wd-steps-2026-12-06/bench_wd.json --out /tmp/wd
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import provenance
from bench_lr import BATCH, CONTEXT, scored, shape, train, vertex
from bench_night import prepare
from corpora import pick_corpus

from hitoban.training.data.shards import load_index
from hitoban.training.optimizer import OptimizerOptions, lr_for_width
from hitoban.training.schedule import ScheduleOptions

DEFAULT_WD = {f.name: f.default for f in dataclasses.fields(OptimizerOptions)}["weight_decay"]  # the product's


def mean_lr_fraction(steps: int) -> float:
    """The schedule's mean lr over the run as a fraction of its peak (the product's, with these runs' --warmup-steps
    0): the decay's exponent over a run is steps x peak lr x wd x this."""
    schedule = ScheduleOptions(warmup_steps=0).schedule_for(1.0, steps)
    return sum(schedule.lr(step) for step in range(steps)) / steps


def exponent(steps: int, lr: float, wd: float) -> float:
    """How much the decay alone shrinks a weight over the run, as the exponent of exp(-x)."""
    return steps * lr * wd * mean_lr_fraction(steps)


def sweep_length(shards: Path, domains: dict, out: Path, width: int, steps: int, grid: list[float],
                 seed: int) -> dict:
    wds, scores = sorted(grid), {}
    while True:
        for wd in wds:
            if wd not in scores:
                folder = out / "runs" / f"w{width}-s{steps}-wd{wd:g}"
                seconds = train(shards, folder, "small", shape(width), {"--weight-decay": wd, "--warmup-steps": 0,
                                                                       "--seed": seed}, steps)
                bpc = scored(folder, domains, out)
                scores[wd] = {"seconds": round(seconds, 1), **{d: round(v, 4) for d, v in bpc.items()},
                              "mean": round(sum(bpc.values()) / len(bpc), 4)}
                print(f"w{width} {steps} steps, wd {wd:g}: {scores[wd]}", flush=True)
        best = int(np.argmin([scores[wd]["mean"] for wd in wds]))
        if best not in (0, len(wds) - 1):
            break
        wds = [float(f"{wds[0] / 4:.3g}")] + wds if best == 0 else wds + [float(f"{wds[-1] * 4:.3g}")]
    optimum, inside = vertex(wds, [scores[wd]["mean"] for wd in wds])
    return {"steps": steps, "grid": {f"{wd:g}": scores[wd] for wd in wds}, "optimum": optimum, "inside_grid": inside}


def report(saved: dict) -> list[str]:
    width, lr, train_tokens = saved["width"], saved["lr"], saved["train_tokens"]
    lines = [f"Weight decay across run lengths at width {width} (Muon lr {lr:g}, its rule), {BATCH} x {CONTEXT} tokens "
             f"a step, {train_tokens:,} training tokens; score: mean held-out bits/char (literature, web).", "",
             "| steps | passes | wd tried: mean (literature, web) | optimum wd | its decay exponent | the default "
             f"{DEFAULT_WD:g}'s exponent | machine | date | command |", "|---|---|---|---|---|---|---|---|---|"]
    for row in saved["rows"]:
        steps = row["steps"]
        tried = "; ".join(f"{wd}: {s['mean']:.3f} ({s['literature']:.3f}, {s['web']:.3f})"
                          for wd, s in row["grid"].items())
        where = "" if row["inside_grid"] else " (grid edge)"
        passes = steps * BATCH * CONTEXT / train_tokens
        lines.append(f"| {steps} | {passes:.2f} | {tried} | {row['optimum']:.3g}{where} "
                     f"| {exponent(steps, lr, row['optimum']):.3g} | {exponent(steps, lr, DEFAULT_WD):.3g} | "
                     f"{row['machine']} | {row['date']} | `{row['command']}` |")
    rows = [r for r in saved["rows"] if r["inside_grid"]]
    if len(rows) >= 2:
        first, last = rows[0], rows[-1]
        measured = math.log(first["optimum"] / last["optimum"]) / math.log(last["steps"] / first["steps"])
        lines += ["", f"The optimum wd scales as steps ^ -{measured:.2f} between {first['steps']} and "
                      f"{last['steps']} steps (the timescale rule predicts steps ^ -1, a constant wd steps ^ 0)."]
    else:
        lines += ["", "Fewer than two lengths have an optimum inside their grid: no exponent is fitted."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=256, help="hidden size (depth 4, the small shape)")
    parser.add_argument("--steps", type=int, nargs="+", default=[200, 800], help="run lengths, steps of 16 x 256")
    parser.add_argument("--grid", type=float, nargs="+", default=[0.025, 0.1, 0.4, 1.6],
                        help="weight decays tried at every length (widened by 4x past an edge that wins)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--corpus", help="corpus folder (default: the larger corpus if present, else tests/corpus)")
    parser.add_argument("--out", default="bench-wd")
    parser.add_argument("--from", dest="saved", metavar="BENCH_WD_JSON",
                        help="no training: report the sweep saved in this bench_wd.json")
    args = parser.parse_args()
    out = Path(args.out)
    if args.saved:
        saved = json.loads(Path(args.saved).read_text())
    else:
        shards, domains = prepare(pick_corpus(args.corpus)[0], out / "data")
        stamp = provenance.stamp()
        rows = {steps: {**sweep_length(shards, domains, out, args.width, steps, args.grid, args.seed), **stamp}
                for steps in sorted(args.steps)}
        earlier = out / "bench_wd.json"  # other lengths of the same sweep, saved by an earlier call: kept
        if earlier.exists():
            before = json.loads(earlier.read_text())
            if (before["width"], before["seed"]) == (args.width, args.seed):
                rows = {**{row["steps"]: row for row in before["rows"]}, **rows}
        saved = {"width": args.width, "lr": lr_for_width(args.width), "seed": args.seed,
                 "train_tokens": load_index(shards)["splits"]["train"]["tokens"],
                 "rows": [rows[steps] for steps in sorted(rows)]}
    lines = report(saved)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_wd.json").write_text(json.dumps(saved, indent=2))
    (out / "bench_wd.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
