"""The data verbs: corpus -> tokenizer -> shards."""

from __future__ import annotations

from hitoban.errors import UsageError
from hitoban.options import ranged
from hitoban.verbs import parse_pairs, verb


def _corpus_args(p):
    p.add_argument("--input", nargs="+", default=[], metavar="PATH",
                   help="local .txt (one document per line; a directory of .txt = one document per file), "
                        ".jsonl or .parquet files, directories or globs")
    p.add_argument("--source", action="append", default=[], choices=["fineweb2-ja", "aozora"],
                   help="Hub source streamed at a pinned revision (needs network); repeat for several")
    p.add_argument("--out", required=True, help="new corpus folder (documents.jsonl + manifest.json)")
    p.add_argument("--name", help="domain name for the local input (default: its file or folder name)")
    p.add_argument("--license", default="unknown (local files)", help="licence of the local input, for the manifest")
    p.add_argument("--doc-per-file", action="store_true", help="each .txt file is one document")
    p.add_argument("--blank-line-docs", action="store_true",
                   help="in .txt files, documents are separated by blank lines (default: one per line)")
    p.add_argument("--text-field", default="text", help="field holding the text in .jsonl/.parquet")
    p.add_argument("--encoding", default="utf-8", help="text encoding of the local input")
    p.add_argument("--errors", default="strict", choices=["strict", "replace", "ignore"],
                   help="what to do with undecodable bytes (default: stop and name the file and offset)")
    p.add_argument("--target-chars", type=ranged(float, above=0),
                   help="stop after this many characters (default: everything)")
    p.add_argument("--share", action="append", metavar="NAME=FRACTION",
                   help="share of the target per source (default aozora=0.10 when mixed, the rest split evenly)")
    p.add_argument("--min-chars", type=ranged(int, min=0), default=200, help="shorter documents are rejected (3LM)")
    p.add_argument("--max-chars", type=ranged(int, min=1), default=20_000, help="longer documents are truncated")
    p.add_argument("--min-ja-ratio", type=ranged(float, min=0, max=1), default=0.70,
                   help="documents with a smaller share of Japanese characters are rejected (3LM)")
    p.add_argument("--near-dup", type=ranged(float, min=0, max=1), default=0.85,
                   help="MinHash-LSH Jaccard threshold for near-duplicates (0 turns it off)")
    p.add_argument("--keep-newlines", action="store_true", help="keep line breaks (3LM joins lines with spaces)")
    p.add_argument("--no-pii-mask", action="store_true", help="do not mask e-mails / phone numbers (not advised)")
    p.add_argument("--seed", type=ranged(int, min=0), default=1234, help="seed for sampling Hub sources")


@verb("corpus", "build a filtered, PII-masked, licence-tracked corpus from local files or pinned Hub datasets")(
    _corpus_args)
def _corpus(args) -> int:
    from hitoban.training.data.corpus import build_corpus, hub_source, local_source
    from hitoban.training.data.filters import FilterSettings

    sources = [hub_source(name) for name in args.source]
    if args.input:
        sources.append(local_source(args.input, name=args.name, license=args.license, text_field=args.text_field,
                                    doc_per_file=args.doc_per_file, blank_line_docs=args.blank_line_docs,
                                    encoding=args.encoding, errors=args.errors))
    settings = FilterSettings(min_chars=args.min_chars, max_chars=args.max_chars, min_japanese_ratio=args.min_ja_ratio,
                              near_dup_threshold=args.near_dup or None, keep_newlines=args.keep_newlines)
    target = int(args.target_chars) if args.target_chars else None
    manifest = build_corpus(sources, args.out, target, parse_pairs(args.share), settings,
                            mask_pii=not args.no_pii_mask, seed=args.seed)
    print(f"corpus: {manifest['total_documents']:,} documents, {manifest['total_chars']:,} chars in "
          f"{manifest['elapsed_seconds']} s; rejected {manifest['filters']['rejected']}; "
          f"PII masked {manifest['pii_masks']} -> {args.out}")
    return 0


def _tokenizer_args(p):
    p.add_argument("--corpus", required=True, help="a folder built by `hitoban corpus`")
    p.add_argument("--out", required=True, help="new tokenizer folder (AutoTokenizer.from_pretrained loads it)")
    p.add_argument("--vocab-size", type=ranged(int, min=260), default=32000,
                   help="pieces, including special and byte pieces")
    p.add_argument("--max-chars", type=ranged(float, above=0), default=300e6,
                   help="character budget of the training sample")
    p.add_argument("--source-cap", action="append", metavar="NAME=CHARS",
                   help="at most CHARS sample characters from one source (zxell's per-language caps)")
    p.add_argument("--context", type=ranged(int, min=2), default=512, help="model_max_length recorded in the tokenizer")
    p.add_argument("--seed", type=ranged(int, min=0), default=1234,
                   help="seed for the training sample and SentencePiece")


@verb("tokenizer", "train a Unigram tokenizer (SentencePiece trainer, tokenizers runtime) with a chat template")(
    _tokenizer_args)
def _tokenizer(args) -> int:
    from hitoban.training.data.tokenizer import train_tokenizer_from_corpus

    meta = train_tokenizer_from_corpus(args.corpus, args.out, args.vocab_size, int(args.max_chars),
                                       parse_pairs(args.source_cap, int), args.seed, args.context)
    print(f"tokenizer: {meta['vocab_size']:,} pieces from {meta['sample']['chars']:,} sample chars; "
          f"held-out chars/token {meta['heldout']['chars_per_token']} -> {args.out}")
    return 0


def _shards_args(p):
    p.add_argument("--corpus", help="a folder built by `hitoban corpus`")
    p.add_argument("--tokenizer", help="a tokenizer folder (with --verify: also check the shards use it)")
    p.add_argument("--out", help="new shard folder")
    p.add_argument("--verify", metavar="SHARDS", help="re-hash and check every invariant of SHARDS, then exit")
    p.add_argument("--shard-tokens", type=ranged(int, min=1), default=50_000_000, help="tokens per train shard file")
    p.add_argument("--val-every", type=ranged(int, min=2), default=400,
                   help="per source, document k%%N==0 -> val, ==1 -> test")
    p.add_argument("--max-heldout-docs", type=ranged(int, min=0), default=2000,
                   help="cap on val (and on test) documents")
    p.add_argument("--context", type=ranged(int, min=2), default=512,
                   help="refuse a train split shorter than one window")
    p.add_argument("--dtype", choices=["uint16", "uint32"], help="default: uint16 when the vocab fits")
    p.add_argument("--seed", type=ranged(int, min=0), default=1234,
                   help="recorded in the index (the split rule is by position)")


@verb("shards", "tokenize a corpus into verified zxell-format shards, or --verify a shard folder")(_shards_args)
def _shards(args) -> int:
    from hitoban.training.data.shards import build_shards, verify_shards

    if args.verify:
        result = verify_shards(args.verify, args.tokenizer, full=True, progress=True)
        print(f"shards OK: {result['shards']} files, tokens {result['splits']}")
        return 0
    if not (args.corpus and args.tokenizer and args.out):
        raise UsageError("give --corpus, --tokenizer and --out (or --verify SHARDS)")
    index = build_shards(args.corpus, args.tokenizer, args.out, args.shard_tokens, args.seed, args.val_every,
                         args.max_heldout_docs, args.context, args.dtype)
    verify_shards(args.out, args.tokenizer)
    splits = ", ".join(f"{name} {s['tokens']:,} tokens / {s['docs']:,} docs" for name, s in index["splits"].items())
    print(f"shards: {splits} ({index['dtype']}, verified) in {index['elapsed_seconds']} s -> {args.out}")
    return 0
