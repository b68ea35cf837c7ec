"""Issue 21: the night on the user's own device. Every bf16 and compile choice is one pure function of the device's
facts (tested here for GPUs and Macs this machine does not have), and each device-path finding has a test that
expresses the device's constraint on a CPU: MPS's missing float64, a fused optimizer's state on another device,
the fp16 scaler's skipped step, Accelerate's kept device, the kill test's memory, Ctrl-C under --supervise, and a
rank-divergent NaN."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
from conftest import launch_hitoban
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from hitoban.errors import ResourceError, UsageError
from hitoban.training import hardware
from hitoban.training.checkpoint import CheckpointError
from hitoban.training.hardware import DeviceFacts, check_precision, choose_compile, plan_device, published_peak
from hitoban.training.options import PretrainConfig

GTX_1050 = DeviceFacts("cuda", "NVIDIA GeForce GTX 1050", (6, 1))
T4 = DeviceFacts("cuda", "Tesla T4", (7, 5))
RTX_3060 = DeviceFacts("cuda", "NVIDIA GeForce RTX 3060", (8, 6))
H100 = DeviceFacts("cuda", "NVIDIA H100 80GB HBM3", (9, 0))
M1_MACOS_13 = DeviceFacts("mps", "arm64", macos=(13, 6))
M1_MACOS_14 = DeviceFacts("mps", "arm64", macos=(14, 2))
CPU_AMX = DeviceFacts("cpu", "Intel Xeon (Sapphire Rapids)", cpu_bf16=True)
CPU_AVX2 = DeviceFacts("cpu", "AMD Ryzen (Zen 3)", cpu_bf16=False)


# ------------------------------------------------------------------------------------------------ one decision
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

    on, why = choose_compile("auto", GTX_1050, 1e6, never)
    assert not on and "compute capability 7.0" in why and "6.1" in why
    assert choose_compile("auto", T4, 10, never)[0] and choose_compile("auto", H100, 10, never)[0]
    assert not choose_compile("auto", M1_MACOS_14, 1e6, never)[0]
    assert choose_compile("on", GTX_1050, 10, never)[0]  # asked for explicitly: the user's call


def test_the_peak_table_matches_the_longest_name_and_does_not_flatter():
    assert published_peak("NVIDIA H100 PCIe", "bf16") == 756e12  # not the SXM's 989
    assert published_peak("NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert published_peak("NVIDIA GeForce RTX 3060", "bf16") == 25.6e12  # fp32 accumulation, half the fp16 number
    assert published_peak("Tesla T4", "fp16") == 65e12 and published_peak("Tesla T4", "bf16") is None
    assert published_peak("Some Future GPU", "bf16") is None  # measured instead


def test_the_cpu_override_forces_the_other_path(monkeypatch):
    monkeypatch.setenv(hardware.CPU_BF16_ENV, "0")
    assert hardware.plan_for("cpu").muon_dtype == "float32" and hardware.default_precision("cpu") == "no"
    monkeypatch.setenv(hardware.CPU_BF16_ENV, "1")
    assert hardware.plan_for("cpu").muon_dtype == "bfloat16" and hardware.default_precision("cpu") == "bf16"


# ------------------------------------------------------------------------------------------------ Muon's dtype
class DtypeRecorder(TorchDispatchMode):
    """Records the dtype of every tensor an operation returns."""

    def __init__(self):
        super().__init__()
        self.dtypes: set[torch.dtype] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.dtypes |= {t.dtype for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)}
        return out


def _muon_pair(ns_dtype):
    from hitoban.training.optim import Muon

    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(48, 32)), torch.nn.Parameter(torch.randn(16, 40))]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    kwargs = dict(lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    return ours, theirs, Muon(ours, ns_dtype=ns_dtype, **kwargs), torch.optim.Muon(theirs, **kwargs)


def _step(params, optimizer, grads, recorder=None):
    for p, g in zip(params, grads):
        p.grad = g.clone()
    if recorder is None:
        optimizer.step()
    else:
        with recorder:
            optimizer.step()


def test_muon_in_bf16_is_torchs_muon_bit_for_bit_and_in_fp32_touches_no_bf16():
    ours, theirs, mine, torchs = _muon_pair(torch.bfloat16)
    for step in range(3):
        grads = [torch.randn_like(p, generator=torch.Generator().manual_seed(step)) for p in ours]
        _step(ours, mine, grads)
        _step(theirs, torchs, grads)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    assert mine.state_dict()["state"].keys() == torchs.state_dict()["state"].keys()

    ours, theirs, fp32, torchs = _muon_pair(torch.float32)
    grads = [torch.randn_like(p) for p in ours]
    recorder = DtypeRecorder()
    _step(ours, fp32, grads, recorder)
    assert torch.bfloat16 not in recorder.dtypes
    control = DtypeRecorder()  # torch's own Muon goes through bf16: the recorder sees it
    _step(theirs, torchs, grads, control)
    assert torch.bfloat16 in control.dtypes
    assert max((a - b).abs().max().item() for a, b in zip(ours, theirs)) < 1e-2  # the same update, more exact


@pytest.mark.slow
def test_a_night_on_a_cpu_without_native_bf16_runs_muon_in_fp32_and_says_so(tiny_shards, tmp_path, monkeypatch):
    from hitoban.training.pretrain import pretrain

    monkeypatch.setenv(hardware.CPU_BF16_ENV, "0")
    run = tmp_path / "run"
    pretrain(PretrainConfig(data=str(tiny_shards), out=str(run), preset="tiny", context=64, batch_size=8, steps=2,
                            eval_every=100, progress=False, cpu=True, compile="off"))
    device = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()
              if json.loads(line)["type"] == "device"]
    assert device and device[0]["muon_dtype"] == "float32" and device[0]["precision_used"] == "no"
    assert "no native bf16" in device[0]["why"]
    lineage = json.loads((run / "final" / "lineage.json").read_text())
    assert lineage["device_plan"]["muon_dtype"] == "float32"


# ------------------------------------------------------------------------------------------------ the fp16 scaler
def test_adamw_without_bias_correction_skips_an_fp16_overflow_step():
    from hitoban.training.optim import AdamW

    for bias_correction in (False, True):
        param = torch.nn.Parameter(torch.ones(4))
        optimizer = AdamW([param], lr=0.1, bias_correction=bias_correction)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
        scaler.scale((param * torch.tensor([1.0, float("inf"), 1.0, 1.0])).sum()).backward()
        scaler.unscale_(optimizer)  # as Accelerate's clip_grad_norm_ does before the step
        scaler.step(optimizer)
        scaler.update()
        assert torch.equal(param.detach(), torch.ones(4)), bias_correction  # skipped, not an inf/NaN update
        assert scaler.get_scale() == 2.0**7
        # and a finite step still updates
        optimizer.zero_grad()
        scaler.scale(param.sum()).backward()
        scaler.step(optimizer)
        assert not torch.equal(param.detach(), torch.ones(4))


# ------------------------------------------------------------------------------------------------ resume placement
def _fused_adamw_with_state(param_device: str, step_device: str):
    from hitoban.training.optim import AdamW

    param = torch.nn.Parameter(torch.zeros(3, device=param_device))
    optimizer = AdamW([param])
    optimizer.state[param] = {"step": torch.tensor(5.0, device=step_device),
                              "exp_avg": torch.zeros(3, device=param_device),
                              "exp_avg_sq": torch.zeros(3, device=param_device)}
    return param, optimizer


def test_after_a_resume_a_fused_groups_state_sits_on_its_parameters_device():
    """A 'meta' parameter stands in for a GPU one: the state that resume used to leave on the CPU is found."""
    from hitoban.training.pretrain import check_state_placement, place_step_counters

    param, optimizer = _fused_adamw_with_state("meta", "cpu")  # what `step.cpu()` after prepare() left
    with pytest.raises(CheckpointError, match=r"'step' of a \(3,\) parameter is on cpu"):
        check_state_placement(optimizer)
    place_step_counters(optimizer)
    check_state_placement(optimizer)
    assert optimizer.state[param]["step"].device.type == "meta"
    # a plain (for-each) group keeps `step` on the CPU, where reading it costs no device sync
    plain = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3, device="meta"))], foreach=False)
    p = plain.param_groups[0]["params"][0]
    plain.state[p] = {"step": torch.tensor(5.0), "exp_avg": torch.zeros(3, device="meta")}
    place_step_counters(plain)
    assert plain.state[p]["step"].device.type == "cpu"
    check_state_placement(plain)
    plain.state[p]["step"] = torch.zeros((), device="meta")  # a plain group's counter on the device: a sync a step
    with pytest.raises(CheckpointError, match="reads it on cpu"):
        check_state_placement(plain)


def test_a_real_resume_passes_the_placement_check_and_a_fused_state_is_fused(tiny_shards, tmp_path):
    from hitoban.training.pretrain import check_state_placement, pretrain, setup

    cfg = PretrainConfig(data=str(tiny_shards), out=str(tmp_path / "run"), preset="tiny", context=64, batch_size=8,
                         steps=4, eval_every=100, progress=False, cpu=True, compile="off", optimizer="adamw",
                         max_hours=1e-9)
    pretrain(cfg)
    run = setup(dataclasses.replace(cfg, max_hours=None))
    try:
        assert run.resumed_from is not None and run.optimizer.param_groups[0]["fused"]
        check_state_placement(run.optimizer)
    finally:
        from hitoban.training.loop import reset_accelerate_state

        reset_accelerate_state()


# ------------------------------------------------------------------------------------------------ MPS: no float64
class RefuseFloat64(TorchDispatchMode):
    """MPS has no float64: any operation that makes a float64 tensor fails, as it would there."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(isinstance(t, torch.Tensor) and t.dtype == torch.float64 for t in tree_flatten(out)[0]):
            raise TypeError(f"{func} made a float64 tensor (MPS has no float64)")
        return out


@pytest.mark.slow
def test_validation_and_bits_per_char_make_no_float64_tensor(tiny_model_dir, tiny_shards, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hitoban.evaluation.bpc import bits_per_char
    from hitoban.training.data import ShardReader
    from hitoban.training.night import evaluate

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    with RefuseFloat64():
        result = bits_per_char(model, tokenizer, "吾輩は猫である。名前はまだ無い。" * 20)
    assert result["bits_per_char"] > 0
    shards = ShardReader(tiny_shards, "val", verify=False)
    domains = shards.domain_streams(2 * 4 * 65)
    from hitoban.modeling import HitobanConfig, HitobanForCausalLM

    small = HitobanForCausalLM(HitobanConfig.from_preset("tiny", vocab_size=shards.vocab_size)).eval()
    with RefuseFloat64():
        evaluated = evaluate(small, shards, domains, 2, 4, 64, _no_autocast)
    assert evaluated["val_loss"] > 0 and evaluated["val_domains"]
    with pytest.raises(TypeError, match="float64"), RefuseFloat64():  # control: the mode does refuse
        torch.ones(2).double()


def _no_autocast():
    from contextlib import nullcontext

    return nullcontext()


def test_ranks_share_the_validation_windows_and_sum_to_the_whole():
    from hitoban.modeling import HitobanConfig, HitobanForCausalLM
    from hitoban.training.nll import token_nats

    torch.manual_seed(0)
    model = HitobanForCausalLM(HitobanConfig.from_preset("tiny", vocab_size=300)).eval()
    ids = np.random.default_rng(0).integers(4, 300, 1000)
    whole = token_nats(model, ids, 3, window=64, batch=4)
    parts = [token_nats(model, ids, 3, window=64, batch=4, part=(rank, 3)) for rank in range(3)]
    assert np.array_equal(sum(parts), whole)
    assert all((p != 0).sum() < len(whole) for p in parts)  # each rank did only its share


# ------------------------------------------------------------------------------------------------ Accelerate's state
def test_a_cpu_accelerator_after_a_gpu_run_runs_on_the_cpu():
    """Accelerate keeps its device between Accelerators: after a GPU run a canary model's Accelerator(cpu=True)
    went to the GPU. A 'meta' device stands in for the GPU the earlier run left behind."""
    from accelerate import Accelerator
    from accelerate.state import PartialState

    from hitoban.training.loop import reset_accelerate_state

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


# ------------------------------------------------------------------------------------------------ sizes and memory
def test_hours_measures_the_micro_batch_the_night_will_run(tiny_shards, monkeypatch):
    from accelerate import Accelerator

    from hitoban.training import calibrate
    from hitoban.training.loop import reset_accelerate_state

    seen = []
    real = calibrate.train_step

    def spy(model, optimizer, accelerator, rows, grad_accum, grad_clip):
        seen.append(len(rows) // grad_accum)
        return real(model, optimizer, accelerator, rows, grad_accum, grad_clip)

    monkeypatch.setattr(calibrate, "train_step", spy)
    reset_accelerate_state(cpu=True)
    try:
        calibrate.measure("tiny", 8, 4000, 32, steps=2, warmup=1, accelerator=Accelerator(cpu=True), grad_accum=4,
                          max_seconds=5)
    finally:
        reset_accelerate_state()
    assert set(seen) == {2}  # 8 rows in 4 micro-batches of 2, as the night with --grad-accum 4 runs them


def test_the_memory_estimate_counts_the_fp32_logits_and_the_cap_is_the_limit(tiny_shards, tmp_path):
    from hitoban.modeling import HitobanConfig
    from hitoban.training.pretrain import estimate_memory_bytes, pretrain

    config = HitobanConfig.from_preset("3lm", vocab_size=32000)
    b, t, v = 32, config.max_position_embeddings, 32000
    extra = estimate_memory_bytes(config, b, t, "bf16") - estimate_memory_bytes(config, b, t, "no")
    assert extra == b * t * v * 4  # the half logits and gradient (2 + 2) beside fp32's three copies: one more fp32
    assert estimate_memory_bytes(config, b, t, "no") > b * t * v * 12  # fp32: logits, log-softmax and gradient
    with pytest.raises(ResourceError, match=r"allowed by --memory-cap-gb"):
        pretrain(PretrainConfig(data=str(tiny_shards), out=str(tmp_path / "r"), preset="tiny", context=64,
                                batch_size=8, steps=2, progress=False, cpu=True, memory_cap_gb=0.01))


# ------------------------------------------------------------------------------------------------ the kill test
def test_the_kill_test_runs_its_trainings_one_at_a_time_on_a_gpu():
    from hitoban.training.killtest import runs_in_parallel

    assert runs_in_parallel([], "cpu") and not runs_in_parallel([], "cuda") and not runs_in_parallel([], "mps")
    assert runs_in_parallel(["--cpu"])  # the CPU on any machine


def test_a_shared_decision_over_several_processes_never_waits_for_the_device(monkeypatch):
    """The per-step decision (deadline, signal, save time) used to be a device tensor read back with .tolist(): a
    host sync with the GPU every step. It travels on the host now (gloo). A 'meta' device stands in for the GPU."""
    import torch.distributed as dist

    from hitoban.training import loop

    seen = []

    def all_reduce(tensor, op=None, group=None):
        seen.append(tensor.device.type)
        tensor[1] = 1.0  # another rank was signalled

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(loop, "host_group", lambda: None)

    class TwoRanks:
        num_processes = 2
        device = torch.device("meta")

    policy = loop.CheckpointPolicy(None, 60.0, None, 20)
    assert policy.after_step(3, 0.0, TwoRanks()) and policy.stop_reason == "signal (another process)"
    assert seen == ["cpu"]


# ---------------------------------------------------------------------------------------- Ctrl-C under --supervise
CHILD = textwrap.dedent("""
    import pathlib, signal, sys, time
    out = pathlib.Path(sys.argv[1])
    def stop(signum, frame):
        time.sleep(1.0)  # the save at the next step boundary
        (out / "saved").write_text("yes")
        sys.exit(0)
    signal.signal(signal.SIGINT, stop)
    (out / "ready").write_text("yes")
    while True:
        time.sleep(0.05)
""")


@pytest.mark.slow
def test_ctrl_c_under_supervise_lets_the_run_save_and_does_not_relaunch(tmp_path):
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    driver = (f"import sys; from pathlib import Path; from hitoban.training.supervise import supervise; "
              f"sys.exit(supervise([{str(tmp_path)!r}], Path({str(tmp_path / 'run')!r}), pause=0, "
              f"command=[sys.executable, {str(child)!r}]))")
    proc = subprocess.Popen([sys.executable, "-c", driver], start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 60
    while not (tmp_path / "ready").exists() and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground group
    output, _ = proc.communicate(timeout=60)
    assert (tmp_path / "saved").exists(), output  # subprocess.call SIGKILLed the child 0.25 s in
    assert proc.returncode == 0 and "waiting for the run to save" in output
    assert output.count("attempt") == 1  # stopped by the user: not relaunched


# ------------------------------------------------------------------------------------------------ a rank-divergent NaN
@pytest.mark.slow
def test_an_inf_loss_on_rank_one_only_stops_both_ranks_with_nothing_saved_past_it(tiny_shards, tmp_path):
    from hitoban.training.checkpoint import current_slot
    from hitoban.training.loop import INF_LOSS_ENV

    run = tmp_path / "run"
    args = ["pretrain", "--data", str(tiny_shards), "--preset", "tiny", "--context", "64", "--steps", "20",
            "--batch-size", "8", "--log-every", "5", "--save-every-steps", "5", "--eval-every", "100",
            "--no-progress", "--cpu", "--precision", "no", "--out", str(run)]
    done = launch_hitoban(args, 2, tmp_path, timeout=240, **{INF_LOSS_ENV: "1:7"})
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert output.count("became non-finite between steps 6 and 10") == 2, output[-3000:]  # both ranks, same words
    assert json.loads((current_slot(run) / "train_state.json").read_text())["step"] == 5

