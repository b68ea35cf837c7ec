"""`hitoban compare` (evaluation/compare.py): the same prompt and seed through every model."""

from __future__ import annotations

import json

from hitoban.cli import main


def test_compare_uses_the_same_seed_per_prompt_for_every_model(tiny_model_dir, tmp_path, capsys):
    from hitoban.evaluation.compare import compare_models

    result = compare_models([tiny_model_dir, tiny_model_dir], chat=["こんにちは"], raw=["梅雨が明けると"],
                            max_new_tokens=12)
    records = result["records"]
    assert [(r["mode"], r["prompt"]) for r in records[:2]] == [("chat", "こんにちは"), ("raw", "梅雨が明けると")]
    assert [r["reply"] for r in records[:2]] == [r["reply"] for r in records[2:]]  # same model, same seeds
    assert main(["compare", str(tiny_model_dir), "--out", str(tmp_path / "cmp"), "--max-new-tokens", "10"]) == 0
    saved = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert len(saved["records"]) == 7 and (tmp_path / "cmp" / "compare.png").stat().st_size > 5000
