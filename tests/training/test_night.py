"""The night's core (training/night.py), shared by pretrain, a federated machine, calibrate: the update's LR and
dropout seed are functions of the step, so the same step is the same update wherever it runs."""

from __future__ import annotations

import numpy as np
import torch

from hitoban.modeling import HitobanConfig
from hitoban.training import night
from hitoban.training.optimizer import OptimizerOptions
from hitoban.training.schedule import Schedule
from hitoban.training.step import make_accelerator, reset_accelerate_state


def run(steps: int, dropout_seed_of, lr_of) -> dict[str, torch.Tensor]:
    reset_accelerate_state(cpu=True)
    accelerator = make_accelerator(True, "no")
    config = HitobanConfig.from_preset("tiny", vocab_size=300, dropout=0.2)
    model, optimizer = night.new_model_and_optimizer(config, OptimizerOptions(optimizer="adamw", lr=1e-3),
                                                     Schedule(1e-3, steps), "float32", seed=3)
    model, optimizer = night.prepare(accelerator, model, optimizer)
    for step in range(steps):
        rows = np.random.default_rng([1, step]).integers(0, 300, (4, 17))
        night.update(model, optimizer, accelerator, rows, lr_of(step), dropout_seed_of(step), 1, 1.0)
        assert {g["lr"] for g in optimizer.param_groups} == {lr_of(step)}
    reset_accelerate_state()
    return {k: v.detach().clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}


def test_the_same_steps_are_the_same_update_and_another_seed_is_not():
    def seed(step):
        return night.step_seed(7, step, 0)

    def lr(step):
        return 1e-3 * (step + 1) / 3

    first, again = run(3, seed, lr), run(3, seed, lr)
    assert all(torch.equal(first[k], again[k]) for k in first)
    other = run(3, lambda step: night.step_seed(8, step, 0), lr)  # negative control: other dropout masks
    assert any(not torch.equal(first[k], other[k]) for k in first)


def test_step_seed_is_a_pure_function_of_seed_step_and_rank():
    assert night.step_seed(1, 2, 0) == night.step_seed(1, 2, 0)
    assert len({night.step_seed(1, 2, 0), night.step_seed(1, 3, 0), night.step_seed(1, 2, 1),
                night.step_seed(2, 2, 0)}) == 4
