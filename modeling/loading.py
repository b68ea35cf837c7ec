"""Loading a saved model folder: where it runs, which files make its tokenizer, model and tokenizer together.

One loader for everything that reads a model (chat, bits/char, generation metrics, the privacy probe, the demo),
so each reads a folder the same way and fails the same clear way on a folder that is not a model.
"""

from __future__ import annotations

from pathlib import Path

import jinja2
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils.chat_template_utils import _compile_jinja_template

from hitoban.errors import InputError
from hitoban.files import check_regular_files, check_tokenizer_files, read_json, read_safetensors_header, read_text


def device_for(cpu: bool = False) -> torch.device:
    """CUDA, else Apple's MPS, else the CPU (always the CPU with `cpu`): where training and evaluation run."""
    if not cpu and torch.cuda.is_available():
        return torch.device("cuda")
    if not cpu and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


CONFIG_FIELDS = {"model_type": str, "vocab_size": int, "hidden_size": int, "num_hidden_layers": int,
                 "num_attention_heads": int}
WEIGHTS = "model.safetensors"


def check_model_folder(path: str | Path, tokenizer: bool = True, chat_template: bool = False) -> Path:
    """The one check of a saved model folder before anything loads it: config fields and ranges, a whole
    safetensors file, and (with `tokenizer`) readable tokenizer files; one line naming the damaged file otherwise."""
    path = Path(path)
    if not path.is_dir():
        raise InputError(f"{path}: not a model folder")
    check_regular_files(path)
    if not (path / "config.json").exists() and not (path / "config.json").is_symlink():
        raise InputError(f"{path}: not a model folder (no config.json)")
    config = read_json(path / "config.json", f"{path}", fields=CONFIG_FIELDS)
    if min(config[k] for k in CONFIG_FIELDS if k != "model_type") < 1:
        raise InputError(f"{path}/config.json: sizes must be at least 1; the file is damaged")
    if (path / "generation_config.json").exists() or (path / "generation_config.json").is_symlink():
        read_json(path / "generation_config.json", f"{path}")
    if (path / "lineage.json").exists() or (path / "lineage.json").is_symlink():
        read_json(path / "lineage.json", f"{path}")
    for weights in weight_files_to_check(path):
        check_safetensors(weights)
    if tokenizer:
        check_tokenizer_folder(path, chat_template=chat_template)
    return path


def weight_files_to_check(path: Path) -> list[Path]:
    """model.safetensors, or every shard its index names (`save_pretrained(max_shard_size=...)`)."""
    index = path / f"{WEIGHTS}.index.json"
    if (path / WEIGHTS).exists() or not (index.exists() or index.is_symlink()):
        return [path / WEIGHTS]
    weight_map = read_json(index, f"{path}", fields={"weight_map": dict})["weight_map"]
    names = sorted({name for name in weight_map.values() if isinstance(name, str)})
    if not names or len(names) != len(set(weight_map.values())) or any("/" in n or n.startswith(".") for n in names):
        raise InputError(f"{index}: not a weights index naming files of this folder; save the model again")
    return [path / name for name in names]


def check_safetensors(path: Path) -> None:
    """A whole safetensors file (hitoban.files.read_safetensors_header says what is wrong with one that is not)."""
    read_safetensors_header(path)


def check_tokenizer_folder(path: str | Path, chat_template: bool = False) -> Path:
    """A tokenizer folder (or a model folder's tokenizer files) that AutoTokenizer can read: tokenizer.json and
    tokenizer_config.json JSON objects, a chat template that parses (required with `chat_template`: chatting and
    the loss mask need it)."""
    path = check_tokenizer_files(path, chat_template=chat_template)
    template = path / "chat_template.jinja"
    if template.exists() or template.is_symlink() or chat_template:
        check_chat_template(read_text(template, f"{path}", hint="the chat template is damaged; copy it back"), path)
    return path


def check_chat_template(text: str, folder: Path) -> None:
    """A chat template that is there and parses (an empty or cut one renders nothing, or fails mid-chat)."""
    if not text.strip():
        raise InputError(f"{folder}/chat_template.jinja is empty; copy the tokenizer's chat template back")
    try:
        _compile_jinja_template(text)
    except jinja2.TemplateSyntaxError as err:
        raise InputError(f"{folder}/chat_template.jinja: not a valid template (line {err.lineno}: {err.message}); "
                         "copy the tokenizer's chat template back") from None


def load_model_and_tokenizer(path: str | Path, device: str | torch.device | None = None,
                             dtype: torch.dtype | None = None, chat_template: bool = False):
    """A `from_pretrained` folder with its tokenizer, on `device` (default: the best one), in `dtype` (default:
    as saved, fp32); a folder without a tokenizer is a clear error."""
    path = check_model_folder(path, chat_template=chat_template)
    model = AutoModelForCausalLM.from_pretrained(path).to(device or device_for()).eval()
    if dtype is not None:
        model = model.to(dtype)
    return model, AutoTokenizer.from_pretrained(path)
