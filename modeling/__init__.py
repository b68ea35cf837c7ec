"""The model: `HitobanConfig` + `HitobanForCausalLM` (single-model-file style) and conversions to/from other formats.

Importing this package registers the model with transformers' Auto classes (so `AutoModelForCausalLM.from_pretrained`
works on any hitoban folder without remote code) and marks the classes for remote code, so that every
`save_pretrained` also writes `auto_map` and the self-contained `configuration_hitoban.py` / `modeling_hitoban.py`
next to the weights: users without hitoban load the folder with `trust_remote_code=True`.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .configuration_hitoban import PRESETS, HitobanConfig
from .modeling_hitoban import HitobanForCausalLM, HitobanModel, HitobanPreTrainedModel

AutoConfig.register(HitobanConfig.model_type, HitobanConfig, exist_ok=True)
AutoModelForCausalLM.register(HitobanConfig, HitobanForCausalLM, exist_ok=True)
AutoModel.register(HitobanConfig, HitobanModel, exist_ok=True)
HitobanConfig.register_for_auto_class()
HitobanForCausalLM.register_for_auto_class("AutoModelForCausalLM")

from .llama_format import from_llama  # noqa: E402  (after the registration: it builds a HitobanForCausalLM)

__all__ = ["PRESETS", "HitobanConfig", "HitobanForCausalLM", "HitobanModel", "HitobanPreTrainedModel", "from_llama"]
