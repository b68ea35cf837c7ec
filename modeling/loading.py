"""Loading a saved model folder: where it runs, which files make its tokenizer, model and tokenizer together.

One loader for everything that reads a model (chat, bits/char, generation metrics, the privacy probe, the demo),
so each reads a folder the same way and fails the same clear way on a folder that is not a model.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hitoban.errors import InputError

# The files that make a saved tokenizer folder loadable with AutoTokenizer (copied into checkpoints, shards and
# exports).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def device_for(cpu: bool = False) -> torch.device:
    """CUDA, else Apple's MPS, else the CPU (always the CPU with `cpu`): where training and evaluation run."""
    if not cpu and torch.cuda.is_available():
        return torch.device("cuda")
    if not cpu and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def load_model_and_tokenizer(path: str | Path, device: str | torch.device | None = None,
                             dtype: torch.dtype | None = None):
    """A `from_pretrained` folder with its tokenizer, on `device` (default: the best one), in `dtype` (default:
    as saved, fp32); a folder without a tokenizer is a clear error."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # hitoban.modeling registered the Auto classes

    path = Path(path)
    if not (path / "config.json").exists():
        raise InputError(f"{path}: not a model folder (no config.json)")
    if not (path / "tokenizer.json").exists():
        raise InputError(f"{path}: no tokenizer.json; measuring or chatting needs the model's own tokenizer next to "
                         "the weights")
    model = AutoModelForCausalLM.from_pretrained(path).to(device or device_for()).eval()
    if dtype is not None:
        model = model.to(dtype)
    return model, AutoTokenizer.from_pretrained(path)
