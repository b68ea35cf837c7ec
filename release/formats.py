"""`--format llama` for `card` and `upload`: publish a hitoban folder's verified Llama export instead of the folder.

A hitoban folder has `model_type: hitoban`, so plain transformers stops at the trust-remote-code question (and vLLM,
MLX-LM, transformers.js and TGI want a known architecture). Its Llama export (`hitoban export-llama`, kept beside it
as FOLDER-llama) is the same function under Llama's names, checked logit for logit, and its lineage.json records the
sha256 of the hitoban weights it was made from. Only through that record, and only after the check has run again on
the two folders as saved, do the card and the PII gate accept measurements of the hitoban weights for the export.
Lazy imports: the Llama export (torch, transformers) loads only for `--format llama`, so `hitoban card` starts
without torch."""

from __future__ import annotations

import json
from pathlib import Path

from hitoban.errors import CheckFailed, UsageError

FORMATS = ("hitoban", "llama")
FORMAT_HELP = ("hitoban: the folder itself (model_type hitoban, remote code beside it); llama: its verified Llama "
               "export, kept in MODEL_DIR-llama (made here when absent), which plain transformers, vLLM, MLX-LM, "
               "TGI and transformers.js load with no remote code")


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    return fmt


def llama_export_dir(model_dir: str | Path) -> Path:
    """Where the Llama export of `model_dir` lives: beside it, `NAME-llama` (as the README's export-llama writes)."""
    model_dir = Path(model_dir)
    return model_dir.parent / f"{model_dir.name}-llama"


def prepare_llama_export(model_dir: str | Path, log=print) -> tuple[Path, dict]:
    """The verified Llama export of `model_dir`: made when absent, otherwise checked again against the folder as
    it is now (an export of other weights is an error, and nothing is replaced). Returns (folder, verification)."""
    from hitoban.modeling.export_llama import export_llama, verify_llama_export

    export = llama_export_dir(model_dir)
    if export.exists():
        checked = verify_llama_export(model_dir, export)
        log(f"# {export}: the Llama export of {model_dir}, verified again (max |logit diff| "
            f"{checked['max_abs_logit_diff']:.2g}, greedy text identical)")
    else:
        checked = export_llama(model_dir, export)
        log(f"# {export}: Llama export of {model_dir} written and verified (max |logit diff| "
            f"{checked['max_abs_logit_diff']:.2g}, greedy text identical)")
    return export, {**checked, "source": Path(model_dir).name}


def remote_code_refusals(folder: Path, names: list[str]) -> list[str]:
    """What would make a `--format llama` upload need remote code (it must need none)."""
    refusals = []
    config = json.loads((folder / "config.json").read_text(encoding="utf-8")) if (folder / "config.json").is_file() \
        else {}
    if config.get("model_type") != "llama" or "auto_map" in config:
        refusals.append(f"config.json is not a plain Llama config (model_type {config.get('model_type')!r}"
                        f"{', auto_map present' if 'auto_map' in config else ''})")
    code = [n for n in names if n.endswith(".py")]
    if code:
        refusals.append(f"Python files would be uploaded with a --format llama model: {code}")
    return refusals


def verified_source(model_dir: Path, export: Path) -> dict:
    """Run the export's check before an upload; a failure is CheckFailed naming what differs."""
    from hitoban.modeling.export_llama import verify_llama_export

    if not export.exists():
        raise CheckFailed(f"no Llama export of {model_dir} at {export}: run `hitoban card {model_dir} --format llama "
                          "--repo ...` first (it exports, verifies and writes the card there)")
    return verify_llama_export(model_dir, export)
