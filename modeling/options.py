"""The model exports' options, defined once (hitoban/options.py's mechanism): `hitoban export-llama` and
`export-gguf`.

Standard library only, and read by the command line without `hitoban.modeling`'s `__init__` (which registers the
model with transformers, so importing it imports torch and transformers): `hitoban --help` builds every verb's parser
from this file (hitoban/verbs/models.py loads it as `hitoban.modeling.options`). Nothing here may import the rest of
`hitoban.modeling`.
"""

from __future__ import annotations

from dataclasses import dataclass

from hitoban.options import Checked, option

OUTTYPES = ("f32", "f16", "q8_0")  # GGUF weight types export_gguf writes; the first (exact) is the default
# `--verify`: greedy tokens that must match transformers' per weight type (rounding moves later argmaxes)
GREEDY_TOKENS_EQUAL = {"f32": 20, "f16": 10, "q8_0": 5}
_GREEDY = ", ".join(f"{n} for {t}" if i == 0 else f"{n} {t}" for i, (t, n) in enumerate(GREEDY_TOKENS_EQUAL.items()))


@dataclass(kw_only=True)
class ExportLlamaOptions(Checked):
    """`hitoban export-llama`: a LlamaForCausalLM folder equal to a hitoban model."""

    src: str = option(help="a hitoban from_pretrained folder", positional=True)
    dst: str = option(help="new folder for the LlamaForCausalLM export", positional=True)


@dataclass(kw_only=True)
class ExportGgufOptions(Checked):
    """`hitoban export-gguf`: a GGUF file for llama.cpp / Ollama."""

    src: str = option(help="a hitoban from_pretrained folder (a run's final/, an sft or tone output)", positional=True)
    out: str = option(help="the .gguf file to write (an Ollama Modelfile is written beside it)", positional=True)
    outtype: str = option(OUTTYPES[0], "weight type: f32 (exact), f16, or q8_0 (8-bit, about a quarter of f32; norms "
                                       "stay f32)", choices=OUTTYPES)
    verify: bool = option(False, "run the file in llama.cpp (needs pip install 'hitoban[llama]'); exit 1 unless it "
                                 f"tokenizes as transformers and gives the same greedy tokens ({_GREEDY}). Default: "
                                 "off")
