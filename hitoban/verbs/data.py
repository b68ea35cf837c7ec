"""The data verbs: corpus -> tokenizer -> shards."""

from __future__ import annotations

from hitoban.errors import UsageError
from hitoban.options import add_options, from_args
from hitoban.verbs import parse_pairs, verb


def _corpus_args(p):
    from hitoban.training.data.options import CorpusOptions

    add_options(p, CorpusOptions)


@verb("corpus", "build a filtered, PII-masked, licence-tracked corpus from local files or pinned Hub datasets")(
    _corpus_args)
def _corpus(args) -> int:
    from hitoban.training.data.options import CorpusOptions

    options = from_args(CorpusOptions, args)  # ranges checked before anything is read
    from hitoban.training.data.corpus import build_corpus, hub_source, local_source
    from hitoban.training.data.workers import single_threaded_blas

    sources = [hub_source(name) for name in options.source]
    if options.input:
        sources.append(local_source(options.input, name=options.name, license=options.license,
                                    text_field=options.text_field, doc_per_file=options.doc_per_file,
                                    blank_line_docs=options.blank_line_docs, encoding=options.encoding,
                                    errors=options.errors))
    target = int(options.target_chars) if options.target_chars else None
    with single_threaded_blas():  # before MinHash's import, so the workers can be forked after it
        manifest = build_corpus(sources, options.out, target, parse_pairs(options.share), options.filter_settings(),
                                mask_pii=options.mask_pii, seed=options.seed, workers=options.workers)
    account, filters = manifest["characters"], manifest["filters"]
    split = (f"; {filters['long_documents']:,} documents over --max-chars split into {filters['split_pieces']:,}"
             if filters["split_pieces"] else "")
    print(f"corpus: {manifest['total_documents']:,} documents, {manifest['total_chars']:,} chars in "
          f"{manifest['elapsed_seconds']} s; rejected {manifest['filters']['rejected']}; "
          f"PII masked {manifest['pii_masks']} -> {options.out}")
    print(f"characters: {account['kept']:,} kept of {account['read']:,} read ({account['cleaned_away']:,} cleaned "
          f"away; dropped {account['dropped'] or 'none'}){split}")
    return 0


def _tokenizer_args(p):
    from hitoban.training.data.options import TokenizerOptions

    add_options(p, TokenizerOptions)


@verb("tokenizer", "train a Unigram tokenizer (SentencePiece trainer, tokenizers runtime) with a chat template")(
    _tokenizer_args)
def _tokenizer(args) -> int:
    from hitoban.training.data.options import TokenizerOptions

    options = from_args(TokenizerOptions, args)
    from hitoban.training.data.tokenizer import train_tokenizer_from_corpus

    meta = train_tokenizer_from_corpus(options.corpus, options.out, options.vocab_size, int(options.max_chars),
                                       parse_pairs(options.source_cap, int), options.seed, options.context,
                                       workers=options.workers)
    print(f"tokenizer: {meta['vocab_size']:,} pieces from {meta['sample']['chars']:,} sample chars; "
          f"held-out chars/token {meta['heldout']['chars_per_token']} -> {options.out}")
    return 0


def _shards_args(p):
    from hitoban.training.data.options import ShardsOptions

    add_options(p, ShardsOptions)


@verb("shards", "tokenize a corpus into verified zxell-format shards, or --verify a shard folder")(_shards_args)
def _shards(args) -> int:
    from hitoban.training.data.options import ShardsOptions

    options = from_args(ShardsOptions, args)
    from hitoban.training.data.workers import single_threaded_blas

    with single_threaded_blas():  # numpy loads without BLAS threads, so the encoding workers can be forked
        from hitoban.training.data.shards import build_shards, verify_shards

    if options.verify:
        result = verify_shards(options.verify, options.tokenizer, full=True, progress=True)
        print(f"shards OK: {result['shards']} files, tokens {result['splits']}")
        return 0
    if not (options.corpus and options.tokenizer and options.out):
        raise UsageError("give --corpus, --tokenizer and --out (or --verify SHARDS)")
    index = build_shards(options.corpus, options.tokenizer, options.out, options.shard_tokens, options.seed,
                         options.val_every, options.max_heldout_docs, options.context, options.dtype,
                         workers=options.workers)
    verify_shards(options.out, options.tokenizer)
    splits = ", ".join(f"{name} {s['tokens']:,} tokens / {s['docs']:,} docs" for name, s in index["splits"].items())
    print(f"shards: {splits} ({index['dtype']}, verified) in {index['elapsed_seconds']} s -> {options.out}")
    return 0
