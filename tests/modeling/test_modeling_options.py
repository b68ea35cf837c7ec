"""modeling/options.py (`hitoban export-llama`, `export-gguf`) and training/import_options.py (`hitoban import`):
the defaults and choices are the exporters' and the importer's own, and the command line reads the options file
without importing torch or transformers."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys

import pytest
from option_edges import accepts

from hitoban.modeling import export_gguf
from hitoban.modeling.options import ExportGgufOptions, ExportLlamaOptions
from hitoban.training import import_checkpoint
from hitoban.training.import_options import ImportOptions


def choices(cls: type, name: str) -> tuple:
    return tuple({f.name: f for f in dataclasses.fields(cls)}[name].metadata["choices"])


def test_defaults_and_choices_are_the_libraries():
    lib = {name: p.default for name, p in inspect.signature(export_gguf.export_gguf).parameters.items()}
    options = ExportGgufOptions(src="s", out="o.gguf")
    assert (options.outtype, options.verify) == (lib["outtype"], lib["verify"])
    assert choices(ExportGgufOptions, "outtype") == export_gguf.OUTTYPES == tuple(export_gguf.GREEDY_TOKENS_EQUAL)
    lib = inspect.signature(import_checkpoint.import_checkpoint).parameters
    assert ImportOptions(src="s", dst="d").format == lib["fmt"].default
    assert choices(ImportOptions, "format") == import_checkpoint.FORMATS


def test_the_command_line_gives_the_dataclass_defaults():
    assert accepts("export-llama", ExportLlamaOptions, ["s", "d"]) == ExportLlamaOptions(src="s", dst="d")
    assert accepts("export-gguf", ExportGgufOptions, ["s", "o.gguf"]) == ExportGgufOptions(src="s", out="o.gguf")
    assert accepts("export-gguf", ExportGgufOptions, ["s", "o", "--outtype", "q8_0", "--verify"]) == (
        ExportGgufOptions(src="s", out="o", outtype="q8_0", verify=True))
    assert accepts("import", ImportOptions, ["s", "d", "--format", "zxell"]) == ImportOptions(
        src="s", dst="d", format="zxell")
    with pytest.raises(SystemExit):
        accepts("export-gguf", ExportGgufOptions, ["s", "o", "--outtype", "q4_0"])


@pytest.mark.slow
def test_the_parser_loads_the_options_file_without_the_model_package():
    """hitoban.modeling's __init__ registers the model with transformers: the command line loads options.py alone,
    and an export afterwards imports the package and shares that module (one OUTTYPES, one dataclass)."""
    code = ("import sys\n"
            "sys.argv[0] = 'hitoban'  # as the console script starts (hitoban/__init__ then leaves the model alone)\n"
            "from hitoban.verbs.models import modeling_options\n"
            "options = modeling_options()\n"
            "assert 'transformers' not in sys.modules and 'torch' not in sys.modules, 'heavy import'\n"
            "assert 'hitoban.modeling' not in sys.modules\n"
            "from hitoban.modeling import export_gguf\n"
            "assert export_gguf.OUTTYPES is options.OUTTYPES and modeling_options() is options\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
