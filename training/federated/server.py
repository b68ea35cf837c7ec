"""The federated run's server: rounds of DiLoCo over Flower's Grid, with the night's crash safety.

Each round: wait for machines, give each a task sized from its measured tokens/s (training/federated/tasks.py), send
the global weights and the task, collect the replies within the lease, refuse what must not be averaged
(`outer.refusal`: an error, a stranger, a wrong shape or dtype, a non-finite delta), return lost tasks to the queue,
apply the outer step, and save the global model, the outer momentum and the queue as an A/B checkpoint
(training/pretrain/checkpoint.py, the night's own). A machine that cannot train the run is no longer offered tasks,
and told why: one that cannot hold the step in memory at once, one that fails the same range twice or three tasks
in a row; a run that no connected machine can train stops with NoMachineCanTrain. Killed and started again with
the same command, the server loads the last checkpoint and re-runs the round it was in: tasks are complete only
once averaged in, so every token of the budget is trained exactly once in the final model. The run folder is an
ordinary run's: final/ (a `from_pretrained` folder with tokenizer and lineage.json naming the federated run),
log.jsonl, heartbeat.json, summary.json.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import time
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.common.constant import ErrorCode

from hitoban.errors import ResourceError, UsageError
from hitoban.modeling import HitobanForCausalLM
from hitoban.provenance import read_lineage
from hitoban.run_folder import FEDERATED_HEARTBEAT, SUMMARY_SCHEMA, RunFolder
from hitoban.training.data.reader import ShardReader
from hitoban.training.data.shards import load_index, sha256_file
from hitoban.training.federated.downlink import (
    UPDATE,
    WEIGHTS,
    apply_update,
    encode_scales,
    encode_update,
    weights_digest,
)
from hitoban.training.federated.inner import trajectory_of
from hitoban.training.federated.keys import registered_keys, reply_payload, signed_by
from hitoban.training.federated.options import ServeOptions
from hitoban.training.federated.outer import (
    DELTA,
    ERROR_MEMORY,
    ERROR_SHARDS,
    ERROR_WEIGHTS,
    METRICS,
    TASK,
    DiLoCo,
    delta_norm,
    out_of_bounds,
    refusal,
    shared_tensors,
)
from hitoban.training.federated.tasks import Task, TaskQueue, slice_windows
from hitoban.training.night import evaluate
from hitoban.training.pretrain.checkpoint import (
    TrainState,
    check_resumable,
    current_slot,
    export_final,
    has_checkpoint,
    load_latest,
    save_checkpoint,
)
from hitoban.training.pretrain.options import shaped_config
from hitoban.training.pretrain.resume import trajectory_fingerprint

OPTIONS_FILE = "federate.json"  # the server's options, written by `federate serve`, read by the ServerApp
DONE = "done"  # the message type's config value that tells a machine the run is over
FEDERATED_KEYS = ("tokens", "inner_steps", "probe_steps", "outer_lr", "outer_momentum")
SAME_RANGE_FAILURES, FAILURES_IN_A_ROW = 2, 3  # a machine failing this often is offered no more tasks
POLL_SECONDS = 0.5  # how often the server asks the SuperLink for replies (Flower's own loop waits 3 s)


class NoMachineCanTrain(ResourceError):
    """Every connected machine has been refused: the run would wait, or re-issue the same task, for ever."""


def plan_budget(options: ServeOptions, train: ShardReader) -> tuple:
    """(model config, context, budget rows) for `train`, the run's train split; a UsageError when the budget is not
    one row or the split has no window of the context."""
    config, context = shaped_config(options.preset, train.vocab_size, options.context, dropout=options.dropout)
    budget = options.tokens // context
    if budget < 1 or int(train.tokens.max()) < context + 1:
        raise UsageError(f"--tokens {options.tokens:,} is {budget:,} rows of {context} tokens and the longest train "
                         f"shard has {int(train.tokens.max()):,} tokens: a federated run needs a row of "
                         f"{context + 1} tokens and a budget of at least one")
    return config, context, budget


def grid_clock(grid) -> Callable[[], float]:
    """The clock replies are timed by: the server's own, or the grid's where it keeps one (an in-process grid whose
    machines train one after another says when each reply would have arrived had they trained side by side)."""
    return getattr(grid, "clock", time.time)


def exchange(grid, messages: list[Message], timeout: float) -> list[tuple[Message, float]]:
    """Flower's send_and_receive, with the server's own clock time at which each reply arrived: a machine's speed
    is measured here, never taken from its reply. A grid without push/pull gives every reply the round's end. The
    server asks again at once while replies keep coming, and waits POLL_SECONDS when a poll brought none."""
    clock = grid_clock(grid)
    if not hasattr(grid, "push_messages"):
        replies = list(grid.send_and_receive(messages, timeout=timeout))
        return [(reply, clock()) for reply in replies]
    waiting, arrived, deadline = set(grid.push_messages(messages)), [], clock() + timeout
    while waiting and clock() < deadline:
        replies = list(grid.pull_messages(set(waiting)))
        for reply in replies:
            arrived.append((reply, clock()))
            waiting.discard(reply.metadata.reply_to_message_id)
        if waiting and not replies:
            time.sleep(POLL_SECONDS)
    return arrived


def snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    return ({k: v.detach().clone() for k, v in model.state_dict().items()}, copy.deepcopy(optimizer.state_dict()))


def restore(model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: tuple[dict, dict]) -> None:
    model.load_state_dict(saved[0])
    optimizer.load_state_dict(copy.deepcopy(saved[1]))


def model_is_finite(model: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def read_options(run: Path) -> ServeOptions:
    return ServeOptions(**json.loads((run / OPTIONS_FILE).read_text()))


class Server:
    """One federated run, driven by a Flower `Grid` (the ServerApp's, or a test's in-process one)."""

    def __init__(self, run: str | Path, log=print):
        self.run, self.log = Path(run), log
        self.folder = RunFolder(self.run)  # config.json, log.jsonl, heartbeat.json, summary.json
        self.options = options = read_options(self.run)
        data = Path(options.data)
        index = load_index(data)
        self.corpus_sha256 = (index.get("corpus") or {}).get("sha256")  # the corpus the shards were encoded from
        self.train = ShardReader(data, "train")
        self.val = ShardReader(data, "val", verify=False) if index["splits"]["val"]["tokens"] else None

        self.config, self.context, budget = plan_budget(options, self.train)
        self.total_steps = math.ceil(budget / options.batch_size)
        # the global batch (--batch-size x --min-machines): the night's batches at this size are the budget's rows
        # (ShardReader.rows) and its schedule is the one the machines walk by the budget's progress
        # (tasks.schedule_step); fixed when the run starts and kept through resumes, so a restart with another
        # --min-machines does not change the trajectory's past
        self.global_batch = options.batch_size * options.min_machines
        self.shards = {s["name"]: s["sha256"] for s in index["shards"] if s["split"] == "train"}
        fingerprint = trajectory_fingerprint(options, self.config, index, sha256_file(data / "shards_index.json"),
                                             self.context, self.total_steps, "per machine")
        self.fingerprint = {**fingerprint, **{k: getattr(options, k) for k in FEDERATED_KEYS}}
        torch.manual_seed(options.seed)
        self.model = HitobanForCausalLM(self.config)
        self.strategy = DiLoCo(self.model, options.outer_lr, options.outer_momentum)
        self.expected = {name: tuple(t.shape) for name, t in shared_tensors(self.model).items()}
        self.tokenizer_dir = data / "tokenizer" if (data / "tokenizer").exists() else None
        self.queue = TaskQueue(budget, options.batch_size)
        self.state = TrainState(run_id=uuid.uuid4().hex, seed=options.seed, fingerprint=self.fingerprint,
                                data_index_sha256=self.fingerprint["data_index_sha256"],
                                args={k: v for k, v in dataclasses.asdict(options).items() if k not in ("data", "out")})
        self.machines: dict[str, dict] = {}  # str(node id) -> {"name", "tok_s"}: names as `_identify` checked them
        self.keys = registered_keys(options.keys) if options.keys else None  # name -> public key (--keys)
        # node id -> the name `_identify` accepted from it, this session only (node ids change when the SuperLink
        # restarts); `connected` is the grid's nodes when the round began
        self.bound_names: dict[int, str] = {}
        self.connected: set[int] = set()
        # the downlink (training/federated/downlink.py): which global weights (by round) each node holds, and the
        # fp16 outer update of the last round; neither is saved: after a resume every machine gets the weights
        self.held: dict[int, int] = {}
        self.last_update: tuple[int, dict, dict] | None = None  # (round it leads to, fp16 update, scales)
        self.refused_nodes: dict[str, str] = {}  # node -> why: shards that differ (kept through resumes)
        # node -> why: a machine that cannot train this run (memory, repeated failures). Not kept through a resume: a
        # restarted server offers every machine tasks again (one rejoined with --grad-accum, say)
        self.excluded: dict[str, str] = {}
        self.failures: dict[str, dict] = {}  # node -> {"start", "same", "in_a_row"}: its recent lost tasks
        self.rounds_log: list[dict] = []
        self.resumed = self._resume()

    @property
    def schedule_steps(self) -> int:
        return math.ceil(self.queue.budget_windows / self.global_batch)

    def _resume(self) -> bool:
        if self.options.resume != "auto" or not has_checkpoint(self.run):  # damaged slots are refused, not skipped
            return False
        _, saved, _, _ = load_latest(self.run, self.model, self.strategy.optimizer,
                                     check=lambda state: check_resumable(state, self.fingerprint), log=self.log)
        extra = saved.extra
        self.queue = TaskQueue.from_json(extra["queue"])
        self.global_batch = int(extra["global_batch"])
        self.machines, self.refused_nodes = extra["machines"], extra["refused_nodes"]
        self.state = dataclasses.replace(saved, resumes=saved.resumes + 1)
        self.log(f"# resumed at round {saved.step} ({self.queue.completed_windows:,} of "
                 f"{self.queue.budget_windows:,} windows trained), resume {self.state.resumes}")
        self._record({"type": "resume", "round": saved.step, "resumes": self.state.resumes})
        return True

    def _announce(self) -> None:
        """RUN/config.json, as the night writes it (the card reads its recipe there): the server's options as given
        (the federated ones among them) and what they resolved to."""
        self.folder.write_config(
            "federated-run",
            given={k: v for k, v in dataclasses.asdict(self.options).items() if k not in ("data", "out")},
            resolved={"context": self.context, "total_steps": self.schedule_steps, "global_batch": self.global_batch,
                      "tokens_per_step": self.global_batch * self.context},
            run_id=self.state.run_id, fingerprint=self.fingerprint,
            hardware="federated (each machine's own device plan)")

    # ------------------------------------------------------------------------------------------------ the rounds
    def serve(self, grid) -> dict:
        """Rounds until every window of the budget is in the global model; then final/ and summary.json."""
        started = time.time()
        self._announce()
        self.state.elapsed_sec = self.state.elapsed_sec or 0.0
        session_start, elapsed_before = time.time(), self.state.elapsed_sec
        while not self.queue.finished:
            nodes = self._wait_for_machines(grid)
            self._round(grid, nodes)
            self.state.elapsed_sec = elapsed_before + time.time() - session_start
            if self.state.step % self.options.eval_every == 0 or self.queue.finished:
                self._evaluate()
            self._save()
        self._finish(grid)
        return self._summarise(started)

    def _wait_for_machines(self, grid) -> list[int]:
        """The machines that may train now; while fewer than --min-machines, waits, and says so in server.log
        whenever the count changes (a server that waits in silence looks hung)."""
        deadline, said = time.time() + self.options.wait_minutes * 60, None
        while True:
            connected = sorted(grid.get_node_ids())
            self.connected = set(connected)
            nodes = [n for n in connected if str(n) not in self.refused_nodes and str(n) not in self.excluded]
            if connected and not nodes:
                reasons = "; ".join(f"{self._name(n)}: {self.refused_nodes.get(str(n)) or self.excluded[str(n)]}"
                                    for n in connected)
                raise NoMachineCanTrain(f"no connected machine can train this run ({reasons}); join one that can "
                                        "(or lower --batch-size), then start the server again with the same command "
                                        "(it resumes)")
            if len(nodes) >= self.options.min_machines:
                return nodes
            if said != nodes:
                said = nodes
                self.log(f"round {self.state.step + 1}: waiting for machines: {len(nodes)} of --min-machines "
                         f"{self.options.min_machines} connected" + (f" ({', '.join(map(self._name, nodes))})"
                                                                     if nodes else "")
                         + f"; giving up after {self.options.wait_minutes:g} min")
            if time.time() > deadline:
                raise RuntimeError(f"only {len(nodes)} machine(s) connected for {self.options.wait_minutes:g} min "
                                   f"(--min-machines {self.options.min_machines}); start more with `hitoban federate "
                                   "join`, then start the server again with the same command (it resumes)")
            time.sleep(1.0)

    def _downlinks(self, nodes, current: dict, version: int) -> dict[int, tuple[str, ArrayRecord, dict[str, int]]]:
        """Per node, (record name, record, scales): the fp16 outer update where the node holds the last round's
        weights, else the weights in full (no scales). Each record is built once a round and sent to every node
        that gets it."""
        update = self.last_update if self.last_update is not None and self.last_update[0] == version else None
        sends_update = {node: update is not None and self.held.get(node) == version - 1 for node in nodes}
        records = {}
        if any(sends_update.values()):
            records[UPDATE] = (UPDATE, ArrayRecord(update[1]), update[2])
        if not all(sends_update.values()):
            records[WEIGHTS] = (WEIGHTS, ArrayRecord(current), {})
        return {node: records[UPDATE if sends_update[node] else WEIGHTS] for node in nodes}

    def _apply_fp16_update(self, before: dict, round_: int) -> None:
        """Encode the outer step (the global model minus `before`) as the fp16 update the machines are sent, and make
        the global model `before + decode(update)`: the weights every machine will rebuild from it."""
        tensors = shared_tensors(self.model)
        update, scales = encode_update(tensors, before)
        rounded = apply_update(before, update, scales)
        with torch.no_grad():
            for name, tensor in tensors.items():
                tensor.copy_(rounded[name])
        self.last_update = (round_, update, scales)

    def _task_config(self, task: Task, version: int, digest: str, scales: dict[str, int], round_start: int,
                     round_windows: int) -> ConfigRecord:
        return ConfigRecord({
            "run-id": self.state.run_id, "task-id": task.task_id, "start": task.start, "end": task.end,
            "version": version, "base": version - 1, "sha256": digest, "scales": encode_scales(scales),
            "seed": self.options.seed, "context": self.context, "global-batch": self.global_batch,
            "schedule-steps": self.schedule_steps, "budget-windows": self.queue.budget_windows,
            "round-start": round_start, "round-windows": round_windows, "round": task.round,
            "options": json.dumps(trajectory_of(self.options)), "shards": json.dumps(self.shards)})

    def _round(self, grid, nodes: list[int]) -> None:
        round_ = self.state.step + 1
        speeds = {n: (self.machines.get(str(n)) or {}).get("tok_s") for n in nodes}
        sizes = slice_windows(speeds, self.options.inner_steps, self.options.batch_size, self.options.probe_steps)
        current = {k: v.detach().float().cpu().clone() for k, v in shared_tensors(self.model).items()}  # not aliased
        version, digest = self.state.step, weights_digest(current)
        round_start = self.queue.completed_windows  # the schedule's place: the budget trained so far
        tasks: dict[int, Task] = {}
        for node in nodes:
            task = self.queue.take(sizes[node], node, round_)
            if task is not None:
                tasks[node] = task
        round_windows = sum(task.windows for task in tasks.values())
        payloads = self._downlinks(list(tasks), current, version)
        down = {node: record.count_bytes() for node, (_, record, _) in payloads.items()}
        messages = [Message(RecordDict({payloads[node][0]: payloads[node][1],
                                        TASK: self._task_config(task, version, digest, payloads[node][2],
                                                                   round_start, round_windows)}),
                            dst_node_id=node, message_type=MessageType.TRAIN) for node, task in tasks.items()]
        self.log(f"round {round_}: {len(tasks)} machine(s), windows "
                 + ", ".join(f"{self._name(n)} [{t.start:,}, {t.end:,})" for n, t in tasks.items()))
        clock = grid_clock(grid)
        began = clock()
        arrivals = exchange(grid, messages, self.options.lease_minutes * 60)
        # which node a reply answers: by the message it replies to (the SuperLink's own errors, e.g. a node gone
        # offline, come from node 1); the sender is then checked against the task's node (`refusal`)
        asked = {m.metadata.message_id: m.metadata.dst_node_id for m in messages}
        by_node: dict[int, tuple[Message, float]] = {}
        for reply, arrived in arrivals:
            node = asked.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)
            if node in tasks and node not in by_node:
                by_node[node] = (reply, arrived - began)
            else:  # a reply nobody asked for (or a second one): logged, never averaged
                self._refuse(round_, node, refusal(reply, None, self.expected, self.state.run_id))
        checked = {}
        for node, task in tasks.items():
            reply, _ = by_node.get(node, (None, None))
            if reply is None:
                why = f"no reply within the lease ({self.options.lease_minutes:g} min)"
            else:  # who sent it first, so that a refused reply is put down to the machine that sent it
                unknown = None if reply.has_error() else self._identify(node, reply, task)
                why = refusal(reply, task, self.expected, self.state.run_id) or unknown
            if why is None:
                checked[node] = reply
            else:
                self._lose(grid, round_, node, task, why, reply, down[node])
        norms = {node: delta_norm(reply.content.array_records[DELTA]) for node, reply in checked.items()}
        weights_norm = math.sqrt(sum(float(t.double().square().sum()) for t in current.values()))
        for node, why in out_of_bounds(norms, weights_norm).items():
            self._lose(grid, round_, node, tasks[node], why, checked.pop(node), down[node])
        accepted = self._outer_step(grid, round_, checked, tasks, down, current)
        round_tokens = 0
        for node in accepted:
            reply, task, seconds = checked[node], tasks[node], by_node[node][1]
            # the machine's speed is what the server saw: its task's tokens over the time to its reply (what it
            # claims about its own tokens and seconds is never read)
            self.machines[str(node)] = {**self.machines.get(str(node), {}),
                                        "tok_s": task.windows * self.context / max(seconds, 1e-3)}
            up = reply.content.array_records[DELTA].count_bytes()
            self.queue.complete(task, self._name(node), round(seconds, 3), up, down[node])
            self.held[node] = version  # it checked the weights' sha256 before training from them
            self.failures.pop(str(node), None)
            round_tokens += task.windows * self.context
        self.state.step = round_
        self.state.tokens_seen = self.queue.completed_windows * self.context
        seconds = clock() - began
        kept = [(checked[n], tasks[n]) for n in accepted]
        record = {"type": "round", "round": round_, "machines": len(tasks), "accepted": len(accepted),
                  "tokens": round_tokens, "tokens_seen": self.state.tokens_seen, "seconds": round(seconds, 2),
                  "train_loss": (sum(float(r.content.metric_records[METRICS]["loss"]) * t.windows for r, t in kept)
                                 / max(sum(t.windows for _, t in kept), 1)) if kept else None,
                  "bytes_down": sum(down.values()), "bytes_up": sum(r.content.array_records[DELTA].count_bytes()
                                                                   for r, _ in kept)}
        self.rounds_log.append(record)
        self._record(record)
        self._heartbeat(seconds, record)

    def _identify(self, node: int, reply: Message, task: Task) -> str | None:
        """Why the reply's machine name cannot be trusted, or None (and the node is known by that name from now
        on). With --keys the name is the key's: the reply must carry a signature of (run, task, name, delta) by
        the registered key of the name it gives. Without keys (--insecure) a name belongs to the node that used it
        while that node stays connected; another node giving it meanwhile is refused."""
        info, delta = reply.content.config_records.get(TASK), reply.content.array_records.get(DELTA)
        if info is None or delta is None:
            return "its reply has no task record or no delta"
        claimed = str(info.get("machine") or f"node-{node}")
        if self.keys is not None:
            key = self.keys.get(claimed)
            if key is None:
                return f"its reply names {claimed!r}, which has no registered key"
            try:
                digest = weights_digest(delta.to_torch_state_dict())
            except (TypeError, ValueError, RuntimeError) as error:
                return f"its delta cannot be read ({type(error).__name__})"
            payload = reply_payload(self.state.run_id, task.task_id, claimed, digest)
            if not signed_by(key, payload, str(info.get("signature", ""))):
                return f"its reply names {claimed!r} but is not signed by {claimed!r}'s key"
        known = self.bound_names.get(node)
        if known is not None and known != claimed:
            return f"it was {known!r} and now names itself {claimed!r}"
        holder = next((n for n, name in self.bound_names.items() if name == claimed and n != node), None)
        if holder is not None and self.keys is None and holder in self.connected:
            return f"its reply names {claimed!r}, the name of node {holder}, which is still connected"
        # the key proves the name (a machine restarted, or the server, comes back as another node id); without keys
        # a name whose node has left is free again (a restarted machine), which is all an unsigned name can mean
        self.bound_names.pop(holder, None)
        self.bound_names[node] = claimed
        self.machines.setdefault(str(node), {"tok_s": None})["name"] = claimed
        return None

    def _lose(self, grid, round_: int, node: int, task: Task, why: str, reply: Message | None, down: int) -> None:
        """A task that is not averaged in goes back to the queue, and counts against its machine."""
        self._refuse(round_, node, why, task)
        self.held.pop(node, None)  # what it holds now is unknown: the weights in full next time
        self.queue.lose(task, self._name(node), why, down)
        code = reply.error.code if reply is not None and reply.has_error() else None
        if code == ERROR_SHARDS:
            self.refused_nodes[str(node)] = reply.error.reason  # never given a task again
        elif code not in (ERROR_WEIGHTS, ErrorCode.NODE_UNAVAILABLE):
            # not its failure: weights that did not match go in full next time, and a machine the SuperLink has
            # lost (killed, restarting) is offered nothing while gone; with its key it comes back as the same node,
            # and must not find itself excluded for having been restarted
            self._count_failure(grid, round_, node, task, why, at_once=code == ERROR_MEMORY)

    def _outer_step(self, grid, round_: int, checked: dict[int, Message], tasks: dict[int, Task],
                    down: dict[int, int], current: dict) -> list[int]:
        """The outer step on the checked deltas, rounded as the machines will rebuild it; the nodes whose deltas
        are in it. A step that leaves the global model non-finite (after the fp16 rounding too) is rolled back, the
        deltas that do so on their own are refused by name, and the rest are applied again: no non-finite model is
        ever kept, or saved."""
        before = snapshot(self.model, self.strategy.optimizer)

        def step(replies: list[Message]) -> bool:
            restore(self.model, self.strategy.optimizer, before)
            if replies:
                self.strategy.aggregate_train(round_, replies)
            self._apply_fp16_update(current, round_)
            return model_is_finite(self.model)

        if step(list(checked.values())):
            return list(checked)
        offenders = [node for node, reply in checked.items() if not step([reply])]
        rest = {n: r for n, r in checked.items() if n not in offenders} if offenders else {}
        for node in [n for n in checked if n not in rest]:
            self._lose(grid, round_, node, tasks[node], "the outer step with its delta made the global model "
                       "non-finite: rolled back", checked[node], down[node])
        if rest and step(list(rest.values())):
            return list(rest)
        for node in rest:  # finite alone, not together: none of them is kept
            self._lose(grid, round_, node, tasks[node], "this round's deltas together made the global model "
                       "non-finite: rolled back", checked[node], down[node])
        step([])
        return []

    def _count_failure(self, grid, round_: int, node: int, task: Task, why: str, at_once: bool) -> None:
        """A lost task counts against its machine: one that cannot hold the step (`at_once`), fails the same range
        twice, or loses three tasks in a row is offered no more, and told why. Without this a machine that cannot
        train got the same range back every round, and with one machine the run never ended."""
        seen = self.failures.get(str(node))
        same = seen["same"] + 1 if seen is not None and seen["start"] == task.start else 1
        in_a_row = seen["in_a_row"] + 1 if seen is not None else 1
        self.failures[str(node)] = {"start": task.start, "same": same, "in_a_row": in_a_row}
        if at_once:
            self._exclude(grid, round_, node, why)
        elif same >= SAME_RANGE_FAILURES:
            self._exclude(grid, round_, node, f"it failed windows [{task.start:,}, ...) {same} times; last: {why}")
        elif in_a_row >= FAILURES_IN_A_ROW:
            self._exclude(grid, round_, node, f"it lost {in_a_row} tasks in a row; last: {why}")

    def _exclude(self, grid, round_: int, node: int, why: str) -> None:
        self.excluded[str(node)] = why
        self.log(f"round {round_}: {self._name(node)} is offered no more tasks: {why}")
        self._record({"type": "excluded", "round": round_, "node": node, "machine": self._name(node), "why": why})
        told = Message(RecordDict({TASK: ConfigRecord({"run-id": self.state.run_id, "refused": why})}),
                       dst_node_id=node, message_type=MessageType.QUERY)
        list(grid.send_and_receive([told], timeout=30))  # best effort: a machine that misses it just idles

    def _refuse(self, round_: int, node: int, why: str, task: Task | None = None) -> None:
        lost = f"; its task {task.task_id} goes back to the queue" if task is not None else ""
        self.log(f"round {round_}: {self._name(node)}: refused: {why}{lost}")
        self._record({"type": "refused", "round": round_, "node": node, "why": why,
                      "task": None if task is None else task.task_id})

    def _name(self, node: int) -> str:
        return (self.machines.get(str(node)) or {}).get("name", f"node-{node}")

    # -------------------------------------------------------------------------------------- records and the end
    def _record(self, record: dict) -> None:
        self.folder.log({**record, "time": round(time.time(), 1)})

    def _heartbeat(self, round_seconds: float, record: dict, finished: bool = False) -> None:
        queue, left = self.queue, self.queue.budget_windows - self.queue.completed_windows
        rate = record["tokens"] / max(round_seconds, 1e-9) if record.get("tokens") else None
        self.folder.heartbeat({
            "kind": FEDERATED_HEARTBEAT, "schema": 1, "round": self.state.step, "tokens_seen": self.state.tokens_seen,
            "token_budget": queue.budget_windows * self.context, "machines": {
                m.get("name", node): {"tok_s": round(m["tok_s"] or 0, 1), **queue.per_node.get(m.get("name"), {})}
                for node, m in self.machines.items()},
            "reissued": len(queue.reissued), "bytes_sent": sum(t["bytes_up"] + t["bytes_down"]
                                                               for t in queue.per_node.values()),
            "train_loss": record.get("train_loss"), "best_val": self.state.best_val,
            "eta_hours": (left * self.context / rate / 3600) if rate and not finished else None,
            "elapsed_hours": round(self.state.elapsed_sec / 3600, 4), "resumes": self.state.resumes,
            "finished": finished, "updated_at": time.time()})

    def _evaluate(self) -> None:
        if self.val is None:
            return

        domains = getattr(self, "_domains", None)
        if domains is None:
            batch = min(self.options.batch_size, 16)
            domains = self._domains = self.val.domain_streams(self.options.eval_batches * batch * (self.context + 1))

        result = evaluate(self.model, self.val, domains, self.options.eval_batches, min(self.options.batch_size, 16),
                          self.context, nullcontext)
        self._record({"type": "eval", "round": self.state.step, **result})
        self.state.best_val = result["val_loss"]  # the final model is the last global model: its loss is recorded
        self.log(f"round {self.state.step}: val loss {result['val_loss']:.4f}")

    def _save(self) -> Path:
        if not model_is_finite(self.model):  # `_outer_step` rolls such a step back: this is the last line of defence
            raise RuntimeError("the global model is not finite; it was not saved (the last checkpoint is kept)")
        self.state.extra = {"queue": self.queue.to_json(), "machines": self.machines,
                            "refused_nodes": self.refused_nodes, "global_batch": self.global_batch}
        return save_checkpoint(self.run, self.model, self.strategy.optimizer, self.state, self.tokenizer_dir)

    def lineage(self) -> dict:
        queue = self.queue
        return {"kind": "federated", "rounds": self.state.step, "algorithm": "DiLoCo (outer SGD, Nesterov "
                f"{self.options.outer_momentum}, lr {self.options.outer_lr}; inner: the night's step)",
                "machines": {name: {"tokens": t["windows"] * self.context, "tasks": t["tasks"],
                                    "lost_tasks": t["lost_tasks"]} for name, t in queue.per_node.items()
                             if t["windows"]},  # the machines whose training is in these weights
                "reissued_ranges": len(queue.reissued)}

    def _finish(self, grid) -> None:
        slot = current_slot(self.run)
        export_final(self.run, slot, {
            "run": self.run.name, "run_id": self.state.run_id, "step": self.state.step, "rounds": self.state.step,
            "total_steps": self.schedule_steps, "val_loss": self.state.best_val, "tokens_seen": self.state.tokens_seen,
            "resumes": self.state.resumes, "elapsed_hours": round(self.state.elapsed_sec / 3600, 4),
            "hardware": "federated: " + ", ".join(sorted(self.queue.per_node)), "federated": self.lineage(),
            "data_index_sha256": self.fingerprint["data_index_sha256"],
            "corpus_sha256": self.corpus_sha256, "tokenizer_sha256": self.fingerprint["tokenizer_sha256"]})
        nodes = list(grid.get_node_ids())
        if nodes:  # tell the machines the run is over (best effort: a machine that misses it just idles)
            done = [Message(RecordDict({TASK: ConfigRecord({"run-id": self.state.run_id, DONE: 1})}),
                            dst_node_id=n, message_type=MessageType.QUERY) for n in nodes]
            list(grid.send_and_receive(done, timeout=30))

    def _summarise(self, started: float) -> dict:
        queue = self.queue
        final = read_lineage(self.run / "final")
        summary = {"kind": "federated-summary", "schema": SUMMARY_SCHEMA, "run_id": self.state.run_id,
                   "rounds": self.state.step,
                   "tokens_seen": self.state.tokens_seen, "token_budget": queue.budget_windows * self.context,
                   "windows": queue.budget_windows, "context": self.context, "best_val": self.state.best_val,
                   "resumes": self.state.resumes, "stop_reason": "budget",
                   "per_machine": {name: {**t, "tokens": t["windows"] * self.context}
                                   for name, t in queue.per_node.items()},
                   "reissued": queue.reissued, "refused_nodes": self.refused_nodes,
                   "excluded_machines": {self._name(int(n)): why for n, why in self.excluded.items()},
                   "session_seconds": round(time.time() - started, 1),
                   "elapsed_hours": round(self.state.elapsed_sec / 3600, 4),
                   "final_weights_sha256": final.get("weights_sha256"), "final_step": final.get("step")}
        self.folder.write_summary(summary["kind"], summary)
        self._heartbeat(1.0, {"tokens": 0, "train_loss": None}, finished=True)
        self.log(f"federate: finished after {self.state.step} rounds, {self.state.tokens_seen:,} tokens; "
                 f"final/ in {self.run}")
        return summary
