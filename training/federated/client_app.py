"""hitoban's Flower ClientApp: what a joined machine does with each message from the server.

A "train" message carries a task and the global weights: in full, or as the fp16 outer update to the weights the
machine kept from its last task (training/federated/downlink.py), checked against the server's sha256 either way (a
machine without those weights, or whose result differs, answers with an error and gets them in full next round).
The reply carries the fp16 delta, the windows and seconds it took (the server sizes the next task from them) and
the task's id. A machine whose shards differ from the server's answers with an error naming the shard instead,
before it trains; one that cannot hold the task's step (its memory preflight, or an out-of-memory) answers with an
error saying what it needs; one whose delta is not finite answers with an error too (the server re-checks either
way). A "query" message with `done` is the end of the run: the machine writes STATE/DONE so `hitoban federate join`
can leave; one with `refused` says the server offers it no more tasks, and why: STATE/REFUSED, and join leaves with
that reason.
"""

from __future__ import annotations

from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from hitoban.training import faults
from hitoban.training.federated.downlink import UPDATE, WEIGHTS, apply_update, decode_scales, weights_digest
from hitoban.training.federated.inner import DONE_FILE, REFUSED_FILE, DoesNotFit, Machine, ShardMismatch, finite
from hitoban.training.federated.keys import reply_payload, sign
from hitoban.training.federated.outer import (
    DELTA,
    ERROR_DIVERGED,
    ERROR_MEMORY,
    ERROR_SHARDS,
    ERROR_WEIGHTS,
    METRICS,
    TASK,
    WEIGHT,
)

app = ClientApp()
_machines: dict[tuple, Machine] = {}


def machine_for(node_config) -> Machine:
    """One Machine per (data, state) in this process: the shard digests are read once."""
    key = (str(node_config["data"]), str(node_config["state"]))
    if key not in _machines:
        _machines[key] = Machine(node_config["data"], node_config["state"], str(node_config.get("name", "machine")),
                                 cpu=bool(node_config.get("cpu", False)),
                                 precision=str(node_config.get("precision", "auto")),
                                 grad_accum=int(node_config.get("grad-accum", 1)),
                                 memory_cap_gb=float(node_config.get("memory-cap-gb", 0)) or None,
                                 signing_key=str(node_config.get("key") or "") or None)
    return _machines[key]


def global_weights(machine: Machine, msg: Message) -> dict | str:
    """The global weights this task starts from: sent in full, or the machine's held ones plus the fp16 update
    (training/federated/downlink.py); either way checked against the server's sha256. A string says why not."""
    task, records = msg.content.config_records[TASK], msg.content.array_records
    run_id, version = str(task["run-id"]), int(task["version"])
    if UPDATE in records:
        held = machine.held_weights(run_id, int(task["base"]))
        if held is None:
            return f"an update to the weights of round {int(task['base'])}, which this machine does not hold"
        weights = apply_update(held, records[UPDATE].to_torch_state_dict(), decode_scales(str(task["scales"])))
    else:
        weights = records[WEIGHTS].to_torch_state_dict()
    if weights_digest(weights) != str(task["sha256"]):
        return f"the weights of round {version} do not match the server's sha256: not trained from"
    machine.hold(weights, run_id, version)
    return weights


def train_reply(machine: Machine, msg: Message) -> Message:
    task = msg.content.config_records[TASK]
    weights = global_weights(machine, msg)
    if isinstance(weights, str):  # not the server's weights: nothing is trained, the server sends them in full
        return Message(Error(code=ERROR_WEIGHTS, reason=f"{machine.name}: {weights}"), reply_to=msg)
    try:
        result = machine.train(weights, task)
    except ShardMismatch as err:
        return Message(Error(code=ERROR_SHARDS, reason=f"ShardMismatch: {machine.name}: {err}"), reply_to=msg)
    except DoesNotFit as err:
        print(f"hitoban: {err}", flush=True)
        return Message(Error(code=ERROR_MEMORY, reason=f"DoesNotFit: {err}"), reply_to=msg)
    if faults.active().federated_nan_delta:  # negative control: this machine sends a NaN delta on purpose
        first = next(iter(result.delta))
        result.delta[first] = result.delta[first].clone()
        result.delta[first].view(-1)[0] = float("nan")
    elif not finite(result.delta):
        return Message(Error(code=ERROR_DIVERGED, reason=f"{machine.name}: the task's training diverged (the delta "
                             "is not finite); nothing was sent"), reply_to=msg)
    print(f"hitoban: {machine.name}: task {int(task['task-id'])}, windows [{int(task['start']):,}, "
          f"{int(task['end']):,}): {result.windows * int(task['context']):,} tokens in {result.seconds:.1f} s, loss "
          f"{result.loss:.4f}", flush=True)
    content = RecordDict({
        DELTA: ArrayRecord({k: v.contiguous() for k, v in result.delta.items()}),
        METRICS: MetricRecord({WEIGHT: result.windows, "tokens": result.windows * int(task["context"]),
                               "seconds": result.seconds, "loss": result.loss}),
        TASK: ConfigRecord({"task-id": int(task["task-id"]), "run-id": str(task["run-id"]), "machine": machine.name,
                            **signature(machine, task, result.delta)}),
    })
    return Message(content, reply_to=msg)


def signature(machine: Machine, task, delta: dict) -> dict:
    """{"signature": hex} over (run, task, name, delta's sha256) with the machine's key; {} without one (--insecure)."""
    if machine.signing_key is None:
        return {}
    payload = reply_payload(str(task["run-id"]), int(task["task-id"]), machine.name, weights_digest(delta))
    return {"signature": sign(machine.signing_key, payload)}


@app.train()
def train(msg: Message, context: Context) -> Message:
    return train_reply(machine_for(context.node_config), msg)


def query_reply(state: Path, msg: Message) -> Message:
    """The server's word outside a task: the run is over (DONE), or it offers this machine no more tasks (REFUSED,
    with its reason); written into the state folder, where `hitoban federate join` reads it."""
    info = msg.content.config_records.get(TASK) or {}
    for key, name in (("done", DONE_FILE), ("refused", REFUSED_FILE)):
        if info.get(key):
            state.mkdir(parents=True, exist_ok=True)
            text = str(info.get("run-id", "")) if key == "done" else str(info[key])
            (state / name).write_text(text + "\n", encoding="utf-8")
            if key == "refused":
                print(f"hitoban: the server offers this machine no more tasks: {info[key]}", flush=True)
    return Message(RecordDict({TASK: ConfigRecord({"ok": 1})}), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    return query_reply(Path(str(context.node_config["state"])), msg)
