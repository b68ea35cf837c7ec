"""One machine's side of a federated round: check the shards against the server's, train the task's windows with the
night's own step, return the delta.

The inner steps are the night's (`training.step.train_step`, the night's optimizer built by `build_optimizer`, its
`Schedule` at the round's place in the budget (`tasks.schedule_step`), the machine's own device plan for precision
and Muon's Newton-Schulz).
Batches are the task's rows of the night's batches at the run's global batch (`ShardReader.rows`), B at a time: a
pure function of (seed, position range), so a re-issued range trains the same rows on any machine, and the machines
of a round together train exactly the rows a single machine would. The inner optimizer state stays on the machine
(DiLoCo keeps it local), saved after every task, so a machine killed mid-task loses at most that task and rejoins
with its state.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from hitoban.errors import InputError, ResourceError
from hitoban.provenance import replacing
from hitoban.training import faults, night
from hitoban.training.data.reader import ShardReader
from hitoban.training.data.shards import load_index, sha256_file
from hitoban.training.device import machine_fields, set_up
from hitoban.training.federated.tasks import schedule_step
from hitoban.training.memory import estimate_memory_bytes, fits, memory_limit
from hitoban.training.optim import load_optimizer_tensors, optimizer_tensors
from hitoban.training.pretrain.options import TrainingOptions, shaped_config
from hitoban.training.step import reset_accelerate_state

MACHINE_ONLY = ("data", *machine_fields(TrainingOptions))  # each machine's own (`machine=True` on the field)
DONE_FILE, REFUSED_FILE = "DONE", "REFUSED"  # in a machine's state folder: the server's word, read by join


class ShardMismatch(InputError):
    """This machine's shards are not the server's: it must not train (its delta would be of other text)."""


def shard_digests(data: Path, state: Path, verified: bool = False) -> dict[str, str]:
    """sha256 of every shard, hashed once and cached by (size, mtime) in the machine's state folder: a restart does
    not re-read gigabytes. `verified`: `verify_shards(full=True)` has just proven every file equal to its index's
    sha256, so those are recorded without reading the files a second time."""
    cache_path = state / "shard-sha256.json"
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    digests, changed = {}, False
    for shard in load_index(data)["shards"]:
        path = data / shard["name"]
        if not path.exists():
            raise ShardMismatch(f"{path} is missing: copy the server's shards (check with `hitoban shards --verify`)")
        key = f"{path.stat().st_size}:{path.stat().st_mtime_ns}"
        if cache.get(shard["name"], {}).get("key") != key:
            cache[shard["name"]] = {"key": key, "sha256": shard["sha256"] if verified else sha256_file(path)}
            changed = True
        digests[shard["name"]] = cache[shard["name"]]["sha256"]
    if changed:
        state.mkdir(parents=True, exist_ok=True)
        cache_path.write_text(json.dumps(cache, indent=1))
    return digests


def check_shards(mine: dict[str, str], servers: dict[str, str]) -> None:
    """Refuse, naming the first shard that differs, before a step is trained."""
    for name, digest in servers.items():
        if name not in mine:
            raise ShardMismatch(f"shard {name} of the server's index is not on this machine")
        if mine[name] != digest:
            raise ShardMismatch(f"shard {name} differs from the server's (sha256 {mine[name][:12]}... here, "
                                f"{digest[:12]}... there): copy the server's shards again")


class DoesNotFit(ResourceError):
    """This machine cannot hold the task's training step: refused before it trains (or after an out-of-memory)."""


def fewest_accumulation_steps(batch: int, fits) -> int | None:
    """The smallest --grad-accum (a divisor of `batch`) whose micro-batch `fits(micro)`, or None."""
    return next((k for k in range(1, batch + 1) if batch % k == 0 and fits(batch // k)), None)


@dataclass
class TaskResult:
    delta: dict[str, torch.Tensor]  # fp16: the global weights minus this machine's after the task
    windows: int
    seconds: float
    loss: float


class Machine:
    """A joined machine: its shards, its device, the folder where its inner optimizer state lives."""

    def __init__(self, data: str | os.PathLike, state: str | os.PathLike, name: str, cpu: bool = False,
                 precision: str = "auto", grad_accum: int = 1, memory_cap_gb: float | None = None,
                 signing_key: str | None = None):
        self.data, self.state, self.name = Path(data), Path(state), name
        self.signing_key = signing_key  # node.key: every reply is signed with it (keys.sign), so the name is the key's
        self.cpu, self.precision_option, self.grad_accum = cpu, precision, grad_accum
        self.memory_cap_gb = memory_cap_gb
        self.reader = ShardReader(self.data, "train")
        self.digests = shard_digests(self.data, self.state)

    def train(self, weights: dict[str, torch.Tensor], task: dict) -> TaskResult:
        """Train windows [start, end) of the run's order from `weights`; return the delta and what it cost. A task
        this machine cannot hold is refused (DoesNotFit) before anything is built."""
        check_shards(self.digests, json.loads(task["shards"]))
        options = TrainingOptions(data=str(self.data), **json.loads(task["options"]))
        reset_accelerate_state(cpu=self.cpu)
        device = set_up(self.cpu, self.precision_option)
        precision, plan, accelerator = device.precision, device.plan, device.accelerator
        config, context = shaped_config(options.preset, self.reader.vocab_size, options.context,
                                        dropout=options.dropout)
        try:
            self.preflight(config, options.batch_size, context, precision, accelerator.device)
            try:
                return self._train(weights, task, options, config, context, plan, accelerator)
            except RuntimeError as error:  # torch.OutOfMemoryError on CUDA; MPS says so in a RuntimeError
                if "out of memory" not in str(error):
                    raise
                message = str(error).splitlines()[0]
            if accelerator.device.type == "cuda":  # the step's tensors went with the handled exception's frames
                torch.cuda.empty_cache()
            raise DoesNotFit(f"{self.name} ran out of memory training this task ({message}); join with a larger "
                             "--grad-accum or from a machine with more memory")
        finally:
            reset_accelerate_state()

    def preflight(self, config, batch: int, context: int, precision: str, device: torch.device) -> None:
        """Refuse a task whose step (the night's estimate for the micro-batch this machine trains) needs more than
        90% of the memory free here, or of --memory-cap-gb: accepted, it would die with out-of-memory every time."""
        have, what = memory_limit(device, self.memory_cap_gb)
        micro = batch // math.gcd(batch, self.grad_accum)
        need = estimate_memory_bytes(config, micro, context, precision)
        if have is None or fits(need, have):
            return
        accumulate = fewest_accumulation_steps(batch, lambda m: fits(estimate_memory_bytes(config, m, context,
                                                                                          precision), have))
        advice = (f"join with --grad-accum {accumulate}" if accumulate is not None else
                  "even one row at a time does not fit: use a machine with more memory")
        raise DoesNotFit(f"{self.name} cannot hold this run: a step of {micro} rows x {context} tokens of "
                         f"{config.num_hidden_layers}x{config.hidden_size} (vocab {config.vocab_size:,}, {precision}) "
                         f"needs about {need / 2**30:.2f} GiB and {have / 2**30:.2f} GiB are {what} on {device.type}; "
                         f"{advice}")

    def _train(self, weights, task, options, config, context, plan, accelerator) -> TaskResult:
        schedule = options.schedule_for(options.lr, int(task["schedule-steps"]))
        model, optimizer = night.new_model_and_optimizer(config, options, schedule, plan.muon_dtype)
        missing, unexpected = model.load_state_dict(weights, strict=False)
        if unexpected or [k for k in missing if k != "lm_head.weight"]:
            raise InputError(f"the server's weights do not fit the model (missing {missing}, unexpected {unexpected})")
        self._load_inner_state(model, optimizer, task["run-id"], accelerator.scaler)
        model, optimizer = night.prepare(accelerator, model, optimizer)
        start, end, batch = int(task["start"]), int(task["end"]), options.batch_size
        pause = faults.active().federated_step_pause  # tests: a slow machine
        task_steps = math.ceil((end - start) / batch)
        losses, began = [], time.perf_counter()
        for k, first in enumerate(range(start, end, batch)):
            rows = self.reader.rows(int(task["seed"]), np.arange(first, min(first + batch, end)),
                                    int(task["global-batch"]), context)
            lr_step = schedule_step(int(task["round-start"]), int(task["round-windows"]), k, task_steps,
                                    int(task["budget-windows"]), schedule.total_steps)
            loss, _ = night.update(model, optimizer, accelerator, rows, schedule.lr(lr_step),
                                   night.step_seed(options.seed, first // batch, 0),  # dropout: keyed to the rows
                                   math.gcd(len(rows), self.grad_accum), options.grad_clip)
            losses.append(loss)
            time.sleep(pause)
        mean_loss = float(torch.stack(losses).mean()) if losses else float("nan")  # one host sync, at the end
        seconds = time.perf_counter() - began
        local = accelerator.unwrap_model(model)
        self._save_inner_state(local, getattr(optimizer, "optimizer", optimizer), task["run-id"], accelerator.scaler)
        trained = dict(local.state_dict())
        delta = {name: (w.float() - trained[name].detach().float().cpu()).to(torch.float16)
                 for name, w in weights.items()}
        return TaskResult(delta, end - start, seconds, mean_loss)

    # ----------------------------------------------------------- the global weights, as the downlink last left them
    def _global_path(self) -> Path:
        return self.state / "global-weights.safetensors"

    def held_weights(self, run_id: str, version: int) -> dict[str, torch.Tensor] | None:
        """The global weights of round `version` of run `run_id` if this machine holds them (a restarted machine
        reads them back from its state folder), else None."""
        path = self._global_path()
        if not path.exists():
            return None

        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
            if meta.get("run-id") != run_id or meta.get("version") != str(version):
                return None
            return {name: f.get_tensor(name) for name in f.keys()}

    def hold(self, weights: dict[str, torch.Tensor], run_id: str, version: int) -> None:
        """Keep the weights a task started from: the next round's fp16 update is applied to them. Atomic."""
        self.state.mkdir(parents=True, exist_ok=True)
        with replacing(self._global_path()) as tmp:
            save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp),
                      metadata={"run-id": run_id, "version": str(version)})

    # ---------------------------------------------------------------- the inner optimizer state, kept on the machine
    def _inner_path(self) -> Path:
        return self.state / "inner-optimizer.safetensors"

    def _load_inner_state(self, model, optimizer, run_id: str, scaler=None) -> None:
        """The machine's inner optimizer state and, under fp16, its gradient scaler: a scale found over earlier
        tasks carries on instead of restarting at 65,536 (and skipping its overflow steps again) every task."""
        path = self._inner_path()
        if path.exists() and (self.state / "inner-run-id").read_text().strip() == run_id:
            load_optimizer_tensors(model, optimizer, load_file(str(path)), scaler)

    def _save_inner_state(self, model, optimizer, run_id: str, scaler=None) -> None:
        """Atomic: a kill mid-save keeps the previous state, never half of one."""
        self.state.mkdir(parents=True, exist_ok=True)
        with replacing(self._inner_path()) as tmp:
            save_file({k: v.detach().cpu().contiguous() for k, v in optimizer_tensors(model, optimizer,
                                                                                        scaler).items()}, str(tmp))
        (self.state / "inner-run-id").write_text(run_id + "\n")


def trajectory_of(options: TrainingOptions) -> dict:
    """The options every machine trains with (the server's), without the ones each machine decides for itself."""
    names = {f.name for f in dataclasses.fields(TrainingOptions)} - set(MACHINE_ONLY)
    return {k: v for k, v in dataclasses.asdict(options).items() if k in names}


def finite(delta: dict[str, torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in delta.values())

