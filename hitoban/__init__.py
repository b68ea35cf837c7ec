"""hitoban: train a small language model overnight on one GPU or Mac, measure it honestly, publish it safely.

`import hitoban` registers the model with transformers' Auto classes (through `hitoban.modeling`, which does the
registering): `AutoModelForCausalLM.from_pretrained` then works on any hitoban folder without remote code, and every
`save_pretrained` also writes the self-contained remote code next to the weights.

The `hitoban` console script is the one exception: there torch and transformers load only when a verb needs them
(each verb imports what it uses), so `hitoban --help` answers at once instead of after seconds of imports.
"""

import os
import sys

from hitoban.provenance import hitoban_version

__version__ = hitoban_version()

_MODEL_NAMES = ("PRESETS", "HitobanConfig", "HitobanForCausalLM")
_CONSOLE_SCRIPT = os.path.basename(getattr(sys, "argv", [""])[0] or "") == "hitoban"

if not _CONSOLE_SCRIPT:
    from hitoban.modeling import PRESETS, HitobanConfig, HitobanForCausalLM  # noqa: F401  (registers Auto classes)


def __getattr__(name: str):
    """The model classes on first use (the console script's lazy path)."""
    if name in _MODEL_NAMES:
        import hitoban.modeling

        return getattr(hitoban.modeling, name)
    raise AttributeError(f"module 'hitoban' has no attribute {name!r}")


__all__ = [*_MODEL_NAMES, "__version__"]
