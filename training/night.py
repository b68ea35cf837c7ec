"""The night's loop over a prepared `Run` (what `pretrain.setup` builds): steps, validation with the best model kept,
crash-safe saves at the policy's moments, the NaN guard, and the summary. `pretrain.pretrain` = setup + this."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hitoban.modeling import HitobanConfig, HitobanForCausalLM
from hitoban.provenance import read_lineage, write_json
from hitoban.training.checkpoint import (
    TrainState,
    current_slot,
    export_final,
    save_checkpoint,
)
from hitoban.training.data import ShardReader
from hitoban.training.hardware import flops_per_token, matmul_peak
from hitoban.training.loop import (
    CheckpointPolicy,
    Monitor,
    TrainingDiverged,
    clock_skew,
    planted_inf_step,
    train_step,
)
from hitoban.training.nll import token_nats
from hitoban.training.optim import lr_at
from hitoban.training.options import PretrainConfig


def step_seed(seed: int, step: int, rank: int) -> int:
    """The torch seed for one step on one process: a resumed run draws the same dropout masks as an uninterrupted
    one without saving any RNG state, on any number of processes."""
    return int(np.random.SeedSequence([seed, step, rank]).generate_state(1, np.uint64)[0])


@torch.no_grad()
def evaluate(model, val: ShardReader | None, domains: dict[str, np.ndarray], batches: int, batch_size: int,
             context: int, autocast, accelerator=None) -> dict:
    """Fixed validation batches (seed 0, steps 0..n-1) plus per-domain loss on `domains` (built once per run).
    Over several processes each rank scores its share of the batches and windows and the sums are reduced: the
    same numbers as one process, in 1/world of the time."""
    if val is None:
        return {}
    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator is not None else (0, 1)
    model.eval()
    device = next(model.parameters()).device
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    for i in range(rank, batches, world):
        rows = torch.from_numpy(val.batch(0, i, batch_size, context)).to(device)
        with autocast():
            loss_sum += model(rows, labels=rows).loss.float()
    per_domain = {}
    for domain, stream in domains.items():  # each token predicted once, as bits/char measures (training.nll)
        if len(stream):
            with autocast():
                nats = token_nats(model, stream, val.end_id, window=context, batch=batch_size, part=(rank, world))
            if world > 1:  # each rank filled its own windows and left the others at zero
                nats = accelerator.reduce(torch.from_numpy(nats).to(device), "sum").cpu().numpy()
            per_domain[domain] = float(nats.mean())
    if world > 1:
        loss_sum = accelerator.reduce(loss_sum, "sum")
    model.train()
    return {"val_loss": float(loss_sum) / batches, "val_domains": per_domain}


@dataclass
class Run:
    """Everything `setup` builds for the loop."""

    cfg: PretrainConfig
    folder: Path
    accelerator: object
    model: torch.nn.Module  # as prepared by Accelerate (DDP-wrapped on several processes)
    train_model: torch.nn.Module  # what the step calls: `model`, compiled or not
    unwrapped: HitobanForCausalLM  # what evaluation and saving see (eager, shares the parameters)
    optimizer: torch.optim.Optimizer
    train: ShardReader
    val: ShardReader | None
    val_domains: dict
    config: HitobanConfig
    context: int
    total_steps: int
    precision: str
    compiled: bool
    state: TrainState
    resumed_from: Path | None
    resume_changes: dict  # options changed on purpose at this resume (--allow-change)
    hardware: str
    tokenizer_dir: Path | None
    device_plan: dict = dataclasses.field(default_factory=dict)  # hardware.plan_device's choices, with why

    @property
    def tokens_per_step(self) -> int:
        return self.cfg.batch_size * self.context

    def lr(self, step: int) -> float:
        cfg = self.cfg
        return lr_at(step, self.total_steps, cfg.lr, cfg.warmup_frac, cfg.min_lr_ratio, cfg.schedule, cfg.decay_frac)


def _announce(run: Run, monitor: Monitor, peak_source: str) -> None:
    """config.json, the resume record and the one-paragraph plan."""
    cfg, state, fp = run.cfg, run.state, run.state.fingerprint
    write_json(run.folder / "config.json", {
        "kind": "pretrain-run", "schema": 1, "run_id": state.run_id, "model": fp["model_config"], "args": state.args,
        "data_index_sha256": fp["data_index_sha256"], "tokenizer_sha256": fp["tokenizer_sha256"],
        "total_steps": run.total_steps, "tokens_per_step": run.tokens_per_step, "hardware": run.hardware,
        "compiled": run.compiled, "device_plan": run.device_plan, "fingerprint": fp})
    monitor.log({"type": "device", "step": state.step, "hardware": run.hardware, **run.device_plan})
    if run.resumed_from is not None:
        print(f"# resumed at step {state.step} (resume {state.resumes}, from {run.resumed_from.name})", flush=True)
        monitor.log({"type": "resume", "step": state.step, "resumes": state.resumes})
        changes = run.resume_changes
        if changes:
            print(f"# resumed with deliberate changes (--allow-change): {changes}", flush=True)
            monitor.log({"type": "change", "step": state.step, "changes": changes})
    params = sum(p.numel() for p in run.unwrapped.parameters())
    non_embedding = sum(p.numel() for n, p in run.unwrapped.named_parameters() if "embed_tokens" not in n)
    tokens = run.total_steps * run.tokens_per_step
    print(f"pretrain: {cfg.preset} {params / 1e6:.2f}M params ({non_embedding / 1e6:.2f}M non-embedding), "
          f"{run.total_steps:,} steps x {run.tokens_per_step:,} tokens = {tokens:,} tokens (D/N "
          f"{tokens / non_embedding:.1f}, {tokens / run.train.total_tokens:.2f} epochs), "
          f"{run.accelerator.num_processes} process(es) on {run.accelerator.device.type}, precision {run.precision}",
          flush=True)
    plan = run.device_plan
    if plan:
        print(f"# device: {plan['why']}; precision {plan['precision_used']}, Muon's Newton-Schulz in "
              f"{plan['muon_dtype']}", flush=True)
    print(f"# MFU against {monitor.peak_flops / run.accelerator.num_processes / 1e12:.2f} TFLOP/s per process "
          f"({peak_source})", flush=True)


def train_night(run: Run) -> dict:
    """The loop: step, monitor, evaluate, save; until the budget, --max-hours or a signal."""
    started = time.time()
    cfg, state, accelerator = run.cfg, run.state, run.accelerator
    main, rank, world = accelerator.is_main_process, accelerator.process_index, accelerator.num_processes
    peak, peak_source = matmul_peak(accelerator.device, run.precision)
    monitor = Monitor(run.folder, run.total_steps, run.tokens_per_step, flops_per_token(run.config, run.context),
                      peak * world, accelerator.device, run.precision == "fp16", main=main, progress=cfg.progress,
                      start_step=state.step)
    if main:
        _announce(run, monitor, peak_source)
    policy = CheckpointPolicy(cfg.save_every_steps, cfg.save_every_min, cfg.max_hours, run.total_steps,
                              last_saved_step=state.step if run.resumed_from is not None else -1)
    policy.stop.install()
    session_start, elapsed_before, skew = time.time(), state.elapsed_sec, clock_skew(rank)
    inf_at = planted_inf_step(rank)

    def elapsed() -> float:  # training time over all sessions
        return elapsed_before + time.time() - session_start + skew

    def save() -> Path | None:
        monitor.check_finite(state.step, policy.last_saved_step, accelerator)  # never save a state past a NaN
        accelerator.wait_for_everyone()
        slot = None
        if main:
            optimizer = getattr(run.optimizer, "optimizer", run.optimizer)
            slot = save_checkpoint(run.folder, run.unwrapped, optimizer,
                                   dataclasses.replace(state, elapsed_sec=elapsed()), run.tokenizer_dir)
        accelerator.wait_for_everyone()
        policy.saved(state.step)
        return slot

    def export(slot: Path, val_loss: float | None) -> None:
        """The best-validation model to RUN/final, with the facts of *these* weights (lineage.json)."""
        export_final(run.folder, slot, {
            "run": run.folder.name, "run_id": state.run_id, "step": state.step, "total_steps": run.total_steps,
            "val_loss": val_loss, "tokens_seen": state.tokens_seen, "resumes": state.resumes,
            "elapsed_hours": round(elapsed() / 3600, 4), "hardware": run.hardware, "device_plan": run.device_plan,
            "data_index_sha256": state.fingerprint["data_index_sha256"],
            "tokenizer_sha256": state.fingerprint["tokenizer_sha256"]})

    try:
        for step in range(state.step, run.total_steps):
            for group in run.optimizer.param_groups:
                group["lr"] = run.lr(step)
            run.model.train()
            torch.manual_seed(step_seed(cfg.seed, step, rank))  # dropout noise: a pure function of (seed, step, rank)
            rows = run.train.batch(cfg.seed, step + 1, cfg.batch_size, run.context, rank, world)  # this rank's rows
            loss, grad_norm = train_step(run.train_model, run.optimizer, accelerator, rows, cfg.grad_accum,
                                         cfg.grad_clip)
            done = state.step = step + 1
            if done == inf_at:
                loss = loss * float("inf")
            state.tokens_seen = done * run.tokens_per_step
            monitor.on_step(done, loss, grad_norm)
            if done % cfg.log_every == 0 or done == run.total_steps:
                monitor.log_window(done, run.lr(step), elapsed(), accelerator, policy.last_saved_step)
            if done % cfg.eval_every == 0 or done == run.total_steps:
                _evaluate_and_keep_best(run, monitor, save, export)
            if policy.after_step(done, elapsed(), accelerator):
                save()
            monitor.heartbeat(state, run.lr(step), elapsed(), stop_reason=policy.stop_reason)
            if policy.stop_reason:
                break
        stop_reason = policy.stop_reason or "budget"
        if policy.last_saved_step != state.step:
            save()
    except TrainingDiverged:
        monitor.heartbeat(state, run.optimizer.param_groups[0]["lr"], elapsed(), finished=True, stop_reason="nan")
        raise
    finally:
        monitor.close()
    if main and run.val is not None and not (run.folder / "final").exists():
        export(current_slot(run.folder), state.best_val)
    monitor.heartbeat(state, run.optimizer.param_groups[0]["lr"], elapsed(), finished=True, stop_reason=stop_reason)
    accelerator.wait_for_everyone()  # no rank leaves while another is still in a collective
    return _summarise(run, monitor, stop_reason, elapsed(), started, peak_source)


def _evaluate_and_keep_best(run: Run, monitor: Monitor, save, export) -> None:
    """Validation; a new best is saved and exported as final/. Every rank takes the same decision (the save is a
    collective), so the compared value is the mean over ranks."""
    accelerator, state = run.accelerator, run.state
    result = evaluate(run.unwrapped, run.val, run.val_domains, run.cfg.eval_batches, min(run.cfg.batch_size, 16),
                      run.context, accelerator.autocast, accelerator)
    if not result:
        return
    monitor.log({"type": "eval", "step": state.step, **result})
    if state.best_val is None or result["val_loss"] < state.best_val:
        state.best_val = result["val_loss"]
        slot = save()
        if accelerator.is_main_process:
            export(slot, round(result["val_loss"], 4))


def _summarise(run: Run, monitor: Monitor, stop_reason: str, elapsed: float, started: float,
               peak_source: str) -> dict:
    state = run.state
    summary = {"steps": state.step, "total_steps": run.total_steps, "tokens_seen": state.tokens_seen,
               "best_val": state.best_val, "resumes": state.resumes, "stop_reason": stop_reason,
               "elapsed_hours": round(elapsed / 3600, 4), "session_seconds": round(time.time() - started, 1),
               "mfu": round(float(np.median(monitor.mfus)), 4) if monitor.mfus else None, "mfu_peak": peak_source,
               "compiled": run.compiled}
    if run.accelerator.is_main_process:
        final_lineage = read_lineage(run.folder / "final") if (run.folder / "final").exists() else None
        write_json(run.folder / "summary.json", {
            "kind": "pretrain-summary", "schema": 1, "run_id": state.run_id, **summary,
            "final_weights_sha256": (final_lineage or {}).get("weights_sha256"),
            "final_step": (final_lineage or {}).get("step")})
        print(f"pretrain stopped ({stop_reason}) at step {state.step:,}/{run.total_steps:,}, best val "
              f"{state.best_val}, resumes {state.resumes}"
              + ("" if state.step == run.total_steps else "; resume with the same command (--resume auto)"),
              flush=True)
    return summary
