"""The device component (training/device.py): `--precision` resolved in one place for every verb that runs a model,
its options each machine's own, and the HF Trainer's arguments from the same resolution."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hitoban.errors import UsageError
from hitoban.training import device as device_module
from hitoban.training.device import PRECISIONS, DeviceOptions, hf_trainer_precision, machine_fields, resolve_precision
from hitoban.training.hardware import DeviceFacts, plan_device

ROOT = Path(__file__).resolve().parents[2]
MACHINES = st.one_of(
    st.builds(DeviceFacts, st.just("cuda"), st.text(max_size=8),
              st.tuples(st.integers(5, 10), st.integers(0, 9)).map(tuple)),
    st.builds(DeviceFacts, st.just("mps"), st.just("arm64"), macos=st.tuples(st.integers(12, 16), st.integers(0, 6))),
    st.builds(DeviceFacts, st.just("cpu"), st.text(max_size=8), cpu_bf16=st.booleans()))


@given(MACHINES, st.sampled_from(PRECISIONS))
def test_auto_is_the_plan_and_an_explicit_precision_is_kept_or_refused(facts, requested):
    plan = plan_device(facts)
    try:
        used = resolve_precision(requested, facts)
    except UsageError as refusal:  # refused: one line naming what to use instead
        assert requested != "auto" and "\n" not in str(refusal)
        return
    assert used == (plan.precision if requested == "auto" else requested)


def test_fp16_on_a_cpu_is_refused():
    with pytest.raises(UsageError, match="needs a GPU"):
        resolve_precision("fp16", DeviceFacts("cpu", "x", cpu_bf16=True))


def test_the_machine_options_are_declared_on_the_fields():
    assert set(machine_fields(DeviceOptions)) == {f.name for f in dataclasses.fields(DeviceOptions)}
    from hitoban.training.pretrain.options import TrainingOptions

    assert set(machine_fields(TrainingOptions)) == {*machine_fields(DeviceOptions), "grad_accum"}


def test_the_hf_trainer_gets_fp32_on_a_cpu_unless_asked(monkeypatch):
    monkeypatch.setattr(device_module, "resolve_precision", lambda requested, facts: requested)
    assert hf_trainer_precision(cpu=True) == {"use_cpu": True, "bf16": False, "fp16": False}
    assert hf_trainer_precision(cpu=True, precision="bf16") == {"use_cpu": True, "bf16": True, "fp16": False}


@given(MACHINES, st.sampled_from(("auto", "no", "bf16")))
def test_chat_decodes_in_the_dtype_the_same_resolution_gives(facts, requested):
    """`hitoban chat --precision`: auto is the plan's weights dtype, an explicit bf16 is checked against the hardware
    as a training run's is (it had its own table before, and took bf16 where training refuses it)."""
    import torch

    from hitoban.training import hardware

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hardware, "device_facts", lambda device: facts)
        try:
            dtype = device_module.decoding_dtype(requested, facts.type)
        except UsageError:
            assert requested == "bf16"  # refused exactly as a training run with --precision bf16 is
            with pytest.raises(UsageError):
                resolve_precision("bf16", facts)
            return
    expected = {"auto": plan_device(facts).weights_dtype == "bfloat16", "no": False, "bf16": True}[requested]
    assert dtype == (torch.bfloat16 if expected else None)


def calls_outside(name: str, allowed: set[str]) -> list[str]:
    """file:line of every call of `name` in product code outside the `allowed` files."""
    found = []
    for area in ("modeling", "training", "evaluation", "release", "hitoban"):
        for path in sorted((ROOT / area).rglob("*.py")):
            relative = str(path.relative_to(ROOT))
            if relative in allowed:
                continue
            for node in ast.walk(ast.parse(path.read_text(), relative)):
                if isinstance(node, ast.Call):
                    func = node.func
                    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                    if called == name:
                        found.append(f"{relative}:{node.lineno}")
    return found


def test_precision_is_resolved_in_one_place():
    """`--precision` is turned into the precision a run uses only by training/device.py (the night, calibrate, a
    federated machine, sft and tone all call it): no other module checks or picks a precision itself."""
    assert calls_outside("check_precision", {"training/device.py", "training/hardware.py"}) == []
    assert calls_outside("make_accelerator", {"training/device.py", "training/step.py"}) == []
    assert calls_outside("resolve_precision", {"training/device.py"}) == []


def test_the_one_place_check_sees_a_second_resolver(tmp_path, monkeypatch):
    """Negative control: a module that checks a precision itself is found."""
    (tmp_path / "training").mkdir()
    (tmp_path / "training" / "rogue.py").write_text("from x import check_precision\ncheck_precision(f, 'bf16')\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert calls_outside("check_precision", set()) == ["training/rogue.py:2"]
