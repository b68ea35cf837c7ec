"""The device component: its options (`--precision`, `--compile`, `--cpu`, `--memory-cap-gb`,
`--skip-memory-check`) and the one place they are resolved against the machine's device plan
(`training/hardware.py: plan_device`), for every verb that runs a model: pretrain, calibrate, a federated machine's
tasks, sft and tone, chat (`decoding_dtype`).

The options are each machine's own (`machine=True` on the field): a federated server does not offer them and a
joining machine decides them for itself. Standard library only at import (`hitoban --help` builds every parser
without torch); `set_up` imports torch and Accelerate when a run starts.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from hitoban.options import Checked, option

PRECISIONS = ("auto", "no", "bf16", "fp16")


@dataclass(kw_only=True)
class DeviceOptions(Checked):
    """Where and in what precision a model runs."""

    precision: str = option("auto", "auto: the device plan (training/hardware.py): bf16 where the hardware has it "
                                    "(CUDA 8.0+, CPUs with AMX / AVX512-BF16), fp16 on CUDA 7.x (T4, V100), fp32 "
                                    "elsewhere, MPS included (bf16 there needs macOS 14; fp16 needs a GPU)",
                            choices=PRECISIONS, machine=True, trajectory=True)
    compile: str = option("auto", "torch.compile the model. auto: on CUDA 7.0+; on a CPU only when a measurement on "
                                  "this machine says the run is long enough to repay the compile time (cached)",
                          choices=("auto", "on", "off"), machine=True)
    cpu: bool = option(False, "train on the CPU even when a GPU/MPS is present", machine=True)
    memory_cap_gb: float | None = option(None, "cap GPU/MPS memory for this process (GiB)", above=0, machine=True)
    skip_memory_check: bool = option(False, "start even when the memory estimate exceeds what is free",
                                     machine=True)


def resolve_precision(requested: str, facts) -> str:
    """The precision a run uses: `auto` is the device plan's; an explicit one is checked against the hardware
    (refused where it cannot run, a warning where it runs slowly). The only place `--precision` is resolved."""
    from hitoban.training.hardware import check_precision, plan_device

    precision = plan_device(facts).precision if requested == "auto" else requested
    check_precision(facts, precision)
    return precision


@dataclass(frozen=True)
class Device:
    """A run's device, decided once: the machine's facts, its plan, the precision used and the Accelerator."""

    facts: Any  # hardware.DeviceFacts
    plan: Any  # hardware.DevicePlan
    precision: str
    accelerator: Any  # accelerate.Accelerator

    def record(self) -> dict:
        """What a run folder records about the device choice."""
        return {**self.plan.record(), "precision_used": self.precision}


def set_up(cpu: bool, precision: str, deterministic: bool = False) -> Device:
    """The run's device and Accelerator. `deterministic` (the kill test on a GPU): deterministic kernels, set before
    cuBLAS's first use, so a killed and resumed run is bit-identical there too."""
    import torch

    from hitoban.modeling.loading import device_for
    from hitoban.training.hardware import device_facts, plan_device
    from hitoban.training.step import make_accelerator

    facts = device_facts(device_for(cpu))
    if deterministic and facts.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS reads it, before its first use
        torch.use_deterministic_algorithms(True)
    plan = plan_device(facts)
    used = resolve_precision(precision, facts)
    return Device(facts, plan, used, make_accelerator(cpu, used))


def hf_trainer_precision(cpu: bool, precision: str = "auto") -> dict:
    """The HF Trainer's device arguments (sft, tone) from the same resolution: the CPU with `--cpu` even where a GPU
    or a Mac is present. `auto` on a CPU or MPS stays fp32 for the Trainer (its fine-tuning runs are short and were
    measured only in fp32 there); on CUDA it is the plan's (bf16 on 8.0+, fp16 with the Trainer's scaler on 7.x)."""
    from hitoban.modeling.loading import device_for
    from hitoban.training.hardware import device_facts

    device = device_for(cpu)
    facts = device_facts(device)
    if precision == "auto" and device.type != "cuda":
        precision = "no"
    used = resolve_precision(precision, facts)
    return {"use_cpu": device.type == "cpu", "bf16": used == "bf16", "fp16": used == "fp16"}


def decoding_dtype(precision: str, device) -> Any:
    """The dtype `hitoban chat` loads weights in (None: the checkpoint's fp32), from the same resolution as
    training: `auto` decodes in bf16 exactly where the plan has native bf16 (decoding one token reads every weight
    once, so half the bytes is about twice the tokens per second; the README's `hitoban chat` row); an explicit
    `bf16` is checked against the hardware like a training run's."""
    import torch

    from hitoban.training.hardware import device_facts, plan_device

    facts = device_facts(device)
    if precision == "auto":
        chosen = plan_device(facts).weights_dtype
    else:
        chosen = "bfloat16" if resolve_precision(precision, facts) == "bf16" else "float32"
    return torch.bfloat16 if chosen == "bfloat16" else None


def machine_fields(cls: type) -> tuple[str, ...]:
    """The fields of an options dataclass that each machine decides for itself (declared `machine=True`)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("machine"))


__all__ = ["PRECISIONS", "Device", "DeviceOptions", "decoding_dtype", "hf_trainer_precision", "machine_fields",
           "resolve_precision", "set_up"]
