"""Japanese text made to measure for the data tests."""

from __future__ import annotations

import numpy as np

JA = ("吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。"
      "何でも薄暗いじめじめした所で泣いていた事だけは記憶している。")


def japanese_doc(seed: int, chars: int = 400) -> str:
    """Distinct Japanese-looking documents (varied kana so they are neither repetitive nor near-duplicates)."""
    rng = np.random.default_rng(seed)
    kana = [chr(c) for c in range(0x3041, 0x3094)] + list("山川空海森花雨風光音夢道町駅店本人日月")
    words = ["".join(rng.choice(kana, size=rng.integers(2, 6))) for _ in range(chars // 3)]
    return "。".join("".join(words[i : i + 4]) for i in range(0, len(words), 4))[:chars] + "。"
