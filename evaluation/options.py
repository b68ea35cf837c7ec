"""The evaluation verbs' options, defined once (hitoban/options.py's mechanism): `hitoban eval` (bits/char over
domains and shards, or 3LM's generation metrics on fixed questions), `compare`, `leaks`, `pii` and `check-kvcache`.
Standard library only at import (`hitoban --help` and `leaks` start without torch): the libraries, which import
torch or NumPy, name the defaults below in their signatures."""

from __future__ import annotations

from dataclasses import dataclass

from hitoban.options import Checked, option
from hitoban.training.data.options import ENCODING

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


COMPARE_NEW_TOKENS = 90
COMPARE_SEED = 777
LEAK_ENGINES = ("sampled-grams", "hyperscan", "ahocorasick-rs")  # matching.Matcher's engines
PII_SAMPLES = 60  # 3LM's
PII_NEW_TOKENS = 40  # 3LM's
CANARY_REPETITIONS = (1, 4, 16, 64)
CANARY_STEPS = 400  # the command line's; canary_control's own default (600) trains longer
CANARY_SEED = 0
KVCACHE_STEPS = 12
KVCACHE_ATOL = 1e-5  # fp32: cached and recomputed logits agree to rounding


@dataclass(kw_only=True)
class CompareOptions(Checked):
    """`hitoban compare`: the same prompts and seeds through several models."""

    models: list[str] = option(help="from_pretrained folders (with tokenizer)", nargs="+", metavar="MODEL",
                               positional=True)
    out: str = option("compare", "folder for compare.json and compare.png")
    max_new_tokens: int = option(COMPARE_NEW_TOKENS, "tokens generated per reply", min=1)
    seed: int = option(COMPARE_SEED, "prompt i is sampled with seed + i in every model", min=0)


@dataclass(kw_only=True)
class LeaksOptions(Checked):
    """`hitoban leaks`: an exact scan of corpora for held-out text."""

    holdout: str = option(help="held-out items: a text file (one per line; chat markers split turns) or JSONL chats "
                               "(messages, ShareGPT conversations, prompt/response, instruction/output, "
                               "question/answer, text); a record none of these reads is counted unprobed and the scan "
                               "exits 4")
    corpus: list[str] = option(help="text files, .jsonl files (their strings are scanned) or `hitoban corpus` folders",
                               nargs="+")
    out: str | None = option(None, "JSON report")
    engine: str | None = option(None, "default: sampled-grams (NumPy) for probes of >= 23 bytes, else hyperscan when "
                                      "installed", choices=LEAK_ENGINES)
    encoding: str = option(ENCODING, "the corpus text files' encoding (e.g. shift_jis, cp932); they are compared as "
                                     "text, so a file that does not decode is refused, never reported clean")


@dataclass(kw_only=True)
class PiiOptions(Checked):
    """`hitoban pii`: the prefix-attack probe of a model, or its canary control."""

    model: str | None = option(None, "a from_pretrained folder to attack (omit with --canaries)", positional=True,
                               nargs="?")
    corpus: list[str] = option(help="the training corpus: text files or `hitoban corpus` folders (with --canaries: the "
                                    "small corpus to plant fake contacts into)", nargs="+")
    samples: int = option(PII_SAMPLES, "distinct contacts to try (3LM: 60); `hitoban upload` accepts a probe of >= 20 "
                                       "(fewer only when the corpus has no more)", min=1)
    max_new_tokens: int = option(PII_NEW_TOKENS, "greedy tokens generated per attack (3LM: 40)", min=1)
    canaries: int | None = option(None, "sensitivity control: plant N fake contacts at --repetitions, train a tiny "
                                        "model on the planted copy and one on the clean copy, attack both", min=1,
                                  metavar="N")
    repetitions: str = option(",".join(map(str, CANARY_REPETITIONS)),
                              "comma-separated repetition counts for --canaries")
    steps: int = option(CANARY_STEPS, "--canaries: training steps per tiny model", min=1)
    seed: int = option(CANARY_SEED, "--canaries: seed for the fakes, their placement and models", min=0)
    out: str | None = option(None, "JSON report (masked values only); with --canaries a folder (default "
                                   "pii-canaries)")


@dataclass(kw_only=True)
class KvcacheOptions(Checked):
    """`hitoban check-kvcache`: cached decoding against full recomputation."""

    model: str | None = option(None, "a from_pretrained folder (default: a random tiny model)")
    steps: int = option(KVCACHE_STEPS, "decoding steps compared", min=1)
    atol: float = option(KVCACHE_ATOL, "largest allowed |cached - recomputed| logit", above=0)
    break_rope_offset: bool = option(False, "negative control: feed new tokens at position 0; the check must then "
                                            "FAIL")


@dataclass(kw_only=True)
class PlotOptions(Checked):
    """`hitoban plot`: a run's loss curves and its kill-test figure."""

    run: str = option(help="a pretraining run folder (log.jsonl; killtest.json if present)", positional=True)
    out: str | None = option(None, "folder for the PNGs (default RUN/plots)")
