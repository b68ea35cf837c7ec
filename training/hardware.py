"""What the machine can do fast: the default precision per device (SPEC §5: bf16 autocast where it is faster).

CPUs differ: with AMX or AVX512-BF16 (Sapphire Rapids, AMD Zen 4) bf16 autocast runs a training step 1.6-1.8x
faster than fp32 (measured here: small b16 3,884 -> 6,720 tok/s, 3lm b8 901 -> 1,603 on an AVX512-BF16 EPYC);
without them bf16 is emulated and ~4x slower. So bf16 is the default only where the hardware has it.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

NATIVE_BF16_FLAGS = re.compile(r"\b(?:amx_bf16|avx512_bf16|bf16)\b")  # x86 AMX / AVX512-BF16, Arm's `bf16` feature


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """True when the CPU multiplies bf16 in hardware (Linux: the flags in /proc/cpuinfo)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = " ".join(line.split(":", 1)[1] for line in cpuinfo.splitlines()
                     if line.lower().startswith(("flags", "features")) and ":" in line)
    return bool(NATIVE_BF16_FLAGS.search(flags))


def default_precision(device_type: str) -> str:
    """`--precision auto`: bf16 on CUDA that supports it and on CPUs with native bf16; fp32 ("no") elsewhere,
    MPS included (its bf16 autocast is not consistently faster)."""
    if device_type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "no"
    if device_type == "cpu":
        return "bf16" if cpu_has_native_bf16() else "no"
    return "no"
