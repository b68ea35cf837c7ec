"""`hitoban pretrain`: the overnight loop on `accelerate.Accelerator` (SPEC §5, 3LM §4).

One command for CPU, one CUDA GPU, a Mac (MPS) or several GPUs (`accelerate launch`). The budget is tokens (or
steps) and the LR schedule is built for exactly that budget. Batches are a pure function of (seed, step), so
resuming needs only weights, optimizer state and the step; on CPU an interrupted-and-resumed run equals the
uninterrupted one bit for bit. The run directory holds:
  CURRENT, ckpt-A/, ckpt-B/    crash-safe checkpoints (training/checkpoint.py)
  final/                       the best-validation model, a `from_pretrained` folder with tokenizer
  log.jsonl                    append-only train/eval/resume records
  heartbeat.json               atomic progress snapshot for `hitoban watch`
  config.json                  model config + arguments + data fingerprint
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import signal
import time
import uuid
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from hitoban.errors import ExitCode, HitobanError, ResourceError, UsageError
from hitoban.modeling import PRESETS, HitobanConfig, HitobanForCausalLM
from hitoban.provenance import read_lineage
from hitoban.training.checkpoint import (
    CheckpointError,
    check_resumable,
    current_slot,
    export_final,
    load_checkpoint,
    save_checkpoint,
)
from hitoban.training.data import ShardReader
from hitoban.training.hardware import default_precision, device_for, flops_per_token, matmul_peak
from hitoban.training.optim import OPTIMIZERS, SCHEDULES, build_optimizer, lr_at
from hitoban.training.shards import load_index, sha256_file


class TrainingDiverged(HitobanError, RuntimeError):
    """Loss or gradient became NaN/inf; the last good checkpoint is untouched."""

    exit_code = ExitCode.DIVERGED


@dataclass
class PretrainConfig:
    data: str
    out: str
    preset: str = "3lm"
    tokens: int | None = None
    steps: int | None = None
    hours: float | None = None  # size the budget to end in this many hours (measured, then fixed for the run)
    batch_size: int = 32
    context: int | None = None  # default: the preset's max_position_embeddings
    grad_accum: int = 1
    lr: float = 6e-4
    min_lr_ratio: float = 0.1
    warmup_frac: float = 0.02
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    adam_bias_correction: bool = True
    optimizer: str = "adamw"  # adamw | muon (Muon on hidden matrices, AdamW on the rest)
    schedule: str = "cosine"  # cosine | wsd
    decay_frac: float = 0.2  # wsd: the final warmdown's share of the steps
    dropout: float = 0.0
    seed: int = 1234
    resume: str = "auto"
    save_every_steps: int | None = None
    save_every_min: float = 10.0
    eval_every: int = 500
    eval_batches: int = 20
    log_every: int = 50
    max_hours: float | None = None
    precision: str = "auto"  # auto | no | bf16 | fp16
    cpu: bool = False
    memory_cap_gb: float | None = None
    skip_memory_check: bool = False
    progress: bool = True
    allow_change: str | None = None  # comma-separated options that may differ from the checkpoint's on resume


# Options that change the training trajectory: a resume with any of them changed is refused unless allowed.
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


CLOCK_SKEW_ENV = "HITOBAN_TEST_CLOCK_SKEW"  # test hook: "RANK:SECONDS" adds SECONDS to that rank's clock


def clock_skew(rank: int) -> float:
    target, _, seconds = os.environ.get(CLOCK_SKEW_ENV, "").partition(":")
    return float(seconds) if target and int(target) == rank else 0.0


def shared_any(accelerator, *flags: bool) -> list[bool]:
    """One decision for every process: a flag true on any rank is true on all. Each rank has its own clock,
    signals and timers, and a save or a stop taken by one rank alone leaves the others waiting in a collective
    that never comes (a hang)."""
    if accelerator.num_processes == 1:
        return [bool(f) for f in flags]
    import torch.distributed as dist

    tensor = torch.tensor([float(f) for f in flags], device=accelerator.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [bool(v) for v in tensor.tolist()]


HOURS_USABLE = 0.9  # of the night: the rest is kept for evaluations, saves and the start


def steps_for_hours(cfg: PretrainConfig, run: Path, accelerator, train: ShardReader, context: int,
                    precision: str) -> int:
    """--hours: the step budget whose schedule ends in `cfg.hours`, from tok/s measured on this very shape,
    precision and device (warm steps only, as `hitoban calibrate`). A resumed run keeps the budget it was sized
    with: the schedule must not change under it."""
    from hitoban.training.calibrate import measure

    slot = current_slot(run) if cfg.resume == "auto" and run.exists() else None
    if slot is not None:
        saved = json.loads((slot / "train_state.json").read_text()).get("fingerprint", {})
        if "total_steps" in saved:
            print(f"# --hours: keeping this run's budget of {saved['total_steps']:,} steps", flush=True)
            return saved["total_steps"]
    world = accelerator.num_processes
    row = measure(cfg.preset, cfg.batch_size // world, train.vocab_size, context, steps=10, warmup=3,
                  device=accelerator.device, data=train, precision=precision, max_seconds=30)
    steps = torch.tensor(max(1, int(row["tok_per_sec"] * world * cfg.hours * 3600 * HOURS_USABLE)
                             // (cfg.batch_size * context)), device=accelerator.device)
    if world > 1:  # one budget for every rank: the slowest measurement decides
        import torch.distributed as dist

        dist.all_reduce(steps, op=dist.ReduceOp.MIN)
    print(f"# --hours {cfg.hours:g}: {row['tok_per_sec'] * world:,.0f} tok/s measured -> {int(steps):,} steps "
          f"({HOURS_USABLE:.0%} of the time trains; the rest is kept for evaluations and saves)", flush=True)
    return int(steps)


def step_outcome(loss: float, grad_norm: float, fp16: bool, skipped_in_a_row: int, max_skips: int = 20) -> str:
    """'ok', 'skipped' (fp16: the gradient scaler overflowed and skips this update, as it is meant to) or
    'diverged' (a non-finite loss, a non-finite gradient without fp16, or too many skips in a row)."""
    if not math.isfinite(loss):
        return "diverged"
    if math.isfinite(grad_norm):
        return "ok"
    if fp16 and skipped_in_a_row < max_skips:
        return "skipped"
    return "diverged"


def step_seed(seed: int, step: int, rank: int) -> int:
    """The torch seed for one step on one process: a resumed run draws the same dropout masks as an uninterrupted
    one without saving any RNG state, on any number of processes."""
    return int(np.random.SeedSequence([seed, step, rank]).generate_state(1, np.uint64)[0])


def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False))
    os.replace(tmp, path)


def hardware_description(device: torch.device, processes: int, precision: str) -> str:
    """What the run trained on, in words, for the model card (e.g. '1 x NVIDIA H200, bf16')."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    elif device.type == "mps":
        name = f"Apple silicon GPU (MPS, {platform.machine()})"
    else:
        name = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    return f"{processes} x {name}, precision {precision}"


def available_memory_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def estimate_memory_bytes(config: HitobanConfig, micro_batch: int, context: int) -> int:
    """Weights + grads + Adam m, v (fp32) + activations (~34 values per hidden unit per layer) + fp32 logits x3."""
    width = config.hidden_size
    per_layer = 4 * width**2 + 3 * width * config.intermediate_size
    params = config.vocab_size * width + config.num_hidden_layers * per_layer
    activations = micro_batch * context * config.hidden_size * config.num_hidden_layers * 34 * 4
    logits = micro_batch * context * config.vocab_size * 4 * 3
    return params * 16 + activations + logits


class _StopFlag:
    """First SIGINT/SIGTERM: stop at the next step boundary (after saving). Second: exit now."""

    def __init__(self):
        self.reason: str | None = None

    def install(self) -> None:
        def handler(signum, frame):
            if self.reason is not None:
                os._exit(128 + signum)
            self.reason = f"signal {signal.Signals(signum).name}"
            print(f"\n{signal.Signals(signum).name}: saving at the next step boundary (again to quit now)", flush=True)

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, handler)


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
    for domain, stream in domains.items():
        windows = len(stream) // (context + 1)
        if windows == 0:
            continue
        rows = torch.from_numpy(stream[: windows * (context + 1)].reshape(windows, context + 1)).to(device)
        total = 0.0
        for start in range(0, windows, batch_size):
            with autocast():
                chunk = rows[start : start + batch_size]
                total += model(chunk, labels=chunk).loss.float().item() * len(chunk)
        per_domain[domain] = total / windows
    model.train()
    return {"val_loss": float(np.mean(losses)), "val_domains": per_domain}


def _reset_accelerate_state() -> None:
    """Accelerate keeps one state per process (mixed precision, gradient accumulation) and refuses a second
    Accelerator with another precision: a run after a Trainer (or a Trainer after a run) in one program would fail.
    A run owns that state while it trains; the distributed state (the process group) is left alone."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()


def pretrain(cfg: PretrainConfig) -> dict:
    """Run (or resume) pretraining; returns the summary. Raises TrainingDiverged / CheckpointError on failure."""
    _reset_accelerate_state()
    try:
        return _pretrain(cfg)
    finally:
        _reset_accelerate_state()  # leave the process as clean as it was found, also after a failure


def _pretrain(cfg: PretrainConfig) -> dict:
    from accelerate import Accelerator

    started = time.time()
    run, data = Path(cfg.out), Path(cfg.data)
    index = load_index(data)
    precision = cfg.precision
    if precision == "auto":  # bf16 where the hardware multiplies it natively (CUDA, AMX / AVX512-BF16 CPUs)
        precision = default_precision(device_for(cfg.cpu).type)
    accelerator = Accelerator(cpu=cfg.cpu, mixed_precision=precision)
    main = accelerator.is_main_process
    rank, world = accelerator.process_index, accelerator.num_processes
    device = accelerator.device

    train = ShardReader(data, "train")
    val = ShardReader(data, "val", verify=False) if index["splits"]["val"]["tokens"] else None
    if cfg.optimizer not in OPTIMIZERS or cfg.schedule not in SCHEDULES:
        raise UsageError(f"--optimizer must be one of {OPTIMIZERS} and --schedule one of {SCHEDULES}")
    if cfg.preset not in PRESETS:
        raise UsageError(f"unknown --preset {cfg.preset!r}; choose one of {', '.join(PRESETS)}")
    config = HitobanConfig.from_preset(cfg.preset, vocab_size=index["tokenizer"]["vocab_size"], dropout=cfg.dropout)
    context = cfg.context or config.max_position_embeddings
    config.max_position_embeddings = max(config.max_position_embeddings, context)
    if cfg.batch_size % (world * cfg.grad_accum):
        raise UsageError(f"--batch-size {cfg.batch_size} must be divisible by processes x grad accumulation "
                         f"({world} x {cfg.grad_accum})")
    micro = cfg.batch_size // (world * cfg.grad_accum)
    tokens_per_step = cfg.batch_size * context
    if sum(x is not None for x in (cfg.tokens, cfg.steps, cfg.hours)) != 1:
        raise UsageError("give exactly one of --tokens, --steps or --hours")
    total_steps = (cfg.steps or (max(1, cfg.tokens // tokens_per_step) if cfg.tokens else
                                 steps_for_hours(cfg, run, accelerator, train, context, precision)))

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

    fingerprint = trajectory_fingerprint(cfg, config, index, sha256_file(data / "shards_index.json"), context,
                                         total_steps, precision)
    torch.manual_seed(cfg.seed)
    model = HitobanForCausalLM(config)
    optimizer = build_optimizer(model, cfg.optimizer, cfg.lr, cfg.weight_decay, cfg.adam_bias_correction)

    state = {"step": 0, "tokens_seen": 0, "best_val": None, "seed": cfg.seed, "elapsed_sec": 0.0, "resumes": 0,
             "run_id": uuid.uuid4().hex,  # names this run in every model it exports (lineage.json) and in the card
             "data_index_sha256": fingerprint["data_index_sha256"], "fingerprint": fingerprint,
             "args": {k: v for k, v in asdict(cfg).items() if k not in ("data", "out")}}
    slot = current_slot(run) if cfg.resume == "auto" and run.exists() else None
    if slot is not None:
        saved = json.loads((slot / "train_state.json").read_text())
        changes = check_resumable(saved, fingerprint, allowed_changes(cfg.allow_change))
        saved = load_checkpoint(slot, model, optimizer)
        if not saved.pop("optimizer_restored"):
            print(f"warning: {slot.name} has no optimizer state; moments restart from zero", flush=True)
        state.update({k: saved[k] for k in ("step", "tokens_seen", "best_val", "elapsed_sec", "resumes")})
        state["run_id"] = saved.get("run_id", state["run_id"])
        state["resumes"] += 1
    elif cfg.resume == "never" and run.exists() and main:
        # A fresh start must leave nothing a later --resume auto could mistake for this run's checkpoint.
        for name in ("CURRENT", "log.jsonl", "heartbeat.json"):
            (run / name).unlink(missing_ok=True)
        for name in ("ckpt-A", "ckpt-B", "final"):
            shutil.rmtree(run / name, ignore_errors=True)
    run.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    model, optimizer = accelerator.prepare(model, optimizer)
    for param_state in optimizer.state.values():  # prepare() moved restored state to the device; a scalar `step`
        if torch.is_tensor(param_state.get("step")):  # there costs a host sync per parameter per step
            param_state["step"] = param_state["step"].cpu()
    unwrapped = accelerator.unwrap_model(model)
    log_file = run / "log.jsonl"

    def log(record: dict) -> None:
        if main:
            with open(log_file, "a", encoding="utf-8") as f:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")

    hardware = hardware_description(device, world, precision)
    if main:
        _write_json_atomic(run / "config.json", {"kind": "pretrain-run", "run_id": state["run_id"],
                                                  "model": fingerprint["model_config"], "args": state["args"],
                                                  "data_index_sha256": fingerprint["data_index_sha256"],
                                                  "tokenizer_sha256": fingerprint["tokenizer_sha256"],
                                                  "total_steps": total_steps, "tokens_per_step": tokens_per_step,
                                                  "hardware": hardware, "fingerprint": fingerprint})

    def export(slot_path: Path, val_loss: float | None) -> None:
        """The best-validation model to RUN/final, with the facts of *these* weights (lineage.json)."""
        export_final(run, slot_path, {"run": run.name, "run_id": state["run_id"], "step": state["step"],
                                      "total_steps": total_steps, "val_loss": val_loss,
                                      "tokens_seen": state["tokens_seen"], "resumes": state["resumes"],
                                      "elapsed_hours": round(elapsed() / 3600, 4), "hardware": hardware,
                                      "data_index_sha256": fingerprint["data_index_sha256"],
                                      "tokenizer_sha256": fingerprint["tokenizer_sha256"]})
    start_step = state["step"]
    if slot is not None and main:
        print(f"# resumed at step {start_step} (resume {state['resumes']}, from {slot.name})", flush=True)
        log({"type": "resume", "step": start_step, "resumes": state["resumes"]})
        if changes:
            print(f"# resumed with deliberate changes (--allow-change): {changes}", flush=True)
            log({"type": "change", "step": start_step, "changes": changes})
    if main:
        non_embedding = sum(p.numel() for n, p in unwrapped.named_parameters() if "embed_tokens" not in n)
        print(f"pretrain: {cfg.preset} {sum(p.numel() for p in unwrapped.parameters()) / 1e6:.2f}M params "
              f"({non_embedding / 1e6:.2f}M non-embedding), {total_steps:,} steps x {tokens_per_step:,} tokens "
              f"= {total_steps * tokens_per_step:,} tokens (D/N {total_steps * tokens_per_step / non_embedding:.1f}, "
              f"{total_steps * tokens_per_step / train.total_tokens:.2f} epochs), {world} process(es) on "
              f"{device.type}, precision {precision}", flush=True)

    peak, peak_source = matmul_peak(device, precision)
    token_flops = flops_per_token(config, context)

    def mfu(tok_per_sec: float) -> float:
        """Model FLOPs utilisation: the FLOPs the model needs per second over what the hardware can do."""
        return tok_per_sec * token_flops / (peak * world)

    if main:
        print(f"# MFU against {peak / 1e12:.2f} TFLOP/s per process ({peak_source})", flush=True)
    eval_batch = min(cfg.batch_size, 16)
    val_domains = val.domain_streams(cfg.eval_batches * eval_batch * (context + 1)) if val is not None else {}
    stop = _StopFlag()
    stop.install()
    tokenizer_dir = data / "tokenizer" if (data / "tokenizer").exists() else None
    session_start, last_save, last_heartbeat = time.time(), time.time(), 0.0
    window: list[float] = []
    interval_start, interval_tokens = time.time(), 0
    stop_reason, last_saved_step, tok_s = None, start_step if slot is not None else -1, 0.0
    skipped_in_a_row = 0
    mfus: list[float] = []  # per log window, for the summary
    bar = tqdm(total=total_steps, initial=start_step, desc="pretrain", unit="step",
               disable=not (main and cfg.progress) or None)

    elapsed_before = state["elapsed_sec"]  # training time of earlier sessions (cumulative across resumes)

    skew = clock_skew(rank)

    def elapsed() -> float:
        return elapsed_before + time.time() - session_start + skew

    def heartbeat(finished: bool = False) -> None:
        if not main:
            return
        remaining = (total_steps - state["step"]) * tokens_per_step
        peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
        _write_json_atomic(run / "heartbeat.json", {
            "updated_at": time.time(), "step": state["step"], "total_steps": total_steps,
            "tokens_seen": state["tokens_seen"], "token_budget": total_steps * tokens_per_step,
            "train_loss": window[-1] if window else None, "best_val": state["best_val"],
            "lr": optimizer.param_groups[0]["lr"], "tok_per_sec": tok_s, "mfu": round(mfu(tok_s), 4),
            "elapsed_hours": round(elapsed() / 3600, 3),
            "eta_hours": round(remaining / tok_s / 3600, 2) if tok_s else None, "peak_gb": peak,
            "resumes": state["resumes"], "finished": finished, "stop_reason": stop_reason})

    def save() -> Path | None:
        nonlocal last_save, last_saved_step
        accelerator.wait_for_everyone()
        slot_path = None
        if main:
            slot_path = save_checkpoint(run, unwrapped, optimizer.optimizer if hasattr(optimizer, "optimizer")
                                        else optimizer, {**state, "elapsed_sec": elapsed()}, tokenizer_dir)
        accelerator.wait_for_everyone()
        last_save, last_saved_step = time.time(), state["step"]
        return slot_path

    for step in range(start_step, total_steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, total_steps, cfg.lr, cfg.warmup_frac, cfg.min_lr_ratio, cfg.schedule,
                                cfg.decay_frac)
        model.train()
        torch.manual_seed(step_seed(cfg.seed, step, rank))  # dropout noise: a pure function of (seed, step, rank)
        loss_sum = torch.zeros((), device=device)
        rows = train.batch(cfg.seed, step + 1, cfg.batch_size, context, rank, world)  # this rank's rows
        for m in range(cfg.grad_accum):
            x = torch.from_numpy(rows[m * micro : (m + 1) * micro]).to(device)
            sync = accelerator.no_sync(model) if m < cfg.grad_accum - 1 else nullcontext()
            with sync, accelerator.autocast():
                loss = model(input_ids=x, labels=x).loss / cfg.grad_accum
                accelerator.backward(loss)
            loss_sum += loss.detach()
        grad_norm = accelerator.clip_grad_norm_(model.parameters(), cfg.grad_clip or float("inf"))
        loss_value = accelerator.reduce(loss_sum, "mean").item()
        outcome = step_outcome(loss_value, float(grad_norm), precision == "fp16", skipped_in_a_row)
        skipped_in_a_row = skipped_in_a_row + 1 if outcome == "skipped" else 0
        if outcome == "skipped":
            log({"type": "skip", "step": step + 1, "reason": "fp16 gradient overflow (the scaler lowers its scale)"})
        if outcome == "diverged":
            stop_reason = "nan"
            heartbeat(finished=True)
            kept = (f"the last good checkpoint (step {last_saved_step}) is untouched" if last_saved_step >= 0
                    else "no checkpoint had been written yet")
            raise TrainingDiverged(f"loss became {loss_value} at step {step + 1} (grad norm {float(grad_norm)}); "
                                   f"stopped without saving: {kept}. Lower --lr or check the data")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state["step"], state["tokens_seen"] = step + 1, (step + 1) * tokens_per_step
        window.append(loss_value)
        interval_tokens += tokens_per_step
        bar.update(1)
        done = state["step"]

        if done % cfg.log_every == 0 or done == total_steps:
            tok_s = interval_tokens / max(time.time() - interval_start, 1e-9)
            log({"type": "train", "step": done, "loss": float(np.mean(window)), "lr": lr_at(
                step, total_steps, cfg.lr, cfg.warmup_frac, cfg.min_lr_ratio, cfg.schedule, cfg.decay_frac),
                "grad_norm": float(grad_norm),
                "tok_per_sec": round(tok_s, 1), "mfu": round(mfu(tok_s), 4), "elapsed": round(elapsed(), 2),
                "window": len(window)})
            bar.set_postfix(loss=f"{np.mean(window):.4f}", tok_s=f"{tok_s:,.0f}", mfu=f"{mfu(tok_s):.0%}")
            mfus.append(mfu(tok_s))
            window, interval_start, interval_tokens = [], time.time(), 0
        if done % cfg.eval_every == 0 or done == total_steps:
            result = evaluate(unwrapped, val, val_domains, cfg.eval_batches, eval_batch, context, accelerator.autocast)
            if result:
                # every rank must take the same best-val decision (it saves, a collective): compare one shared value
                result["val_loss"] = accelerator.reduce(torch.tensor(result["val_loss"], device=device), "mean").item()
                log({"type": "eval", "step": done, **result})
                if state["best_val"] is None or result["val_loss"] < state["best_val"]:
                    state["best_val"] = result["val_loss"]
                    slot_path = save()
                    if main:
                        export(slot_path, round(result["val_loss"], 4))
        over_time = bool(cfg.max_hours) and elapsed() > cfg.max_hours * 3600
        over_time, signalled, save_time = shared_any(accelerator, over_time, stop.reason is not None,
                                                     time.time() - last_save > cfg.save_every_min * 60)
        if over_time:
            stop_reason = "max_hours"
        if signalled:
            stop_reason = stop.reason or "signal (another process)"
        due = (cfg.save_every_steps and done % cfg.save_every_steps == 0) or save_time
        if (due or stop_reason or done == total_steps) and last_saved_step != done:
            save()
        if main and time.time() - last_heartbeat > 30:
            heartbeat()
            last_heartbeat = time.time()
        if stop_reason:
            break
    bar.close()
    stop_reason = stop_reason or "budget"
    if last_saved_step != state["step"]:
        save()
    if main and val is not None and not (run / "final").exists():
        export(current_slot(run), state["best_val"])
    heartbeat(finished=True)
    accelerator.wait_for_everyone()  # no rank leaves while another is still in a collective
    summary = {"steps": state["step"], "total_steps": total_steps, "tokens_seen": state["tokens_seen"],
               "best_val": state["best_val"], "resumes": state["resumes"], "stop_reason": stop_reason,
               "elapsed_hours": round(elapsed() / 3600, 4), "session_seconds": round(time.time() - started, 1),
               "mfu": round(float(np.median(mfus)), 4) if mfus else None, "mfu_peak": peak_source}
    if main:
        final_lineage = read_lineage(run / "final") if (run / "final").exists() else None
        _write_json_atomic(run / "summary.json", {"kind": "pretrain-summary", "run_id": state["run_id"], **summary,
                                                   "final_weights_sha256": (final_lineage or {}).get("weights_sha256"),
                                                   "final_step": (final_lineage or {}).get("step")})
        print(f"pretrain stopped ({stop_reason}) at step {state['step']:,}/{total_steps:,}, best val "
              f"{state['best_val']}, resumes {state['resumes']}"
              + ("" if state["step"] == total_steps else "; resume with the same command (--resume auto)"),
              flush=True)
    return summary


__all__ = ["PretrainConfig", "pretrain", "TrainingDiverged", "CheckpointError", "evaluate"]
