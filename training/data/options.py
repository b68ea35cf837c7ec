"""`hitoban corpus`, `tokenizer` and `shards`' options, defined once (hitoban/options.py's mechanism).

Standard library only at import: `hitoban --help` and `shards --verify` build every parser without tqdm, numpy or
transformers. So the filters' defaults are read from `FilterSettings` (filters.py needs only the standard library),
and the defaults of the libraries whose modules import heavy ones (corpus.py: tqdm; shards.py: numpy; tokenizer.py:
transformers) are the constants below, which those libraries' signatures name.
"""

from __future__ import annotations

from dataclasses import dataclass

from hitoban.options import Checked, option, same_as
from hitoban.training.data.filters import LONG_DOCS, FilterSettings
from hitoban.training.data.workers import default_workers

SEED = 1234  # the data stage's seed: sampling Hub sources, the tokenizer's sample and SentencePiece, the shard index
CONTEXT = 512  # tokens per window: the tokenizer's model_max_length, the shortest train split shards accept
ENCODING = "utf-8"  # local text files (corpus) and corpus text files (leaks)
DECODE_ERRORS = ("strict", "replace", "ignore")  # what undecodable bytes get; the first is the default
TEXT_FIELD = "text"  # the text's field in .jsonl / .parquet input
LOCAL_LICENSE = "unknown (local files)"
HUB_SOURCE_NAMES = ("fineweb2-ja", "aozora")  # corpus.HUB_SOURCES' keys (their pinned revisions live there)
VOCAB_SIZE = 32_000
SAMPLE_CHARS = 300_000_000  # the tokenizer's training sample
MIN_VOCAB = 260  # the special and byte pieces every vocabulary holds
SHARD_TOKENS = 50_000_000
VAL_EVERY = 400  # per source, document k % N == 0 -> val, == 1 -> test
MAX_HELDOUT_DOCS = 2000
DTYPES = ("uint16", "uint32")

_FILTERS = FilterSettings  # class attributes: the dataclass's field defaults (3LM's)


@dataclass(kw_only=True)
class CorpusOptions(Checked):
    """`hitoban corpus`: local files and pinned Hub sources through the filters and the PII masker."""

    input: list[str] = option(help="local .txt (one document per line; a directory of .txt = one document per file), "
                                   ".jsonl or .parquet files, directories or globs",
                              factory=list, nargs="+", metavar="PATH")
    source: list[str] = option(help="Hub source streamed at a pinned revision (needs network); repeat for several",
                               factory=list, repeat=True, choices=HUB_SOURCE_NAMES)
    out: str = option(help="new corpus folder (documents.jsonl + manifest.json)")
    name: str | None = option(None, "domain name for the local input (default: its file or folder name)")
    license: str = option(LOCAL_LICENSE, "licence of the local input, for the manifest")
    doc_per_file: bool = option(False, "each .txt file is one document")
    blank_line_docs: bool = option(False, "in .txt files, documents are separated by blank lines (default: one per "
                                          "line)")
    text_field: str = option(TEXT_FIELD, "field holding the text in .jsonl/.parquet")
    encoding: str = option(ENCODING, "text encoding of the local input")
    errors: str = option(DECODE_ERRORS[0], "what to do with undecodable bytes (default: stop and name the file and "
                                           "offset)", choices=DECODE_ERRORS)
    target_chars: float | None = option(None, "stop after this many characters (default: everything)", min=1)
    share: list[str] = option(help="share of the target per source (default aozora=0.10 when mixed, the rest split "
                                   "evenly)", factory=list, repeat=True, metavar="NAME=FRACTION")
    min_chars: int = same_as(FilterSettings, "min_chars")
    max_chars: int = same_as(FilterSettings, "max_chars")
    long_docs: str = option(_FILTERS.long_docs, "documents over --max-chars: split (keep them whole, in pieces) or "
                                                "truncate (keep the first --max-chars, 3LM's rule for web pages)",
                            choices=LONG_DOCS)
    min_ja_ratio: float = same_as(FilterSettings, "min_japanese_ratio")
    near_dup: float = same_as(FilterSettings, "near_dup_threshold")
    keep_newlines: bool = option(_FILTERS.keep_newlines, "keep line breaks (3LM joins lines with spaces)")
    mask_pii: bool = option(True, "do not mask e-mails / phone numbers (not advised)", flag="--no-pii-mask")
    seed: int = option(SEED, "seed for sampling Hub sources", min=0)
    workers: int = option(default_workers(), "processes for the filters (default: this machine's cores); the "
                                             "corpus is the same for any number", min=1)

    def filter_settings(self) -> FilterSettings:
        """The filters these options ask for (the rest at FilterSettings' defaults); --near-dup 0 turns it off."""
        return FilterSettings(min_chars=self.min_chars, max_chars=self.max_chars, min_japanese_ratio=self.min_ja_ratio,
                              near_dup_threshold=self.near_dup or None, keep_newlines=self.keep_newlines,
                              long_docs=self.long_docs)


@dataclass(kw_only=True)
class TokenizerOptions(Checked):
    """`hitoban tokenizer`: a Unigram tokenizer trained on a sample of a corpus."""

    corpus: str = option(help="a folder built by `hitoban corpus`")
    out: str = option(help="new tokenizer folder (AutoTokenizer.from_pretrained loads it)")
    vocab_size: int = option(VOCAB_SIZE, "pieces, including special and byte pieces", min=MIN_VOCAB)
    max_chars: float = option(float(SAMPLE_CHARS), "character budget of the training sample", min=1)
    source_cap: list[str] = option(help="at most CHARS sample characters from one source (zxell's per-language caps)",
                                   factory=list, repeat=True, metavar="NAME=CHARS")
    context: int = option(CONTEXT, "model_max_length recorded in the tokenizer", min=2)
    seed: int = option(SEED, "seed for the training sample and SentencePiece", min=0)
    workers: int = option(default_workers(), "threads for the encoder that measures held-out characters/token "
                                             "(default: this machine's cores); the trainer's split is fixed, so "
                                             "the tokenizer is the same on any machine", min=1)


@dataclass(kw_only=True)
class ShardsOptions(Checked):
    """`hitoban shards`: a corpus tokenized into verified shards, or --verify a shard folder."""

    corpus: str | None = option(None, "a folder built by `hitoban corpus`")
    tokenizer: str | None = option(None, "a tokenizer folder (with --verify: also check the shards use it)")
    out: str | None = option(None, "new shard folder")
    verify: str | None = option(None, "re-hash and check every invariant of SHARDS, then exit", metavar="SHARDS")
    shard_tokens: int = option(SHARD_TOKENS, "tokens per train shard file", min=1)
    val_every: int = option(VAL_EVERY, "per source, document k%%N==0 -> val, ==1 -> test", min=2)
    max_heldout_docs: int = option(MAX_HELDOUT_DOCS, "cap on val (and on test) documents", min=0)
    context: int = option(CONTEXT, "refuse a train split shorter than one window", min=2)
    dtype: str | None = option(None, "default: uint16 when the vocab fits", choices=DTYPES)
    seed: int = option(SEED, "recorded in the index (the split rule is by position)", min=0)
    workers: int = option(default_workers(), "processes that encode while one reads and writes (default: this "
                                             "machine's cores); the shards are the same for any number", min=1)
