"""hitoban: train a small language model overnight on one GPU or Mac, measure it honestly, publish it safely.

`import hitoban` registers the model with transformers' Auto classes (through `hitoban.modeling`, which does the
registering): `AutoModelForCausalLM.from_pretrained` then works on any hitoban folder without remote code, and every
`save_pretrained` also writes the self-contained remote code next to the weights.

Importing this package is the same in every process (it never looks at `sys.argv`) and loads neither torch nor
transformers by itself:
  - `HitobanConfig`, `HitobanForCausalLM` and `PRESETS` load `hitoban.modeling` (and so torch) on first use;
  - the registration happens when transformers is there: at once if a module imported it already, else right after
    the first `import transformers` of the process (a one-shot import hook; `from transformers import
    AutoModelForCausalLM` is how the Auto classes are reached, so they are registered before any use of them).
So the `hitoban` command (`hitoban.cli`, also `python -m hitoban`) starts its light verbs (`--help`, `leaks`,
`secrets`, `watch`, `shards` (building or `--verify`), `card`, `upload --dry-run`) in well under a second without
torch or transformers (tests/hitoban/test_startup.py), while a verb that imports transformers gets the model
registered as a library user does.
"""

import importlib
import importlib.util
import sys

_MODEL_NAMES = ("PRESETS", "HitobanConfig", "HitobanForCausalLM")


def _register() -> None:
    """Register the Auto classes (importing hitoban.modeling does it; a second call costs nothing)."""
    importlib.import_module("hitoban.modeling")


class _RegisterAfterTransformers:
    """One-shot import hook (first on sys.meta_path): the first `import transformers` of the process runs as usual,
    then imports hitoban.modeling, which registers the Auto classes. Asked about any other module it says nothing."""

    def find_spec(self, name, path=None, target=None):
        if name != "transformers":
            return None
        self.remove()
        spec = importlib.util.find_spec(name)  # the real finders' answer, this hook out of the way
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_then_register(module):
            run(module)
            _register()

        spec.loader.exec_module = exec_then_register
        return spec

    def remove(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:  # another thread's import got here first
            pass


if "transformers" in sys.modules:
    _register()
elif not any(isinstance(finder, _RegisterAfterTransformers) for finder in sys.meta_path):
    sys.meta_path.insert(0, _RegisterAfterTransformers())


def __getattr__(name: str):
    """The model classes on first use, and `__version__` (importlib.metadata costs a tenth of a second at every
    start)."""
    if name == "__version__":
        from hitoban.provenance import hitoban_version

        globals()["__version__"] = version = hitoban_version()
        return version
    if name in _MODEL_NAMES:
        import hitoban.modeling

        return getattr(hitoban.modeling, name)
    raise AttributeError(f"module 'hitoban' has no attribute {name!r}")


__all__ = [*_MODEL_NAMES, "__version__"]
