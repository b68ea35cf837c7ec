"""DiLoCo's outer step against a hand computation, and the refusals of deltas that must never be averaged in."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("flwr", reason="the federated extra: pip install 'hitoban[federated]'")

from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from hitoban.training.federated.outer import (  # noqa: E402
    DELTA,
    METRICS,
    TASK,
    WEIGHT,
    DiLoCo,
    delta_norm,
    out_of_bounds,
    refusal,
)
from hitoban.training.federated.tasks import Task  # noqa: E402

TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 1  # what a ServerApp process has set


def reply(node: int, delta: dict, windows: int, task_id: int = 0, run_id: str = "r") -> Message:
    asked = Message(RecordDict({TASK: ConfigRecord({"x": 1})}), dst_node_id=node, message_type="train")
    return Message(RecordDict({DELTA: ArrayRecord({k: Array(np.asarray(v)) for k, v in delta.items()}),
                               METRICS: MetricRecord({WEIGHT: windows, "tokens": windows, "seconds": 1.0, "loss": 1.0}),
                               TASK: ConfigRecord({"task-id": task_id, "run-id": run_id})}), reply_to=asked)


class Two(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
        self.b = torch.nn.Parameter(torch.tensor([[0.5, 0.25], [4.0, -1.0]]))


def by_hand(theta: dict, rounds: list, momentum_factor: float, lr: float = 0.7) -> dict:
    """DiLoCo's outer step written out: g = sum w_i d_i / sum w_i; m = mu m + g; theta -= lr (g + mu m)."""
    theta = {k: v.astype(np.float64).copy() for k, v in theta.items()}
    momentum = {k: np.zeros_like(v) for k, v in theta.items()}
    for deltas, windows in rounds:
        for k in theta:
            g = sum(w * d[k].astype(np.float64) for w, d in zip(windows, deltas)) / sum(windows)
            momentum[k] = momentum_factor * momentum[k] + g
            theta[k] = theta[k] - lr * (g + momentum_factor * momentum[k])
    return theta


def test_outer_step_is_token_weighted_nesterov_sgd_by_hand():
    model = Two()
    start = {k: v.detach().numpy().copy() for k, v in model.named_parameters()}
    outer = DiLoCo(model, lr=0.7, momentum=0.9)
    rng = np.random.default_rng(0)
    rounds = [([{k: rng.normal(size=v.shape).astype(np.float16) for k, v in start.items()} for _ in range(2)], [3, 1])
              for _ in range(3)]
    for i, (deltas, windows) in enumerate(rounds):
        outer.aggregate_train(i, [reply(5, deltas[0], windows[0]), reply(6, deltas[1], windows[1])])
    got = {k: p.detach().numpy() for k, p in model.named_parameters()}
    want = by_hand(start, rounds, 0.9)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)
    # the control: the same check against plain SGD (no momentum) fails, so the comparison can tell them apart
    plain = by_hand(start, rounds, 0.0)
    assert not all(np.allclose(got[k], plain[k], atol=1e-3) for k in plain)
    # and an unweighted mean is told apart too
    unweighted = by_hand(start, [(d, [1, 1]) for d, _ in rounds], 0.9)
    assert not all(np.allclose(got[k], unweighted[k], atol=1e-3) for k in unweighted)


def test_momentum_zero_and_lr_one_is_plain_token_weighted_averaging():
    """`--outer-momentum 0 --outer-lr 1`: the global model becomes the token-weighted mean of the machines' models
    (FedAvg), which measured closest to one machine over a few rounds (README, Benchmarks)."""
    model = Two()
    start = {k: v.detach().numpy().copy() for k, v in model.named_parameters()}
    outer = DiLoCo(model, lr=1.0, momentum=0.0)
    rng = np.random.default_rng(1)
    rounds = [([{k: rng.normal(size=v.shape).astype(np.float16) for k, v in start.items()} for _ in range(2)], [3, 1])
              for _ in range(3)]
    for i, (deltas, windows) in enumerate(rounds):
        outer.aggregate_train(i, [reply(5, deltas[0], windows[0]), reply(6, deltas[1], windows[1])])
    got = {k: p.detach().numpy() for k, p in model.named_parameters()}
    want = by_hand(start, rounds, 0.0, lr=1.0)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)
    # the control: DiLoCo's momentum on the same deltas ends elsewhere
    nesterov = by_hand(start, rounds, 0.9, lr=1.0)
    assert not all(np.allclose(got[k], nesterov[k], atol=1e-3) for k in nesterov)


SHAPES = {"a": (3,), "b": (2, 2)}
GOOD = {"a": np.ones(3, np.float16), "b": np.ones((2, 2), np.float16)}


@pytest.mark.parametrize("case, make, match", [
    ("nan", lambda: reply(5, {**GOOD, "a": np.array([1, np.nan, 0], np.float16)}, 4), "not finite"),
    ("inf", lambda: reply(5, {**GOOD, "b": np.full((2, 2), np.inf, np.float16)}, 4), "not finite"),
    ("shape", lambda: reply(5, {**GOOD, "b": np.ones((2, 3), np.float16)}, 4), "shape"),
    ("dtype", lambda: reply(5, {**GOOD, "a": np.ones(3, np.float64)}, 4), "float64"),
    ("missing", lambda: reply(5, {"a": GOOD["a"]}, 4), "wrong tensors"),
    ("extra", lambda: reply(5, {**GOOD, "c": np.ones(1, np.float16)}, 4), "wrong tensors"),
    ("other task", lambda: reply(5, GOOD, 4, task_id=9), "given task 0"),
    ("other run", lambda: reply(5, GOOD, 4, run_id="old"), "of run old"),
    ("windows", lambda: reply(5, GOOD, 3), "trained 3 windows"),
    ("stranger", lambda: reply(7, GOOD, 4), "given to node 5"),
])
def test_a_delta_that_must_not_be_averaged_is_refused(case, make, match):
    task = Task(task_id=0, start=0, end=4, node=5, round=1)
    assert refusal(reply(5, GOOD, 4), task, SHAPES, "r") is None  # the control: the good delta passes
    assert match in refusal(make(), task, SHAPES, "r")


def test_an_error_reply_and_an_unasked_delta_are_refused():
    asked = Message(RecordDict({TASK: ConfigRecord({"x": 1})}), dst_node_id=5, message_type="train")
    error = Message(Error(code=4001, reason="ShardMismatch: shard train-000.bin differs"), reply_to=asked)
    assert "ShardMismatch" in refusal(error, Task(0, 0, 4, 5, 1), SHAPES, "r")
    assert "did not give it" in refusal(reply(5, GOOD, 4), None, SHAPES, "r")


def with_metrics(values: dict) -> Message:
    """A good reply whose metric record holds `values` instead (a key mapped to None is left out)."""
    made = reply(5, GOOD, 4)
    metrics = made.content.metric_records[METRICS]
    for key, value in values.items():
        if value is None:
            del metrics[key]
        else:
            metrics[key] = value
    return made


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from([WEIGHT, "loss"]),
       value=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**13, 10**13)))
def test_every_metric_value_is_either_the_task_s_own_or_refused_by_name(key, value):
    """The class behind `num-examples` NaN (a ValueError), 16.9 windows for a 16-window task (accepted) and a missing
    field (a KeyError after acceptance): whatever a machine puts there, the reader answers, and accepts only a
    whole window count equal to the task's and a finite loss >= 0."""
    task = Task(task_id=0, start=0, end=4, node=5, round=1)
    why = refusal(with_metrics({key: value}), task, SHAPES, "r")
    good = (value is not None and not isinstance(value, bool) and math.isfinite(value)
            and (value == 4 if key == WEIGHT else value >= 0))
    assert (why is None) == good, (key, value, why)
    if why is not None:
        assert "node 5" in why


def test_what_a_machine_says_about_its_speed_is_never_read():
    task = Task(task_id=0, start=0, end=4, node=5, round=1)
    assert refusal(with_metrics({"tokens": None, "seconds": None}), task, SHAPES, "r") is None
    assert refusal(with_metrics({"tokens": float("nan"), "seconds": -1.0}), task, SHAPES, "r") is None


@settings(max_examples=100, deadline=None)
@given(honest=st.lists(st.floats(0.1, 1.0), min_size=0, max_size=6), scale=st.floats(1e-3, 1e30))
def test_a_delta_out_of_bounds_is_refused_and_honest_spreads_are_not(honest, scale):
    """The bounds against the global weights and the round's median: an honest spread (norms within 10x of each
    other, under the weights' norm) is never refused; zero always is; a delta over 10x the weights' always is."""
    weights_norm = 1.0
    norms = dict(enumerate(honest))
    assert out_of_bounds(norms, weights_norm) == {}
    with_zero = out_of_bounds({**norms, 99: 0.0}, weights_norm)
    assert set(with_zero) == {99} and "all zeros" in with_zero[99]
    outlier = out_of_bounds({**norms, 99: 10.0 * weights_norm * (1 + scale)}, weights_norm)
    assert set(outlier) == {99} and "global weights" in outlier[99]


def test_a_norm_ten_times_the_round_s_median_is_refused_with_three_or_more_replies():
    assert set(out_of_bounds({1: 0.1, 2: 0.12, 3: 2.0}, 100.0)) == {3}
    assert out_of_bounds({1: 0.1, 3: 2.0}, 100.0) == {}  # two replies: no median to stand on
    assert delta_norm(ArrayRecord({"a": Array(np.full(3, 3e38, np.float32))})) == pytest.approx(3e38 * 3 ** 0.5)
