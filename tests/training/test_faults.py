"""training/faults.py, the one owner of the HITOBAN_* hooks (issue 36): parsing, the read-once cache, scoped blocks,
to_env round trips into a real subprocess, and refusals that name the hook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from hitoban.training import faults
from hitoban.training.faults import ENV, Faults, FaultsError


@pytest.fixture
def fresh_cache(monkeypatch):
    """The environment's hooks re-read in this test only (and again after it, for the tests that follow)."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv(faults.CPU_BF16_ENV, raising=False)
    faults._from_environment.cache_clear()
    yield monkeypatch
    faults._from_environment.cache_clear()


def test_nothing_set_means_every_hook_off():
    off = faults.parse({})
    assert off == Faults() and off.named() == {}
    assert (off.pause_in_save, off.state_digest_dir, off.deterministic, off.clock_skew, off.inf_loss,
            off.federated_step_pause, off.federated_nan_delta, off.cpu_bf16) == (0.0, None, False, None, None, 0.0,
                                                                                 False, None)


def test_the_json_variable_sets_each_hook_with_its_type():
    hooks = faults.parse({ENV: json.dumps({"pause_in_save": 1, "state_digest_dir": "/tmp/d", "deterministic": True,
                                           "clock_skew": [1, 100000], "inf_loss": [1, 7],
                                           "federated_step_pause": 1.5, "federated_nan_delta": True,
                                           "cpu_bf16": False})})
    assert hooks == Faults(1.0, "/tmp/d", True, (1, 100000.0), (1, 7), 1.5, True, False)
    assert faults.parse({ENV: "  "}) == Faults()  # empty: nothing set


def test_the_documented_cpu_bf16_alias_is_accepted_and_the_json_hook_wins_over_it():
    assert faults.parse({faults.CPU_BF16_ENV: "0"}).cpu_bf16 is False
    assert faults.parse({faults.CPU_BF16_ENV: "1"}).cpu_bf16 is True
    assert faults.parse({faults.CPU_BF16_ENV: "1", ENV: '{"cpu_bf16": false}'}).cpu_bf16 is False
    with pytest.raises(FaultsError, match="HITOBAN_CPU_BF16='yes': it takes 0 .* or 1"):
        faults.parse({faults.CPU_BF16_ENV: "yes"})


@pytest.mark.parametrize("text, message", [
    ('{"pause_in_sav": 1}', r"HITOBAN_FAULTS: unknown fault hook pause_in_sav; the known hooks are pause_in_save, "),
    ('{"a": 1, "b": 2}', "unknown fault hooks a, b"),
    ("pause_in_save=1", "is not JSON"),
    ("[1, 2]", "it takes a JSON object"),
    ('{"pause_in_save": "1"}', "pause_in_save='1': it takes seconds"),
    ('{"pause_in_save": -1}', "pause_in_save=-1: it takes seconds, a number >= 0"),
    ('{"deterministic": 1}', "deterministic=1: it takes true or false"),
    ('{"inf_loss": [1]}', r"inf_loss=\[1\]: it takes \[rank, step\]"),
    ('{"inf_loss": [1, 7.5]}', r"it takes \[rank, step\] \(two integers\)"),
    ('{"clock_skew": "1:100"}', r"clock_skew='1:100': it takes \[rank, seconds\]"),
    ('{"cpu_bf16": 0}', "cpu_bf16=0: it takes true, false or null"),
])
def test_a_wrong_variable_is_refused_naming_the_hook(text, message):
    with pytest.raises(FaultsError, match=message):
        faults.parse({ENV: text})


def test_an_unknown_hook_name_is_refused_everywhere_with_the_known_ones():
    for call in (lambda: faults.make(pause=1), lambda: faults.to_env(pause=1),
                 lambda: faults.scoped(pause=1).__enter__()):
        with pytest.raises(FaultsError, match="unknown fault hook pause; the known hooks are .*federated_nan_delta"):
            call()
    assert faults.active() == faults._from_environment()  # the refused scoped() left nothing behind


def test_the_environment_is_read_once_and_cached(fresh_cache):
    fresh_cache.setenv(ENV, '{"deterministic": true}')
    first = faults.active()
    assert first.deterministic
    fresh_cache.setenv(ENV, '{"pause_in_save": 3}')  # changed after the first read: not seen
    assert faults.active() is first
    faults._from_environment.cache_clear()
    assert faults.active() == faults.make(pause_in_save=3)


def test_a_bad_environment_fails_at_the_first_read(fresh_cache):
    fresh_cache.setenv(ENV, '{"pause": 1}')
    with pytest.raises(FaultsError, match="unknown fault hook pause"):
        faults.active()


def test_scoped_sets_hooks_over_the_environment_nests_and_restores(fresh_cache):
    fresh_cache.setenv(ENV, '{"deterministic": true}')
    assert faults.clock_skew(1) == 0.0 and faults.planted_inf_step(1) is None
    with faults.scoped(clock_skew=(1, 5), inf_loss=(0, 7)) as outer:
        assert outer is faults.active() and outer.deterministic  # over the environment's hooks
        assert faults.clock_skew(1) == 5.0 and faults.clock_skew(0) == 0.0
        assert faults.planted_inf_step(0) == 7 and faults.planted_inf_step(1) is None
        with faults.scoped(clock_skew=None):
            assert faults.clock_skew(1) == 0.0 and faults.planted_inf_step(0) == 7
        assert faults.clock_skew(1) == 5.0
        seen = []
        thread = threading.Thread(target=lambda: seen.append(faults.active()))  # every thread of the process
        thread.start()
        thread.join()
        assert seen == [outer]
    assert faults.active() == faults.make(deterministic=True)
    with pytest.raises(RuntimeError), faults.scoped(pause_in_save=2):
        raise RuntimeError  # an exception leaves the block restored too
    assert faults.active().pause_in_save == 0.0


def test_to_env_round_trips_through_parse_and_into_a_subprocess(tmp_path):
    hooks = {"pause_in_save": 1, "state_digest_dir": tmp_path, "deterministic": True, "clock_skew": (1, 100000),
             "inf_loss": (1, 7), "federated_step_pause": 1.5, "federated_nan_delta": True, "cpu_bf16": False}
    env = faults.to_env(**hooks)
    assert list(env) == [ENV] and faults.parse(env) == faults.make(**hooks)
    assert faults.to_env() == {ENV: "{}"} and faults.parse(faults.to_env()) == Faults()
    assert faults.parse(faults.to_env(cpu_bf16=True)).cpu_bf16 is True  # not dropped as "falsy"
    child_env = {k: v for k, v in os.environ.items() if k not in (ENV, faults.CPU_BF16_ENV)}
    probe = ("import dataclasses, json; from hitoban.training import faults; "
             "print(json.dumps(dataclasses.asdict(faults.active())))")
    out = subprocess.run([sys.executable, "-c", probe], env={**child_env, **env}, capture_output=True, text=True,
                         check=True).stdout
    assert Faults(**json.loads(out)) == faults.make(**hooks)
    # the module is standard library only: the light verbs of the console script may import it
    light = subprocess.run([sys.executable, "-c", "import sys; from hitoban.training import faults; "
                            "print(sorted({'torch', 'transformers'} & set(sys.modules)))"],
                           env=child_env, capture_output=True, text=True, check=True).stdout
    assert light.strip() == "[]"


def test_the_docstring_lists_every_hook_with_who_uses_it():
    doc = faults.__doc__
    for hook in faults.HOOKS:
        assert f"\n  {hook} " in doc, hook
    for variable in (ENV, faults.CPU_BF16_ENV):
        assert variable in doc
