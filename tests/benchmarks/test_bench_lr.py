"""benchmarks/bench_lr.py's fit against its definition: the smallest largest factor between a power law in width and
the optima of the widths swept at the `small` depth; rows of the depth sweep (`--depths`) check the rule and never
move it."""

from __future__ import annotations

import math

import pytest
from conftest import REPO
from hypothesis import given, settings
from hypothesis import strategies as st


@pytest.fixture(scope="module")
def bench_lr(benchmark):
    return benchmark("bench_lr")


def row(bench_lr, width: int, optimum: float, depth: int | None = None) -> dict:
    return {"overrides": bench_lr.shape(width, depth or bench_lr.DEPTH), "optimum": optimum}


@settings(max_examples=100, deadline=None)
@given(a=st.floats(1e-3, 1e-1), k=st.floats(0.0, 2.0), noise=st.lists(st.floats(-0.3, 0.3), min_size=3, max_size=3),
       deep=st.lists(st.tuples(st.sampled_from([1, 2, 6, 8, 12]), st.floats(1e-4, 1.0)), max_size=4))
def test_the_fit_is_minimax_over_the_small_depths_widths_and_ignores_other_depths(bench_lr, a, k, noise, deep):
    widths = [128, 256, 384]
    rows = [row(bench_lr, w, a * (256 / w) ** k * math.exp(e)) for w, e in zip(widths, noise)]
    fitted = bench_lr.fit(rows)
    assert bench_lr.fit(rows + [row(bench_lr, 256, opt, depth) for depth, opt in deep]) == fitted
    at_256, exponent = fitted

    def worst(a_: float, k_: float) -> float:
        return max(abs(math.log(a_ * (256 / r["overrides"]["hidden_size"]) ** k_ / r["optimum"])) for r in rows)

    # the definition: no exponent on the fit's grid (0 to 2 by 1e-4), each with its best anchor, does better
    best = min(worst(math.exp(centre(rows, e)), e) for e in [i / 100 for i in range(201)])
    assert worst(at_256, exponent) <= best + 1e-3


def centre(rows: list[dict], exponent: float) -> float:
    """The anchor (log) that balances the largest residuals above and below the line of this exponent."""
    residuals = [math.log(r["optimum"]) - exponent * math.log(256 / r["overrides"]["hidden_size"]) for r in rows]
    return (max(residuals) + min(residuals)) / 2


def test_one_width_fits_nothing_whatever_the_depths(bench_lr):
    assert bench_lr.fit([row(bench_lr, 256, 0.01), row(bench_lr, 256, 0.005, 8), row(bench_lr, 128, 0.02, 2)]) is None


@pytest.mark.parametrize("argv", [["--widths", "256"], ["--widths", "128", "256", "--depths", "2", "8"]])
def test_a_3lm_check_without_a_fit_to_predict_from_is_refused_before_anything_trains(tmp_path, argv):
    """The check predicts the 3lm lr from the fit over depth 4's widths: one width, or no depth-4 rows, leaves
    nothing to fit, and the sweep must stop at once with one line (not after hours of runs, with a traceback)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_lr.py"), *argv, "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        "bench_lr: --check 3lm predicts from a fit over two widths or more at depth 4; add a width (and depth 4 to "
        "--depths) or pass --check none"]
    assert list(tmp_path.iterdir()) == []  # nothing prepared, nothing trained
