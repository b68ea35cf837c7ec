"""`hitoban pretrain`: the overnight loop on `accelerate.Accelerator` (docs/design.md §6).

One command for CPU, one CUDA GPU, a Mac (MPS) or several GPUs (`accelerate launch`). The budget is tokens, steps
or hours, and the LR schedule is built for exactly that budget. Batches are a pure function of (seed, step), so
resuming needs only weights, optimizer state and the step; on CPU an interrupted-and-resumed run equals the
uninterrupted one bit for bit. Shaped like torchtitan's trainer: a `Trainer` builds everything in its constructor
(data, model, optimizer, resume), `train_step` is one update, and `train()` reads as the night does, with the
monitor (log, heartbeat, tok/s, MFU, NaN guard) and the checkpoint policy as its parts. The run directory holds:
  CURRENT, ckpt-A/, ckpt-B/    crash-safe checkpoints (training/pretrain/checkpoint.py)
  final/                       the best-validation model, a `from_pretrained` folder with tokenizer
  log.jsonl                    append-only train/eval/resume records
  heartbeat.json               atomic progress snapshot for `hitoban watch`
  config.json, summary.json    model config + arguments + data fingerprint; the run's outcome
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from pathlib import Path

import numpy as np
import torch

from hitoban.errors import UsageError
from hitoban.modeling import PRESETS
from hitoban.provenance import read_lineage
from hitoban.run_folder import RunFolder
from hitoban.training import faults, night
from hitoban.training.data.reader import ShardReader
from hitoban.training.data.shards import load_index, sha256_file
from hitoban.training.device import set_up
from hitoban.training.hardware import (
    choose_compile,
    flops_per_token,
    hardware_description,
    matmul_peak,
)
from hitoban.training.pretrain.budget import memory_preflight, steps_for_hours
from hitoban.training.pretrain.calibrate import compile_gain
from hitoban.training.pretrain.checkpoint import (
    PREVIOUS_RUN,
    CheckpointError,
    RunLock,
    TrainState,
    check_resumable,
    current_slot,
    drop_set_aside,
    export_final,
    has_checkpoint,
    load_latest,
    restore_set_aside,
    save_checkpoint,
    set_aside,
)
from hitoban.training.pretrain.monitor import Monitor, TrainingDiverged
from hitoban.training.pretrain.options import PretrainConfig, shaped_config
from hitoban.training.pretrain.policy import CheckpointPolicy
from hitoban.training.pretrain.resume import (
    allowed_changes,
    check_state_placement,
    trajectory_fingerprint,
)
from hitoban.training.step import reset_accelerate_state
from hitoban.training.trackers import RunTrackers, check_available, parse_report_to


def _check_options(cfg: PretrainConfig, world: int) -> None:
    if cfg.preset not in PRESETS:
        raise UsageError(f"unknown --preset {cfg.preset!r}; choose one of {', '.join(PRESETS)}")
    if cfg.batch_size % (world * cfg.grad_accum):
        raise UsageError(f"--batch-size {cfg.batch_size} must be divisible by processes x grad accumulation "
                         f"({world} x {cfg.grad_accum})")
    if sum(x is not None for x in (cfg.tokens, cfg.steps, cfg.hours)) != 1:
        raise UsageError("give exactly one of --tokens, --steps or --hours")


class Trainer:
    """One night: built from its options (data, model, optimizer, the resume, refused when the trajectory changed),
    then `train()`."""

    def __init__(self, cfg: PretrainConfig):
        self.cfg, self.started = cfg, time.time()  # --hours counts from here
        self.folder, data = Path(cfg.out), Path(cfg.data)
        self.report_to = parse_report_to(cfg.report_to)
        check_available(self.report_to)  # a missing tracker package is an error now, not an empty dashboard later
        index = load_index(data)
        self.corpus_sha256 = (index.get("corpus") or {}).get("sha256")  # the corpus the shards were encoded from
        # the kill test asks for deterministic kernels on a GPU: same device, same bits
        self.device = set_up(cfg.cpu, cfg.precision, deterministic=faults.active().deterministic)
        facts, plan, self.precision = self.device.facts, self.device.plan, self.device.precision
        precision, self.accelerator = self.precision, self.device.accelerator
        accelerator = self.accelerator
        world, device = accelerator.num_processes, accelerator.device
        self.main, self.rank, self.world = accelerator.is_main_process, accelerator.process_index, world
        _check_options(cfg, world)
        # one process per run folder, taken before anything is measured, read or changed there
        self.lock = RunLock(self.folder).acquire() if self.main else None
        try:
            self.train_data = ShardReader(data, "train")
            self.val = ShardReader(data, "val", verify=False) if index["splits"]["val"]["tokens"] else None
            self.config, self.context = shaped_config(cfg.preset, index["tokenizer"]["vocab_size"], cfg.context,
                                                      dropout=cfg.dropout)
            micro = cfg.batch_size // (world * cfg.grad_accum)
            memory_preflight(cfg, self.config, device, micro, self.context, precision)  # before a step of this size
            self.compiled, why = self._choose_compile(facts, plan, micro)
            self.total_steps = (cfg.steps or (max(1, cfg.tokens // self.tokens_per_step) if cfg.tokens else
                                              steps_for_hours(cfg, self.folder, accelerator, self.train_data,
                                                              self.context, self.compiled, plan.muon_dtype,
                                                              self.started)))
            self.schedule = cfg.schedule_for(cfg.lr, self.total_steps)
            fingerprint = trajectory_fingerprint(cfg, self.config, index, sha256_file(data / "shards_index.json"),
                                                 self.context, self.total_steps, precision)
            model, optimizer = night.new_model_and_optimizer(self.config, cfg, self.schedule, plan.muon_dtype,
                                                             seed=cfg.seed)
            # The trajectory is recorded once, in the fingerprint; `args` holds the rest of the options.
            args = {k: v for k, v in dataclasses.asdict(cfg).items()
                    if k not in ("data", "out") and k not in fingerprint}
            self.state = TrainState(run_id=uuid.uuid4().hex, seed=cfg.seed, fingerprint=fingerprint,
                                    data_index_sha256=fingerprint["data_index_sha256"], args=args)
            self._prepare(model, optimizer, fingerprint, plan, why, data)
        except BaseException:
            self.close()  # a refused resume or a failed setup leaves the folder free
            raise

    def _prepare(self, model, optimizer, fingerprint: dict, plan, why: str, data: Path) -> None:
        """The resume, Accelerate's prepare (DDP on several processes), compile, and what evaluation reuses."""
        cfg, accelerator, device, world, precision = (self.cfg, self.accelerator, self.accelerator.device,
                                                      self.world, self.precision)
        self.resumed_from, self.resume_changes = self._resume(model, optimizer, fingerprint)
        self.folder.mkdir(parents=True, exist_ok=True)
        accelerator.wait_for_everyone()
        self.model, self.optimizer = night.prepare(accelerator, model, optimizer)  # DDP on several processes
        check_state_placement(self.optimizer)
        self.unwrapped = accelerator.unwrap_model(self.model)  # what evaluation and saving see (eager, shared)
        if self.compiled and device.type == "cpu":
            # Inductor's CPU kernels reduce in a nondeterministic order unless asked (two compiled runs differed by
            # ~6e-5); with deterministic algorithms they are bit-exact, so a compiled night resumes exactly.
            torch.use_deterministic_algorithms(True)
        self.train_model = torch.compile(self.model) if self.compiled else self.model  # shares the parameters
        if self.main:
            print(f"# torch.compile: {'on' if self.compiled else 'off'} ({why})", flush=True)
        eval_rows = cfg.eval_batches * self.eval_batch * (self.context + 1)
        self.val_domains = self.val.domain_streams(eval_rows) if self.val is not None else {}
        self.hardware = hardware_description(device, world, precision)
        self.device_plan = {**self.device.record(), "compile": why}
        self.tokenizer_dir = data / "tokenizer" if (data / "tokenizer").exists() else None

    def close(self) -> None:
        """Release the run folder (its lock) for the next process."""
        if self.lock is not None:
            self.lock.release()

    @property
    def tokens_per_step(self) -> int:
        return self.cfg.batch_size * self.context

    @property
    def eval_batch(self) -> int:
        return min(self.cfg.batch_size, 16)

    def _choose_compile(self, facts, plan, micro: int) -> tuple[bool, str]:
        cfg, world = self.cfg, self.world

        def measured_gain() -> dict:
            return compile_gain(cfg.preset, micro, self.train_data.vocab_size, self.context, self.accelerator,
                                self.train_data, cfg.optimizer, plan.muon_dtype)

        budget_tokens = cfg.tokens or (cfg.steps or 0) * self.tokens_per_step
        peak, _ = matmul_peak(self.accelerator.device, self.precision)
        estimate = (cfg.hours * 3600 if cfg.hours else
                    budget_tokens * flops_per_token(self.config, self.context) / (0.4 * peak * world))
        return choose_compile(cfg.compile, facts, estimate, measured_gain)

    def _resume(self, model, optimizer, fingerprint: dict) -> tuple[Path | None, dict]:
        """Continue from the last complete checkpoint (--resume auto, falling back to the previous slot when the
        newest is damaged), or set the earlier run aside (--resume never) until this one has saved."""
        cfg, folder = self.cfg, self.folder
        if cfg.resume == "auto" and self.main and restore_set_aside(folder):
            print(f"# a --resume never run here stopped before its first save: {folder}'s earlier run is back and "
                  "resumes", flush=True)
        self.accelerator.wait_for_everyone()
        if cfg.resume == "auto" and folder.exists() and has_checkpoint(folder):
            allowed = allowed_changes(cfg.allow_change)
            slot, saved, restored, changes = load_latest(  # verified against its checksums; the main process repoints
                folder, model, optimizer, check=lambda state: check_resumable(state, fingerprint, allowed),
                scaler=self.accelerator.scaler, repoint=self.main)
            if not restored:
                print(f"warning: {slot.name} has no optimizer state; moments restart from zero", flush=True)
            self.state = dataclasses.replace(saved, fingerprint=fingerprint, args=self.state.args,
                                             resumes=saved.resumes + 1)
            return slot, changes
        if cfg.resume == "never" and folder.exists() and self.main:
            moved = set_aside(folder)
            if moved:
                print(f"# --resume never: the earlier run is kept in {folder / PREVIOUS_RUN} until this one has its "
                      "first checkpoint", flush=True)
        return None, {}

    # ---------------------------------------------------------------------------------------------------- the night
    def train(self) -> dict:
        """Step, monitor, evaluate, save; until the budget, --max-hours or a signal. Returns the summary."""
        started = time.time()
        cfg, state = self.cfg, self.state
        peak, self.peak_source = matmul_peak(self.accelerator.device, self.precision)
        self.monitor = Monitor(self.folder, self.total_steps, self.tokens_per_step,
                               flops_per_token(self.config, self.context), peak * self.world,
                               self.accelerator.device, self.precision == "fp16", main=self.main,
                               progress=cfg.progress, start_step=state.step, skipped_steps=state.skipped_steps)
        if self.main and self.report_to:
            self.monitor.trackers = RunTrackers(self.report_to, self.folder, self.folder.name, state.run_id,
                                                state.step if self.resumed_from is not None else None)
            self.monitor.trackers.start(self._tracker_config())
        if self.main:
            self._announce()
        self.policy = CheckpointPolicy(cfg.save_every_steps, cfg.save_every_min, cfg.max_hours, self.total_steps,
                                       last_saved_step=state.step if self.resumed_from is not None else -1)
        self.policy.stop.install()
        self._session_start, self._elapsed_before = time.time(), state.elapsed_sec
        self._skew, inf_at = faults.clock_skew(self.rank), faults.planted_inf_step(self.rank)
        monitor, policy = self.monitor, self.policy
        try:
            for step in range(state.step, self.total_steps):
                loss, grad_norm = self.train_step(step)
                done = state.step = step + 1
                if done == inf_at:
                    loss = loss * float("inf")
                state.tokens_seen = done * self.tokens_per_step
                monitor.on_step(done, loss, grad_norm)
                if done % cfg.log_every == 0 or done == self.total_steps:
                    monitor.log_window(done, self.schedule.lr(step), self.elapsed(), self.accelerator,
                                       policy.last_saved_step)
                if done % cfg.eval_every == 0 or done == self.total_steps:
                    self.evaluate_and_keep_best()
                if policy.after_step(done, self.elapsed(), self.accelerator):
                    self.save()
                monitor.heartbeat(state, self.schedule.lr(step), self.elapsed(), stop_reason=policy.stop_reason)
                if policy.stop_reason:
                    break
            stop_reason = policy.stop_reason or "budget"
            if policy.last_saved_step != state.step:
                self.save()
        except TrainingDiverged:
            monitor.heartbeat(state, self.optimizer.param_groups[0]["lr"], self.elapsed(), finished=True,
                              stop_reason="nan")
            raise
        finally:
            monitor.close()
            if monitor.trackers is not None:
                monitor.trackers.finish()
                monitor.trackers = None
        if self.main and self.val is not None and not (self.folder / "final").exists():
            self.export(current_slot(self.folder), state.best_val)
        monitor.heartbeat(state, self.optimizer.param_groups[0]["lr"], self.elapsed(), finished=True,
                          stop_reason=stop_reason)
        self.accelerator.wait_for_everyone()  # no rank leaves while another is still in a collective
        return self._summarise(stop_reason, started)

    def train_step(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The update made after `step` updates: its LR and dropout seed are functions of the step, its rows of
        (seed, step); (loss, gradient norm) stay on the device."""
        cfg = self.cfg
        rows = self.train_data.batch(cfg.seed, step + 1, cfg.batch_size, self.context, self.rank, self.world)
        return night.update(self.train_model, self.optimizer, self.accelerator, rows, self.schedule.lr(step),
                            night.step_seed(cfg.seed, step, self.rank), cfg.grad_accum, cfg.grad_clip)

    def elapsed(self) -> float:
        """Training time over all sessions."""
        return self._elapsed_before + time.time() - self._session_start + self._skew

    def save(self) -> Path | None:
        """A crash-safe checkpoint of the state after the last step (a collective: every rank calls it)."""
        self.monitor.check_finite(self.state.step, self.policy.last_saved_step, self.accelerator)  # never past a NaN
        self.state.skipped_steps = self.monitor.skipped_steps
        self.accelerator.wait_for_everyone()
        slot = None
        if self.main:
            optimizer = getattr(self.optimizer, "optimizer", self.optimizer)
            slot = save_checkpoint(self.folder, self.unwrapped, optimizer,
                                   dataclasses.replace(self.state, elapsed_sec=self.elapsed()), self.tokenizer_dir,
                                   self.accelerator.scaler)
        self.accelerator.wait_for_everyone()
        self.policy.saved(self.state.step)
        if self.main and drop_set_aside(self.folder):
            print(f"# this run has its first checkpoint: the earlier run ({PREVIOUS_RUN}/) is removed", flush=True)
        return slot

    def export(self, slot: Path, val_loss: float | None) -> None:
        """The best-validation model to RUN/final, with the facts of *these* weights (lineage.json)."""
        state = self.state
        export_final(self.folder, slot, {
            "run": self.folder.name, "run_id": state.run_id, "step": state.step, "total_steps": self.total_steps,
            "val_loss": val_loss, "tokens_seen": state.tokens_seen, "resumes": state.resumes,
            "elapsed_hours": round(self.elapsed() / 3600, 4), "hardware": self.hardware,
            "device_plan": self.device_plan, "data_index_sha256": state.fingerprint["data_index_sha256"],
            "corpus_sha256": self.corpus_sha256, "tokenizer_sha256": state.fingerprint["tokenizer_sha256"]})

    def evaluate_and_keep_best(self) -> None:
        """Validation; a new best is saved and exported as final/. Every rank takes the same decision (the save is
        a collective), so the compared value is the mean over ranks."""
        accelerator, state = self.accelerator, self.state
        result = night.evaluate(self.unwrapped, self.val, self.val_domains, self.cfg.eval_batches, self.eval_batch,
                          self.context, accelerator.autocast, accelerator)
        if not result:
            return
        self.monitor.log({"type": "eval", "step": state.step, **result})
        if state.best_val is None or result["val_loss"] < state.best_val:
            state.best_val = result["val_loss"]
            slot = self.save()
            if accelerator.is_main_process:
                self.export(slot, round(result["val_loss"], 4))

    def _tracker_config(self) -> dict:
        """What a tracker shows as the run's config: the options, the shape and the budget."""
        cfg, state = self.cfg, self.state
        return {**{k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("data", "out")},
                "run": self.folder.name, "run_id": state.run_id, "data": Path(cfg.data).name,
                "total_steps": self.total_steps, "tokens_per_step": self.tokens_per_step,
                "parameters": self.unwrapped.num_parameters(), "precision_used": self.precision,
                "compiled": self.compiled, "data_index_sha256": state.fingerprint["data_index_sha256"]}

    def _announce(self) -> None:
        """config.json, the device and resume records, and the one-paragraph plan."""
        cfg, state, fp, monitor = self.cfg, self.state, self.state.fingerprint, self.monitor

        RunFolder(self.folder).write_config(
            "pretrain-run", given={k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("data", "out")},
            resolved={"lr": cfg.lr, "precision": self.precision, "compile": self.compiled,
                      "context": self.context, "total_steps": self.total_steps,
                      "tokens_per_step": self.tokens_per_step},
            run_id=state.run_id, fingerprint=fp, hardware=self.hardware, device_plan=self.device_plan)
        monitor.log({"type": "device", "step": state.step, "hardware": self.hardware, **self.device_plan})
        if self.resumed_from is not None:
            print(f"# resumed at step {state.step} (resume {state.resumes}, from {self.resumed_from.name})",
                  flush=True)
            monitor.log({"type": "resume", "step": state.step, "resumes": state.resumes})
            if self.resume_changes:
                print(f"# resumed with deliberate changes (--allow-change): {self.resume_changes}", flush=True)
                monitor.log({"type": "change", "step": state.step, "changes": self.resume_changes})
        params = self.unwrapped.num_parameters()
        non_embedding = self.unwrapped.num_parameters(exclude_embeddings=True)
        tokens = self.total_steps * self.tokens_per_step
        print(f"pretrain: {cfg.preset} {params / 1e6:.2f}M params ({non_embedding / 1e6:.2f}M non-embedding), "
              f"{self.total_steps:,} steps x {self.tokens_per_step:,} tokens = {tokens:,} tokens (D/N "
              f"{tokens / non_embedding:.1f}, {tokens / self.train_data.total_tokens:.2f} epochs), {self.world} "
              f"process(es) on {self.accelerator.device.type}, precision {self.precision}", flush=True)
        plan = self.device_plan
        print(f"# device: {plan['why']}; precision {plan['precision_used']}, Muon's Newton-Schulz in "
              f"{plan['muon_dtype']}", flush=True)
        print(f"# MFU against {monitor.peak_flops / self.world / 1e12:.2f} TFLOP/s per process "
              f"({self.peak_source})", flush=True)

    def _summarise(self, stop_reason: str, started: float) -> dict:
        state, monitor = self.state, self.monitor
        summary = {"steps": state.step, "total_steps": self.total_steps, "tokens_seen": state.tokens_seen,
                   "skipped_steps": state.skipped_steps, "updates_applied": state.step - state.skipped_steps,
                   "passes": round(state.tokens_seen / max(1, self.train_data.total_tokens), 3),
                   "best_val": state.best_val, "resumes": state.resumes, "stop_reason": stop_reason,
                   "elapsed_hours": round(self.elapsed() / 3600, 4),
                   "session_seconds": round(time.time() - started, 1),
                   "mfu": round(float(np.median(monitor.mfus)), 4) if monitor.mfus else None,
                   "mfu_peak": self.peak_source, "compiled": self.compiled}
        if self.main:
            final_lineage = read_lineage(self.folder / "final") if (self.folder / "final").exists() else None

            RunFolder(self.folder).write_summary("pretrain-summary", {
                "run_id": state.run_id, **summary, "final_weights_sha256": (final_lineage or {}).get("weights_sha256"),
                "final_step": (final_lineage or {}).get("step")})
            skipped = (f" ({state.skipped_steps:,} fp16 overflow steps skipped by the gradient scaler: "
                       f"{state.step - state.skipped_steps:,} updates applied)" if state.skipped_steps else "")
            print(f"pretrain stopped ({stop_reason}) at step {state.step:,}/{self.total_steps:,}{skipped}, best val "
                  f"{state.best_val}, resumes {state.resumes}"
                  + ("" if state.step == self.total_steps else "; resume with the same command (--resume auto)"),
                  flush=True)
        return summary


def pretrain(cfg: PretrainConfig) -> dict:
    """Run (or resume) pretraining; returns the summary. Raises TrainingDiverged / CheckpointError on failure."""
    reset_accelerate_state(cpu=cfg.cpu)
    deterministic = torch.are_deterministic_algorithms_enabled()
    trainer = None
    try:
        trainer = Trainer(cfg)
        return trainer.train()
    finally:
        if trainer is not None:
            trainer.close()
        reset_accelerate_state()  # leave the process as clean as it was found, also after a failure
        torch.use_deterministic_algorithms(deterministic)


__all__ = ["PretrainConfig", "Trainer", "pretrain", "TrainingDiverged", "CheckpointError"]
