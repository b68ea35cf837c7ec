"""hitoban: train a small language model overnight on one GPU or Mac, measure it honestly, publish it safely.

`import hitoban` registers the model with transformers' Auto classes (so `AutoModelForCausalLM.from_pretrained`
works on any hitoban folder without remote code) and marks the classes for remote code, so that every
`save_pretrained` also writes `auto_map` and the self-contained `configuration_hitoban.py` / `modeling_hitoban.py`
next to the weights: users without hitoban load the folder with `trust_remote_code=True`.
"""

from importlib.metadata import PackageNotFoundError, version

from transformers import AutoConfig, AutoModelForCausalLM

from hitoban.modeling import PRESETS, HitobanConfig, HitobanForCausalLM

try:
    __version__ = version("hitoban")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+source"

AutoConfig.register(HitobanConfig.model_type, HitobanConfig, exist_ok=True)
AutoModelForCausalLM.register(HitobanConfig, HitobanForCausalLM, exist_ok=True)
HitobanConfig.register_for_auto_class()
HitobanForCausalLM.register_for_auto_class("AutoModelForCausalLM")

__all__ = ["PRESETS", "HitobanConfig", "HitobanForCausalLM", "__version__"]
