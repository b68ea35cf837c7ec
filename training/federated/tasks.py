"""The federated run's work: the token budget as a queue of window ranges, handed out per round and per machine.

The budget is a sequence of context windows (rows of ctx + 1 tokens): the rows of the single-machine night's own
batches at the run's global batch, in order (`ShardReader.rows`: position p is row p % G of batch (seed, p // G)),
so the machines train the very rows one machine would, random crops included (fixed windows repeated every epoch
instead measured +0.07 bits/char worse on held-out web text than the night at equal tokens, even with one machine).
A task is a range [start, end) of that sequence. Each round every machine gets a range sized from its measured
tokens/s, so the rounds end together; a range whose delta never arrives (the machine missed its lease, or its reply
was refused) goes back to the head of the queue and is handed out again. A range is `complete` only once its delta
is averaged into the global model, so each window of the budget is trained exactly once in the final model. The
whole queue is plain JSON: it is saved in the server's checkpoint every round.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass
class Task:
    """One machine's work in one round: windows [start, end) of the run's sequence."""

    task_id: int
    start: int
    end: int
    node: int  # the Flower node id it was given to
    round: int

    @property
    def windows(self) -> int:
        return self.end - self.start


@dataclass
class TaskQueue:
    """What is left of the budget, and who trained what. `budget_windows` windows in all; `next_window` is where
    fresh ranges are cut from, `returned` holds lost ranges, handed out first."""

    budget_windows: int
    batch_size: int  # windows per inner step: tasks are cut in whole steps where the budget allows
    next_window: int = 0
    returned: list[list[int]] = field(default_factory=list)
    completed_windows: int = 0
    next_task_id: int = 0
    reissued: list[dict] = field(default_factory=list)  # ranges handed out again: {start, end, lost_by, round, why}
    per_node: dict[str, dict] = field(default_factory=dict)  # node name -> windows, tasks, seconds, bytes

    @property
    def remaining(self) -> int:
        """Windows not yet handed out (fresh or returned)."""
        return self.budget_windows - self.next_window + sum(end - start for start, end in self.returned)

    @property
    def finished(self) -> bool:
        return self.completed_windows == self.budget_windows

    def take(self, windows: int, node: int, round_: int) -> Task | None:
        """Up to `windows` windows for `node`, one range: the first returned range (or its head) if any, else a
        fresh one. A machine gets at most one task a round (one copy of the weights each way)."""
        if windows <= 0 or not self.remaining:
            return None
        if self.returned:
            start, end = self.returned[0]
            cut = min(end, start + windows)
            if cut == end:
                self.returned.pop(0)
            else:
                self.returned[0] = [cut, end]
        else:
            start = self.next_window
            cut = min(self.budget_windows, start + windows)
            self.next_window = cut
        self.next_task_id += 1
        return Task(self.next_task_id - 1, start, cut, node, round_)

    def _tally(self, name: str) -> dict:
        return self.per_node.setdefault(name, {"windows": 0, "tasks": 0, "seconds": 0.0, "bytes_up": 0,
                                               "bytes_down": 0, "lost_tasks": 0})

    def complete(self, task: Task, name: str, seconds: float, bytes_up: int, bytes_down: int) -> None:
        """The task's delta is in the global model: its windows count as trained."""
        self.completed_windows += task.windows
        tally = self._tally(name)
        tally["windows"] += task.windows
        tally["tasks"] += 1
        tally["seconds"] += seconds
        tally["bytes_up"] += bytes_up
        tally["bytes_down"] += bytes_down

    def lose(self, task: Task, name: str, why: str, bytes_down: int = 0) -> None:
        """The range goes back to the head of the queue (kept in budget order), to be trained in a later round."""
        self.returned.append([task.start, task.end])
        self.returned.sort()
        self.reissued.append({"start": task.start, "end": task.end, "lost_by": name, "round": task.round,
                              "why": why})
        tally = self._tally(name)
        tally["lost_tasks"] += 1
        tally["bytes_down"] += bytes_down

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> TaskQueue:
        return cls(**data)


def schedule_step(round_start: int, round_windows: int, step: int, task_steps: int, budget_windows: int,
                  schedule_steps: int) -> int:
    """The learning-rate schedule's step for inner step `step` (of `task_steps`) of a task in a round that starts
    with `round_start` windows of the budget trained and hands out `round_windows`: the budget's progress at that
    point of the round, in the steps of a schedule built for `schedule_steps`. Every machine of a round walks the
    round's stretch of the schedule in its own number of steps, so machines that train side by side use the same lr
    at the same moment (DiLoCo's inner schedule), as a single machine at the global batch would; a range trained
    again after a loss gets the lr of the round that trains it."""
    position = round_start * task_steps + round_windows * step  # windows x task_steps, kept whole
    return min(position * schedule_steps // (budget_windows * task_steps), schedule_steps - 1)


def slice_windows(speeds: dict[int, float | None], inner_steps: int, batch_size: int, probe_steps: int
                  ) -> dict[int, int]:
    """Windows per node for one round: the fastest known machine gets `inner_steps` steps (DiLoCo's H), each other
    the share its tokens/s allows, at least one step; a machine not measured yet gets `probe_steps`, which
    measures it."""
    known = [s for s in speeds.values() if s]
    fastest = max(known) if known else None
    sizes = {}
    for node, speed in speeds.items():
        steps = probe_steps if not speed or fastest is None else max(1, round(inner_steps * speed / fastest))
        sizes[node] = steps * batch_size
    return sizes
