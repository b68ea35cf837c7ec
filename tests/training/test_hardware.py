"""The device plan (training/hardware.py): every bf16 and compile choice one pure function of the device's
facts, tested for GPUs and Macs this CI never sees, and the precision checks with the alternative they name."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hitoban.errors import UsageError
from hitoban.training import hardware
from hitoban.training.hardware import DeviceFacts, check_precision, choose_compile, plan_device, published_peak

GTX_1050 = DeviceFacts("cuda", "NVIDIA GeForce GTX 1050", (6, 1))
T4 = DeviceFacts("cuda", "Tesla T4", (7, 5))
RTX_3060 = DeviceFacts("cuda", "NVIDIA GeForce RTX 3060", (8, 6))
H100 = DeviceFacts("cuda", "NVIDIA H100 80GB HBM3", (9, 0))
M1_MACOS_13 = DeviceFacts("mps", "arm64", macos=(13, 6))
M1_MACOS_14 = DeviceFacts("mps", "arm64", macos=(14, 2))
CPU_AMX = DeviceFacts("cpu", "Intel Xeon (Sapphire Rapids)", cpu_bf16=True)
CPU_AVX2 = DeviceFacts("cpu", "AMD Ryzen (Zen 3)", cpu_bf16=False)


@pytest.mark.parametrize("facts, precision, native, muon, compiles", [
    (GTX_1050, "no", False, "float32", False),  # Pascal: no bf16, fp16 at 1/64 rate, Triton refuses 6.1
    (T4, "fp16", False, "float32", True),  # Turing: fp16 tensor cores; bf16 only emulated
    (RTX_3060, "bf16", True, "bfloat16", True),
    (H100, "bf16", True, "bfloat16", True),
    (M1_MACOS_13, "no", False, "float32", False),
    (M1_MACOS_14, "no", False, "float32", False),
    (CPU_AMX, "bf16", True, "bfloat16", True),
    (CPU_AVX2, "no", False, "float32", True),
])
def test_the_device_plan_for_each_kind_of_machine(facts, precision, native, muon, compiles):
    plan = plan_device(facts)
    assert (plan.precision, plan.bf16_native, plan.muon_dtype, plan.compile_possible) == (precision, native, muon,
                                                                                         compiles)
    assert plan.weights_dtype == muon  # chat and Space decode in bf16 exactly where the hardware has it
    assert plan.why and json.loads(json.dumps(plan.record()))["why"] == plan.why


def test_emulated_bf16_is_refused_on_a_gpu_and_fp16_warned_before_tensor_cores():
    with pytest.raises(UsageError, match=r"Tesla T4, compute capability 7\.5.*--precision fp16"):
        check_precision(T4, "bf16")
    with pytest.raises(UsageError, match=r"--precision no"):
        check_precision(GTX_1050, "bf16")
    said: list[str] = []
    check_precision(GTX_1050, "fp16", warn=said.append)
    assert "no fp16 tensor cores" in said[0]
    check_precision(RTX_3060, "bf16", warn=said.append)
    check_precision(T4, "fp16", warn=said.append)
    assert len(said) == 1
    with pytest.raises(UsageError, match="macOS 14"):
        check_precision(M1_MACOS_13, "bf16")
    check_precision(M1_MACOS_14, "bf16")


def test_compile_auto_follows_the_device():
    def never():
        raise AssertionError("measured although the answer was known")

    compiled, reason = choose_compile("auto", GTX_1050, 1e6, never)
    assert not compiled and "compute capability 7.0" in reason and "6.1" in reason
    assert choose_compile("auto", T4, 10, never)[0] and choose_compile("auto", H100, 10, never)[0]
    assert not choose_compile("auto", M1_MACOS_14, 1e6, never)[0]
    assert choose_compile("on", GTX_1050, 10, never)[0]  # asked for explicitly: the user's call


def test_the_peak_table_matches_exact_names_and_does_not_flatter():
    assert published_peak("NVIDIA H100 PCIe", "bf16") == 756e12  # not the SXM's 989
    # issue 34: matched as substrings, these took a smaller card's peak (MFU x1.5 for the L40)
    for name in ("NVIDIA L40", "NVIDIA GeForce RTX 3060 Ti", "NVIDIA GeForce RTX 4090 D", "Tesla V100S-PCIE-32GB"):
        assert published_peak(name, "bf16") is None and published_peak(name, "fp16") is None
    assert published_peak("NVIDIA H200 NVL", "bf16") == 835e12 and published_peak(" NVIDIA H200 ", "bf16") == 989e12
    assert published_peak("NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert published_peak("NVIDIA GeForce RTX 3060", "bf16") == 25.6e12  # fp32 accumulation, half the fp16 number
    assert published_peak("Tesla T4", "fp16") == 65e12 and published_peak("Tesla T4", "bf16") is None
    assert published_peak("Some Future GPU", "bf16") is None  # measured instead


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([(p, n) for p, table in hardware.PUBLISHED_PEAK.items() for n in table]),
       st.text(alphabet="0123456789 ABCDEGHIKLNPSTXabcdefgilmnoprsx-", min_size=1, max_size=8),
       st.booleans())
def test_a_name_one_step_from_the_table_is_measured_not_looked_up(entry, extra, before):
    """The class: any name that is not exactly a table entry (a known one with something added before or after)
    gets no published peak, so its MFU comes from a measured peak labelled as such."""
    precision, name = entry
    other = (extra + name) if before else (name + extra)
    if other.strip() in hardware.PUBLISHED_PEAK[precision]:
        return
    assert published_peak(other, precision) is None


def test_the_cpu_override_forces_the_other_path():
    from hitoban.training import faults

    with faults.scoped(cpu_bf16=False):
        assert hardware.plan_for("cpu").muon_dtype == "float32" and hardware.default_precision("cpu") == "no"
    with faults.scoped(cpu_bf16=True):
        assert hardware.plan_for("cpu").muon_dtype == "bfloat16" and hardware.default_precision("cpu") == "bf16"
    # HITOBAN_CPU_BF16, the documented alias (README, benchmarks), says the same in a process's environment
    assert faults.parse({faults.CPU_BF16_ENV: "0"}) == faults.make(cpu_bf16=False)
    assert faults.parse({faults.CPU_BF16_ENV: "1"}) == faults.make(cpu_bf16=True)


def test_native_bf16_is_detected_from_the_cpu_flags():
    from hitoban.training.hardware import cpu_has_native_bf16

    zen4 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
    sapphire = "flags\t\t: fpu avx2 avx512f amx_bf16 amx_tile amx_int8\n"
    epyc_avx2 = "flags\t\t: fpu sse2 avx2 fma\nmodel name\t: AMD EPYC avx512_bf16-free\n"  # flags line decides
    graviton3 = "Features\t: fp asimd sve bf16 i8mm\n"
    assert cpu_has_native_bf16(zen4) and cpu_has_native_bf16(sapphire) and cpu_has_native_bf16(graviton3)
    assert not cpu_has_native_bf16(epyc_avx2) and not cpu_has_native_bf16("")


def test_compile_auto_by_hand():
    cpu, cuda = DeviceFacts("cpu"), DeviceFacts("cuda", "NVIDIA A100", (8, 0))

    def never():
        raise AssertionError("measured although the answer was known")

    assert choose_compile("on", cpu, 10, never)[0] and not choose_compile("off", cuda, 1e6, never)[0]
    assert choose_compile("auto", cuda, 10, never)[0]
    assert not choose_compile("auto", DeviceFacts("mps", macos=(14, 0)), 1e6, never)[0]
    assert not choose_compile("auto", cpu, 600, never)[0]  # 10 minutes: not worth measuring
    gain = {"eager_step_s": 1.0, "compiled_step_s": 0.8, "compile_s": 400.0}
    # 1.25x per step saves 20% of the run: 2 hours -> 1,440 s saved > 400 s of compiling
    compiled, reason = choose_compile("auto", cpu, 7200, lambda: gain)
    assert compiled and "1.25x" in reason and "saves ~17 min" in reason
    # 30 minutes -> 360 s saved < 400 s: stays eager, and says why
    compiled, reason = choose_compile("auto", cpu, 1800, lambda: gain)
    assert not compiled and "would cost ~1 min" in reason


def test_precisions_a_device_cannot_run_are_refused_with_the_alternative(monkeypatch):
    with pytest.raises(UsageError, match="fp16 needs a GPU"):
        check_precision("cpu", "fp16")
    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: False)
    with pytest.raises(UsageError, match="macOS 14"):
        check_precision("mps", "bf16")
    monkeypatch.setattr("hitoban.training.hardware.cpu_has_native_bf16", lambda: False)
    said = []
    check_precision("cpu", "bf16", warn=said.append)
    assert "emulated" in said[0]
    check_precision("cpu", "no", warn=said.append)
    assert len(said) == 1
