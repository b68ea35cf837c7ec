"""What every result row says about itself: the machine (a short label docs/benchmarks.md's legend explains), the date
and the command that made it, so a benchmark writes its rows for the results page as they are (issue 38).

The machine label is `VENDOR-KIND-Nc`: EPYC or Xeon (else the CPU model's first word), the CPU's bf16 (AMX, bf16 for
AVX512-BF16 or Arm bf16, nobf16), the cores; `-as-AVX2` where the run imitated a CPU without native bf16
(HITOBAN_CPU_BF16=0 with ONEDNN_MAX_CPU_ISA=AVX2); a CUDA GPU's name where one ran.
"""

from __future__ import annotations

import datetime
import os
import shlex
import sys
from pathlib import Path

IMITATION = ("HITOBAN_CPU_BF16", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def machine() -> str:
    import torch

    from hitoban.training.hardware import cpu_has_native_bf16, cpu_model

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0).replace("NVIDIA ", "").replace(" ", "-")
    model = cpu_model() or "cpu"
    vendor = next((name for name in ("EPYC", "Xeon", "Ryzen", "Core") if name in model), model.split()[0])
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    native = cpu_has_native_bf16(cpuinfo)  # the device plan's own reader of the flags
    kind = "nobf16" if not native else "AMX" if "amx_bf16" in cpuinfo else "bf16"
    imitated = os.environ.get("HITOBAN_CPU_BF16") == "0" and os.environ.get("ONEDNN_MAX_CPU_ISA") == "AVX2"
    return f"{vendor}-{kind}-{os.cpu_count()}c" + ("-as-AVX2" if imitated else "")


def command() -> str:
    """The command line as run from the repository root, with the imitation's variables where they were set."""
    env = [f"{name}={os.environ[name]}" for name in IMITATION if name in os.environ]
    script = Path(sys.argv[0])
    script = f"benchmarks/{script.name}" if script.suffix == ".py" else str(script)
    return shlex.join([*env, "python", script, *sys.argv[1:]])


def stamp() -> dict[str, str]:
    return {"machine": machine(), "date": datetime.date.today().isoformat(), "command": command()}


def table(header: list[str], rows: list[list], stamped: dict[str, str] | None = None) -> list[str]:
    """A markdown table whose every row ends with the machine, the date and the command (the results page's rule)."""
    stamped = stamped or stamp()
    tail = [stamped["machine"], stamped["date"], f"`{stamped['command']}`"]
    lines = ["| " + " | ".join([*header, "machine", "date", "command"]) + " |",
             "|" + "---|" * (len(header) + 3)]
    return lines + ["| " + " | ".join([*map(str, row), *tail]) + " |" for row in rows]
