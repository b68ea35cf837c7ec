"""DiLoCo's outer step on Flower's FedAvg, and the checks every delta from the network passes first.

DiLoCo (arXiv 2311.08105): each machine trains the global weights θ for H inner steps and sends Δ = θ − θ_local; the
server averages the deltas (weighted by tokens trained) into a pseudo-gradient g and applies it with SGD, Nesterov
momentum 0.9, lr 0.7: m ← 0.9·m + g; θ ← θ − 0.7·(g + 0.9·m), which is torch's `SGD(nesterov=True)` exactly, so
the server holds the global model with a torch SGD whose momentum buffers are the outer momentum (saved in the
server's A/B checkpoint like any optimizer state). Flower's `FedAvgM` has no Nesterov, so `DiLoCo` subclasses its
`FedAvg`: the weighted mean is Flower's (`aggregate_arrayrecords`), on deltas widened to fp32 first (Flower
accumulates in the arrays' own dtype, and fp16 sums lose bits); the step is torch's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from hitoban.training.federated.tasks import Task

DELTA, METRICS, TASK = "delta", "metrics", "task"  # the record names of a machine's reply
# a machine's error replies, by code: shards that differ from the server's, a delta that is not finite, weights whose
# sha256 does not match (sent in full next time), a task it cannot hold in memory
ERROR_SHARDS, ERROR_DIVERGED, ERROR_WEIGHTS, ERROR_MEMORY = 4001, 4002, 4003, 4004
WEIGHT = "num-examples"  # Flower's weighting key: here the tokens the delta was trained on
DELTA_DTYPES = ("float16", "float32")  # bf16 cannot travel (numpy has no bf16): machines send fp16
MAX_TO_WEIGHTS, MAX_TO_MEDIAN = 10.0, 10.0  # a delta's bounds (out_of_bounds)


def shared_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a delta carries: the state_dict without tied copies (the tied lm_head is the embedding)."""
    seen, tensors = set(), {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        tensors[name] = tensor
    return tensors


def whole_number(value) -> int | None:
    """`value` as an int when it is a finite number with no fraction (16.9 is not 16), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return int(value) if value == int(value) else None


def refusal(reply: Message, task: Task | None, expected: dict[str, tuple[int, ...]], run_id: str) -> str | None:
    """Why a machine's reply must not be averaged in, or None: the one reader of a reply. `task` is the task the
    server gave the replying node (None: it gave it none); `expected` the delta's tensors and shapes. Every field
    the server uses is checked here (present, typed, finite, in range); what a machine says about its own speed is
    not read at all (the server measures it)."""
    node = reply.metadata.src_node_id
    if reply.has_error():
        return f"node {node} replied with an error: {reply.error.reason}"
    if task is None:
        return f"node {node} sent a delta for a task the server did not give it"
    content = reply.content
    info = content.config_records.get(TASK)
    if info is None or info.get("task-id") != task.task_id or info.get("run-id") != run_id:
        return (f"node {node} sent a delta for task {None if info is None else info.get('task-id')} of run "
                f"{None if info is None else info.get('run-id')}, but was given task {task.task_id} of run {run_id}")
    if node != task.node:
        return f"the delta for task {task.task_id} came from node {node}, but the task was given to node {task.node}"
    delta = content.array_records.get(DELTA)
    metrics = content.metric_records.get(METRICS)
    if delta is None or metrics is None:
        return f"node {node}'s reply has no delta or no metrics"
    windows = whole_number(metrics.get(WEIGHT))
    if windows != task.windows:
        return f"node {node} says it trained {metrics.get(WEIGHT)!r} windows; its task has {task.windows}"
    loss = metrics.get("loss")
    if isinstance(loss, bool) or not isinstance(loss, (int, float)) or not math.isfinite(loss) or loss < 0:
        return f"node {node}'s loss is {loss!r}: a finite number >= 0 was expected"
    missing, unexpected = sorted(set(expected) - set(delta)), sorted(set(delta) - set(expected))
    if missing or unexpected:
        return f"node {node}'s delta has the wrong tensors (missing {missing[:3]}, unexpected {unexpected[:3]})"
    for name, shape in expected.items():
        array = delta[name]
        if array.dtype not in DELTA_DTYPES:
            return f"node {node}'s delta {name} is {array.dtype}; only {' or '.join(DELTA_DTYPES)} is accepted"
        if tuple(array.shape) != tuple(shape):
            return f"node {node}'s delta {name} has shape {tuple(array.shape)}, the model's is {tuple(shape)}"
        if not np.isfinite(array.numpy()).all():
            return f"node {node}'s delta {name} is not finite (NaN or inf)"
    return None


def delta_norm(delta: ArrayRecord) -> float:
    """The L2 norm of a whole delta, summed in float64 (a finite fp32 delta of 3e38 squares past fp32's range)."""
    return math.sqrt(sum(float(np.square(array.numpy().astype(np.float64)).sum()) for array in delta.values()))


def out_of_bounds(norms: dict[int, float], weights_norm: float) -> dict[int, str]:
    """node -> why, for the round's deltas no honest task makes. The rules, each a refusal (never a clip: a clipped
    delta would still be credited as trained):
    - an all-zero delta: nothing was trained;
    - a norm over MAX_TO_WEIGHTS times the global weights' norm: a task of inner steps does not move the model
      further than ten times its own size (the honest tiny runs here move it well under once);
    - with three or more non-zero replies, a norm over MAX_TO_MEDIAN times their median: one machine's step is not
      ten times everyone else's. With one or two machines only the first two rules apply."""
    moved = [norm for norm in norms.values() if norm > 0]  # zeros are refused anyway: they must not set the median
    median = float(np.median(moved)) if len(moved) >= 3 else None
    refused = {}
    for node, norm in norms.items():
        if norm == 0:
            refused[node] = "its delta is all zeros: nothing was trained"
        elif norm > MAX_TO_WEIGHTS * weights_norm:
            refused[node] = (f"its delta's norm {norm:.3g} is over {MAX_TO_WEIGHTS:g}x the global weights' "
                             f"({weights_norm:.3g})")
        elif median is not None and norm > MAX_TO_MEDIAN * median:
            refused[node] = f"its delta's norm {norm:.3g} is over {MAX_TO_MEDIAN:g}x the round's median ({median:.3g})"
    return refused


class DiLoCo(FedAvg):
    """FedAvg whose aggregate is a pseudo-gradient, applied to the global model with Nesterov SGD (the outer step).
    The global model's parameters and the SGD are the server's; `aggregate_train` returns the new global weights."""

    def __init__(self, model: torch.nn.Module, lr: float = 0.7, momentum: float = 0.9):
        super().__init__(weighted_by_key=WEIGHT, arrayrecord_key=DELTA)
        self.model = model
        self.names = {name for name in shared_tensors(model)}
        self.optimizer = torch.optim.SGD([p for n, p in model.named_parameters() if n in self.names], lr=lr,
                                         momentum=momentum, nesterov=momentum > 0)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The token-weighted mean delta (replies already checked by `refusal`), then one outer step."""
        replies = [r for r in replies if not r.has_error()]
        if not replies:
            return None, None
        # only what `refusal` checked travels on: the delta, the task's window count (equal to the claim, or refused)
        # and the loss; a machine's other metrics never reach the aggregate
        kept = [RecordDict({DELTA: ArrayRecord({k: Array(v.numpy().astype(np.float32)) for k, v in
                                                r.content.array_records[DELTA].items()}),
                            METRICS: MetricRecord({WEIGHT: int(r.content.metric_records[METRICS][WEIGHT]),
                                                   "loss": float(r.content.metric_records[METRICS]["loss"])})})
                for r in replies]
        mean = aggregate_arrayrecords(kept, WEIGHT).to_torch_state_dict()
        self.outer_step(mean)
        metrics = self.train_metrics_aggr_fn(kept, WEIGHT)
        return ArrayRecord({k: v.detach() for k, v in shared_tensors(self.model).items()}), metrics

    @torch.no_grad()
    def outer_step(self, pseudo_gradient: dict[str, torch.Tensor]) -> None:
        for name, param in self.model.named_parameters():
            if name in self.names:
                param.grad = pseudo_gradient[name].to(param.device, param.dtype)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
