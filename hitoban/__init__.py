"""hitoban: train a small language model overnight on one GPU or Mac, measure it honestly, publish it safely.

`import hitoban` registers the model with transformers' Auto classes (through `hitoban.modeling`, which does the
registering): `AutoModelForCausalLM.from_pretrained` then works on any hitoban folder without remote code, and every
`save_pretrained` also writes the self-contained remote code next to the weights.

The `hitoban` console script (or `python -m hitoban.cli`) is the one exception: there torch and transformers load
only when a verb needs them (each verb imports what it uses), so `hitoban --help`, `leaks`, `secrets`, `watch`,
`shards --verify`, `card` and `upload --dry-run` start in well under a second (tests/test_startup.py checks that
they import neither) instead of after seconds of imports.
"""

import os
import sys

_MODEL_NAMES = ("PRESETS", "HitobanConfig", "HitobanForCausalLM")
_ARGV0, _ORIG_ARGV = (getattr(sys, "argv", None) or [""])[0] or "", getattr(sys, "orig_argv", [])
# the `hitoban` script, or `python [options] -m hitoban.cli` (sys.argv[0] is "-m" while this package is imported)
_RUN_AS_MODULE = "-mhitoban.cli" in _ORIG_ARGV or ["-m", "hitoban.cli"] in map(list, zip(_ORIG_ARGV, _ORIG_ARGV[1:]))
_CONSOLE_SCRIPT = os.path.basename(_ARGV0) == "hitoban" or (_ARGV0 == "-m" and _RUN_AS_MODULE)

if not _CONSOLE_SCRIPT:
    from hitoban.modeling import PRESETS, HitobanConfig, HitobanForCausalLM  # noqa: F401  (registers Auto classes)


def __getattr__(name: str):
    """The model classes on first use (the console script's lazy path), and `__version__` (importlib.metadata costs
    a tenth of a second at every start)."""
    if name == "__version__":
        from hitoban.provenance import hitoban_version

        globals()["__version__"] = version = hitoban_version()
        return version
    if name in _MODEL_NAMES:
        import hitoban.modeling

        return getattr(hitoban.modeling, name)
    raise AttributeError(f"module 'hitoban' has no attribute {name!r}")


__all__ = [*_MODEL_NAMES, "__version__"]
