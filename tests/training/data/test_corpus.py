"""Building a corpus (training/data/corpus.py): local and Hub sources, character targets and shares, input errors
named by file and offset."""

from __future__ import annotations

import json
import shutil

import pytest
from data_helpers import JA, japanese_doc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hitoban.training.data.corpus import CorpusInputError, build_corpus, hub_source, iter_corpus, local_source
from hitoban.training.data.filters import FilterSettings


def test_corpus_from_literature_and_web(tmp_path, corpus):
    literature = tmp_path / "lit"
    literature.mkdir()
    for path in sorted((corpus / "literature").glob("0*.txt"))[:25]:
        shutil.copy(path, literature / path.name)
    sources = [local_source([str(literature)], license="public domain"),
               local_source([str(corpus / "web-or-wiki" / "react-dev-ja.txt")], name="web", license="CC BY 4.0",
                            blank_line_docs=True)]
    manifest = build_corpus(sources, tmp_path / "corpus", progress=False)
    assert [s["name"] for s in manifest["sources"]] == ["lit", "web"]
    assert manifest["sources"][0]["documents"] > 20 and manifest["sources"][1]["documents"] > 50
    assert abs(sum(s["share"] for s in manifest["sources"]) - 1) < 1e-3
    assert manifest["output"]["bytes"] == (tmp_path / "corpus" / "documents.jsonl").stat().st_size
    raw = (tmp_path / "corpus" / "manifest.json").read_text()
    assert str(tmp_path) not in raw and "/root" not in raw  # no absolute paths in anything publishable
    records = list(iter_corpus(tmp_path / "corpus"))
    assert len(records) == manifest["total_documents"] and {r["source"] for r in records} == {"lit", "web"}


def test_target_chars_and_shares_cap_each_source(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("\n".join(japanese_doc(i) for i in range(30)), encoding="utf-8")
    b.write_text("\n".join(japanese_doc(100 + i) for i in range(30)), encoding="utf-8")
    manifest = build_corpus([local_source([str(a)]), local_source([str(b)])], tmp_path / "c", target_chars=4000,
                            shares={"a": 0.25}, progress=False)
    chars = {s["name"]: s["chars"] for s in manifest["sources"]}
    assert 1000 <= chars["a"] < 1000 + 402 and 3000 <= chars["b"] < 3000 + 402


def test_non_utf8_input_names_the_file_and_offset(tmp_path):
    bad = tmp_path / "shift_jis.txt"
    bad.write_bytes(japanese_doc(0).encode("utf-8") + b"\n" + JA.encode("shift_jis") * 4 + b"\n")
    with pytest.raises(CorpusInputError, match=r"shift_jis\.txt: not valid utf-8 at byte offset \d+"):
        build_corpus([local_source([str(bad)])], tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp*"))
    replaced = build_corpus([local_source([str(bad)], errors="replace")], tmp_path / "replaced", progress=False)
    assert replaced["sources"][0]["documents_seen"] == 2
    sjis = tmp_path / "sjis.txt"
    sjis.write_bytes(japanese_doc(3).encode("shift_jis"))
    ok = build_corpus([local_source([str(sjis)], encoding="shift_jis")], tmp_path / "sjis", progress=False)
    assert ok["total_documents"] == 1 and next(iter_corpus(tmp_path / "sjis"))["text"] == japanese_doc(3)


def test_empty_and_all_rejected_inputs_are_clear_errors(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(CorpusInputError, match="empty"):
        build_corpus([local_source([str(empty)])], tmp_path / "out", progress=False)
    english = tmp_path / "en.txt"
    english.write_text("An English document that is long enough. " * 10, encoding="utf-8")
    with pytest.raises(CorpusInputError, match="every document was rejected"):
        build_corpus([local_source([str(english)])], tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_jsonl_and_parquet_inputs(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("\n".join(json.dumps({"body": japanese_doc(i)}, ensure_ascii=False) for i in range(5)) + "\n",
                     encoding="utf-8")
    pq.write_table(pa.table({"body": [japanese_doc(50 + i) for i in range(4)]}), tmp_path / "docs.parquet")
    manifest = build_corpus([local_source([str(jsonl), str(tmp_path / "docs.parquet")], text_field="body")],
                            tmp_path / "c", progress=False)
    assert manifest["total_documents"] == 9
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps({"body": japanese_doc(9)}) + "\n{not json\n", encoding="utf-8")
    with pytest.raises(CorpusInputError, match=r"broken\.jsonl:2: not valid JSON"):
        build_corpus([local_source([str(broken)], text_field="body")], tmp_path / "c2", progress=False)


def test_unknown_hub_source_is_refused():
    with pytest.raises(CorpusInputError, match="unknown source"):
        hub_source("wikipedia")
    assert hub_source("aozora").revision == "42a9c9c0f1d67e6a5554d9bea4201973dc9b049c"


@pytest.mark.network
def test_hub_sources_stream_at_pinned_revisions(tmp_path):
    manifest = build_corpus([hub_source("aozora"), hub_source("fineweb2-ja")], tmp_path / "hub", target_chars=200_000,
                            progress=False)
    assert {s["revision"] for s in manifest["sources"]} == {
        "42a9c9c0f1d67e6a5554d9bea4201973dc9b049c", "af9c13333eb981300149d5ca60a8e9d659b276b9"}
    assert manifest["total_chars"] >= 150_000


# characters JSON escapes or must carry as they are: quotes, backslashes, tabs, non-BMP, full-width, RTL, U+2028
ESCAPED = st.sampled_from(['"', "\\", "\t", "𠮷", "😀", "＂", "\u2028", "/", "عربي", "<|email|>", "\x7f"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.one_of(ESCAPED, st.sampled_from(list(JA[:40]))), min_size=60, max_size=200),
                min_size=1, max_size=4),
       st.lists(st.one_of(ESCAPED, st.characters(codec="utf-8")), min_size=1, max_size=6).map("".join),
       st.sampled_from([1, 2]))
def test_every_line_of_the_corpus_is_its_record_as_json_dumps_writes_it(tmp_path_factory, docs, name, workers):
    """The writing process joins bytes that the workers encoded (filters.encode_pieces); each line must still be
    exactly `json.dumps({"text", "source"}, ensure_ascii=False)` and a newline, whatever the text and the source
    name hold, and the manifest's sha256 that of those bytes."""
    folder = tmp_path_factory.mktemp("docs")
    lines = ["".join(doc) for doc in docs]
    (folder / "in.txt").write_text("\n".join(lines), encoding="utf-8")
    out = folder / "corpus"
    manifest = build_corpus([local_source([str(folder / "in.txt")], name=name)], out, progress=False,
                            workers=workers, settings=FilterSettings(min_chars=10, min_japanese_ratio=0.0,
                                                                     near_dup_threshold=None, repeat_limit=0))
    written = (out / "documents.jsonl").read_bytes()
    assert written and written.endswith(b"\n")
    for line in written.splitlines(keepends=True):
        record = json.loads(line)
        assert record["source"] == name
        assert line == (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
    assert [r["text"] for r in iter_corpus(out)] == [r["text"] for r in map(json.loads, written.splitlines())]
    assert manifest["output"]["bytes"] == len(written)
