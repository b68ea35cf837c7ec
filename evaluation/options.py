"""`hitoban eval`'s options, defined once (hitoban/options.py's mechanism): bits/char over domains and shards, or
3LM's generation metrics on fixed questions."""

from __future__ import annotations

from dataclasses import dataclass

from hitoban.options import Checked, option

DOMAIN_CHARS = 400_000  # 3LM truncates each domain to its first 400,000 characters


@dataclass(kw_only=True)
class EvalOptions(Checked):
    kind: str = option(help="bpc: bits per character (3LM's definition); gen: 3LM generation metrics on fixed "
                            "questions", choices=("bpc", "gen"), positional=True)
    models: list[str] = option(help="from_pretrained folders (with tokenizer)", nargs="+", metavar="MODEL",
                               positional=True)
    domain: list[str] = option(help="a text file per domain; repeatable", factory=list, repeat=True,
                               metavar="NAME=PATH")
    shards: str | None = option(None, "also report per-domain bits/char on this shard set's val split")
    max_chars: int = option(DOMAIN_CHARS, "use the first N chars of each domain (0 = all)", min=0)
    questions: str | None = option(None, "gen: questions JSONL (id, category, turns, keywords)")
    compare: str | None = option(None, "gen: print deltas against an earlier result", metavar="PREVIOUS.json")
    out: str | None = option(None, "JSON result (default bpc.json / gen.json); bpc also writes .md and .png beside it")
