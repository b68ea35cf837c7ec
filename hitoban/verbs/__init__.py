"""The verbs of `hitoban`, one module per stage of the night; each verb parses, calls one library function and
prints its summary (the library writes the artefacts). `hitoban.cli` builds the parser from VERBS.
Lazy imports, in every verb module here: each verb imports its library when it runs, so `hitoban --help` and the
light verbs (`leaks`, `secrets`, `watch`, `shards --verify`, `card`, `upload --dry-run`) start without torch or
transformers (tests/hitoban/test_startup.py)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from hitoban.errors import UsageError
from hitoban.options import add_options, from_args

VERBS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


def verb(name: str, help: str):
    """Register `add_arguments` + `run` for a verb; `run` returns the exit code."""

    def decorate(add_arguments):
        def register(run):
            VERBS[name] = (help, add_arguments, run)
            return run

        return register

    return decorate


def verb_of(name: str, help: str, options: type):
    """Register a verb whose options are the dataclass `options` (its one declaration): `run` receives the checked
    dataclass, not argparse's namespace."""

    def register(run):
        VERBS[name] = (help, lambda parser: add_options(parser, options), lambda args: run(from_args(options, args)))
        return run

    return register


def print_json(result: dict) -> None:
    print(json.dumps(result, ensure_ascii=False, indent=2))


def parse_pairs(items: list[str] | None, kind=float) -> dict:
    """NAME=VALUE pairs from repeated flags (`--share aozora=0.1`)."""
    pairs = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"expected NAME=VALUE, got {item!r}")
        pairs[name] = kind(float(value)) if kind is int else kind(value)
    return pairs
