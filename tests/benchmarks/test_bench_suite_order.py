"""benchmarks/bench_suite_order.py: the log it reads and the schedule it replays, against their definitions."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


@pytest.fixture(scope="module")
def order(benchmark):
    return benchmark("bench_suite_order")


def test_a_tests_seconds_are_its_setup_call_and_teardown_summed(order):
    log = ("12.50s call     tests/a.py::test_x\n2.25s setup    tests/a.py::test_x\n0.25s teardown tests/a.py::test_x\n"
           "3.00s call     tests/b.py::test_y[1]\n[gw0] PASSED tests/a.py::test_x\n(5 durations < 0.005s hidden.)\n")
    assert order.durations(log) == {"tests/a.py::test_x": 15.0, "tests/b.py::test_y[1]": 3.0}


files_and_seconds = st.lists(st.lists(st.integers(0, 50), min_size=1, max_size=6), min_size=1, max_size=12)


@settings(max_examples=100, deadline=None)
@given(files_and_seconds, st.integers(1, 4))
def test_the_replay_runs_every_test_once_and_one_worker_takes_the_sum(order, spec, workers):
    files = {f"f{i}.py": [f"f{i}.py::t{j}" for j in range(len(tests))] for i, tests in enumerate(spec)}
    seconds = {f"f{i}.py::t{j}": float(s) for i, tests in enumerate(spec) for j, s in enumerate(tests)}
    clock = order.simulate(list(files), files, seconds, workers)
    assert len(clock) == workers and sum(clock) == pytest.approx(sum(seconds.values()))
    if workers == 1:
        assert clock == [pytest.approx(sum(seconds.values()))]


def test_a_long_file_last_keeps_one_worker_busy_after_the_other_is_done(order):
    """By hand, xdist's rule: each worker takes a file, and another while it has at most two tests left."""
    files = {"long.py": ["long.py::t"], **{f"s{i}.py": [f"s{i}.py::t"] for i in range(6)}}
    seconds = {"long.py::t": 60.0, **{f"s{i}.py::t": 10.0 for i in range(6)}}
    short_first = [f"s{i}.py" for i in range(6)] + ["long.py"]
    assert max(order.simulate(short_first, files, seconds)) == 90.0  # 30 s of shorts each, then the long one: 30 + 60
    # long first: its worker also holds the next file it was handed (s1), and takes one more (s3) as the long test
    # ends; the other runs the remaining four: 60 + 20 against 40
    assert order.simulate(["long.py", *short_first[:-1]], files, seconds) == [80.0, 40.0]


def test_xdists_default_puts_the_files_with_most_tests_first_then_slow_files_then_the_path(order):
    files = {"tests/b.py": ["x"], "tests/a/z.py": ["y", "z"], "tests/c.py": ["w"], "tests/a.py": ["v"]}
    assert order.xdist_default_order(files, slow_files={"tests/c.py"}) == [
        "tests/a/z.py", "tests/c.py", "tests/a.py", "tests/b.py"]


def test_a_log_without_durations_is_refused_not_replayed_as_zero(order, tmp_path, monkeypatch):
    """Nothing measured, nothing printed: a log written without --durations=0 stops the script with a message."""
    import sys

    log = tmp_path / "plain.log"
    log.write_text("[gw0] PASSED tests/a.py::test_x\n1 passed in 3.00s\n")
    monkeypatch.setattr(sys, "argv", ["bench_suite_order.py", "--log", str(log)])
    with pytest.raises(SystemExit, match="no duration lines"):
        order.main()
