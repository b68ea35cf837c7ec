"""evaluation/options.py: `hitoban compare`, `leaks`, `pii` and `check-kvcache` take every default from the library
that uses it (read here from the library itself), and refuse values outside today's ranges in one line."""

from __future__ import annotations

import dataclasses
import inspect

from option_edges import accepts, check_edges

from hitoban.evaluation import compare, kvcache, leaks, privacy
from hitoban.evaluation.options import CompareOptions, KvcacheOptions, LeaksOptions, PiiOptions


def defaults(function) -> dict:
    return {name: p.default for name, p in inspect.signature(function).parameters.items()}


def test_defaults_are_the_libraries():
    options, lib = CompareOptions(models=["m"]), defaults(compare.compare_models)
    assert (options.max_new_tokens, options.seed) == (lib["max_new_tokens"], lib["seed"])
    options, lib = LeaksOptions(holdout="h", corpus=["c"]), defaults(leaks.scan_for_leaks)
    assert (options.encoding, options.engine, options.out) == (lib["encoding"], lib["engine"], lib["out"])
    options, lib = PiiOptions(corpus=["c"]), defaults(privacy.probe_model)
    assert (options.samples, options.max_new_tokens) == (lib["samples"], lib["max_new_tokens"])
    lib = defaults(privacy.canary_control)
    assert tuple(int(x) for x in options.repetitions.split(",")) == lib["repetitions"] and options.seed == lib["seed"]
    assert options.steps == 400  # the command line's own (canary_control's default trains longer)
    options, lib = KvcacheOptions(), defaults(kvcache.check_kvcache)
    assert (options.model, options.steps, options.atol, options.break_rope_offset) == (
        lib["model"], lib["steps"], lib["atol"], lib["break_rope_offset"])


def test_every_engine_offered_is_one_the_matcher_runs():
    from hitoban.evaluation.matching import LeakScanError, Matcher

    engines = {f.name: f for f in dataclasses.fields(LeaksOptions)}["engine"].metadata["choices"]
    for engine in engines:
        try:
            Matcher([b"x" * 40], engine=engine)
        except ImportError:  # hyperscan has no wheel here: offered, refused by the import, not as unknown
            continue
        except LeakScanError as err:
            assert "unknown engine" not in str(err), engine


def test_the_command_line_gives_the_dataclass_defaults():
    assert accepts("compare", CompareOptions, ["m1", "m2"]) == CompareOptions(models=["m1", "m2"])
    assert accepts("leaks", LeaksOptions, ["--holdout", "h", "--corpus", "a", "b"]) == LeaksOptions(
        holdout="h", corpus=["a", "b"])
    assert accepts("pii", PiiOptions, ["--corpus", "c"]) == PiiOptions(corpus=["c"])
    assert accepts("pii", PiiOptions, ["m", "--corpus", "c"]).model == "m"
    assert accepts("check-kvcache", KvcacheOptions, []) == KvcacheOptions()


def test_ranges_at_their_edges(capsys):
    check_edges("compare", CompareOptions, ["m"], {"--max-new-tokens": (["1"], ["0"]), "--seed": (["0"], ["-1"])},
                capsys)
    check_edges("pii", PiiOptions, ["--corpus", "c"], {
        "--samples": (["1"], ["0"]), "--max-new-tokens": (["1"], ["0"]), "--canaries": (["1"], ["0"]),
        "--steps": (["1"], ["0"]), "--seed": (["0"], ["-1"])}, capsys)
    check_edges("check-kvcache", KvcacheOptions, [], {"--steps": (["1"], ["0"]), "--atol": (["1e-12"], ["0", "-1"])},
                capsys)
