"""Windowed NLL (training/nll.py) as validation and bits/char use it: no float64 on the device (MPS has
none), and ranks that share the windows sum to the whole."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers import AutoModelForCausalLM, AutoTokenizer


class RefuseFloat64(TorchDispatchMode):
    """MPS has no float64: any operation that makes a float64 tensor fails, as it would there."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(isinstance(t, torch.Tensor) and t.dtype == torch.float64 for t in tree_flatten(out)[0]):
            raise TypeError(f"{func} made a float64 tensor (MPS has no float64)")
        return out


def _no_autocast():
    from contextlib import nullcontext

    return nullcontext()


@pytest.mark.slow
def test_validation_and_bits_per_char_make_no_float64_tensor(tiny_model_dir, tiny_shards, tmp_path):

    from hitoban.evaluation.bpc import bits_per_char
    from hitoban.training.data.reader import ShardReader
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
