"""The federated budget: every window handed out until trained exactly once, whatever is lost on the way; slices
sized by speed; a task's rows are the night's batches; its lr the night's schedule at the budget's progress."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hitoban.training.federated.tasks import TaskQueue, slice_windows


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
    assert (again.start, again.end) == (0, 6)  # the earliest lost range first (budget order)
    assert queue.take(100, 3, 2).end == 10
    assert (queue.take(3, 3, 2).start, queue.reissued[0]["lost_by"]) == (10, "b")


def test_slices_follow_measured_speed_and_an_unmeasured_machine_gets_the_probe():
    sizes = slice_windows({1: 8000.0, 2: 1000.0, 3: None}, inner_steps=80, batch_size=4, probe_steps=5)
    assert sizes == {1: 80 * 4, 2: 10 * 4, 3: 5 * 4}
    assert slice_windows({1: 1.0, 2: 1e-6}, 80, 4, 5)[2] == 4  # at least one step


def night_batch(reader, seed: int, step: int, G: int, ctx: int) -> np.ndarray:
    """The night's batch (seed, step) written out from its definition (training/data/reader.py): with
    default_rng([seed, step]), a shard per row in proportion to its tokens (among shards that hold a window), then a
    random offset in it; a row is ctx + 1 tokens from there."""
    usable = reader.tokens - ctx - 1
    weights = np.where(usable >= 0, reader.tokens, 0).astype(np.float64)
    rng = np.random.default_rng([seed, step])
    shards = rng.choice(len(reader.arrays), size=G, p=weights / weights.sum())
    offsets = rng.integers(0, usable[shards] + 1)
    return np.stack([np.asarray(reader.arrays[s][o : o + ctx + 1], dtype=np.int64) for s, o in zip(shards, offsets)])


def test_task_rows_are_the_single_runs_batches_cut_anywhere(tiny_shards):
    """Position p is row p % G of the night's batch (seed, p // G): one machine of batch G takes the night's batches
    whole, two machines of batch G/2 the night's DDP rank slices, and a range cut mid-step (a re-issued or last task)
    the same rows as the whole; another seed draws other rows (the control)."""
    from hitoban.training.data.reader import ShardReader

    reader, ctx, G, seed = ShardReader(tiny_shards, "train"), 32, 8, 11
    night = np.concatenate([night_batch(reader, seed, step, G, ctx) for step in range(3)])
    for step in range(3):
        whole = night[step * G : (step + 1) * G]
        assert (reader.rows(seed, np.arange(step * G, (step + 1) * G), G, ctx) == whole).all()
        assert (reader.batch(seed, step, G, ctx) == whole).all()
        for rank in range(2):
            half = np.arange(step * G + rank * G // 2, step * G + (rank + 1) * G // 2)
            assert (reader.rows(seed, half, G, ctx) == reader.batch(seed, step, G, ctx, rank, 2)).all()
            assert (reader.rows(seed, half, G, ctx) == night[half]).all()
    assert (reader.rows(seed, np.arange(5, 19), G, ctx) == night[5:19]).all()
    assert not (reader.rows(seed + 1, np.arange(0, 8), G, ctx) == night[:8]).all()
    with pytest.raises(Exception, match="shorter than one window"):
        reader.rows(seed, np.arange(2), G, int(reader.tokens.max()))


def test_machines_side_by_side_use_the_lr_a_single_machine_at_the_global_batch_would():
    """Inner steps walk the schedule by the budget's progress (DiLoCo's inner schedule). Written out for 2 machines
    x batch 8 against one machine x batch 16 over the same budget: in round r both machines' k-th steps are the
    single run's step r*H + k (not the second machine 75 steps ahead, starting round 1 past the warmup); one
    machine at the global batch is the single run exactly; a slow machine's fewer steps span the same stretch; a
    range trained again after a loss gets the lr of the round that trains it."""
    from hitoban.training.federated.tasks import schedule_step

    H, single_steps, budget = 75, 600, 600 * 16  # windows; the single run takes 600 steps of 16
    for r in range(8):
        start, round_windows = r * 2 * H * 8, 2 * H * 8
        for machine in range(2):
            steps = [schedule_step(start, round_windows, k, H, budget, single_steps) for k in range(H)]
            assert steps == [r * H + k for k in range(H)], (r, machine)
    alone = [schedule_step(r * H * 16, H * 16, k, H, budget, single_steps) for r in range(8) for k in range(H)]
    assert alone == list(range(single_steps))
    # an RTX 3060 with H steps and a GTX 1050 with H/8 in the same round: both start and end within the round's stretch
    round_windows = (H + H // 8) * 8
    fast = [schedule_step(0, round_windows, k, H, budget, single_steps) for k in range(H)]
    slow = [schedule_step(0, round_windows, k, H // 8, budget, single_steps) for k in range(H // 8)]
    stretch = round_windows * single_steps // budget
    assert fast[0] == slow[0] == 0 and max(fast[-1], slow[-1]) < stretch and slow == sorted(set(slow))
    assert slow[-1] >= stretch - stretch // (H // 8) - 1  # the slow one's steps are spread over the stretch
    # a lost range handed out again two rounds later, at budget progress 1200 windows: its lr is that round's
    again = [schedule_step(1200, 1200, k, H, budget, single_steps) for k in range(H)]
    assert again == [H + k for k in range(H)]
