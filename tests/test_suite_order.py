"""The suite's own order: xdist hands each worker one file at a time, in conftest's order, the longest first."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from conftest import SLOW_SECONDS, expected_seconds, longest_files_first
from hypothesis import given
from hypothesis import strategies as st


def fake_item(path: str, seconds: float | None, slow: bool, index: int):
    """What the ordering reads of a pytest item: its file and its `slow` marker (with `seconds` or without)."""
    mark = SimpleNamespace(kwargs={} if seconds is None else {"seconds": seconds}) if slow else None
    return SimpleNamespace(path=Path(path), index=index,
                           get_closest_marker=lambda name: mark if name == "slow" else None)


tests = st.lists(st.tuples(st.sampled_from(["a.py", "b.py", "c.py", "d.py"]),
                           st.one_of(st.none(), st.integers(1, 500)), st.booleans()), max_size=30)


@given(tests)
def test_files_come_longest_first_each_whole_and_in_its_own_order(specs):
    """Independently of conftest: each file's expected seconds summed from the specs themselves."""
    items = [fake_item(path, seconds, slow, i) for i, (path, seconds, slow) in enumerate(specs)]
    ordered = list(items)
    longest_files_first(ordered)
    assert sorted(i.index for i in ordered) == list(range(len(items)))  # nothing lost, nothing doubled
    totals: dict[Path, float] = {}
    for path, seconds, slow in specs:
        totals[Path(path)] = totals.get(Path(path), 0) + ((SLOW_SECONDS if seconds is None else seconds) if slow else 0)
    runs = [item.path for k, item in enumerate(ordered) if k == 0 or ordered[k - 1].path != item.path]
    assert len(runs) == len(set(runs))  # each file in one piece
    assert [totals[p] for p in runs] == sorted((totals[p] for p in runs), reverse=True)
    first_seen = list(dict.fromkeys(Path(path) for path, _, _ in specs))
    for a, b in zip(runs, runs[1:]):  # equal totals keep the collection's order
        assert totals[a] > totals[b] or first_seen.index(a) < first_seen.index(b)
    for path in runs:
        indices = [i.index for i in ordered if i.path == path]
        assert indices == sorted(indices)


def test_a_slow_test_without_seconds_counts_slow_seconds_and_a_fast_one_nothing():
    assert expected_seconds(fake_item("a.py", None, True, 0)) == SLOW_SECONDS
    assert expected_seconds(fake_item("a.py", 410, True, 0)) == 410
    assert expected_seconds(fake_item("a.py", 410, False, 0)) == 0


def test_xdist_keeps_conftests_order(pytestconfig):
    """xdist's default reorders files by their number of tests, which undid conftest's order: the federation file,
    one four-minute test, went out 79th of 83 files. pyproject's addopts turns that off."""
    assert pytestconfig.getoption("loadscopereorder") is False
    assert pytestconfig.getoption("dist") in ("loadfile", "no")  # "no": -n 0, one process, nothing to schedule
