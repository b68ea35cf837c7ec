"""benchmarks/bench_workers.py's arithmetic against its definition: the rate after start-up is the characters the
whole corpus adds to a run of its first few works, over the seconds it adds, and the few works are the first
fortieth by name."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st


@pytest.fixture(scope="module")
def bench_workers(benchmark):
    return benchmark("bench_workers")


SECONDS = st.integers(-100, 3000).map(lambda centiseconds: centiseconds / 100)  # what a run adds


@given(st.floats(0.5, 5), SECONDS, st.floats(0.5, 5), SECONDS,
       st.integers(1_000, 100_000), st.integers(1, 10_000_000))
def test_the_rate_after_start_up_is_added_characters_over_added_seconds(bench_workers, few1, more1, few2, more2,
                                                                        few_chars, more_chars):
    sizes = {"few": {1: {"seconds": few1}, 2: {"seconds": few2}},
             "all": {1: {"seconds": few1 + more1}, 2: {"seconds": few2 + more2}}}
    chars = {"few": few_chars, "all": few_chars + more_chars}
    rates = bench_workers.rates(sizes, chars)
    if more1 <= 0 or more2 <= 0:  # the whole took no longer than a few works: nothing after start-up was measured
        assert rates is None
    else:
        assert rates == pytest.approx({1: more_chars / more1, 2: more_chars / more2})


@pytest.mark.parametrize("works, linked", [(789, 19), (80, 2), (40, 2), (3, 2), (120, 3)])
def test_the_few_works_are_the_first_fortieth_by_name_at_least_two(bench_workers, tmp_path, works, linked):
    literature = tmp_path / "literature"
    literature.mkdir()
    names = [f"{i:06d}.txt" for i in range(works)]
    for name in reversed(names):  # made in the opposite order: the choice is by name
        (literature / name).write_text(name)
    few = bench_workers.first_works(literature, tmp_path / "out")
    assert sorted(p.name for p in few.iterdir()) == names[:linked]
    assert all((few / name).resolve() == (literature / name).resolve() for name in names[:linked])


@given(st.lists(st.tuples(st.floats(0.1, 20), st.floats(0.1, 20)), min_size=1, max_size=9))
def test_the_paired_speed_up_is_the_median_of_each_rounds_ratio(bench_workers, rounds):
    runs = {1: {"runs": [one for one, _ in rounds]}, 2: {"runs": [two for _, two in rounds]}}
    ratios = sorted(one / two for one, two in rounds)
    middle = len(ratios) // 2
    expected = ratios[middle] if len(ratios) % 2 else (ratios[middle - 1] + ratios[middle]) / 2
    assert bench_workers.paired_speedup(runs, 2) == pytest.approx(expected)


def test_control_best_over_best_is_not_the_paired_speed_up(bench_workers):
    """Negative control: the definition test tells the paired median from best over best. Three rounds, two at 1.8x
    and one whose runs met different loads (its 1-worker run fast, its 2-worker run slow: 1.2x): the paired median
    stays 1.8x, best over best (2.9 s / 2.0 s) reports 1.45x."""
    runs = {1: {"runs": [3.6, 3.6, 2.9]}, 2: {"runs": [2.0, 2.0, 2.42]}}
    assert bench_workers.paired_speedup(runs, 2) == pytest.approx(1.8)
    assert min(runs[1]["runs"]) / min(runs[2]["runs"]) == pytest.approx(1.45)


@given(st.integers(2, 8), st.lists(st.tuples(st.floats(0.1, 20), st.floats(0.1, 40)), min_size=1, max_size=9))
def test_the_machine_ceiling_is_n_times_one_alone_over_n_at_once(bench_workers, workers, rounds):
    """N one-worker runs at once doing N times one run's work in `together` seconds: N x alone / together, the
    median over rounds, each round's two runs paired."""
    runs = {1: {"runs": [alone for alone, _ in rounds]}, "together": {"runs": [together for _, together in rounds]}}
    ratios = sorted(workers * alone / together for alone, together in rounds)
    middle = len(ratios) // 2
    expected = ratios[middle] if len(ratios) % 2 else (ratios[middle - 1] + ratios[middle]) / 2
    assert bench_workers.machine_ceiling(runs, workers) == pytest.approx(expected)


def test_runs_together_start_at_once_and_wait_for_the_last(bench_workers):
    """Three commands that each sleep 0.4 s: started at once they take about 0.4 s, not 1.2 s (the ceiling's runs
    would otherwise be one after another), and no less than 0.4 s (all are waited for)."""
    import sys

    sleep = [sys.executable, "-c", "import time; time.sleep(0.4)"]
    seconds = bench_workers.timed_together([sleep, sleep, sleep])
    assert 0.4 <= seconds < 1.0


def test_a_failed_run_among_those_together_stops_the_benchmark(bench_workers):
    import sys

    with pytest.raises(SystemExit, match="failed"):
        bench_workers.timed_together([[sys.executable, "-c", "pass"], [sys.executable, "-c", "raise SystemExit(3)"]])
