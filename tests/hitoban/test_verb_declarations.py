"""Every verb's options come from one declaration: an option dataclass field (hitoban/options.py). Checked twice:
statically (no verb module writes an argparse option by hand) and on the built parser (every option a verb offers
is a declared field, with that field's help)."""

from __future__ import annotations

import argparse
import ast
import dataclasses
from pathlib import Path

import hitoban.verbs
from hitoban.cli import build_parser
from hitoban.options import Checked

HAND_WRITTEN = {"add_argument", "add_mutually_exclusive_group", "add_argument_group"}
VERBS_DIR = Path(hitoban.verbs.__file__).parent


def hand_written_options(source: str) -> list[int]:
    """Lines that declare an argparse option by hand."""
    return [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr in HAND_WRITTEN]


def declared_helps() -> dict[str, set[str]]:
    """Field name -> the helps it is declared with, over every option dataclass."""
    helps: dict[str, set[str]] = {}
    classes, seen = [Checked], set()
    while classes:
        cls = classes.pop()
        classes += [c for c in cls.__subclasses__() if c not in seen]
        seen.add(cls)
        if dataclasses.is_dataclass(cls):
            for f in dataclasses.fields(cls):
                helps.setdefault(f.name, set()).add(f.metadata.get("help", ""))
                if f.metadata.get("off"):
                    helps[f.name].add(f.metadata.get("off_help", ""))
    return helps


def undeclared(parser: argparse.ArgumentParser, helps: dict[str, set[str]], where: str = "") -> list[str]:
    """Options of `parser` (and its sub-commands) that no dataclass field declares with that help."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += undeclared(sub, helps, f"{where} {name}")
            continue
        if action.help not in helps.get(action.dest, set()):
            found.append(f"{where} {action.option_strings or action.dest}")
    return found


def test_no_verb_module_writes_an_option_by_hand():
    offenders = {path.name: lines for path in sorted(VERBS_DIR.glob("*.py"))
                 if (lines := hand_written_options(path.read_text(encoding="utf-8")))}
    assert not offenders


def test_negative_control_a_hand_written_option_is_found():
    source = 'def _args(p):\n    p.add_argument("--steps", type=int, default=3)\n    p.add_mutually_exclusive_group()\n'
    assert hand_written_options(source) == [2, 3]


def test_every_option_of_every_verb_is_a_declared_field():
    parser, helps = build_parser(), declared_helps()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [text for name, sub in verbs.choices.items() for text in undeclared(sub, helps, name)]
    assert not missing
    assert len(verbs.choices) >= 27  # the walk saw the verbs (an empty parser would pass anything)


def test_negative_control_a_hand_written_option_on_a_parser_is_undeclared():
    parser, helps = build_parser(), declared_helps()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    watch = verbs.choices["watch"]
    assert not undeclared(watch, helps)
    watch.add_argument("--every", type=float, default=5.0, help="seconds between refreshes")
    assert undeclared(watch, helps) == [" ['--every']"]
