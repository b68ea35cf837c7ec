"""`hitoban federate`'s options: the server offers only what it reads (issue 36)."""

from __future__ import annotations

import dataclasses

from hitoban.cli import build_parser
from hitoban.options import add_options
from hitoban.training.federated.options import JoinOptions, ServeOptions
from hitoban.training.pretrain.options import TrainingOptions

MACHINE_FLAGS = ("--precision", "--compile", "--cpu", "--memory-cap-gb", "--skip-memory-check", "--grad-accum")


def help_of(*argv: str) -> str:
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices[argv[0]]
    for word in argv[1:]:
        sub = sub._subparsers._group_actions[0].choices[word]
    return sub.format_help()


def test_serve_offers_no_machine_option_and_join_offers_them():
    """`federate serve --help` showed six options nothing read; each machine decides them with `join`."""
    serve, join = help_of("federate", "serve"), help_of("federate", "join")
    assert not [flag for flag in MACHINE_FLAGS if flag in serve]
    assert [flag for flag in ("--precision", "--cpu", "--grad-accum", "--memory-cap-gb") if flag not in join] == []
    assert "--inner-steps" in serve and "--lr" in serve  # the trajectory is the server's


def test_not_offered_is_every_machine_field_and_keeps_its_default():
    machine = {f.name for f in dataclasses.fields(TrainingOptions) if f.metadata.get("machine")}
    assert set(ServeOptions.not_offered) == machine
    assert {f.name for f in dataclasses.fields(JoinOptions)} >= {"cpu", "precision", "grad_accum"}


def test_negative_control_a_class_without_not_offered_shows_them():
    import argparse

    parser = argparse.ArgumentParser()
    add_options(parser, TrainingOptions)
    text = parser.format_help()
    assert all(flag in text for flag in MACHINE_FLAGS)
