"""The night's optimizers (training/optim.py): AdamW without bias correction is MLX's update, Muon's
Newton-Schulz in the plan's dtype, and the fp16 scaler's skipped step."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from hitoban.training import faults
from hitoban.training.optim import AdamW
from hitoban.training.pretrain.options import PretrainConfig
from hitoban.training.pretrain.trainer import pretrain


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


def test_adamw_without_bias_correction_is_the_mlx_update():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5))
    start, grad = p.detach().clone(), torch.randn(5)
    optimizer = AdamW([p], lr=0.1, weight_decay=0.1, bias_correction=False)
    p.grad = grad.clone()
    optimizer.step()
    m, v = 0.1 * grad, 0.001 * grad**2
    expected = start * (1 - 0.1 * 0.1) - 0.1 * m / (v.sqrt() + 1e-8)
    assert torch.allclose(p.detach(), expected, atol=1e-6)
    q = torch.nn.Parameter(start.clone())
    reference = torch.optim.AdamW([q], lr=0.1, weight_decay=0.1)
    r = torch.nn.Parameter(start.clone())
    ours = AdamW([r], lr=0.1, weight_decay=0.1)
    for opt, param in ((reference, q), (ours, r)):
        param.grad = grad.clone()
        opt.step()
    assert torch.equal(q, r)


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
def test_a_night_on_a_cpu_without_native_bf16_runs_muon_in_fp32_and_says_so(tiny_shards, tmp_path):
    run = tmp_path / "run"
    with faults.scoped(cpu_bf16=False):
        pretrain(PretrainConfig(data=str(tiny_shards), out=str(run), preset="tiny", context=64, batch_size=8,
                                steps=2, eval_every=100, progress=False, cpu=True, compile="off"))
    device = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()
              if json.loads(line)["type"] == "device"]
    assert device and device[0]["muon_dtype"] == "float32" and device[0]["precision_used"] == "no"
    assert "no native bf16" in device[0]["why"]
    lineage = json.loads((run / "final" / "lineage.json").read_text())
    assert lineage["device_plan"]["muon_dtype"] == "float32"


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
