"""The class of a value the command line refuses that the library took (`FilterSettings(max_chars=-5)` split a long
document for ever; `dedup_prefix_chars=0` made every document a duplicate of the first; `build_corpus(target_chars=
0.5)` wrote one document). Each component's settings declare their ranges (hitoban.options.CheckedSettings), the
verbs copy them (`same_as`), and the data verbs' library functions check their arguments against their options'
ranges: drawn from outside every declared range, each is refused in one line before anything is written; drawn from
inside, the filters serve it."""

from __future__ import annotations

import dataclasses
import signal

import alarm
import hypothesis
import pytest
from hypothesis import strategies as st
from option_edges import in_range, outside, ranged

from hitoban.errors import UsageError
from hitoban.training.data import corpus, shards, tokenizer
from hitoban.training.data.chat import ChatFilterSettings
from hitoban.training.data.filters import DocumentFilter, FilterSettings
from hitoban.training.data.options import CorpusOptions, ShardsOptions, TokenizerOptions
from hitoban.training.finetune.lora import LoraSettings

SETTINGS = (FilterSettings, ChatFilterSettings, LoraSettings)
# each library function of the data verbs, its options class, and its arguments' names for the options' fields
LIBRARY = {
    "build_corpus": (lambda tmp, **kw: corpus.build_corpus([], tmp / "out", **kw), CorpusOptions,
                     {"target_chars": "target_chars", "seed": "seed", "workers": "workers"}),
    "train_tokenizer_from_corpus": (lambda tmp, **kw: tokenizer.train_tokenizer_from_corpus(tmp / "none", tmp / "out",
                                                                                           **kw), TokenizerOptions,
                                    {"vocab_size": "vocab_size", "max_chars": "max_chars", "seed": "seed",
                                     "model_max_length": "context", "workers": "workers"}),
    "build_shards": (lambda tmp, **kw: shards.build_shards(tmp / "none", tmp / "none", tmp / "out", **kw),
                     ShardsOptions, {name: name for name in ("shard_tokens", "seed", "val_every", "max_heldout_docs",
                                                             "context", "workers")}),
}


def ranged_fields(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if ranged(f)]


def test_every_component_settings_declares_ranges_and_the_verbs_copy_them():
    """The ranges are written once: each verb's field for a setting has the setting's range."""
    from hitoban.training.finetune.options import FinetuneOptions

    copies = {(CorpusOptions, "min_chars"): (FilterSettings, "min_chars"),
              (CorpusOptions, "max_chars"): (FilterSettings, "max_chars"),
              (CorpusOptions, "min_ja_ratio"): (FilterSettings, "min_japanese_ratio"),
              (CorpusOptions, "near_dup"): (FilterSettings, "near_dup_threshold"),
              (FinetuneOptions, "max_user_chars"): (ChatFilterSettings, "max_user_chars"),
              (FinetuneOptions, "max_assistant_chars"): (ChatFilterSettings, "max_assistant_chars"),
              (FinetuneOptions, "min_char_freq"): (ChatFilterSettings, "min_char_freq"),
              (FinetuneOptions, "lora_r"): (LoraSettings, "r"),
              (FinetuneOptions, "lora_alpha"): (LoraSettings, "alpha"),
              (FinetuneOptions, "lora_dropout"): (LoraSettings, "dropout")}
    limits = ("min", "max", "above", "below")
    for (verb, name), (settings, setting) in copies.items():
        mine, theirs = verb.__dataclass_fields__[name].metadata, settings.__dataclass_fields__[setting].metadata
        assert {k: mine.get(k) for k in limits} == {k: theirs.get(k) for k in limits}, (verb, name)
    for cls in SETTINGS:
        assert ranged_fields(cls)


@st.composite
def a_broken_setting(draw):
    cls = draw(st.sampled_from(SETTINGS))
    f = draw(st.sampled_from(ranged_fields(cls)))
    return cls, f.name, draw(outside(f))


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(a_broken_setting())
def test_a_setting_outside_its_range_is_refused_where_it_is_made(broken):
    cls, name, value = broken
    with pytest.raises(UsageError) as refused:
        cls(**{name: value})
    assert str(refused.value).startswith(f"{cls.__name__}({name}=...) {value:g}: must be")




SENTENCES = ["吾輩は猫である。", "名前はまだ無い。", "どこで生れたかとんと見当がつかぬ。", "Python 3.11 で動く。",
             "何でも薄暗いじめじめした所でニャーニャー泣いていた事だけは記憶している。", "\n", " ", "ああああ"]
TEXT = st.lists(st.sampled_from(SENTENCES), max_size=600).map("".join)  # up to about 20,000 characters


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(values=st.fixed_dictionaries({f.name: in_range(f, top=5000) for f in ranged_fields(FilterSettings)}),
                  texts=st.lists(TEXT, max_size=4), long_docs=st.sampled_from(["split", "truncate"]))
def test_any_filter_settings_inside_their_ranges_filter_any_text(values, texts, long_docs):
    """Every character read is accounted for, whatever settings the ranges admit (a negative max_chars had
    looped for ever in the split)."""
    doc_filter = DocumentFilter(FilterSettings(**values, long_docs=long_docs))
    with alarm.deadline(20, "the filters still ran after 20 s"):
        kept = [piece for text in texts for piece in doc_filter.pieces(text)]
    counts = doc_filter.chars
    assert counts["kept"] == sum(map(len, kept))
    assert counts["read"] == sum(map(len, texts))


@st.composite
def a_broken_argument(draw):
    name = draw(st.sampled_from(sorted(LIBRARY)))
    call, options, fields = LIBRARY[name]
    argument = draw(st.sampled_from(sorted(a for a, f in fields.items() if ranged(options.__dataclass_fields__[f]))))
    field = options.__dataclass_fields__[fields[argument]]
    return name, argument, field, draw(outside(field))


@hypothesis.settings(max_examples=80, deadline=None)
@hypothesis.given(broken=a_broken_argument())
def test_a_data_library_function_refuses_what_its_verb_refuses_before_writing(broken, tmp_path_factory):
    name, argument, field, value = broken
    tmp = tmp_path_factory.mktemp("library")
    call, options, _ = LIBRARY[name]
    with pytest.raises(UsageError) as refused:
        call(tmp, **{argument: value})
    flag = "--" + field.name.replace("_", "-")
    assert str(refused.value).startswith(f"{flag} {value:g}: must be") and "\n" not in str(refused.value)
    assert list(tmp.iterdir()) == []


def test_the_deadline_puts_back_an_outer_alarm_with_the_time_it_has_left():
    """`alarm.deadline` (this file's hang guard, and each README command's) must not cancel pytest-timeout's alarm
    for the rest of a test."""
    fired = []
    before = signal.signal(signal.SIGALRM, lambda *_: fired.append(True))
    try:
        signal.setitimer(signal.ITIMER_REAL, 30)
        with alarm.deadline(5, "unused"):
            pass
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 25 < left <= 30 and not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
