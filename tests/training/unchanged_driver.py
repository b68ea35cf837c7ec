"""Runs one of the tests' tiny nights through whatever `hitoban` is importable and prints the sha256 of every
result that must not change when the code is reshaped (tests/training/test_unchanged.py runs it once with the
baseline commit's code and once with this checkout's). It uses only the public library API both versions share."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

NIGHT = dict(preset="tiny", context=64, batch_size=8, log_every=5, eval_every=10, eval_batches=2, progress=False,
             cpu=True, save_every_min=60)
# Muon's lr at the tiny preset was the baseline's default (2e-3) until issue 37 gave every preset a width rule: given
# explicitly, so the comparison is of the code, not of a default that was meant to change.
BASELINE_MUON_LR = 2e-3
RUNS = {  # name -> options over NIGHT; "stop" interrupts the run there and resumes it (the kill test's promise)
    "muon-auto": dict(steps=24, lr=BASELINE_MUON_LR),  # else the defaults: muon, wsd, the plan's precision
    "adamw-cosine-fp32": dict(steps=24, optimizer="adamw", schedule="cosine", precision="no", dropout=0.1),
    "muon-fp32-resumed": dict(steps=24, precision="no", stop=12, lr=BASELINE_MUON_LR),
}


def with_shared_rate(options_class, options: dict) -> dict:
    """AdamW's group beside Muon ran at Muon's lr until issue 37 gave it its own rule (`--adamw-lr`): where the code
    has the option, Muon's runs give it Muon's lr, so the comparison is of the code, not of a default meant to change
    (the baseline's options have no such field)."""
    if "adamw_lr" in options_class.__dataclass_fields__ and options.get("optimizer", "muon") == "muon":
        return {**options, "adamw_lr": options["lr"]}
    return options


def digest_tensors(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def losses(run: Path) -> list:
    return [(r["type"], r.get("step"), r.get("loss"), r.get("val_loss"))
            for r in map(json.loads, (run / "log.jsonl").read_text().splitlines()) if r["type"] in ("train", "eval")]


def pretrain_run(data: str, out: Path, name: str) -> dict:
    from hitoban.training.pretrain.options import PretrainConfig
    from hitoban.training.pretrain.trainer import pretrain

    options = with_shared_rate(PretrainConfig, {**NIGHT, **RUNS[name]})
    stop = options.pop("stop", None)
    if stop:  # the first session ends at `stop`; the second resumes from its checkpoint with the longer budget
        pretrain(PretrainConfig(data=data, out=str(out), **{**options, "steps": stop}))
        options["allow_change"] = "total_steps"
    pretrain(PretrainConfig(data=data, out=str(out), **options))
    slot = (out / (out / "CURRENT").read_text().strip())
    return {"final": digest_tensors(load_file(str(out / "final" / "model.safetensors"))),
            "checkpoint": digest_tensors(load_file(str(slot / "model.safetensors"))),
            "log": hashlib.sha256(json.dumps(losses(out)).encode()).hexdigest()}


def federated_task(data: str, out: Path) -> dict:
    from hitoban.modeling import HitobanConfig, HitobanForCausalLM
    from hitoban.training.data.shards import load_index
    from hitoban.training.federated.inner import Machine, trajectory_of
    from hitoban.training.pretrain.options import TrainingOptions

    vocab = load_index(Path(data))["tokenizer"]["vocab_size"]
    torch.manual_seed(7)
    model = HitobanForCausalLM(HitobanConfig.from_preset("tiny", vocab_size=vocab))
    weights = {k: v.detach().clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    machine = Machine(data, out / "state", "a", cpu=True, precision="no")
    options = TrainingOptions(**with_shared_rate(TrainingOptions, dict(data=data, preset="tiny", context=64,
                                                                        batch_size=8, lr=BASELINE_MUON_LR)))
    task = {"run-id": "r", "start": 16, "end": 48, "seed": options.seed, "global-batch": 8, "schedule-steps": 10,
            "budget-windows": 80, "round-start": 16, "round-windows": 32,
            "options": json.dumps(trajectory_of(options)), "shards": json.dumps(machine.digests)}
    first = machine.train(weights, task)
    second = machine.train(weights, {**task, "start": 48, "end": 64, "round-start": 48})  # with its inner state
    return {"delta": digest_tensors(first.delta), "second": digest_tensors(second.delta),
            "loss": repr((first.loss, second.loss))}


def tiny_model() -> dict:
    import numpy as np

    from hitoban.training.tiny import train_tiny

    stream = np.random.default_rng(3).integers(0, 300, size=5000)
    model, curve = train_tiny(stream, 300, 12, seed=5, context=32, batch=4, max_positions=64)
    return {"weights": digest_tensors(dict(model.state_dict())), "losses": repr(curve)}


if __name__ == "__main__":
    data, out = sys.argv[1], Path(sys.argv[2])
    result = {name: pretrain_run(data, out / name, name) for name in RUNS}
    result["federated"] = federated_task(data, out / "federated")
    result["tiny"] = tiny_model()
    import hitoban.training.pretrain.trainer as trainer

    result["code"] = str(Path(trainer.__file__).resolve())  # which checkout's code ran (not compared)
    print(json.dumps(result))
