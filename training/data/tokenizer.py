"""Tokenizer: train a Unigram model with SentencePiece, run it with `tokenizers` (docs/design.md §3).

Why two libraries: SentencePiece's unigram trainer is several times faster and leaner than `tokenizers`'
UnigramTrainer (the measurement: docs/design.md §3), while `tokenizers` is what transformers, the Hub and every
downstream user run. The trained pieces and scores are copied into a `tokenizers.models.Unigram(byte_fallback=True)`;
a test keeps the ids identical to SentencePiece's.

Settings (3LM): identity normalisation (full-width ？！ stay full-width), no dummy prefix, no whitespace split,
byte fallback (no <unk> ever for real text), special tokens <|unk|>=0 <|user|>=1 <|assistant|>=2 <|end|>=3,
<|end|> doubling as eos, pad and document separator.
"""

from __future__ import annotations

import io
import json
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from hitoban.errors import InputError, OutputExistsError
from hitoban.modeling.loading import check_tokenizer_folder
from hitoban.options import checked_against
from hitoban.training.data.corpus import iter_corpus, load_manifest
from hitoban.training.data.markers import ASSISTANT, END, MARKERS, SPECIAL_TOKENS, UNK, USER, require_markers  # noqa: F401  (re-exported)
from hitoban.training.data.options import CONTEXT, MIN_VOCAB, SAMPLE_CHARS, SEED, VOCAB_SIZE, TokenizerOptions
from hitoban.training.data.workers import encode_documents, encoding_threads

# SentencePiece's unigram trainer splits its work into one part per thread, and the pieces it ends with depend on
# that split (1, 2 and 16 threads give three different tokenizers of one sample and seed). The count is fixed, not
# the machine's cores, so a corpus and a seed give the same tokenizer everywhere; 16 threads on 2 cores cost no
# more than 2 (69-73 s against 68-73 s on a 21 MB sample, 2-core AMD EPYC, 2026-12-05).
TRAINER_THREADS = 16

# `<|user|>Q<|assistant|>A<|end|>` per turn, exactly 3LM's line format. `{% generation %}` marks what the model is
# trained on (assistant content and the closing <|end|>, so it learns to stop); see `return_assistant_tokens_mask`.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{ '<|user|>' + message['content'] }}"
    "{%- elif message['role'] == 'assistant' %}{{ '<|assistant|>' }}"
    "{%- generation %}{{ message['content'] + '<|end|>' }}{%- endgeneration %}"
    "{%- else %}{{ raise_exception('hitoban chat supports the roles user and assistant, got ' + message['role']) }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|assistant|>' }}{%- endif %}"
)

_SENTENCE_END = re.compile(r"(?<=[。！？\n])")


def sentence_pieces(text: str, min_bytes: int = 200, max_bytes: int = 6000, cut_chars: int = 2000) -> Iterator[str]:
    """Split a document into tokenizer-training lines (docs/design.md §3).

    Split after 。！？ or newline, merge consecutive pieces until >= `min_bytes` UTF-8 bytes, hard-cut any line
    over `max_bytes` into `cut_chars`-character chunks. Internal newlines become spaces; blank lines are dropped.
    """

    def emit(piece: str) -> Iterator[str]:
        piece = piece.replace("\n", " ").strip()
        if not piece:
            return
        if len(piece.encode("utf-8")) <= max_bytes:
            yield piece
            return
        for start in range(0, len(piece), cut_chars):
            chunk = piece[start : start + cut_chars].strip()
            if chunk:
                yield chunk

    buffer, size = [], 0
    for piece in _SENTENCE_END.split(text):
        buffer.append(piece)
        size += len(piece.encode("utf-8"))
        if size >= min_bytes:
            yield from emit("".join(buffer))
            buffer, size = [], 0
    yield from emit("".join(buffer))


def write_training_sample(
    documents: Iterable[tuple[str, str]],
    path: str | os.PathLike,
    max_chars: int = SAMPLE_CHARS,
    source_caps: dict[str, int] | None = None,
) -> dict:
    """Write sentence-split lines from (source, text) pairs to `path`, within a total and per-source char budget.

    Per-source caps implement zxell's rule (a small language/domain still gets a fair share of the vocabulary).
    Streams: only one document is in memory at a time. Returns counts for the manifest.
    """
    source_caps = source_caps or {}
    per_source: dict[str, int] = {}
    stats = {"documents_seen": 0, "documents_used": 0, "lines": 0, "chars": 0}
    with open(path, "w", encoding="utf-8") as out:
        for source, text in documents:
            stats["documents_seen"] += 1
            if stats["chars"] >= max_chars:
                break
            if per_source.get(source, 0) >= source_caps.get(source, max_chars):
                continue
            stats["documents_used"] += 1
            for line in sentence_pieces(text):
                out.write(line + "\n")
                stats["lines"] += 1
                stats["chars"] += len(line)
                per_source[source] = per_source.get(source, 0) + len(line)
    stats["chars_per_source"] = per_source
    return stats


def train_sentencepiece(
    sample_path: str | os.PathLike, vocab_size: int, seed: int = SEED, hard_vocab_limit: bool = True,
) -> bytes:
    """Train SentencePiece unigram (3LM settings) on a line file; returns the serialized model.

    `hard_vocab_limit=False` lets a small text end with fewer pieces than asked (the demo); the real pipeline
    keeps it on so a 32k request yields exactly 32k pieces or a clear error.
    """
    lines = sum(1 for _ in open(sample_path, encoding="utf-8"))
    if lines == 0:
        raise InputError("the tokenizer training sample is empty: the corpus has no usable text")
    spm.set_random_generator_seed(seed)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            input=str(sample_path),
            model_writer=model,
            model_type="unigram",
            vocab_size=vocab_size,
            byte_fallback=True,
            split_by_whitespace=False,
            add_dummy_prefix=False,
            remove_extra_whitespaces=False,
            normalization_rule_name="identity",
            unk_piece=UNK,
            unk_id=0,
            bos_id=-1,
            eos_id=-1,
            pad_id=-1,
            user_defined_symbols=SPECIAL_TOKENS[1:],
            character_coverage=0.9995,
            input_sentence_size=2_000_000,
            shuffle_input_sentence=True,
            train_extremely_large_corpus=lines > 2_000_000,
            max_sentence_length=8192,
            hard_vocab_limit=hard_vocab_limit,
            num_threads=TRAINER_THREADS,
            minloglevel=2,
        )
    except RuntimeError as err:
        if "Vocabulary size too high" in str(err):
            raise InputError(
                f"the corpus is too small for a vocabulary of {vocab_size} ({str(err).split('. ')[-2]}); "
                "use a smaller --vocab-size or more text"
            ) from err
        if "smaller than required_chars" in str(err):
            raise InputError(
                f"a vocabulary of {vocab_size} cannot hold every character of the sample plus the {MIN_VOCAB} special "
                f"and byte pieces ({str(err).split('required_chars. ')[-1].split('.')[0]}); use a larger --vocab-size"
            ) from err
        raise
    return without_local_paths(model.getvalue())


def without_local_paths(proto: bytes) -> bytes:
    """The model with its trainer's record of the sample's path removed: a temporary folder's name made the file
    differ from run to run, and a local path has no place in a file that gets published."""
    spec = sentencepiece_model_pb2.ModelProto()
    spec.ParseFromString(proto)
    del spec.trainer_spec.input[:]
    return spec.SerializeToString()


def tokenizers_from_sentencepiece(model_proto: bytes) -> Tokenizer:
    """Copy a SentencePiece unigram model into `tokenizers` (identical ids; see module docstring)."""
    sp = spm.SentencePieceProcessor(model_proto=model_proto)
    # Scores are copied unchanged: `tokenizers` derives its unknown-character penalty from the lowest score, exactly
    # as SentencePiece does. Two texts do not round-trip: U+2581 "▁" decodes as a space (SentencePiece alike), and
    # the literal "<0x41>" matches the byte piece and decodes to "A" (SentencePiece never matches byte pieces
    # against text; Llama/Mistral tokenizers share this). Everything else, emoji and unseen scripts included, does.
    vocab = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
    tok = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    tok.normalizer = normalizers.Replace(Regex(" "), "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


def wrap_for_transformers(tok: Tokenizer, model_max_length: int = CONTEXT) -> PreTrainedTokenizerFast:
    """The transformers face of the tokenizer: special tokens, chat template, left padding for batched generate."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token=UNK,
        eos_token=END,
        pad_token=END,
        extra_special_tokens=[USER, ASSISTANT],
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def train_tokenizer_from_texts(
    texts: Iterable[str] | Iterable[tuple[str, str]],
    out_dir: str | os.PathLike,
    vocab_size: int = VOCAB_SIZE,
    seed: int = SEED,
    max_chars: int = SAMPLE_CHARS,
    source_caps: dict[str, int] | None = None,
    model_max_length: int = CONTEXT,
    hard_vocab_limit: bool = True,
) -> dict:
    """Sample -> SentencePiece -> tokenizers -> `out_dir` (a folder `AutoTokenizer.from_pretrained` loads).

    `texts` yields documents, or (source, document) pairs when per-source caps apply. Writes to a temp folder
    and renames, so `out_dir` is either complete or absent. Returns the stats that go into `tokenizer_meta.json`.
    """
    out_dir = Path(out_dir)
    pairs = (item if isinstance(item, tuple) else ("default", item) for item in texts)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp") as tmp:
        tmp = Path(tmp)
        sample_stats = write_training_sample(pairs, tmp / "sample.txt", max_chars, source_caps)
        proto = train_sentencepiece(tmp / "sample.txt", vocab_size, seed, hard_vocab_limit)
        (tmp / "sample.txt").unlink()
        tok = tokenizers_from_sentencepiece(proto)
        staged = tmp / "tokenizer"
        wrap_for_transformers(tok, model_max_length).save_pretrained(staged)
        (staged / "sentencepiece.model").write_bytes(proto)  # the trainer's own output, kept for provenance
        meta = {"vocab_size": tok.get_vocab_size(), "requested_vocab_size": vocab_size, "seed": seed,
                "sample": sample_stats, "special_tokens": SPECIAL_TOKENS}
        (staged / "tokenizer_meta.json").write_text(json.dumps(meta, ensure_ascii=False, indent=2), encoding="utf-8")
        if out_dir.exists():
            raise OutputExistsError(f"{out_dir} already exists; remove it or choose another --out")
        os.replace(staged, out_dir)
    return meta


def load_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerFast:
    """Load a hitoban tokenizer folder (any `AutoTokenizer` folder works) and check the markers are single tokens."""
    tok = AutoTokenizer.from_pretrained(str(check_tokenizer_folder(path)))

    def single_token(marker: str) -> int | None:  # AutoTokenizer answers a missing token with the unk id
        found = tok.convert_tokens_to_ids(marker)
        return None if found == tok.unk_token_id and marker != UNK else found

    require_markers(path, single_token)
    return tok


def chars_per_token(tok: PreTrainedTokenizerFast, texts: Iterable[str]) -> float:
    """Characters per token on held-out text (3LM: 2.101 at 32k on web text). Higher = more compact."""
    chars = tokens = 0
    batch: list[str] = []
    for text in [*texts, None]:  # None flushes the last batch
        if text is not None:
            batch.append(text)
        if len(batch) == 256 or (text is None and batch):
            encodings = encode_documents(tok.backend_tokenizer, batch)  # Rust, parallel
            tokens += sum(len(e.ids) for e in encodings)
            chars += sum(map(len, batch))
            batch = []
    return chars / max(tokens, 1)


@checked_against(TokenizerOptions, "vocab_size", "max_chars", "seed", "workers", model_max_length="context")
def train_tokenizer_from_corpus(
    corpus: str | os.PathLike,
    out_dir: str | os.PathLike,
    vocab_size: int = VOCAB_SIZE,
    max_chars: int = SAMPLE_CHARS,
    source_caps: dict[str, int] | None = None,
    seed: int = SEED,
    model_max_length: int = CONTEXT,
    heldout_every: int = 50,
    hard_vocab_limit: bool = True,
    workers: int | None = None,
) -> dict:
    """Train on a `hitoban corpus` folder: a strided sample within `max_chars` (huge corpora are never read whole),
    every `heldout_every`-th sampled document kept out and used to report chars/token. `workers`: the encoder's
    threads (default: every core); SentencePiece's trainer always splits its work TRAINER_THREADS ways."""
    if workers:
        encoding_threads(workers)
    manifest = load_manifest(corpus)
    stride = max(1, round(manifest["total_chars"] / max_chars))  # 3LM: spread the sample over the whole corpus
    heldout: list[str] = []

    def sample():
        for index, record in enumerate(iter_corpus(corpus)):
            if index % stride:
                continue
            if (index // stride) % heldout_every == heldout_every - 1:
                if sum(map(len, heldout)) < 2_000_000:
                    heldout.append(record["text"])
                continue
            yield record["source"], record["text"]

    meta = train_tokenizer_from_texts(sample(), out_dir, vocab_size, seed, max_chars, source_caps, model_max_length,
                                      hard_vocab_limit)
    tok = load_tokenizer(out_dir)
    meta["sample"]["stride"] = stride
    meta["heldout"] = {"documents": len(heldout), "chars": sum(map(len, heldout)),
                       "chars_per_token": round(chars_per_token(tok, heldout), 4) if heldout else None}
    meta["corpus_sha256"] = manifest["output"]["sha256"]
    Path(out_dir, "tokenizer_meta.json").write_text(json.dumps(meta, ensure_ascii=False, indent=2), encoding="utf-8")
    return meta
