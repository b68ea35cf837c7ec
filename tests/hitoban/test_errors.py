"""User-facing errors: one line and a named exit code; anything else keeps its traceback (issue 12, finding 7)."""

from __future__ import annotations

import pytest

from hitoban.cli import main
from hitoban.errors import ExitCode, HitobanError, NotMeasured
from hitoban.training.pretrain.monitor import TrainingDiverged


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
