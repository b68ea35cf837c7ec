"""User-facing errors: one line and a named exit code; anything else keeps its traceback (issue 12, finding 7)."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hitoban import errors
from hitoban.cli import main
from hitoban.errors import ExitCode, HitobanError, NotMeasured, UsageError
from hitoban.training.pretrain.monitor import TrainingDiverged

ERROR_CLASSES = [getattr(errors, name) for name in errors.__all__
                 if isinstance(getattr(errors, name), type) and issubclass(getattr(errors, name), HitobanError)]


def test_bad_input_is_one_line_with_exit_2(tmp_path, capsys):
    assert main(["eval", "bpc", str(tmp_path), "--domain", f"x={tmp_path / 'missing.txt'}"]) == ExitCode.BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "hitoban eval: error:" in err and "Traceback" not in err


def test_a_torch_failure_is_not_disguised_as_bad_input(monkeypatch):
    """A RuntimeError from inside torch (here: a stand-in for CUDA OOM) must surface with its traceback."""
    import hitoban.evaluation.kvcache as kvcache

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(kvcache, "check_kvcache", out_of_memory)
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        main(["check-kvcache"])


def test_divergence_and_not_measured_have_their_own_codes(monkeypatch, capsys):
    import hitoban.evaluation.kvcache as kvcache

    for error, code in ((TrainingDiverged("loss became nan"), ExitCode.DIVERGED),
                        (NotMeasured("nothing to measure"), ExitCode.NOT_MEASURED)):
        def fail(*args, _error=error, **kwargs):
            raise _error

        monkeypatch.setattr(kvcache, "check_kvcache", fail)
        assert main(["check-kvcache"]) == code
    assert issubclass(TrainingDiverged, HitobanError)  # recognised by class, not by its name as a string


@given(st.sampled_from(ERROR_CLASSES), st.text(max_size=40))
def test_every_user_error_prints_one_line_whatever_it_quotes(error_class, quoted):
    """The class behind a device named '\\n' (hypothesis found it): a message quoting what the user or the machine
    gave (a device name, a path, a file's text) still prints as one line, and still says what was quoted."""
    message = str(error_class(f"this GPU ({quoted}) has no native bf16"))
    assert not any(unicodedata.category(c) == "Cc" for c in message)
    assert message.startswith("this GPU (") and message.endswith(") has no native bf16")
    assert all(c in message for c in quoted if unicodedata.category(c) != "Cc")


def test_a_quoted_newline_through_the_command_is_one_line(monkeypatch, capsys):
    """The same through `hitoban`'s own printing, with the negative control: the plain exception keeps the newline."""
    import hitoban.evaluation.kvcache as kvcache

    def fail(*args, **kwargs):
        raise UsageError("this GPU (\nTesla M60) has no native bf16")

    monkeypatch.setattr(kvcache, "check_kvcache", fail)
    assert main(["check-kvcache"]) == ExitCode.BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "(\\nTesla M60)" in err
    assert "\n" in str(ValueError("this GPU (\nTesla M60)"))  # control: what one_line undoes
