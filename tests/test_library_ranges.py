"""The class of a value the command line refuses that the library took (`FilterSettings(max_chars=-5)` split a long
document for ever; `dedup_prefix_chars=0` made every document a duplicate of the first; `build_corpus(target_chars=
0.5)` wrote one document; `check_kvcache(steps=0)` passed having decoded nothing with the cache; `run_killtest(kills=
0)` trained its uninterrupted runs, then failed with a traceback). Each component's settings declare their ranges
(hitoban.options.CheckedSettings), the verbs copy them (`same_as`), and a library function that takes an option's
value bare checks it against the option's range (`hitoban.options.checked_against`). Which functions those are is
read from the verbs' own code: every ranged option a verb hands to a function, bare, is found and must be checked
there; drawn from outside every declared range, each value is refused in one line before anything is written;
drawn from inside, the filters serve it."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import signal
from pathlib import Path

import alarm
import hypothesis
import pytest
from hypothesis import strategies as st
from option_edges import in_range, outside, ranged

import hitoban.verbs
from hitoban.errors import UsageError
from hitoban.training.data.chat import ChatFilterSettings
from hitoban.training.data.filters import DocumentFilter, FilterSettings
from hitoban.training.data.options import CorpusOptions
from hitoban.training.finetune.lora import LoraSettings

SETTINGS = (FilterSettings, ChatFilterSettings, LoraSettings)
LIMITS = ("min", "max", "above", "below")
BARE = {"int", "float"}  # a conversion hands the value on unchanged in range: `int(options.max_chars)` is bare


def _imported(nodes) -> dict[str, tuple[str, str]]:
    """name -> (module, attribute) of the `from X import Y` statements among `nodes`."""
    return {alias.asname or alias.name: (node.module, alias.name) for node in nodes
            if isinstance(node, ast.ImportFrom) and node.module for alias in node.names}


def _resolve(names: dict[str, tuple[str, str]], name: str):
    module, attribute = names[name]
    return getattr(importlib.import_module(module), attribute)


def _option_read(expression: ast.expr) -> str | None:
    """The field X where `expression` is `options.X`, `int(options.X)`, `float(options.X)` or `options.X or ...`."""
    if isinstance(expression, ast.Call) and isinstance(expression.func, ast.Name) and expression.func.id in BARE \
            and len(expression.args) == 1:
        expression = expression.args[0]
    if isinstance(expression, ast.BoolOp) and isinstance(expression.op, ast.Or):
        expression = expression.values[0]
    if isinstance(expression, ast.Attribute) and isinstance(expression.value, ast.Name) \
            and expression.value.id == "options":
        return expression.attr
    return None


def _evaluate(names: dict, expression: ast.expr):
    """An imported name, an attribute of one, or what a call of one without arguments returns (the verbs'
    `modeling_options().ExportGgufOptions`)."""
    if isinstance(expression, ast.Name):
        return _resolve(names, expression.id)
    if isinstance(expression, ast.Attribute):
        return getattr(_evaluate(names, expression.value), expression.attr)
    if isinstance(expression, ast.Call) and not expression.args and not expression.keywords:
        return _evaluate(names, expression.func)()
    raise AssertionError(f"the verbs' reader cannot follow {ast.unparse(expression)}: teach it")


def _options_classes(function: ast.FunctionDef, names: dict) -> list[type]:
    """The classes `options` holds in a verb's handler: `options = from_args(Cls, args)`, or `options: Cls`."""
    made = [node.value.args[0] for node in ast.walk(function)
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "options" for t in node.targets)
            and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "from_args"]
    made += [a.annotation for a in function.args.args
             if a.arg == "options" and isinstance(a.annotation, ast.Name) and a.annotation.id in names]
    return [_evaluate(names, expression) for expression in made]


def verb_handoffs() -> list[tuple[str, object, str, list[dataclasses.Field]]]:
    """Every call in hitoban/verbs/ that hands a ranged option bare to a function of hitoban: (where, the function,
    its argument's name, the option's fields that range could be: one per options class the handler holds)."""
    found = []
    for path in sorted(Path(hitoban.verbs.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        own = f"hitoban.verbs.{path.stem}" if path.stem != "__init__" else "hitoban.verbs"
        module_names = {**{n.name: (own, n.name) for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)},
                        **_imported(tree.body)}
        for function in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
            names = {**module_names, **_imported(ast.walk(function))}
            classes = _options_classes(function, names)
            for call in (n for n in ast.walk(function) if isinstance(n, ast.Call)):
                if not isinstance(call.func, ast.Name) or call.func.id not in names \
                        or not names[call.func.id][0].startswith("hitoban"):
                    continue
                target = _resolve(names, call.func.id)
                if not inspect.isfunction(target):
                    continue
                parameters = [name for name, p in inspect.signature(target).parameters.items()
                              if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]  # `argv_for(Cls, **values)` builds
                given = [*zip(parameters, call.args),  # a command line whose own verb checks them: not a taker
                         *((k.arg, k.value) for k in call.keywords if k.arg in parameters)]
                for argument, expression in given:
                    name = _option_read(expression)
                    fields = [cls.__dataclass_fields__[name] for cls in classes
                              if name in cls.__dataclass_fields__ and ranged(cls.__dataclass_fields__[name])]
                    if fields:
                        found.append((f"{path.name}:{call.lineno}", target, argument, fields))
    return found


HANDOFFS = verb_handoffs()
CHECKED = sorted({target for _, target, _, _ in HANDOFFS}, key=lambda f: f"{f.__module__}.{f.__qualname__}")


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


def test_every_ranged_option_a_verb_hands_on_bare_is_checked_by_the_function_that_takes_it():
    """Found in the verbs' code, not listed: a function that takes a ranged option's value bare checks it against
    the same range (a caller of the library gets what the command line gives)."""
    where = {place for place, *_ in HANDOFFS}
    assert len(HANDOFFS) >= 20 and {"data.py", "pretraining.py", "models.py", "measure.py", "start.py",
                                    "federated.py"} <= {place.split(":")[0] for place in where}
    for place, target, argument, fields in HANDOFFS:
        checked = getattr(target, "checked_arguments", {})
        assert argument in checked, f"{place}: {target.__qualname__}({argument}=...) is not checked"
        theirs = {k: checked[argument].metadata.get(k) for k in LIMITS}
        assert any({k: f.metadata.get(k) for k in LIMITS} == theirs for f in fields), (place, argument)


def test_the_verbs_code_is_read_for_every_form_of_a_bare_option():
    """The reader's own control: each form a verb hands an option on in is found, and a computed value is not."""
    source = """
from hitoban.training.pretrain.killtest import run_killtest
def _verb(options: KillTestOptions):
    run_killtest(options.data, options.work, steps=int(options.steps), kills=options.kills or 2)
    run_killtest(options.data, options.work, None, options.steps + 1)
"""
    tree = ast.parse(source)
    call = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "run_killtest"]
    assert [_option_read(k.value) for k in call[0].keywords] == ["steps", "kills"]
    assert [_option_read(a) for a in call[1].args] == ["data", "work", None, None]


def _stand_in(parameter: inspect.Parameter, tmp: Path):
    """A value for a required argument the range check never reads: a path inside `tmp`."""
    return tmp / parameter.name


@st.composite
def a_broken_argument(draw):
    target = draw(st.sampled_from(CHECKED))
    argument = draw(st.sampled_from(sorted(a for a, f in target.checked_arguments.items() if ranged(f))))
    return target, argument, draw(outside(target.checked_arguments[argument]))


@hypothesis.settings(max_examples=120, deadline=None)
@hypothesis.given(broken=a_broken_argument())
def test_a_library_function_refuses_what_its_verb_refuses_before_anything_is_written(broken, tmp_path_factory):
    target, argument, value = broken
    tmp = tmp_path_factory.mktemp("library")
    required = {name: _stand_in(p, tmp) for name, p in inspect.signature(target).parameters.items()
                if p.default is inspect.Parameter.empty and name != argument}
    with pytest.raises(UsageError) as refused:
        target(**required, **{argument: value})
    assert str(refused.value).startswith(f"{target.__name__}({argument}=...) {value:g}: must be")
    assert "\n" not in str(refused.value) and list(tmp.iterdir()) == []


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


OPTION_MODULES = ("hitoban.start_options", "hitoban.training.finetune.options", "hitoban.training.data.options",
                  "hitoban.training.federated.options", "hitoban.training.import_options",
                  "hitoban.training.pretrain.options", "hitoban.evaluation.options", "hitoban.release.options",
                  "hitoban.modeling.options", "hitoban.training.data.filters", "hitoban.training.data.chat",
                  "hitoban.training.finetune.lora")


def checked_classes() -> list[type]:
    """Every options and settings dataclass with ranges (hitoban.options.Checked and its subclasses)."""
    from hitoban.options import Checked

    for module in OPTION_MODULES:
        importlib.import_module(module)
    found, todo = set(), [Checked]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if dataclasses.is_dataclass(cls) and any(ranged(f) for f in dataclasses.fields(cls)):
            found.add(cls)
    return sorted(found, key=lambda c: f"{c.__module__}.{c.__qualname__}")


def made(cls: type):
    """`cls` with its defaults, its required fields given plain values (a name, a list of one, 1)."""
    plain = {"str": "x", "list[str]": ["x"], "int": 1}
    return cls(**{f.name: plain[str(f.type)] for f in dataclasses.fields(cls)
                  if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING})


CHECKED_CLASSES = checked_classes()


@st.composite
def a_broken_assignment(draw):
    cls = draw(st.sampled_from(CHECKED_CLASSES))
    f = draw(st.sampled_from([f for f in dataclasses.fields(cls) if ranged(f)]))
    return cls, f, draw(outside(f)), draw(in_range(f))


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(broken=a_broken_assignment())
def test_options_changed_after_they_were_made_keep_their_ranges(broken):
    """A library caller who sets a field of options already made (`config.steps = 0`) is refused as making them so
    would be, and the options keep the value they had; a value inside the range is taken."""
    cls, f, bad, good = broken
    options = made(cls)
    before = getattr(options, f.name)
    with pytest.raises(UsageError, match=r"must be"):
        setattr(options, f.name, bad)
    assert getattr(options, f.name) == before
    setattr(options, f.name, good)
    assert getattr(options, f.name) == good


def test_every_options_class_with_ranges_is_found():
    names = {cls.__name__ for cls in CHECKED_CLASSES}
    assert {"PretrainConfig", "FinetuneOptions", "CorpusOptions", "FilterSettings", "LoraSettings", "KvcacheOptions",
            "KillTestOptions", "ServeOptions", "DoctorOptions"} <= names and len(names) >= 25
