"""`hitoban import`'s options, defined once (hitoban/options.py's mechanism), beside import_checkpoint.py, which
imports torch: standard library only, so `hitoban --help` builds this verb's parser without it."""

from __future__ import annotations

from dataclasses import dataclass

from hitoban.options import Checked, option

FORMATS = ("3lm", "zxell")  # the checkpoint formats import_checkpoint reads


@dataclass(kw_only=True)
class ImportOptions(Checked):
    """`hitoban import`: a 3LM-MLX or zxell checkpoint converted into a hitoban folder."""

    src: str = option(help="3LM-MLX folder (model.safetensors + config.json) or zxell .pt checkpoint", positional=True)
    dst: str = option(help="new hitoban from_pretrained folder", positional=True)
    format: str | None = option(None, "source format (detected from the files when omitted)", choices=FORMATS)
