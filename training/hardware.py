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


# Published dense bf16 tensor-core peaks (FLOP/s) of common GPUs; anything else is measured.
PUBLISHED_BF16_PEAK = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12,
                       "RTX 4090": 165e12, "RTX 3090": 71e12, "RTX 3060": 51e12, "A10G": 70e12}
PEAK_CACHE = Path.home() / ".cache" / "hitoban" / "matmul_peak.json"


def flops_per_token(config, context: int) -> float:
    """Training FLOPs per token: 6 per parameter (forward + backward; the tied embedding counts once, as the output
    projection) plus attention's 12 x layers x width x context (nanoGPT / PaLM's estimate)."""
    width, layers = config.hidden_size, config.num_hidden_layers
    params = config.vocab_size * width + layers * (4 * width**2 + 3 * width * config.intermediate_size)
    return 6 * params + 12 * layers * width * context


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels: CUDA and MPS run asynchronously, so a clock read without this times the queueing."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def measured_once(cache: Path, key: str, measure):
    """`measure()`'s result for `key`, measured on the first call and kept in the JSON file `cache` (a read-only
    home only costs a re-measurement next time)."""
    import json

    from hitoban.provenance import write_json

    cached = json.loads(cache.read_text()) if cache.exists() else {}
    if key not in cached:
        cached[key] = measure()
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            write_json(cache, cached)
        except OSError:
            pass
    return cached[key]


def matmul_peak(device: torch.device, precision: str, cache: Path = PEAK_CACHE) -> tuple[float, str]:
    """(FLOP/s, where the number comes from): a known GPU's published bf16 peak, else the best of a few large
    matmuls timed once on this machine and cached (same device, dtype and torch)."""
    import platform
    import time

    dtype = torch.bfloat16 if precision in ("bf16", "fp16") else torch.float32
    if device.type == "cuda" and dtype != torch.float32:
        name = torch.cuda.get_device_name(device)
        for key, peak in PUBLISHED_BF16_PEAK.items():
            if key in name:
                return peak, f"published bf16 peak of {name}"
    machine = (torch.cuda.get_device_name(device) if device.type == "cuda"
               else platform.processor() or platform.machine())

    def measure() -> float:
        size = 2048 if device.type == "cpu" else 8192
        a = torch.randn(size, size, device=device, dtype=dtype)
        b = torch.randn(size, size, device=device, dtype=dtype)
        best = float("inf")
        for _ in range(4):
            synchronize(device)
            start = time.perf_counter()
            a @ b
            synchronize(device)
            best = min(best, time.perf_counter() - start)
        return 2 * size**3 / best

    key = f"{device.type}|{machine}|{dtype}|{torch.get_num_threads()} threads|torch {torch.__version__}"
    return measured_once(cache, key, measure), f"measured {dtype} matmul peak of this machine"


def available_memory_bytes(device: torch.device) -> int | None:
    """Memory this run can still take: free CUDA memory; on MPS what Metal recommends minus what the driver holds
    (unified memory, shared with the system); on a CPU the system's available RAM (psutil: Linux and macOS)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "mps":
        return max(0, torch.mps.recommended_max_memory() - torch.mps.driver_allocated_memory())
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # psutil comes with accelerate; without it, no preflight rather than a wrong one
        return None


def check_precision(device_type: str, precision: str, warn=print) -> None:
    """Refuse a precision the device cannot run, with what to use instead; warn where it runs but slowly."""
    from hitoban.errors import UsageError

    if precision == "fp16" and device_type == "cpu":
        raise UsageError("--precision fp16 needs a GPU (CUDA or MPS); on a CPU use bf16 (native on AMX / "
                         "AVX512-BF16 CPUs) or no (fp32)")
    if precision == "bf16" and device_type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UsageError(f"this GPU ({torch.cuda.get_device_name()}) has no bf16; use --precision fp16 or no")
    if precision == "bf16" and device_type == "mps" and not torch.backends.mps.is_macos_or_newer(14, 0):
        raise UsageError("bf16 on Apple's MPS needs macOS 14 or newer; use --precision fp16 or no (fp32)")
    if precision == "bf16" and device_type == "cpu" and not cpu_has_native_bf16():
        warn("warning: this CPU has no native bf16 (no AMX / AVX512-BF16): bf16 is emulated and about 4x slower "
             "than fp32 here; --precision no is faster")


COMPILE_MIN_CPU_SECONDS = 20 * 60  # shorter CPU runs are not worth a measurement that takes a minute or two


def choose_compile(option: str, device: torch.device, run_seconds: float, measure_gain) -> tuple[bool, str]:
    """(compile?, why). `auto`: on CUDA; on a CPU only when the measured speed-up repays the measured compile time
    over this run's length (`measure_gain()` -> {"eager_step_s", "compiled_step_s", "compile_s"}, cached per
    machine and shape by calibrate); off on MPS, whose inductor backend is still young."""
    if option in ("on", "off"):
        return option == "on", f"--compile {option}"
    if device.type == "cuda":
        return True, "auto: CUDA"
    if device.type != "cpu":
        return False, f"auto: off on {device.type}"
    if run_seconds < COMPILE_MIN_CPU_SECONDS:
        return False, f"auto: a run of ~{run_seconds / 60:.0f} min on a CPU cannot repay the compile time"
    gain = measure_gain()
    speedup = gain["eager_step_s"] / gain["compiled_step_s"]
    saved = run_seconds * (1 - 1 / speedup) - gain["compile_s"]
    verdict = "saves" if saved > 0 else "would cost"
    return saved > 0, (f"auto: measured {speedup:.2f}x per step after {gain['compile_s']:.0f} s of compiling, so it "
                       f"{verdict} ~{abs(saved) / 60:.0f} min over this ~{run_seconds / 60:.0f}-min run")
