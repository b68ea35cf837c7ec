"""The training step's process state (training/step.py): Accelerate's kept device is reset for a CPU run."""

from __future__ import annotations

import torch
from conftest import night_config

from hitoban.training.pretrain.trainer import pretrain


def test_a_cpu_accelerator_after_a_gpu_run_runs_on_the_cpu():
    """Accelerate keeps its device between Accelerators: after a GPU run a canary model's Accelerator(cpu=True)
    went to the GPU. A 'meta' device stands in for the GPU the earlier run left behind."""
    from accelerate import Accelerator
    from accelerate.state import PartialState

    from hitoban.training.step import reset_accelerate_state

    try:
        reset_accelerate_state()
        PartialState._reset_state()
        PartialState(cpu=True)
        PartialState._shared_state["device"] = torch.device("meta")  # as a CUDA run leaves it
        reset_accelerate_state()
        assert Accelerator(cpu=True).device.type == "meta"  # control: the kept state wins without the fix
        reset_accelerate_state(cpu=True)
        assert Accelerator(cpu=True).device.type == "cpu"
    finally:
        reset_accelerate_state()
        PartialState._reset_state()


def test_runs_of_different_precision_and_a_trainer_share_one_process(tiny_shards, tmp_path):
    """Accelerate refuses a second Accelerator with another precision in one process; a bf16 run between fp32 work
    (the Trainer, another run) used to fail with 'AcceleratorState has already been initialized'."""
    from accelerate import Accelerator

    Accelerator(cpu=True, mixed_precision="no")  # what a Trainer (fp32 on a CPU) leaves behind
    pretrain(night_config(tiny_shards, tmp_path / "bf16", steps=2, eval_every=100, precision="bf16"))
    pretrain(night_config(tiny_shards, tmp_path / "fp32", steps=2, eval_every=100, precision="no"))
    assert Accelerator(cpu=True, mixed_precision="no").mixed_precision == "no"  # and it leaves no state behind


def test_a_batch_is_copied_without_waiting_only_where_the_host_buffer_may_be_freed_at_once():
    """Issue 34 (MPS, pytorch issue 189690): a `non_blocking` copy from a numpy buffer freed after the step reads
    freed storage on MPS. Only CUDA stages pageable memory before the call returns; every other device copies
    synchronously. (The MPS failure itself needs a Mac; this pins the decision, and the copy's result below.)"""
    import numpy as np

    from hitoban.training.step import copies_without_waiting, to_device

    assert copies_without_waiting(torch.device("cuda"))
    assert not copies_without_waiting(torch.device("mps")) and not copies_without_waiting(torch.device("cpu"))
    rows = np.arange(12, dtype=np.int64).reshape(3, 4)
    x = to_device(rows, torch.device("cpu"))
    del rows
    assert x.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
