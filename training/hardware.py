"""What the machine can do fast: the default precision per device (docs/design.md §6: bf16 where it is faster).

CPUs differ: with AMX or AVX512-BF16 (Sapphire Rapids, AMD Zen 4) bf16 autocast runs a training step 1.6-1.8x
faster than fp32 (measured here: small b16 3,884 -> 6,720 tok/s, 3lm b8 901 -> 1,603 on an AVX512-BF16 EPYC);
without them bf16 is emulated and ~4x slower. So bf16 is the default only where the hardware has it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from hitoban.errors import UsageError
from hitoban.provenance import write_json
from hitoban.training import faults

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


@dataclass(frozen=True)
class DeviceFacts:
    """What the precision and compile choices depend on, and nothing else: read from the machine by
    `device_facts`, or written out by hand for a machine we do not have (tests: a GTX 1050, a T4, an M1)."""

    type: str  # "cuda", "mps" or "cpu"
    name: str = ""
    capability: tuple[int, int] | None = None  # CUDA compute capability
    macos: tuple[int, int] | None = None  # MPS: the macOS version
    cpu_bf16: bool = False  # CPU: AMX, AVX512-BF16 or Arm's bf16 (the Linux flags)


@dataclass(frozen=True)
class DevicePlan:
    """Every use of bf16 and of torch.compile, decided once per device (`plan_device`) and recorded with the run."""

    precision: str  # `--precision auto`: "bf16", "fp16" or "no" (fp32)
    bf16_native: bool  # the hardware multiplies bf16 (else torch emulates it, several times slower)
    muon_dtype: str  # Muon's Newton-Schulz iteration: "bfloat16" where native, else "float32"
    weights_dtype: str  # chat and Space decoding: "bfloat16" where native, else "float32"
    compile_possible: bool  # Inductor can compile for this device (`--compile auto` may then choose it)
    why: str

    def record(self) -> dict:
        return dataclasses.asdict(self)


BF16_NATIVE_CAPABILITY = (8, 0)  # Ampere: bf16 tensor cores; torch.cuda.is_bf16_supported() also says yes to emulation
FP16_TENSOR_CAPABILITY = (7, 0)  # Volta/Turing: fp16 tensor cores; Pascal (a GTX 1050: 6.1) runs fp16 at 1/64 rate
INDUCTOR_MIN_CAPABILITY = (7, 0)  # Triton, under Inductor, refuses older GPUs
MPS_BF16_MACOS = (14, 0)  # MPS runs bf16 from macOS 14


def plan_device(facts: DeviceFacts) -> DevicePlan:
    """The one decision: a pure function of (device type, compute capability, OS version, CPU features)."""
    if facts.type == "cuda":
        cc = facts.capability or (0, 0)
        native = cc >= BF16_NATIVE_CAPABILITY
        precision = "bf16" if native else "fp16" if cc >= FP16_TENSOR_CAPABILITY else "no"
        compiles = cc >= INDUCTOR_MIN_CAPABILITY
        half = ("fp16 tensor cores with the gradient scaler" if precision == "fp16"
                else "no fast fp16 either (before 7.0), so fp32")
        why = (f"{facts.name or 'CUDA GPU'}, compute capability {cc[0]}.{cc[1]}: "
               + ("bf16 tensor cores" if native else f"no native bf16 (before 8.0), {half}")
               + ("" if compiles else "; Inductor needs compute capability 7.0, so no torch.compile"))
    elif facts.type == "mps":  # bf16 runs from macOS 14 but is not assumed fast: Muon and decoding stay fp32 too
        native, precision, compiles = False, "no", False
        why = (f"Apple MPS on macOS {'.'.join(map(str, facts.macos or ()))}: fp32 (bf16 autocast is not consistently "
               "faster there" + ("" if mps_runs_bf16(facts) else "; bf16 needs macOS 14")
               + "); Inductor's MPS backend is young")
    else:
        native = facts.cpu_bf16
        precision, compiles = ("bf16" if native else "no"), True
        why = (f"CPU {facts.name}: " + ("native bf16 (AMX / AVX512-BF16 / Arm bf16)" if native else
               "no native bf16 (no AMX / AVX512-BF16 / Arm bf16: bf16 is emulated and slower), so fp32 throughout"))
    dtype = "bfloat16" if native else "float32"
    return DevicePlan(precision, native, dtype, dtype, compiles, why)


def mps_runs_bf16(facts: DeviceFacts) -> bool:
    return facts.macos is not None and facts.macos >= MPS_BF16_MACOS


def device_facts(device: torch.device | str) -> DeviceFacts:
    """The facts of this machine's `device`."""
    device = torch.device(device)
    if device.type == "cuda":
        return DeviceFacts("cuda", torch.cuda.get_device_name(device), tuple(torch.cuda.get_device_capability(device)))
    if device.type == "mps":
        version = tuple(int(x) for x in (platform.mac_ver()[0] or "0.0").split(".")[:2])
        return DeviceFacts("mps", platform.machine(), macos=(version + (0,))[:2])
    forced = faults.active().cpu_bf16  # HITOBAN_CPU_BF16=0/1: decide as on a CPU without/with native bf16
    native = cpu_has_native_bf16() if forced is None else forced
    return DeviceFacts("cpu", cpu_model() or platform.processor() or platform.machine(), cpu_bf16=native)


def cpu_model() -> str | None:
    """The CPU's marketing name (Linux: /proc/cpuinfo's `model name`; macOS: sysctl), for records and tables."""
    try:
        if sys.platform == "darwin":
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                  timeout=5).stdout.strip() or None
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def plan_for(device: torch.device | str) -> DevicePlan:
    return plan_device(device_facts(device))


def default_precision(device_type: str) -> str:
    """`--precision auto` on this machine's device of that type (`plan_device`)."""
    return plan_for(device_type).precision


# Published dense tensor-core peaks (FLOP/s) with fp32 accumulation, as training uses them (GeForce cards run fp32
# accumulation at half their headline fp16 rate: an RTX 3060 is 25.6, not 51), keyed by the exact name
# `torch.cuda.get_device_name` reports. Only an exact name counts: matched as a substring, an L40 took the L4's
# figure (its MFU x1.5), an RTX 3060 Ti the 3060's, an H200 NVL the SXM's. Any other GPU is measured, and says so.
# MFU must not be flattered.
_A100 = ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe")
PUBLISHED_PEAK = {
    "bf16": {"NVIDIA H200": 989e12, "NVIDIA H200 NVL": 835e12, "NVIDIA H100 80GB HBM3": 989e12,
             "NVIDIA H100 PCIe": 756e12, "NVIDIA H100 NVL": 835e12, **dict.fromkeys(_A100, 312e12),
             "NVIDIA L40S": 362e12, "NVIDIA L4": 121e12, "NVIDIA GeForce RTX 4090": 165e12,
             "NVIDIA GeForce RTX 3090": 71e12, "NVIDIA GeForce RTX 3060": 25.6e12, "NVIDIA A10G": 70e12},
    "fp16": {"Tesla T4": 65e12, "Tesla V100-PCIE-16GB": 112e12, "Tesla V100-PCIE-32GB": 112e12,
             "Tesla V100-SXM2-16GB": 125e12, "Tesla V100-SXM2-32GB": 125e12},
}
PEAK_CACHE = Path.home() / ".cache" / "hitoban" / "matmul_peak.json"


def published_peak(name: str, precision: str) -> float | None:
    """The published peak of the GPU named exactly `name` (surrounding spaces aside), or None: measure it."""
    return PUBLISHED_PEAK.get(precision, {}).get(name.strip())


def parameter_count(config) -> int:
    """The model's parameters from its config alone (before it is built): the tied embedding once, and per layer
    the four attention projections and SwiGLU's three (norm weights, a few thousand, left out)."""
    width = config.hidden_size
    return config.vocab_size * width + config.num_hidden_layers * (4 * width**2 + 3 * width * config.intermediate_size)


def flops_per_token(config, context: int) -> float:
    """Training FLOPs per token: 6 per parameter (forward + backward; the tied embedding counts once, as the output
    projection) plus attention's 12 x layers x width x context (nanoGPT / PaLM's estimate)."""
    return 6 * parameter_count(config) + 12 * config.num_hidden_layers * config.hidden_size * context


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels: CUDA and MPS run asynchronously, so a clock read without this times the queueing."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def measured_once(cache: Path, key: str, measure):
    """`measure()`'s result for `key`, measured on the first call and kept in the JSON file `cache` (a read-only
    home only costs a re-measurement next time)."""
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
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    if device.type == "cuda" and precision in PUBLISHED_PEAK:
        name = torch.cuda.get_device_name(device)
        peak = published_peak(name, precision)
        if peak is not None:
            return peak, f"published dense {precision} peak of {name}"
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


def check_precision(facts: DeviceFacts | str, precision: str, warn=print) -> None:
    """Refuse a precision the device cannot run or only emulates, with what to use instead; warn where it runs but
    slowly. `facts`: the device's facts, or a device type to read them for."""
    facts = device_facts(facts) if isinstance(facts, str) else facts
    plan = plan_device(facts)
    if precision == "fp16" and facts.type == "cpu":
        raise UsageError("--precision fp16 needs a GPU (CUDA or MPS); on a CPU use bf16 (native on AMX / "
                         "AVX512-BF16 CPUs) or no (fp32)")
    if precision == "bf16" and facts.type == "cuda" and not plan.bf16_native:
        cc = facts.capability or (0, 0)
        raise UsageError(f"this GPU ({facts.name}, compute capability {cc[0]}.{cc[1]}) has no native bf16 (it needs "
                         f"8.0, Ampere or newer): torch would emulate it, slowly; use --precision {plan.precision} "
                         "(what auto picks here)")
    if precision == "fp16" and facts.type == "cuda" and (facts.capability or (0, 0)) < FP16_TENSOR_CAPABILITY:
        warn(f"warning: {facts.name} has no fp16 tensor cores (compute capability below 7.0): fp16 is slower than "
             "fp32 there; --precision no is faster")
    if precision == "bf16" and facts.type == "mps" and not mps_runs_bf16(facts):
        raise UsageError("bf16 on Apple's MPS needs macOS 14 or newer; use --precision fp16 or no (fp32)")
    if precision == "bf16" and facts.type == "cpu" and not facts.cpu_bf16:
        warn("warning: this CPU has no native bf16 (no AMX / AVX512-BF16): bf16 is emulated and about 4x slower "
             "than fp32 here; --precision no is faster")


COMPILE_MIN_CPU_SECONDS = 20 * 60  # shorter CPU runs are not worth a measurement that takes a minute or two


def choose_compile(option: str, facts: DeviceFacts, run_seconds: float, measure_gain) -> tuple[bool, str]:
    """(compile?, why). `auto`: on CUDA GPUs Inductor supports (compute capability 7.0+); on a CPU only when the
    measured speed-up repays the measured compile time over this run's length (`measure_gain()` ->
    {"eager_step_s", "compiled_step_s", "compile_s"}, cached per machine and shape by calibrate); off on MPS, whose
    inductor backend is still young."""
    if option in ("on", "off"):
        return option == "on", f"--compile {option}"
    plan = plan_device(facts)
    if facts.type == "cuda":
        cc = facts.capability or (0, 0)
        if not plan.compile_possible:
            return False, f"auto: off, Inductor needs compute capability 7.0 and {facts.name} has {cc[0]}.{cc[1]}"
        return True, f"auto: CUDA, compute capability {cc[0]}.{cc[1]}"
    if facts.type != "cpu":
        return False, f"auto: off on {facts.type}"
    if run_seconds < COMPILE_MIN_CPU_SECONDS:
        return False, f"auto: a run of ~{run_seconds / 60:.0f} min on a CPU cannot repay the compile time"
    gain = measure_gain()
    speedup = gain["eager_step_s"] / gain["compiled_step_s"]
    saved = run_seconds * (1 - 1 / speedup) - gain["compile_s"]
    verdict = "saves" if saved > 0 else "would cost"
    return saved > 0, (f"auto: measured {speedup:.2f}x per step after {gain['compile_s']:.0f} s of compiling, so it "
                       f"{verdict} ~{abs(saved) / 60:.0f} min over this ~{run_seconds / 60:.0f}-min run")


def hardware_description(device: torch.device, processes: int, precision: str) -> str:
    """What a run trained on, in words, for the model card (e.g. '1 x NVIDIA H200, precision bf16')."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    elif device.type == "mps":
        name = f"Apple silicon GPU (MPS, {platform.machine()})"
    else:
        name = f"CPU ({cpu_model() or platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    return f"{processes} x {name}, precision {precision}"

