"""Text shared by the evaluation tests: a held-out chat line and the prose it is planted in."""

from __future__ import annotations

HOLDOUT_LINE = ("<|user|>日本で一番高い山の名前とその標高はどれくらいですか？また、その山が位置している地域について"
                "教えてください。<|assistant|>日本で最も高い山は富士山で、標高は三千七百七十六メートルです。<|end|>")


FILLER = ("春の川べりを歩くと、水の音がいつもより明るく聞こえる。"
          "雪解けの水が山から下りてきて、石の間を急いで流れていく。")
