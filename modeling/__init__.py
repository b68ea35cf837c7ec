"""The model: `HitobanConfig` + `HitobanForCausalLM` (single-model-file style) and conversions to/from other formats."""

from .configuration_hitoban import PRESETS, HitobanConfig
from .modeling_hitoban import HitobanForCausalLM, HitobanModel, HitobanPreTrainedModel

__all__ = ["PRESETS", "HitobanConfig", "HitobanForCausalLM", "HitobanModel", "HitobanPreTrainedModel"]
