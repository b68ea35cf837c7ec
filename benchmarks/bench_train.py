"""Overhead of the full `hitoban pretrain` loop over the bare training step, and checkpoint cost
(docs/design.md §6, §7, §17).

Rows: tok/s of the bare step (forward, backward, clip, AdamW on batches from the same reader) vs the real loop
(schedule, logging, heartbeat, signal checks, final save excluded); checkpoint save/load seconds and sizes for the
`3lm` preset; the save cost amortised over the default 10-minute save interval. Both loop and bare step run in
this process, alternating, so machine drift hits both.

    python benchmarks/bench_train.py --data SHARDS [--preset small] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch

from hitoban.modeling import HitobanConfig, HitobanForCausalLM
from hitoban.training.data.reader import ShardReader
from hitoban.training.hardware import default_precision, plan_for
from hitoban.training.night import evaluate
from hitoban.training.optim import AdamW, build_optimizer
from hitoban.training.optimizer import default_lr
from hitoban.training.pretrain.checkpoint import TrainState, load_checkpoint, save_checkpoint
from hitoban.training.pretrain.options import PretrainConfig
from hitoban.training.pretrain.trainer import pretrain
from hitoban.training.step import reset_accelerate_state, train_step


def bare_tok_s(data: str, preset: str, steps: int, batch: int, context: int, precision: str,
               optimizer_name: str) -> float:
    """The training step alone (`step.train_step`: forward, backward, clip, update) in the loop's precision, with
    the loop's optimizer."""
    from accelerate import Accelerator

    reset_accelerate_state(cpu=True)
    accelerator = Accelerator(cpu=True, mixed_precision=precision)
    reader = ShardReader(data)
    config = HitobanConfig.from_preset(preset, vocab_size=reader.vocab_size)
    torch.manual_seed(0)
    model = HitobanForCausalLM(config).train()
    lr = default_lr(optimizer_name, config.hidden_size)  # what the loop runs
    optimizer = build_optimizer(model, optimizer_name, lr,
                                muon_dtype=plan_for("cpu").muon_dtype)
    start = None
    for step in range(steps + 2):
        if step == 2:
            start = time.perf_counter()  # two warm-up steps, as the loop's first window also pays them
        train_step(model, optimizer, accelerator, reader.batch(0, step, batch, context), 1, 1.0)
    reset_accelerate_state()
    return steps * batch * context / (time.perf_counter() - start)


def loop_tok_s(data: str, preset: str, steps: int, batch: int, context: int, precision: str, optimizer_name: str,
               work: Path) -> float:
    """The whole loop at its default cadence (a log window of `steps`, heartbeat, signals, schedule); the second
    window is timed, so start-up and the first steps are not counted. Evaluation and saves are amortised apart."""
    run = work / f"run-{time.time_ns()}"
    pretrain(PretrainConfig(data=data, out=str(run), preset=preset, steps=2 * steps, batch_size=batch,
                            context=context, log_every=steps, eval_every=10**9, progress=False, cpu=True,
                            precision=precision, compile="off", optimizer=optimizer_name))
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    shutil.rmtree(run)
    return [r for r in records if r["type"] == "train"][1]["tok_per_sec"]


def eval_seconds(data: str, preset: str, batch: int, context: int, precision: str) -> float:
    """One default validation (20 batches of min(batch, 16) plus the per-domain windows)."""
    reader, val = ShardReader(data), ShardReader(data, "val", verify=False)
    model = HitobanForCausalLM(HitobanConfig.from_preset(preset, vocab_size=reader.vocab_size))
    domains = val.domain_streams(20 * min(batch, 16) * (context + 1))
    dtype = torch.bfloat16 if precision == "bf16" else None

    def autocast():
        return torch.autocast("cpu", dtype=dtype, enabled=dtype is not None)

    start = time.perf_counter()
    evaluate(model, val, domains, 20, min(batch, 16), context, autocast)
    return time.perf_counter() - start


def checkpoint_cost(work: Path) -> dict:
    config = HitobanConfig.from_preset("3lm")
    model = HitobanForCausalLM(config)
    optimizer = AdamW(model.parameters())
    x = torch.randint(0, config.vocab_size, (1, 16))
    model(x, labels=x).loss.backward()
    optimizer.step()
    run = work / "ckpt"
    run.mkdir()
    start = time.perf_counter()
    slot = save_checkpoint(run, model, optimizer, TrainState(run_id="bench", seed=0, step=1), None)
    save_seconds = time.perf_counter() - start
    fresh = HitobanForCausalLM(config)
    start = time.perf_counter()
    load_checkpoint(slot, fresh, AdamW(fresh.parameters()))
    load_seconds = time.perf_counter() - start
    return {"save_seconds": save_seconds, "load_seconds": load_seconds,
            "model_mb": (slot / "model.safetensors").stat().st_size / 1e6,
            "optimizer_mb": (slot / "optimizer.safetensors").stat().st_size / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--precision", default=default_precision("cpu"), help="default: this CPU's auto choice")
    parser.add_argument("--optimizer", default=PretrainConfig.optimizer, help="the same for the loop and the bare step")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hitoban-bench-train-"))
    bare, loop = [], []
    for _ in range(args.rounds):
        bare.append(bare_tok_s(args.data, args.preset, args.steps, args.batch, args.context, args.precision,
                               args.optimizer))
        loop.append(loop_tok_s(args.data, args.preset, args.steps, args.batch, args.context, args.precision,
                               args.optimizer, work))
    step_seconds = args.batch * args.context / max(bare)
    evaluation = eval_seconds(args.data, args.preset, args.batch, args.context, args.precision) / (500 * step_seconds)
    cost = checkpoint_cost(work)
    saving = cost["save_seconds"] / 600
    loop_overhead = 1 - max(loop) / max(bare)
    print(f"preset {args.preset}, batch {args.batch} x ctx {args.context}, precision {args.precision}, "
          f"optimizer {args.optimizer}, "
          f"{args.steps} timed steps x {args.rounds} rounds")
    print(f"bare training step      {max(bare):>10,.0f} tok/s")
    print(f"hitoban pretrain loop   {max(loop):>10,.0f} tok/s   overhead {loop_overhead:+.1%} (log window "
          f"{args.steps} steps, heartbeat, signals, schedule)")
    print(f"validation every 500 steps (default): {evaluation:.2%} of training time")
    print(f"3lm checkpoint: save {cost['save_seconds']:.2f} s, load {cost['load_seconds']:.2f} s, "
          f"model {cost['model_mb']:.1f} MB + optimizer {cost['optimizer_mb']:.1f} MB; "
          f"amortised over the default 10-min interval: {saving:.2%} of training time")
    print(f"total loop overhead at defaults: {loop_overhead + evaluation + saving:+.1%} (target <= 5%)")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
