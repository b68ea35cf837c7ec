"""Overhead of the full `hitoban pretrain` loop over the bare training step, and checkpoint cost (SPEC §5, §10).

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
from hitoban.training.checkpoint import load_checkpoint, save_checkpoint
from hitoban.training.data import ShardReader
from hitoban.training.optim import AdamW
from hitoban.training.pretrain import PretrainConfig, pretrain


def bare_tok_s(data: str, preset: str, steps: int, batch: int, context: int) -> float:
    reader = ShardReader(data)
    config = HitobanConfig.from_preset(preset, vocab_size=reader.vocab_size)
    torch.manual_seed(0)
    model = HitobanForCausalLM(config).train()
    optimizer = AdamW(model.parameters())
    start = None
    for step in range(steps + 2):
        if step == 2:
            start = time.perf_counter()  # two warm-up steps, as the loop's first interval also pays them
        x = torch.from_numpy(reader.batch(0, step, batch, context))
        model(x, labels=x).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return steps * batch * context / (time.perf_counter() - start)


def loop_tok_s(data: str, preset: str, steps: int, batch: int, context: int, work: Path) -> float:
    run = work / f"run-{time.time_ns()}"
    pretrain(PretrainConfig(data=data, out=str(run), preset=preset, steps=steps + 2, batch_size=batch,
                            context=context, log_every=1, eval_every=10**9, progress=False, cpu=True))
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    train = [r for r in records if r["type"] == "train"][2:]  # drop the two warm-up steps
    seconds = sum(batch * context / r["tok_per_sec"] for r in train)
    shutil.rmtree(run)
    return len(train) * batch * context / seconds


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
    slot = save_checkpoint(run, model, optimizer, {"step": 1}, None)
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
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hitoban-bench-train-"))
    bare, loop = [], []
    for _ in range(args.rounds):
        bare.append(bare_tok_s(args.data, args.preset, args.steps, args.batch, args.context))
        loop.append(loop_tok_s(args.data, args.preset, args.steps, args.batch, args.context, work))
    cost = checkpoint_cost(work)
    amortised = cost["save_seconds"] / 600
    print(f"preset {args.preset}, batch {args.batch} x ctx {args.context}, {args.steps} timed steps x {args.rounds}")
    print(f"bare training step      {max(bare):>10,.0f} tok/s")
    print(f"hitoban pretrain loop   {max(loop):>10,.0f} tok/s   overhead {1 - max(loop) / max(bare):+.1%} "
          "(target <= 10%)")
    print(f"3lm checkpoint: save {cost['save_seconds']:.2f} s, load {cost['load_seconds']:.2f} s, "
          f"model {cost['model_mb']:.1f} MB + optimizer {cost['optimizer_mb']:.1f} MB; "
          f"amortised over the default 10-min interval: {amortised:.2%} of training time")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
