"""The learning-rate rules, fitted and checked: sweeps of one parameter group's lr at several widths in the night's
regime. `--group muon` sweeps `--lr` (Muon's hidden matrices; AdamW's group at its own rule), `--group adamw` sweeps
`--adamw-lr` (the tied embedding and the norms; Muon at its rule).

Each width is the `small` preset's shape (depth 4, head 64, SwiGLU 8/3) at another hidden size, trained with hitoban's
defaults (Muon + AdamW, WSD; Muon's update is scaled to AdamW's RMS, so both groups' rates read alike) for the same
steps of 16 x 256
tokens, reading its training text less than once (the passes are printed), and scored by bits/char on held-out
literature and web never trained on (their mean decides). The measured optimum at each width is the vertex of a
parabola through the best grid point and its neighbours in log2(lr); the group's rule `lr = at_256 * (256 / width)
** exponent` (training/optimizer.py) is fitted to those optima so that the largest factor between rule and
optimum is smallest (the target's own terms: within 1.5x at every width), and `--check 3lm` trains the `3lm` shape
(width 512, depth 6; this benchmark's vocabulary 8000 and context 256) at that fit's lr and at half and twice it.
`--depths` sweeps each width at other numbers of layers too (the product's rule has no depth term: these rows
check it there, and stay out of the fit, which reads depth 4). `--from` refits and reports a saved sweep without
training.

    python benchmarks/bench_lr.py [--group muon] [--widths 128 256 384] [--steps 200] [--check 3lm] [--out bench-lr]
    python benchmarks/bench_lr.py --group adamw --widths 64 128 256 --grid 0.25 0.5 1 2 4 --out bench-lr-adamw
    python benchmarks/bench_lr.py --widths 256 --depths 2 4 8 --check none --out bench-lr   # the rule at other depths
    python benchmarks/bench_lr.py --from benchmarks/results/lr-sweep-2026-12-05/bench_lr.json --out /tmp/lr-fit

Every run is a subprocess of `hitoban pretrain` with the preset's width replaced in that process only. The corpus is
bench_night.py's (the larger one where present; the first line says which).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import provenance
from bench_night import bits_per_char, prepare, run
from corpora import pick_corpus

from hitoban.training.data.shards import load_index
from hitoban.training.optimizer import (
    ADAMW_GROUP_LR_AT_256,
    ADAMW_GROUP_LR_WIDTH_EXPONENT,
    LR_AT_256,
    LR_WIDTH_EXPONENT,
    adamw_group_lr_for_width,
    lr_for_width,
)

WITH_SHAPE = r'''
import json, sys
from hitoban.modeling import configuration_hitoban
configuration_hitoban.PRESETS[sys.argv[1]] = {**configuration_hitoban.PRESETS[sys.argv[1]], **json.loads(sys.argv[2])}
from hitoban.cli import main
sys.exit(main(sys.argv[3:]))
'''
BATCH, CONTEXT = 16, 256
DEFAULT_SEED = 1234  # `hitoban pretrain --seed`'s default
RULES = {"muon": (LR_AT_256, LR_WIDTH_EXPONENT, lr_for_width, "LR_AT_256, LR_WIDTH_EXPONENT"),
         "adamw": (ADAMW_GROUP_LR_AT_256, ADAMW_GROUP_LR_WIDTH_EXPONENT, adamw_group_lr_for_width,
                   "ADAMW_GROUP_LR_AT_256, ADAMW_GROUP_LR_WIDTH_EXPONENT")}  # each group's product rule


DEPTH = 4  # the small preset's: the widths' sweeps and the fit are at this depth


def shape(width: int, depth: int = DEPTH) -> dict:
    return {"hidden_size": width, "num_hidden_layers": depth, "num_attention_heads": max(1, width // 64)}


def pretrain_argv(shards: Path, folder: Path, preset: str, rates: dict[str, float | int], steps: int) -> list[str]:
    """`hitoban pretrain`'s arguments for one run: BATCH x CONTEXT tokens a step unless `rates` sets the batch."""
    flags = {"--batch-size": BATCH, "--context": CONTEXT, "--steps": steps, **rates}
    return ["pretrain", "--data", str(shards), "--preset", preset,
            *(x for flag, value in flags.items() for x in (flag, f"{value:g}")),
            "--eval-every", "1000000", "--eval-batches", "2", "--resume", "never", "--no-progress",
            "--out", str(folder)]


def train(shards: Path, folder: Path, preset: str, overrides: dict, rates: dict[str, float | int], steps: int
          ) -> float:
    """Seconds for one `hitoban pretrain` at this shape and these settings ({"--lr": ..., "--adamw-lr": ...,
    "--seed": ..., and "--batch-size" where not BATCH}; skipped where its final/ is already there)."""
    if (folder / "final" / "model.safetensors").exists():
        return json.loads((folder / "seconds.json").read_text())
    argv = pretrain_argv(shards, folder, preset, rates, steps)
    seconds = run([sys.executable, "-c", WITH_SHAPE, preset, json.dumps(overrides)] + argv)
    (folder / "seconds.json").write_text(json.dumps(seconds))
    return seconds


def scored(folder: Path, domains: dict, out: Path) -> dict[str, float]:
    """Held-out bits/char per domain of the run in `folder`, kept beside it (a rerun that adds seeds or a check
    scores only its new runs)."""
    saved = folder / "bits_per_char.json"
    if saved.exists():
        return json.loads(saved.read_text())
    bpc = bits_per_char({"run": folder / "final"}, domains, out)
    result = {d: bpc[("run", d)] for d in domains}
    saved.write_text(json.dumps(result))
    return result


def vertex(lrs: list[float], scores: list[float]) -> tuple[float, bool]:
    """(the optimum lr, whether it lies inside the grid): a parabola in log2(lr) through the best point and its two
    neighbours; the best grid point itself where it sits at an edge."""
    best = int(np.argmin(scores))
    if best in (0, len(lrs) - 1):
        return lrs[best], False
    x = np.log2(lrs[best - 1: best + 2])
    a, b, _ = np.polyfit(x, scores[best - 1: best + 2], 2)
    return float(2 ** (-b / (2 * a))), True


def seeded_point(shards: Path, domains: dict, out: Path, name: str, preset: str, overrides: dict,
                 flags: dict[str, float | int], steps: int, seeds: tuple[int, ...] | list[int]) -> dict:
    """One grid point trained at every seed and scored: the seeds' mean seconds and bits/char per domain, the mean
    over domains ("mean"), and each seed's ("seeds") where there are several. A seed's run is `out`/runs/`name`, with
    "-s{seed}" for seeds other than pretrain's default (which keeps the folder names of sweeps made before --seeds)."""
    runs = []
    for seed in seeds:
        folder = out / "runs" / (name + ("" if seed == DEFAULT_SEED else f"-s{seed}"))
        seconds = train(shards, folder, preset, overrides, {**flags, "--seed": seed}, steps)
        runs.append({"seconds": seconds, **scored(folder, domains, out)})
    point = {key: round(float(np.mean([r[key] for r in runs])), 4 if key in domains else 1)
             for key in ("seconds", *domains)}
    per_seed = [sum(r[d] for d in domains) / len(domains) for r in runs]
    point["mean"] = round(float(np.mean(per_seed)), 4)
    if len(seeds) > 1:
        point["seeds"] = {str(seed): round(m, 4) for seed, m in zip(seeds, per_seed)}
    print(f"{name}: {point}", flush=True)
    return point


def grid_search(values: list[float], evaluate: Callable[[float], float], factor: float | None,
                bounds: tuple[float, float] = (0.0, math.inf)) -> list[float]:
    """The grid actually evaluated: every value (3 significant digits), then, while the best (lowest score) sits at
    an edge, one more value `factor` beyond that edge (none when `factor` is None, or past `bounds`). `evaluate` runs
    once per value."""
    values, seen = sorted({float(f"{v:.3g}") for v in values}), {}
    while True:
        for value in values:
            if value not in seen:
                seen[value] = evaluate(value)
        best = int(np.argmin([seen[v] for v in values]))
        if factor is None or best not in (0, len(values) - 1):
            return values
        beyond = float(f"{values[0] / factor:.3g}") if best == 0 else float(f"{values[-1] * factor:.3g}")
        if not bounds[0] <= beyond <= bounds[1]:
            return values
        values = sorted(values + [beyond])


def sweep(shards: Path, domains: dict, out: Path, label: str, preset: str, overrides: dict, lrs: list[float],
          steps: int, widen: bool, group: str = "muon", seeds: tuple[int, ...] = (1234,)) -> dict:
    """Train at every lr of `group` at every seed (and one more lr beyond an edge that wins, when `widen`), score
    (the seeds' mean), find the optimum. Sweeping AdamW's group, Muon runs at its rule's lr for the width (what the
    product would give it)."""
    width = overrides["hidden_size"]
    scores: dict[float, dict] = {}

    def evaluate(lr: float) -> float:
        rates = {"--lr": lr} if group == "muon" else {"--lr": lr_for_width(width), "--adamw-lr": lr}
        scores[lr] = seeded_point(shards, domains, out, f"{label}-lr{lr:g}", preset, overrides, rates, steps, seeds)
        return scores[lr]["mean"]

    lrs = grid_search(lrs, evaluate, factor=2 if widen else None)
    optimum, inside = vertex(lrs, [scores[lr]["mean"] for lr in lrs])
    return {"label": label, "overrides": overrides, "steps": steps, "group": group,
            "grid": {f"{lr:g}": scores[lr] for lr in lrs}, "optimum": optimum, "inside_grid": inside}


def fit(rows: list[dict]) -> tuple[float, float] | None:
    """(lr at width 256, exponent) of lr = a * (256 / width) ** k over the optima, fitted as the target is stated:
    the smallest largest factor between rule and optimum (minimax in log-log; least squares let one noisy width
    pull the line past 1.5x at another). None below two widths: one optimum fixes no exponent."""
    rows = [r for r in rows if r["overrides"].get("num_hidden_layers", DEPTH) == DEPTH]  # not the depth sweep's
    if len({r["overrides"]["hidden_size"] for r in rows}) < 2:
        return None
    x = np.log([256 / r["overrides"]["hidden_size"] for r in rows])
    y = np.log([r["optimum"] for r in rows])
    exponents = np.linspace(0.0, 2.0, 20_001)
    residuals = y[None, :] - exponents[:, None] * x[None, :]
    spread = residuals.max(axis=1) - residuals.min(axis=1)
    best = int(np.argmin(spread))
    centre = (residuals[best].max() + residuals[best].min()) / 2
    return float(math.exp(centre)), float(exponents[best])


def report(rows: list[dict], train_tokens: int, fitted_rule: tuple[float, float] | None, group: str = "muon"
           ) -> list[str]:
    """The results page's table: each shape's grid, its optimum, the fit's (where there is one) and the product
    rule's lr against it."""
    at_256, exponent, rule, names = RULES[group]
    a, k = fitted_rule or (None, None)
    fitted_words = (f"Fitted on the swept widths' optima (minimax in log-log): {a:.3g} x (256 / width) ^ {k:.2f}"
                    if fitted_rule else "Not fitted (one width swept: a check of the rule, not a fit)")
    lines = [f"Group swept: {group}. Training text: {train_tokens:,} tokens. {fitted_words}; the product's rule "
             f"(training/optimizer.py, {names}): {at_256:g} x (256 / width) ^ {exponent:g}.", ""]
    body = []
    for row in rows:
        width = row["overrides"]["hidden_size"]
        tried = "; ".join(f"{lr}: {s['mean']:.3f} ({s['literature']:.3f}, {s['web']:.3f})" for lr, s in
                          row["grid"].items())
        edge = "" if row["inside_grid"] else " (grid edge)"
        passes = row["steps"] * BATCH * CONTEXT / train_tokens
        product = rule(width)
        fitted = ""
        if fitted_rule:
            at_fit = a * (256 / width) ** k
            fitted = f"{at_fit:.3g} ({at_fit / row['optimum']:.2f}x)"
        seeds = len(next(iter(row["grid"].values())).get("seeds", {0: 0}))
        body.append([f"{row['label']} (width {width})", row["steps"], f"{passes:.3f}", seeds, tried,
                     f"{row['optimum']:.3g}{edge}", fitted,
                     f"{product:.3g} ({product / row['optimum']:.2f}x)"])
    return lines + provenance.table(["shape", "steps", "passes", "seeds",
                                     "lr tried: mean held-out bits/char (literature, web)", "measured optimum",
                                     "fit's lr (/ optimum)", "product's lr (/ optimum)"], body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--group", choices=sorted(RULES), default="muon", help="the parameter group whose lr is "
                        "swept: muon (--lr) or adamw (--adamw-lr); the other runs at its product rule")
    parser.add_argument("--widths", type=int, nargs="+", default=[128, 256, 384], help="hidden sizes swept")
    parser.add_argument("--depths", type=int, nargs="+", default=[DEPTH], help="layers swept at every width (the "
                        "fit reads depth 4's rows only; the others check the width rule at another depth)")
    parser.add_argument("--steps", type=int, default=200, help="steps of 16 x 256 tokens per run")
    parser.add_argument("--grid", type=float, nargs="+", default=[0.5, 1, 2],
                        help="multiples of the centre lr tried at each width (widened by 2x past an edge that wins)")
    parser.add_argument("--centre", type=float, nargs=2, metavar=("AT_256", "EXPONENT"), help="the grid's centre "
                        "at each width: AT_256 x (256 / width) ^ EXPONENT (default: the group's product rule, "
                        "training/optimizer.py)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1234], help="train every grid point at each of "
                        "these seeds (init and batches); a point's score is their mean")
    parser.add_argument("--check-seeds", type=int, nargs="+", help="the 3lm check's seeds (default: --seeds)")
    parser.add_argument("--check", choices=["3lm", "none"], default="3lm", help="also train the 3lm shape at the "
                        "fitted lr, half and twice it")
    parser.add_argument("--check-steps", type=int, default=200)
    parser.add_argument("--corpus", help="corpus folder (default: the larger corpus if present, else tests/corpus)")
    parser.add_argument("--out", default="bench-lr")
    parser.add_argument("--from", dest="saved", metavar="BENCH_LR_JSON", help="no training: fit and report the "
                        "sweep saved in this bench_lr.json (e.g. benchmarks/results/lr-sweep-2026-12-05/)")
    args = parser.parse_args()
    out = Path(args.out)
    if args.saved:
        saved = json.loads(Path(args.saved).read_text())
        train_tokens, rows, group = saved["train_tokens"], saved["rows"], saved.get("group", "muon")
    else:
        train_tokens, rows = run_sweeps(args, out)
        group = args.group
    fitted = fit([row for row in rows if row["label"] != "3lm"])
    lines = report(rows, train_tokens, fitted, group)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_lr.json").write_text(json.dumps({"train_tokens": train_tokens, "group": group, "fit": fitted,
                                                   "rows": rows}, indent=2))
    (out / "bench_lr.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def run_sweeps(args: argparse.Namespace, out: Path) -> tuple[int, list[dict]]:
    """Train the grid at every width, then (`--check 3lm`) the 3lm shape around the fit's lr for it."""

    at_256, exponent = args.centre or RULES[args.group][:2]
    if args.check == "3lm" and (len(set(args.widths)) < 2 or DEPTH not in args.depths):  # before anything trains
        raise SystemExit(f"bench_lr: --check 3lm predicts from a fit over two widths or more at depth {DEPTH}; add a "
                         f"width (and depth {DEPTH} to --depths) or pass --check none")

    def centre(width: int) -> float:
        return float(f"{at_256 * (256 / width) ** exponent:.2g}")

    shards, domains = prepare(pick_corpus(args.corpus)[0], out / "data")
    train_tokens = load_index(shards)["splits"]["train"]["tokens"]
    rows = [sweep(shards, domains, out, f"w{width}" + ("" if depth == DEPTH else f"-d{depth}"), "small",
                  shape(width, depth), [centre(width) * g for g in args.grid], args.steps, widen=True,
                  group=args.group, seeds=tuple(args.seeds)) for width in args.widths for depth in args.depths]
    if args.check == "3lm":
        a, k = fit(rows)
        predicted = float(f"{a * (256 / 512) ** k:.2g}")  # this sweep's fit, before the 3lm shape is seen
        rows.append(sweep(shards, domains, out, "3lm", "3lm", {"hidden_size": 512},
                          [predicted * g for g in (0.5, 1, 2)], args.check_steps, widen=False, group=args.group,
                          seeds=tuple(args.check_seeds or args.seeds)))
    return train_tokens, rows


if __name__ == "__main__":
    main()
