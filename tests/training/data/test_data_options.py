"""training/data/options.py: `hitoban corpus`, `tokenizer` and `shards` take every default from the library that
uses it (read here from the library itself), and refuse values outside today's ranges in one line."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from option_edges import accepts, check_edges, in_range, ranged

from hitoban.cli import main
from hitoban.options import argv_for
from hitoban.training.data import corpus, shards, tokenizer
from hitoban.training.data.filters import FilterSettings
from hitoban.training.data.options import CorpusOptions, ShardsOptions, TokenizerOptions


def defaults(function) -> dict:
    return {name: p.default for name, p in inspect.signature(function).parameters.items()}


def test_corpus_defaults_are_the_filters_and_the_corpus_builders():
    options, filters = CorpusOptions(out="o"), FilterSettings()
    assert (options.min_chars, options.max_chars, options.min_ja_ratio, options.near_dup, options.keep_newlines) == (
        filters.min_chars, filters.max_chars, filters.min_japanese_ratio, filters.near_dup_threshold,
        filters.keep_newlines)
    assert options.filter_settings() == filters  # the command line's defaults filter as the library's do
    assert dataclasses.replace(options, near_dup=0).filter_settings().near_dup_threshold is None  # 0 turns it off
    source = corpus.Source(name="x", license="y")
    assert (options.text_field, options.encoding, options.errors) == (source.text_field, source.encoding,
                                                                      source.errors)
    assert options.license == defaults(corpus.local_source)["license"]
    built = defaults(corpus.build_corpus)
    assert (options.seed, options.mask_pii, options.target_chars) == (built["seed"], built["mask_pii"],
                                                                      built["target_chars"])
    field = {f.name: f for f in dataclasses.fields(CorpusOptions)}
    assert tuple(field["source"].metadata["choices"]) == tuple(corpus.HUB_SOURCES)


def test_tokenizer_and_shards_defaults_are_their_libraries():
    options, trained = TokenizerOptions(corpus="c", out="o"), defaults(tokenizer.train_tokenizer_from_corpus)
    assert (options.vocab_size, options.max_chars, options.seed, options.context) == (
        trained["vocab_size"], trained["max_chars"], trained["seed"], trained["model_max_length"])
    assert isinstance(options.max_chars, float)  # as before: --max-chars 3e8 is a float on the command line
    options, built = ShardsOptions(), defaults(shards.build_shards)
    assert (options.shard_tokens, options.seed, options.val_every, options.max_heldout_docs, options.context,
            options.dtype) == (built["shard_tokens"], built["seed"], built["val_every"], built["max_heldout_docs"],
                               built["context"], built["dtype"])
    assert str(shards.dtype_for_vocab(70_000)) in ShardsOptions.__dataclass_fields__["dtype"].metadata["choices"]


def test_the_command_line_gives_the_dataclass_defaults():
    assert accepts("corpus", CorpusOptions, ["--out", "o"]) == CorpusOptions(out="o")
    assert accepts("tokenizer", TokenizerOptions, ["--corpus", "c", "--out", "o"]) == TokenizerOptions(
        corpus="c", out="o")
    assert accepts("shards", ShardsOptions, []) == ShardsOptions()
    parsed = accepts("corpus", CorpusOptions, ["--out", "o", "--source", "aozora", "--source", "fineweb2-ja",
                                               "--no-pii-mask", "--share", "aozora=0.2", "--input", "a", "b"])
    assert (parsed.source, parsed.mask_pii, parsed.share, parsed.input) == (
        ["aozora", "fineweb2-ja"], False, ["aozora=0.2"], ["a", "b"])


def test_ranges_at_their_edges(capsys):
    check_edges("corpus", CorpusOptions, ["--out", "o"], {
        "--min-chars": (["0"], ["-1"]), "--max-chars": (["1"], ["0"]),
        "--min-ja-ratio": (["0", "1"], ["-0.01", "1.01"]), "--near-dup": (["0", "1"], ["-0.01", "1.01"]),
        "--target-chars": (["1", "3e8"], ["0.5", "0", "-5"]), "--seed": (["0"], ["-1"])}, capsys)
    check_edges("tokenizer", TokenizerOptions, ["--corpus", "c", "--out", "o"], {
        "--vocab-size": (["260"], ["259", "0"]), "--max-chars": (["1", "3e8"], ["0.5", "0"]),
        "--context": (["2"], ["1"]), "--seed": (["0"], ["-1"])}, capsys)
    check_edges("shards", ShardsOptions, [], {
        "--shard-tokens": (["1"], ["0"]), "--val-every": (["2"], ["1"]), "--max-heldout-docs": (["0"], ["-1"]),
        "--context": (["2"], ["1"]), "--seed": (["0"], ["-1"])}, capsys)


def run_with(verb: str, cls: type, required: list[str], values: dict, out: Path, capsys) -> int:
    """`hitoban VERB` with `cls`'s fields set to `values`: it writes `out`, or stops with exit 2, one line, nothing
    written. Returns the exit code."""
    capsys.readouterr()
    code = main([verb, *required, "--out", str(out), *argv_for(cls, **values)])
    err = capsys.readouterr().err.splitlines()
    if code == 0:
        assert out.exists()
    else:
        assert code == 2 and len(err) == 1 and not out.exists(), (code, err)
    return code


SERVED = [f for f in dataclasses.fields(CorpusOptions) if ranged(f) and f.name != "workers"]  # workers: test_workers


@pytest.fixture(scope="module")
def documents(tmp_path_factory) -> Path:
    """Three works: one long (split or cut), one a near copy of another, one mostly Latin."""
    folder = tmp_path_factory.mktemp("documents")
    story = "".join(f"吾輩は猫である。名前はまだ無い{i}。どこで生れたかとんと見当がつかぬ。" for i in range(60))
    (folder / "a.txt").write_text(story, encoding="utf-8")
    (folder / "b.txt").write_text(story[:1500].replace("猫", "犬", 3), encoding="utf-8")
    (folder / "c.txt").write_text("Latin text with a few 日本語 words. " * 20, encoding="utf-8")
    return folder


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.fixed_dictionaries({f.name: in_range(f) for f in SERVED}))
def test_every_value_the_corpus_verb_accepts_builds_or_is_refused_in_one_line(values, documents, tmp_path_factory,
                                                                              capsys):
    """The class of an option value inside the range its --help declares that the component it configures cannot
    serve (--near-dup 0.99 was one: datasketch refused one band, a traceback). Any such values together build a
    corpus, or stop with exit 2, one line and nothing written."""
    out = tmp_path_factory.mktemp("built") / "corpus"
    required = ["--input", str(documents), "--doc-per-file", "--workers", "1"]
    if run_with("corpus", CorpusOptions, required, values, out, capsys) == 0:
        assert (out / "manifest.json").exists() and (out / "documents.jsonl").exists()


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory, literature_texts) -> Path:
    """40 documents of 500 characters of real literature as a corpus (one per line): enough for val and test
    documents at a small --val-every."""
    text = "".join(literature_texts[:5]).replace("\n", "")
    lines = tmp_path_factory.mktemp("lines") / "lines.txt"
    lines.write_text("\n".join(text[i * 500:(i + 1) * 500] for i in range(40)), encoding="utf-8")
    out = tmp_path_factory.mktemp("small") / "corpus"
    assert main(["corpus", "--input", str(lines), "--out", str(out), "--workers", "1"]) == 0
    return out


SHARDS_SERVED = [f for f in dataclasses.fields(ShardsOptions) if ranged(f) and f.name != "workers"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.fixed_dictionaries({f.name: in_range(f) for f in SHARDS_SERVED}))
def test_every_value_the_shards_verb_accepts_builds_or_is_refused_in_one_line(values, small_corpus, tokenizer_dir,
                                                                              tmp_path_factory, capsys):
    required = ["--corpus", str(small_corpus), "--tokenizer", str(tokenizer_dir), "--workers", "1"]
    run_with("shards", ShardsOptions, required, values, tmp_path_factory.mktemp("shards") / "out", capsys)


TOKENIZER_SERVED = [f for f in dataclasses.fields(TokenizerOptions) if ranged(f) and f.name != "workers"]


@pytest.mark.slow  # a tokenizer trained per example: 1 to 20 s
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.fixed_dictionaries({f.name: in_range(f) for f in TOKENIZER_SERVED}))
def test_every_value_the_tokenizer_verb_accepts_trains_or_is_refused_in_one_line(values, small_corpus,
                                                                                 tmp_path_factory, capsys):
    run_with("tokenizer", TokenizerOptions, ["--corpus", str(small_corpus), "--workers", "1"], values,
             tmp_path_factory.mktemp("tok") / "out", capsys)
