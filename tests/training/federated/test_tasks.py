"""The federated budget: every window handed out until trained exactly once, whatever is lost on the way; slices
sized by speed; windows read where they are."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hitoban.training.federated.tasks import TaskQueue, budget_windows, slice_windows, window_order


@settings(max_examples=30, deadline=None)
@given(budget=st.integers(1, 400), batch=st.integers(1, 16),
       plan=st.lists(st.tuples(st.integers(1, 60), st.booleans()), min_size=1, max_size=40))
def test_every_window_is_completed_exactly_once_whatever_is_lost(budget, batch, plan):
    queue = TaskQueue(budget, batch)
    trained = np.zeros(budget, dtype=int)
    i = 0
    while not queue.finished:
        size, lost = plan[i % len(plan)]
        i += 1
        task = queue.take(size, node=1, round_=i)
        assert task is not None and task.windows <= size
        if lost and i < 200:  # a machine missed its lease: the range goes back
            queue.lose(task, "m", "no reply")
        else:
            trained[task.start : task.end] += 1
            queue.complete(task, "m", 1.0, 10, 20)
        queue = TaskQueue.from_json(queue.to_json())  # saved and reloaded every round, as the server does
    assert (trained == 1).all()
    assert queue.take(5, 1, i) is None
    assert queue.per_node["m"]["windows"] == budget
    assert queue.per_node["m"]["lost_tasks"] == len(queue.reissued)


def test_a_returned_range_is_handed_out_before_fresh_windows_and_in_budget_order():
    queue = TaskQueue(100, 4)
    first, second = queue.take(10, 1, 1), queue.take(10, 2, 1)
    queue.lose(second, "b", "late")
    queue.lose(first, "a", "late")
    again = queue.take(6, 3, 2)
    assert (again.start, again.end) == (0, 6)  # the earliest lost range first: it keeps its place in the schedule
    assert queue.take(100, 3, 2).end == 10
    assert (queue.take(3, 3, 2).start, queue.reissued[0]["lost_by"]) == (10, "b")


def test_slices_follow_measured_speed_and_an_unmeasured_machine_gets_the_probe():
    sizes = slice_windows({1: 8000.0, 2: 1000.0, 3: None}, inner_steps=80, batch_size=4, probe_steps=5)
    assert sizes == {1: 80 * 4, 2: 10 * 4, 3: 5 * 4}
    assert slice_windows({1: 1.0, 2: 1e-6}, 80, 4, 5)[2] == 4  # at least one step


def test_window_order_is_a_seeded_permutation():
    order = window_order(3, 1000)
    assert sorted(order.tolist()) == list(range(1000))
    assert (order == window_order(3, 1000)).all() and not (order == window_order(4, 1000)).all()


def test_a_budget_longer_than_the_data_runs_into_further_epochs_each_window_once_per_epoch():
    ids = budget_windows(5, 10, 0, 25)
    assert sorted(ids[:10].tolist()) == sorted(ids[10:20].tolist()) == list(range(10))
    assert not (ids[:10] == ids[10:20]).all()  # each epoch in its own order
    assert (budget_windows(5, 10, 7, 23) == ids[7:23]).all()  # a range is the same windows wherever it is cut


def test_windows_read_the_tokens_they_name(tiny_shards):
    from hitoban.training.data.reader import ShardReader

    reader = ShardReader(tiny_shards, "train")
    ctx = 64
    counts = reader.window_counts(ctx)
    assert (counts == (reader.tokens - 1) // ctx).all()
    streams = [np.asarray(a, dtype=np.int64) for a in reader.arrays]
    ids = np.array([0, counts[0] - 1, counts[0], int(counts.sum()) - 1])
    rows = reader.windows(ids, ctx)
    expected = [streams[0][0 : ctx + 1], streams[0][(counts[0] - 1) * ctx : counts[0] * ctx + 1],
                streams[1][0 : ctx + 1],
                streams[-1][(counts[-1] - 1) * ctx : counts[-1] * ctx + 1]]
    assert all((row == want).all() for row, want in zip(rows, expected))
    with pytest.raises(ValueError, match="window ids"):
        reader.windows(np.array([int(counts.sum())]), ctx)
