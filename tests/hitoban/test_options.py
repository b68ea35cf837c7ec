"""Options defined once (hitoban/options.py): the command line from the dataclass, and the kill test's
runs given the night's exact options back."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from hitoban.options import add_options, argv_for, from_args, to_argv
from hitoban.release.options import UploadOptions
from hitoban.training.pretrain.options import PretrainConfig, TrainingOptions


def test_the_command_line_is_built_from_the_dataclass_defaults_and_all():
    parser = argparse.ArgumentParser()
    add_options(parser, PretrainConfig)
    args = parser.parse_args(["--data", "d", "--out", "o", "--steps", "7"])
    parsed = from_args(PretrainConfig, args)
    assert parsed == PretrainConfig(data="d", out="o", steps=7)  # every default comes from the dataclass
    args = parser.parse_args(["--data", "d", "--out", "o", "--tokens", "1e6", "--no-adam-bias-correction",
                              "--no-progress", "--optimizer", "muon", "--dropout", "0.1"])
    parsed = from_args(PretrainConfig, args)
    assert (parsed.tokens, parsed.adam_bias_correction, parsed.progress, parsed.optimizer, parsed.dropout) == (
        1_000_000, False, False, "muon", 0.1)
    with pytest.raises(SystemExit):  # the budget is one of --tokens / --steps / --hours, and required
        parser.parse_args(["--data", "d", "--out", "o", "--steps", "3", "--hours", "1"])


def test_the_kill_test_gets_the_nights_exact_options_back():
    night = TrainingOptions(data="shards", preset="small", lr=1e-3, adam_bias_correction=False, optimizer="muon",
                            schedule="wsd", dropout=0.1, cpu=True, context=128)
    parser = argparse.ArgumentParser()
    add_options(parser, TrainingOptions)
    again = from_args(TrainingOptions, parser.parse_args(["--data", "shards"] + to_argv(night)))
    assert again == night
    # every trajectory option is spelled out, defaults included: a changed default cannot slip past the kill test
    argv = to_argv(TrainingOptions(data="x"))
    assert "--optimizer" in argv and "--weight-decay" in argv and "--seed" in argv and "--data" not in argv
    from hitoban.training.optimizer import lr_for_width

    assert argv[argv.index("--lr") + 1] == f"{lr_for_width(512):g}"  # resolved once (3lm, 512 wide): the number
    assert TrainingOptions(data="x", optimizer="adamw").lr == 6e-4 and TrainingOptions(data="x", lr=1e-3).lr == 1e-3
    assert to_argv(dataclasses.replace(night, lr=2e-3)) != to_argv(night)  # and a change is carried


def test_the_default_lr_is_the_measured_one_for_the_optimizer_and_shape():
    from hitoban.training.pretrain.options import PretrainConfig

    def lr(**options):
        return PretrainConfig(data="d", out="o", steps=1, **options).lr

    from hitoban.training.optimizer import LR_AT_256, lr_for_width

    assert lr(preset="small") == LR_AT_256  # the rule's anchor: small is 256 wide
    assert lr(preset="tiny") > lr(preset="small") > lr(preset="zxell-s") > lr(preset="3lm") == lr_for_width(512)
    assert lr(preset="small", optimizer="adamw") == 6e-4 and lr(preset="small", lr=1e-3) == 1e-3


def test_an_on_off_switch_pair_is_one_field_and_the_two_exclude_each_other():
    """`--private` / `--public` (release/options.py) declare one boolean: given neither it keeps its default, each
    switch sets it, both at once are refused by argparse in one line, and argv_for spells the value back."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_options(parser, UploadOptions)
    base = ["MODEL", "--repo", "me/m"]
    assert from_args(UploadOptions, parser.parse_args(base)).private is True
    assert from_args(UploadOptions, parser.parse_args([*base, "--public"])).private is False
    assert from_args(UploadOptions, parser.parse_args([*base, "--private"])).private is True
    with pytest.raises(argparse.ArgumentError, match="not allowed with argument --private"):
        parser.parse_args([*base, "--private", "--public"])
    assert argv_for(UploadOptions, private=False) == ["--public"] and argv_for(UploadOptions, private=True) == []
