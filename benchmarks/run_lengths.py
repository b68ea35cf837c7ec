"""One option of `hitoban pretrain` swept at several run lengths, at one width, in the night's regime (under one pass
over the training text): the shared half of bench_wd.py and bench_warmup.py, which ask of one option each whether its
best value stays put or follows the run's length.

Every run is bench_lr.py's (`hitoban pretrain` at the `small` shape with the width replaced, Muon and AdamW's group at
their lr rules) at each of `--seeds` (a seed's points are paired: the same initialisation and batches), scored by
the mean of held-out literature and web bits/char. The optimum is the vertex of a parabola in log2(value) through the
best grid point and its neighbours; the grid widens by `factor` past an edge that wins, within the option's bounds.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import provenance
from bench_lr import BATCH, CONTEXT, DEFAULT_SEED, DEPTH, grid_search, seeded_point, shape, vertex
from bench_night import prepare
from corpora import pick_corpus

from hitoban.training.data.shards import load_index
from hitoban.training.optimizer import lr_for_width


@dataclass(frozen=True)
class Knob:
    """The option swept: its flag, the run folders' tag, the flags every run of the sweep also gets, the grid's
    widening factor, the bounds (a function of the length's steps) it may widen within, and the steps a run at a
    value takes at a length (the length itself, unless the option changes the tokens a step reads)."""

    flag: str
    tag: str
    fixed: dict = field(default_factory=dict)
    factor: float | None = 4.0
    bounds: Callable[[int], tuple[float, float]] = lambda steps: (0.0, math.inf)
    steps_for: Callable[[float, int], int] = lambda value, steps: steps
    flags_for: Callable[[float, int], dict] = lambda value, width: {}  # more flags that follow the value (the lrs)
    note: str = ""  # what the flags that follow the value do, for the report's title


def sweep_length(shards: Path, domains: dict, out: Path, width: int, steps: int, knob: Knob, grid: list[float],
                 seeds: list[int], depth: int = DEPTH) -> dict:
    """One length's grid at every seed; a value's score is its seeds' mean (each seed's kept where there are
    several: the points of one seed are paired, the seeds show how far a difference between points is noise)."""
    scores: dict[float, dict] = {}

    def evaluate(value: float) -> float:
        scores[value] = seeded_point(shards, domains, out, f"{shape_tag(width, depth)}-s{steps}-{knob.tag}{value:g}",
                                     "small", shape(width, depth),
                                     {knob.flag: value, **knob.fixed, **knob.flags_for(value, width)},
                                     knob.steps_for(value, steps),
                                     seeds)
        return scores[value]["mean"]

    values = grid_search(grid, evaluate, knob.factor, knob.bounds(steps))
    optimum, inside = vertex(values, [scores[v]["mean"] for v in values])
    return {"steps": steps, "seeds": seeds, "grid": {f"{v:g}": scores[v] for v in values}, "optimum": optimum,
            "inside_grid": inside}


def sweep(args: argparse.Namespace, knob: Knob, out: Path, name: str) -> dict:
    """Every length of `args.steps` swept; the lengths an earlier call saved in `out`/`name`.json (same width) kept
    with their own seeds, machine, date and command."""
    shards, domains = prepare(pick_corpus(args.corpus)[0], out / "data")
    stamp = provenance.stamp()
    knob = knob if args.widen else replace(knob, factor=None)
    rows = {steps: {**sweep_length(shards, domains, out, args.width, steps, knob, args.grid, args.seeds, args.depth),
                    **stamp} for steps in sorted(args.steps)}
    earlier = out / f"{name}.json"
    if earlier.exists():
        before = json.loads(earlier.read_text())
        if (before["width"], before.get("depth", DEPTH)) == (args.width, args.depth):
            rows = {**{row["steps"]: row for row in before["rows"]}, **rows}
    return {"width": args.width, **({"depth": args.depth} if args.depth != DEPTH else {}),
            "lr": lr_for_width(args.width), **({"lr_note": knob.note} if knob.note else {}),
            "train_tokens": load_index(shards)["splits"]["train"]["tokens"],
            "rows": [rows[steps] for steps in sorted(rows)]}


def shape_tag(width: int, depth: int) -> str:
    """A run folder's shape: the width, and the depth where it is not the small shape's (the names of the sweeps
    made before --depth)."""
    return f"w{width}" + ("" if depth == DEPTH else f"-d{depth}")


def tried(row: dict) -> str:
    """A row's grid as the results table shows it: value: mean (literature, web), and each seed's mean where there
    are several."""
    def point(value: str, s: dict) -> str:
        seeds = " [" + ", ".join(f"seed {k}: {m:.3f}" for k, m in s["seeds"].items()) + "]" if "seeds" in s else ""
        return f"{value}: {s['mean']:.3f} ({s['literature']:.3f}, {s['web']:.3f}){seeds}"

    return "; ".join(point(value, s) for value, s in row["grid"].items())


def report(saved: dict, title: str, short: str, columns: list[str], cells: Callable[[dict], list[str]],
           predictions: str) -> list[str]:
    """The results table of one option's sweep: per length, the passes, the grid, the optimum and the option's own
    `columns` (`cells` of a row), then how the optimum scales with the run's length against `predictions`."""
    width, lr, train_tokens = saved["width"], saved["lr"], saved["train_tokens"]
    headers = ["steps", "passes", f"{columns[0]}", f"optimum {short}", *columns[1:], "machine", "date", "command"]
    rates = saved.get("lr_note") or f"Muon lr {lr:g}, its rule"
    at = f"width {width}" + (f", depth {saved['depth']}" if "depth" in saved else "")
    lines = [f"{title} across run lengths at {at} ({rates}), lengths in steps of "
             f"{BATCH} x {CONTEXT} tokens, {train_tokens:,} training tokens; score: mean held-out bits/char "
             "(literature, web).", "",
             "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in saved["rows"]:
        steps = row["steps"]
        where = "" if row["inside_grid"] else " (grid edge)"
        lines.append("| " + " | ".join([str(steps), f"{steps * BATCH * CONTEXT / train_tokens:.2f}", tried(row),
                                         f"{row['optimum']:.3g}{where}", *cells(row), row["machine"], row["date"],
                                         f"`{row['command']}`"]) + " |")
    fitted = length_exponent(saved["rows"])
    if fitted:
        inside, k = fitted
        span = f"between {inside[0]['steps']} and {inside[-1]['steps']} steps"
        if len(inside) > 2:  # the least-squares slope, and each neighbouring pair's, to show how straight the line is
            pairs = ", ".join(f"{a['steps']}-{b['steps']}: ^ {exponent(slope(a, b))}"
                              for a, b in zip(inside, inside[1:]))
            span = f"by least squares over {len(inside)} lengths {span} (between neighbours {pairs})"
        lines += ["", f"The optimum {short} scales as steps ^ {exponent(k)} {span} ({predictions})."]
    else:
        lines += ["", "Fewer than two lengths have an optimum inside their grid: no exponent is fitted."]
    return lines


def exponent(k: float) -> str:
    """k to two decimals, never "-0.00": an optimum that did not move (a tiny negative k) printed a sign it had not."""
    return f"{round(k, 2) + 0.0:.2f}"


def slope(a: dict, b: dict) -> float:
    return math.log(b["optimum"] / a["optimum"]) / math.log(b["steps"] / a["steps"])


def length_exponent(rows: list[dict]) -> tuple[list[dict], float] | None:
    """(the rows used, k) with optimum ~ steps ^ k fitted by least squares in log-log over the lengths whose optimum
    lies inside their grid (through two, that is the slope between them); None below two such lengths."""
    inside = [r for r in rows if r["inside_grid"]]
    if len(inside) < 2:
        return None
    x = [math.log(r["steps"]) for r in inside]
    y = [math.log(r["optimum"]) for r in inside]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    k = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)
    return inside, k


def arguments(doc: str, grid: list[float], grid_help: str, out: str, name: str,
              more: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if more:
        more(parser)  # the option's own arguments
    parser.add_argument("--width", type=int, default=256, help="hidden size")
    parser.add_argument("--depth", type=int, default=DEPTH, help=f"layers ({DEPTH}, the small shape's; --width 512 "
                        "--depth 6 is the 3lm shape, for a short check there)")
    parser.add_argument("--steps", type=int, nargs="+", default=[200, 800], help="run lengths, steps of 16 x 256")
    parser.add_argument("--grid", type=float, nargs="+", default=grid, help=grid_help)
    parser.add_argument("--seeds", "--seed", type=int, nargs="+", default=[DEFAULT_SEED], help="train every grid "
                        "point at each seed (initialisation and batches); a point's score is their mean")
    parser.add_argument("--no-widen", dest="widen", action="store_false", help="train the grid as given, "
                        "nothing beyond an edge that wins (its optimum is then reported as at the grid's edge)")
    parser.add_argument("--corpus", help="corpus folder (default: the larger corpus if present, else tests/corpus)")
    parser.add_argument("--out", default=out)
    parser.add_argument("--from", dest="saved", metavar=f"{name.upper()}_JSON",
                        help=f"no training: report the sweep saved in this {name}.json")
    return parser.parse_args()


def main(doc: str, knob: Knob | Callable[[argparse.Namespace], Knob], name: str, grid: list[float], grid_help: str,
         report: Callable[[dict], list[str]], more: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
    """`knob`, or a function of the arguments (with `more`'s) that picks it."""
    args = arguments(doc, grid, grid_help, name.replace("_", "-"), name, more)
    out = Path(args.out)
    knob = knob if isinstance(knob, Knob) else knob(args)
    saved = json.loads(Path(args.saved).read_text()) if args.saved else sweep(args, knob, out, name)
    lines = report(saved)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(saved, indent=2))
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
