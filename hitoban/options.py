"""Options defined once: a dataclass field per option, with its help and its default.

Every verb's options are such a dataclass (`training/pretrain/options.py`, `training/finetune/options.py`, ...);
its command line is built from it (as `transformers.HfArgumentParser` does, but into the subcommand parsers the CLI
already has) and the library function takes it, so an option or a default is never written twice, and the kill
test hands the night's exact options to its runs (`to_argv`). A value's range is declared with it too, and held
wherever a value arrives: options made or changed after (`Checked`), a component's settings (`CheckedSettings`), a
library function's bare argument (`checked_against`).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import field

from hitoban.errors import UsageError


def option(default=dataclasses.MISSING, help: str = "", *, factory=None, **meta):  # noqa: A002 - argparse's word
    """A dataclass field with its command-line help. `factory` makes a fresh default (a list). meta: choices, group
    (a mutually exclusive group that must be given), flag (the spelling of a boolean switch), off and off_help (a
    second switch that sets a boolean back, the pair exclusive: `--private` / `--public`), parse (a callable for
    the value), metavar, nargs, positional (an argument without a flag), repeat (given once per value); and the
    value's range, checked by `check_ranges` before anything is read or written: min, max (inclusive), above, below
    (exclusive)."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help, **meta})
    return field(default=default, metadata={"help": help, **meta})


RANGE_WORDS = {"min": ("at least", lambda v, b: v >= b), "max": ("at most", lambda v, b: v <= b),
               "above": ("above", lambda v, b: v > b), "below": ("below", lambda v, b: v < b)}


def out_of_range(value, limits) -> str | None:
    """How `value` breaks `limits` (any of min, max, above, below among them), e.g. "must be at least 1"; None
    when it keeps them."""
    for key, (words, holds) in RANGE_WORDS.items():
        if key in limits and not holds(value, limits[key]):
            return f"must be {words} {limits[key]:g}"
    return None


def check_ranges(options, spelled: Callable[[dataclasses.Field], str] | None = None) -> None:
    """Every field within its declared range, or a UsageError naming the option as the command line spells it (the
    library's callers get the same check as the command line's), or as `spelled(field)` names it."""
    for f in dataclasses.fields(options):
        _check(f, getattr(options, f.name), spelled)


def checked_against(cls: type, *same: str, **fields: str):
    """A library function that takes options' values as bare arguments (not in a `cls`) refuses, before it starts,
    what the command line refuses: each argument named in `same` is checked against `cls`'s field of that name,
    each of `fields` (argument=field) against the field it names, the value named as the caller wrote it
    (`run_killtest(kills=...) 0: must be at least 1`). The pairs stay on the function (`checked_arguments`): the
    verbs' test reads them to find any ranged option a verb hands to a function that would not check it."""
    pairs = {**{name: name for name in same}, **fields}
    missing = [name for name in pairs.values() if name not in cls.__dataclass_fields__]
    if missing:
        raise TypeError(f"{cls.__name__} has no field {missing}")

    def wrap(function: Callable) -> Callable:
        signature = inspect.signature(function)

        @functools.wraps(function)
        def checked(*args, **kwargs):
            given = signature.bind(*args, **kwargs).arguments
            for argument, name in pairs.items():
                if argument in given:
                    _check(cls.__dataclass_fields__[name], given[argument],
                           lambda _, argument=argument: f"{function.__name__}({argument}=...)")
            return function(*args, **kwargs)

        checked.checked_arguments = {argument: cls.__dataclass_fields__[name] for argument, name in pairs.items()}
        return checked

    return wrap


def _check(f: dataclasses.Field, value, spelled: Callable[[dataclasses.Field], str] | None = None) -> None:
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return
    if (broken := out_of_range(value, f.metadata)) is not None:
        raise UsageError(f"{(spelled or _command_line_name)(f)} {value:g}: {broken}")


def _command_line_name(f: dataclasses.Field) -> str:
    return f.name if f.metadata.get("positional") else _flag(f)


class Checked:
    """A verb's options whose ranges are checked as soon as they are made, and whenever a field is set after (a
    library caller's `options.steps = 0` is refused as `PretrainConfig(steps=0)` would be)."""

    def _spelled(self, f: dataclasses.Field) -> str:
        return _command_line_name(f)

    def __post_init__(self) -> None:
        check_ranges(self, self._spelled)

    def __setattr__(self, name: str, value) -> None:
        f = getattr(type(self), "__dataclass_fields__", {}).get(name)
        if f is not None:
            _check(f, value, self._spelled)
        super().__setattr__(name, value)


class CheckedSettings(Checked):
    """A component's settings (the filters', an adapter's) whose ranges are checked as soon as they are made, for
    callers of the library who make them directly; the verbs' options copy these fields (`same_as`), ranges
    included, so both say the same. A broken value is named as the caller wrote it: `FilterSettings(max_chars=0)`."""

    def _spelled(self, f: dataclasses.Field) -> str:
        return f"{type(self).__name__}({f.name}=...)"


def parse_count(text: str) -> int:
    return int(float(text))  # 1e9 and 1_000_000 both work for token budgets


def _flag(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def add_options(parser: argparse.ArgumentParser, cls: type, only: tuple[str, ...] | None = None,
                skip: tuple[str, ...] = (), optional: tuple[str, ...] = ()) -> None:
    """Add `cls`'s fields (or `only` those, minus `skip` and the class's own `not_offered`) as options; fields
    without a default are required unless named in `optional`. Every help ends with the default (the CLI's formatter
    shows it). A class lists in `not_offered` the inherited fields its verb never reads (they keep their defaults),
    so `--help` shows only what the verb uses."""
    hints = typing.get_type_hints(cls)
    skip = (*skip, *getattr(cls, "not_offered", ()))
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for f in dataclasses.fields(cls):
        if (only is not None and f.name not in only) or f.name in skip:
            continue
        kind = hints[f.name]
        base = next((t for t in typing.get_args(kind) if t is not type(None)), kind)
        if typing.get_origin(base) is list:
            base = typing.get_args(base)[0]
        meta, kwargs = f.metadata, {"help": f.metadata.get("help", ""), "dest": f.name}
        default = _default(f)
        if base is bool and meta.get("off"):
            pair = parser.add_mutually_exclusive_group()
            pair.add_argument(_flag(f), action="store_true", default=default, **kwargs)
            pair.add_argument(meta["off"], action="store_false", dest=f.name, help=meta.get("off_help", ""))
            continue
        if base is bool:
            kwargs.update(action="store_false" if default else "store_true", default=default)
        else:
            kwargs.update(type=meta.get("parse", base), metavar=meta.get("metavar"), nargs=meta.get("nargs"))
            if meta.get("repeat"):  # `--x a --x b`; given no time, the dataclass's default (from_args)
                kwargs.update(action="append", default=None, choices=meta.get("choices"))
                parser.add_argument(_flag(f), **{k: v for k, v in kwargs.items() if v is not None or k == "default"})
                continue
            if meta.get("choices"):
                kwargs["choices"] = meta["choices"]
            if meta.get("positional"):
                given = {k: v for k, v in kwargs.items() if v is not None and k != "dest"}
                parser.add_argument(f.name, **given, **({} if default is dataclasses.MISSING else {"default": default}))
                continue
            if default is dataclasses.MISSING:
                kwargs["required"] = f.name not in optional and "group" not in meta
                kwargs["default"] = None
            else:
                kwargs["default"] = default
        target = parser
        if meta.get("group"):
            if meta["group"] not in groups:
                groups[meta["group"]] = parser.add_mutually_exclusive_group(required=True)
            target = groups[meta["group"]]
        target.add_argument(_flag(f), **{k: v for k, v in kwargs.items() if v is not None or k == "default"})


def from_args(cls: type, args: argparse.Namespace, **overrides):
    """The dataclass of parsed `args` (fields the parser did not define keep their defaults, as do repeatable
    options given no time)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {name: getattr(args, name) for name, f in fields.items() if hasattr(args, name)
              and not (f.metadata.get("repeat") and getattr(args, name) is None)}
    return cls(**{**values, **overrides})


def same_as(cls: type, name: str, **meta):
    """A field with the same default and help as `cls`'s field `name` (another verb's own copy of a shared option:
    the default and its help are still written once)."""
    f = cls.__dataclass_fields__[name]
    return option(f.default, **{**f.metadata, **meta})


def flag_of(cls: type, name: str) -> str:
    """How the command line spells `cls`'s field `name`."""
    return _flag(cls.__dataclass_fields__[name])


def argv_for(cls: type, **values) -> list[str]:
    """Command-line arguments that set `cls`'s fields to `values`, spelled as `add_options` spells them (a switch
    appears when its value is not the default; None is left out)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    argv: list[str] = []
    for name, value in values.items():
        f = fields[name]  # a KeyError names a field the dataclass does not have
        if value is None:
            continue
        if isinstance(value, bool):
            if value != _default(f):
                argv += [f.metadata["off"] if f.metadata.get("off") and not value else _flag(f)]
        else:
            argv += [_flag(f), str(value)]
    return argv


def to_argv(options, cls: type | None = None, skip: tuple[str, ...] = ("data",)) -> list[str]:
    """The fields of `cls` (default: all of `options`'s) as command-line arguments again (the kill test's runs),
    defaults included, so a changed default can never make the kill test run another night than the one it vouches
    for."""
    names = [f.name for f in dataclasses.fields(cls or type(options)) if f.name not in skip]
    return argv_for(cls or type(options), **{name: getattr(options, name) for name in names})


__all__ = ["Checked", "add_options", "argv_for", "check_ranges", "checked_against", "flag_of", "from_args",
           "to_argv", "option", "parse_count", "same_as"]
