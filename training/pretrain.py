"""`hitoban pretrain`: the overnight loop on `accelerate.Accelerator` (docs/design.md §6).

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
import uuid
from pathlib import Path

import torch

from hitoban.errors import ResourceError, UsageError
from hitoban.modeling import PRESETS, HitobanConfig, HitobanForCausalLM
from hitoban.modeling.loading import device_for
from hitoban.training.checkpoint import (
    DETERMINISTIC_ENV,
    CheckpointError,
    TrainState,
    check_resumable,
    current_slot,
    load_checkpoint,
)
from hitoban.training.data import ShardReader
from hitoban.training.hardware import (
    available_memory_bytes,
    check_precision,
    choose_compile,
    cpu_model,
    device_facts,
    flops_per_token,
    matmul_peak,
    plan_device,
)
from hitoban.training.loop import TrainingDiverged, reset_accelerate_state
from hitoban.training.night import Run, train_night
from hitoban.training.optim import build_optimizer
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
                    compiled: bool, muon_dtype: str = "bfloat16") -> int:
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
                  accelerator=accelerator, data=train, max_seconds=30, compiled=compiled, optimizer_name=cfg.optimizer,
                  grad_accum=cfg.grad_accum, muon_dtype=muon_dtype)
    steps = torch.tensor(max(1, int(row["tok_per_sec"] * world * cfg.hours * 3600 * HOURS_USABLE)
                             // (cfg.batch_size * context)), device=accelerator.device)
    if world > 1:  # one budget for every rank: the slowest measurement decides
        import torch.distributed as dist

        dist.all_reduce(steps, op=dist.ReduceOp.MIN)
    print(f"# --hours {cfg.hours:g}: {row['tok_per_sec'] * world:,.0f} tok/s measured -> {int(steps):,} steps "
          f"({HOURS_USABLE:.0%} of the time trains; the rest is kept for evaluations and saves)", flush=True)
    return int(steps)


def hardware_description(device: torch.device, processes: int, precision: str) -> str:
    """What the run trained on, in words, for the model card (e.g. '1 x NVIDIA H200, bf16')."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    elif device.type == "mps":
        name = f"Apple silicon GPU (MPS, {platform.machine()})"
    else:
        name = f"CPU ({cpu_model() or platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    return f"{processes} x {name}, precision {precision}"


def estimate_memory_bytes(config: HitobanConfig, micro_batch: int, context: int, precision: str = "no") -> int:
    """Weights + grads + Adam m, v (fp32: 16 bytes a parameter) + activations (~34 values per hidden unit per layer)
    + the B x T x V logits: in fp32, the logits, the loss's fp32 log-softmax and its saved gradient (12 bytes an
    entry); under bf16/fp16 the half logits and half gradient beside those, and the fp32 copy of the logits that
    Accelerate's `convert_outputs_to_fp32` makes of the model's output (16 bytes an entry)."""
    width = config.hidden_size
    per_layer = 4 * width**2 + 3 * width * config.intermediate_size
    params = config.vocab_size * width + config.num_hidden_layers * per_layer
    activations = micro_batch * context * config.hidden_size * config.num_hidden_layers * 34 * 4
    logits = micro_batch * context * config.vocab_size * (16 if precision in ("bf16", "fp16") else 12)
    return params * 16 + activations + logits


def state_device(group: dict, param: torch.Tensor, key: str) -> torch.device:
    """Where an optimizer reads one state tensor: a fused or capturable AdamW reads everything, `step` included, on
    the parameter's device (torch's own load_state_dict keeps it there for them); a plain (for-each) one reads `step`
    on the CPU (on the device it costs a host sync per parameter per step) and the rest on the parameter's device."""
    on_device = group.get("fused") or group.get("capturable") or key != "step"
    return param.device if on_device else torch.device("cpu")


def place_step_counters(optimizer: torch.optim.Optimizer) -> None:
    """Put each restored `step` counter where its optimizer reads it (`state_device`): Accelerate's prepare() moves
    the whole restored state to the device, and a fused AdamW fails at its first step with `step` anywhere else."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param) or {}
            if torch.is_tensor(state.get("step")):
                state["step"] = state["step"].to(state_device(group, param, "step"))


def check_state_placement(optimizer: torch.optim.Optimizer) -> None:
    """Every state tensor where its optimizer reads it (`state_device`), or a CheckpointError naming the first that
    is not (the check `hitoban doctor` runs after a resume)."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            for key, value in (optimizer.state.get(param) or {}).items():
                want = state_device(group, param, key)
                if torch.is_tensor(value) and value.device != want:
                    raise CheckpointError(f"optimizer state {key!r} of a {tuple(param.shape)} parameter is on "
                                          f"{value.device}, its optimizer reads it on {want}")


def pretrain(cfg: PretrainConfig) -> dict:
    """Run (or resume) pretraining; returns the summary. Raises TrainingDiverged / CheckpointError on failure."""
    reset_accelerate_state(cpu=cfg.cpu)
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
                      context: int, precision: str) -> None:
    """Refuse a run whose estimate exceeds what it may use: free memory, or --memory-cap-gb when that is lower."""
    if device.type in ("cuda", "mps") and cfg.memory_cap_gb:
        total = (torch.cuda.get_device_properties(device).total_memory if device.type == "cuda"
                 else torch.mps.recommended_max_memory())
        fraction = min(1.0, cfg.memory_cap_gb * 2**30 / total)
        (torch.cuda if device.type == "cuda" else torch.mps).set_per_process_memory_fraction(fraction)
    need, free = estimate_memory_bytes(config, micro, context, precision), available_memory_bytes(device)
    limits = [(free, "free"), (cfg.memory_cap_gb * 2**30 if cfg.memory_cap_gb else None, "allowed by --memory-cap-gb")]
    have, what = min(((b, w) for b, w in limits if b is not None), default=(None, ""))
    if have is not None and need > 0.9 * have and not cfg.skip_memory_check:
        raise ResourceError(f"this run needs about {need / 2**30:.1f} GiB but {have / 2**30:.1f} GiB are {what} on "
                            f"{device}; lower --batch-size (or use --grad-accum), close other programs, or pass "
                            "--skip-memory-check")


def setup(cfg: PretrainConfig) -> Run:
    """Data, model, optimizer, the resume (refused when the trajectory changed) and the run folder."""
    from accelerate import Accelerator

    cfg = with_default_lr(cfg)
    folder, data = Path(cfg.out), Path(cfg.data)
    index = load_index(data)
    facts = device_facts(device_for(cfg.cpu))
    if os.environ.get(DETERMINISTIC_ENV) and facts.type == "cuda":  # the kill test: same device, same bits
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS's first use
        torch.use_deterministic_algorithms(True)
    plan = plan_device(facts)
    precision = plan.precision if cfg.precision == "auto" else cfg.precision
    check_precision(facts, precision)
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
    _memory_preflight(cfg, config, device, micro, context, precision)  # before anything measures a step of this size
    token_flops = flops_per_token(config, context)
    peak, _ = matmul_peak(device, precision)

    def measured_compile_gain() -> dict:
        from hitoban.training.calibrate import compile_gain

        return compile_gain(cfg.preset, micro, train.vocab_size, context, accelerator, train, cfg.optimizer,
                            plan.muon_dtype)

    budget_tokens = cfg.tokens or (cfg.steps or 0) * tokens_per_step
    estimate = (cfg.hours * 3600 if cfg.hours else budget_tokens * token_flops / (0.4 * peak * world))
    compiled, why = choose_compile(cfg.compile, facts, estimate, measured_compile_gain)
    total_steps = (cfg.steps or (max(1, cfg.tokens // tokens_per_step) if cfg.tokens else
                                 steps_for_hours(cfg, folder, accelerator, train, context, compiled, plan.muon_dtype)))

    fingerprint = trajectory_fingerprint(cfg, config, index, sha256_file(data / "shards_index.json"), context,
                                         total_steps, precision)
    torch.manual_seed(cfg.seed)
    model = HitobanForCausalLM(config)
    optimizer = build_optimizer(model, cfg.optimizer, cfg.lr, cfg.weight_decay, cfg.adam_bias_correction,
                                plan.muon_dtype)
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
    place_step_counters(optimizer)
    check_state_placement(optimizer)
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
               device_plan={**plan.record(), "precision_used": precision, "compile": why},
               tokenizer_dir=data / "tokenizer" if (data / "tokenizer").exists() else None)


__all__ = ["PretrainConfig", "pretrain", "setup", "train_night", "TrainingDiverged", "CheckpointError"]
