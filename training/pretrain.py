"""`hitoban pretrain`: the overnight loop on `accelerate.Accelerator` (SPEC §5, 3LM §4).

One command for CPU, one CUDA GPU, a Mac (MPS) or several GPUs (`accelerate launch`). The budget is tokens, steps
or hours, and the LR schedule is built for exactly that budget. Batches are a pure function of (seed, step), so
resuming needs only weights, optimizer state and the step; on CPU an interrupted-and-resumed run equals the
uninterrupted one bit for bit. The shape, in the spirit of torchtitan's trainer: `setup` (data, model, optimizer,
resume) -> `train_step` -> the monitor (log, heartbeat, tok/s, MFU, NaN guard) -> the checkpoint policy, with the
train state one dataclass (`checkpoint.TrainState`). The run directory holds:
  CURRENT, ckpt-A/, ckpt-B/    crash-safe checkpoints (training/checkpoint.py)
  final/                       the best-validation model, a `from_pretrained` folder with tokenizer
  log.jsonl                    append-only train/eval/resume records
  heartbeat.json               atomic progress snapshot for `hitoban watch`
  config.json, summary.json    model config + arguments + data fingerprint; the run's outcome
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hitoban.errors import ResourceError, UsageError
from hitoban.modeling import PRESETS, HitobanConfig, HitobanForCausalLM
from hitoban.modeling.loading import device_for
from hitoban.provenance import read_lineage, write_json
from hitoban.training.checkpoint import (
    DETERMINISTIC_ENV,
    CheckpointError,
    TrainState,
    check_resumable,
    current_slot,
    export_final,
    load_checkpoint,
    save_checkpoint,
)
from hitoban.training.data import ShardReader
from hitoban.training.hardware import (
    available_memory_bytes,
    check_precision,
    choose_compile,
    default_precision,
    flops_per_token,
    matmul_peak,
)
from hitoban.training.loop import (
    CheckpointPolicy,
    Monitor,
    TrainingDiverged,
    clock_skew,
    reset_accelerate_state,
    train_step,
)
from hitoban.training.nll import token_nats
from hitoban.training.optim import build_optimizer, lr_at
from hitoban.training.options import PretrainConfig, with_default_lr
from hitoban.training.shards import load_index, sha256_file

# Options that change the training trajectory: a resume with any of them changed is refused unless allowed.
# (--compile is not one: compiled and eager runs resume each other's checkpoints.)
TRAJECTORY_OPTIONS = ("seed", "batch_size", "context", "grad_accum", "lr", "min_lr_ratio", "warmup_frac",
                      "weight_decay", "grad_clip", "adam_bias_correction", "optimizer", "schedule", "decay_frac",
                      "dropout", "precision", "total_steps")


def trajectory_fingerprint(cfg: PretrainConfig, config: HitobanConfig, index: dict, data_index_sha256: str,
                           context: int, total_steps: int, precision: str) -> dict:
    """Everything a resumed run must share with its checkpoint to continue the same trajectory."""
    model_config = config.to_diff_dict()
    for key in ("transformers_version", "dropout"):  # dropout is named on its own, so a refusal can say so
        model_config.pop(key, None)
    values = {**{k: getattr(cfg, k) for k in TRAJECTORY_OPTIONS if hasattr(cfg, k)}, "context": context,
              "total_steps": total_steps, "precision": precision}
    return {"model_config": model_config, "tokenizer_sha256": index["tokenizer"]["sha256"],
            "data_index_sha256": data_index_sha256, **{k: values[k] for k in TRAJECTORY_OPTIONS}}


def allowed_changes(option: str | None) -> set[str]:
    names = {name.strip().replace("-", "_") for name in (option or "").split(",") if name.strip()}
    unknown = sorted(names - set(TRAJECTORY_OPTIONS))
    if unknown:
        raise UsageError(f"--allow-change: unknown option(s) {unknown}; choose from {', '.join(TRAJECTORY_OPTIONS)}")
    return names


HOURS_USABLE = 0.9  # of the night: the rest is kept for evaluations, saves and the start


def steps_for_hours(cfg: PretrainConfig, run: Path, accelerator, train: ShardReader, context: int,
                    compiled: bool) -> int:
    """--hours: the step budget whose schedule ends in `cfg.hours`, from tok/s measured on this very shape,
    precision, device and compile choice (warm steps only, as `hitoban calibrate`). A resumed run keeps the budget
    it was sized with: the schedule must not change under it."""
    from hitoban.training.calibrate import measure

    slot = current_slot(run) if cfg.resume == "auto" and run.exists() else None
    steps = TrainState.read(slot).fingerprint.get("total_steps") if slot is not None else None
    if steps is not None:
        print(f"# --hours: keeping this run's budget of {steps:,} steps", flush=True)
        return steps
    world = accelerator.num_processes
    row = measure(cfg.preset, cfg.batch_size // world, train.vocab_size, context, steps=10, warmup=3,
                  accelerator=accelerator, data=train, max_seconds=30, compiled=compiled, optimizer_name=cfg.optimizer)
    steps = torch.tensor(max(1, int(row["tok_per_sec"] * world * cfg.hours * 3600 * HOURS_USABLE)
                             // (cfg.batch_size * context)), device=accelerator.device)
    if world > 1:  # one budget for every rank: the slowest measurement decides
        import torch.distributed as dist

        dist.all_reduce(steps, op=dist.ReduceOp.MIN)
    print(f"# --hours {cfg.hours:g}: {row['tok_per_sec'] * world:,.0f} tok/s measured -> {int(steps):,} steps "
          f"({HOURS_USABLE:.0%} of the time trains; the rest is kept for evaluations and saves)", flush=True)
    return int(steps)


def step_seed(seed: int, step: int, rank: int) -> int:
    """The torch seed for one step on one process: a resumed run draws the same dropout masks as an uninterrupted
    one without saving any RNG state, on any number of processes."""
    return int(np.random.SeedSequence([seed, step, rank]).generate_state(1, np.uint64)[0])


def hardware_description(device: torch.device, processes: int, precision: str) -> str:
    """What the run trained on, in words, for the model card (e.g. '1 x NVIDIA H200, bf16')."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    elif device.type == "mps":
        name = f"Apple silicon GPU (MPS, {platform.machine()})"
    else:
        name = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    return f"{processes} x {name}, precision {precision}"


def estimate_memory_bytes(config: HitobanConfig, micro_batch: int, context: int) -> int:
    """Weights + grads + Adam m, v (fp32) + activations (~34 values per hidden unit per layer) + fp32 logits x3."""
    width = config.hidden_size
    per_layer = 4 * width**2 + 3 * width * config.intermediate_size
    params = config.vocab_size * width + config.num_hidden_layers * per_layer
    activations = micro_batch * context * config.hidden_size * config.num_hidden_layers * 34 * 4
    logits = micro_batch * context * config.vocab_size * 4 * 3
    return params * 16 + activations + logits


@torch.no_grad()
def evaluate(model, val: ShardReader | None, domains: dict[str, np.ndarray], batches: int, batch_size: int,
             context: int, autocast) -> dict:
    """Fixed validation batches (seed 0, steps 0..n-1) plus per-domain loss on `domains` (built once per run)."""
    if val is None:
        return {}
    model.eval()
    device = next(model.parameters()).device
    losses = []
    for i in range(batches):
        rows = torch.from_numpy(val.batch(0, i, batch_size, context)).to(device)
        with autocast():
            losses.append(model(rows, labels=rows).loss.float().item())
    per_domain = {}
    for domain, stream in domains.items():  # each token predicted once, as bits/char measures (training.nll)
        if len(stream):
            with autocast():
                nats = token_nats(model, stream, val.end_id, window=context, batch=batch_size)
            per_domain[domain] = float(nats.mean())
    model.train()
    return {"val_loss": float(np.mean(losses)), "val_domains": per_domain}


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

    @property
    def tokens_per_step(self) -> int:
        return self.cfg.batch_size * self.context

    def lr(self, step: int) -> float:
        cfg = self.cfg
        return lr_at(step, self.total_steps, cfg.lr, cfg.warmup_frac, cfg.min_lr_ratio, cfg.schedule, cfg.decay_frac)


def pretrain(cfg: PretrainConfig) -> dict:
    """Run (or resume) pretraining; returns the summary. Raises TrainingDiverged / CheckpointError on failure."""
    reset_accelerate_state()
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        return train_night(setup(cfg))
    finally:
        reset_accelerate_state()  # leave the process as clean as it was found, also after a failure
        torch.use_deterministic_algorithms(deterministic)


def _check_options(cfg: PretrainConfig, world: int) -> None:
    if cfg.preset not in PRESETS:
        raise UsageError(f"unknown --preset {cfg.preset!r}; choose one of {', '.join(PRESETS)}")
    if cfg.batch_size % (world * cfg.grad_accum):
        raise UsageError(f"--batch-size {cfg.batch_size} must be divisible by processes x grad accumulation "
                         f"({world} x {cfg.grad_accum})")
    if sum(x is not None for x in (cfg.tokens, cfg.steps, cfg.hours)) != 1:
        raise UsageError("give exactly one of --tokens, --steps or --hours")


def _memory_preflight(cfg: PretrainConfig, config: HitobanConfig, device: torch.device, micro: int,
                      context: int) -> None:
    if device.type in ("cuda", "mps") and cfg.memory_cap_gb:
        total = (torch.cuda.get_device_properties(device).total_memory if device.type == "cuda"
                 else torch.mps.recommended_max_memory())
        fraction = min(1.0, cfg.memory_cap_gb * 2**30 / total)
        (torch.cuda if device.type == "cuda" else torch.mps).set_per_process_memory_fraction(fraction)
    need, have = estimate_memory_bytes(config, micro, context), available_memory_bytes(device)
    if have is not None and need > 0.9 * have and not cfg.skip_memory_check:
        raise ResourceError(f"this run needs about {need / 2**30:.1f} GiB but {have / 2**30:.1f} GiB are free on "
                            f"{device}; lower --batch-size (or use --grad-accum), close other programs, or pass "
                            "--skip-memory-check")


def setup(cfg: PretrainConfig) -> Run:
    """Data, model, optimizer, the resume (refused when the trajectory changed) and the run folder."""
    from accelerate import Accelerator

    cfg = with_default_lr(cfg)
    folder, data = Path(cfg.out), Path(cfg.data)
    index = load_index(data)
    device_type = device_for(cfg.cpu).type
    if os.environ.get(DETERMINISTIC_ENV) and device_type == "cuda":  # the kill test: same device, same bits
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS's first use
        torch.use_deterministic_algorithms(True)
    precision = default_precision(device_type) if cfg.precision == "auto" else cfg.precision
    check_precision(device_type, precision)
    accelerator = Accelerator(cpu=cfg.cpu, mixed_precision=precision)
    world, device = accelerator.num_processes, accelerator.device
    _check_options(cfg, world)
    train = ShardReader(data, "train")
    val = ShardReader(data, "val", verify=False) if index["splits"]["val"]["tokens"] else None
    config = HitobanConfig.from_preset(cfg.preset, vocab_size=index["tokenizer"]["vocab_size"], dropout=cfg.dropout)
    context = cfg.context or config.max_position_embeddings
    config.max_position_embeddings = max(config.max_position_embeddings, context)
    micro = cfg.batch_size // (world * cfg.grad_accum)
    tokens_per_step = cfg.batch_size * context
    _memory_preflight(cfg, config, device, micro, context)  # before anything measures a step of this size
    token_flops = flops_per_token(config, context)
    peak, _ = matmul_peak(device, precision)

    def measured_compile_gain() -> dict:
        from hitoban.training.calibrate import compile_gain

        return compile_gain(cfg.preset, micro, train.vocab_size, context, accelerator, train, cfg.optimizer)

    budget_tokens = cfg.tokens or (cfg.steps or 0) * tokens_per_step
    estimate = (cfg.hours * 3600 if cfg.hours else budget_tokens * token_flops / (0.4 * peak * world))
    compiled, why = choose_compile(cfg.compile, device, estimate, measured_compile_gain)
    total_steps = (cfg.steps or (max(1, cfg.tokens // tokens_per_step) if cfg.tokens else
                                 steps_for_hours(cfg, folder, accelerator, train, context, compiled)))

    fingerprint = trajectory_fingerprint(cfg, config, index, sha256_file(data / "shards_index.json"), context,
                                         total_steps, precision)
    torch.manual_seed(cfg.seed)
    model = HitobanForCausalLM(config)
    optimizer = build_optimizer(model, cfg.optimizer, cfg.lr, cfg.weight_decay, cfg.adam_bias_correction)
    state = TrainState(run_id=uuid.uuid4().hex, seed=cfg.seed, fingerprint=fingerprint,
                       data_index_sha256=fingerprint["data_index_sha256"],
                       args={k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("data", "out")})
    slot = current_slot(folder) if cfg.resume == "auto" and folder.exists() else None
    changes: dict = {}
    if slot is not None:
        changes = check_resumable(TrainState.read(slot), fingerprint, allowed_changes(cfg.allow_change))
        saved, restored = load_checkpoint(slot, model, optimizer)
        if not restored:
            print(f"warning: {slot.name} has no optimizer state; moments restart from zero", flush=True)
        state = dataclasses.replace(saved, fingerprint=fingerprint, args=state.args, resumes=saved.resumes + 1)
    elif cfg.resume == "never" and folder.exists() and accelerator.is_main_process:
        # A fresh start must leave nothing a later --resume auto could mistake for this run's checkpoint.
        for name in ("CURRENT", "log.jsonl", "heartbeat.json", "summary.json"):
            (folder / name).unlink(missing_ok=True)
        for name in ("ckpt-A", "ckpt-B", "final"):
            shutil.rmtree(folder / name, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    model, optimizer = accelerator.prepare(model, optimizer)
    for param_state in optimizer.state.values():  # prepare() moved restored state to the device; a scalar `step`
        if torch.is_tensor(param_state.get("step")):  # there costs a host sync per parameter per step
            param_state["step"] = param_state["step"].cpu()
    unwrapped = accelerator.unwrap_model(model)
    if compiled and device.type == "cpu":
        # Inductor's CPU kernels reduce in a nondeterministic order unless asked (two compiled runs differed by ~6e-5);
        # with deterministic algorithms they are bit-exact, so a compiled night resumes exactly, as an eager one.
        torch.use_deterministic_algorithms(True)
    train_model = torch.compile(model) if compiled else model  # shares the parameters; saving sees plain names
    if accelerator.is_main_process:
        print(f"# torch.compile: {'on' if compiled else 'off'} ({why})", flush=True)
    eval_batch = min(cfg.batch_size, 16)
    val_domains = val.domain_streams(cfg.eval_batches * eval_batch * (context + 1)) if val is not None else {}
    return Run(cfg=cfg, folder=folder, accelerator=accelerator, model=model, train_model=train_model,
               unwrapped=unwrapped, optimizer=optimizer, train=train, val=val, val_domains=val_domains, config=config,
               context=context, total_steps=total_steps, precision=precision, compiled=compiled, state=state,
               resumed_from=slot, resume_changes=changes, hardware=hardware_description(device, world, precision),
               tokenizer_dir=data / "tokenizer" if (data / "tokenizer").exists() else None)


def _announce(run: Run, monitor: Monitor, peak_source: str) -> None:
    """config.json, the resume record and the one-paragraph plan."""
    cfg, state, fp = run.cfg, run.state, run.state.fingerprint
    write_json(run.folder / "config.json", {
        "kind": "pretrain-run", "schema": 1, "run_id": state.run_id, "model": fp["model_config"], "args": state.args,
        "data_index_sha256": fp["data_index_sha256"], "tokenizer_sha256": fp["tokenizer_sha256"],
        "total_steps": run.total_steps, "tokens_per_step": run.tokens_per_step, "hardware": run.hardware,
        "compiled": run.compiled, "fingerprint": fp})
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

    def elapsed() -> float:  # training time over all sessions
        return elapsed_before + time.time() - session_start + skew

    def save() -> Path | None:
        monitor.check_finite(state.step, policy.last_saved_step)  # never save a state past a NaN
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
            "elapsed_hours": round(elapsed() / 3600, 4), "hardware": run.hardware,
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
                      run.context, accelerator.autocast)
    if not result:
        return
    result["val_loss"] = accelerator.reduce(torch.tensor(result["val_loss"], device=accelerator.device),
                                            "mean").item()
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


__all__ = ["PretrainConfig", "pretrain", "setup", "train_night", "TrainingDiverged", "CheckpointError", "evaluate"]
