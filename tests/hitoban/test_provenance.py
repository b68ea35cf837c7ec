"""hitoban/provenance.py's whole-or-nothing writes: many writers of one file, and a writer that fails."""

from __future__ import annotations

import json
import multiprocessing
import os

import pytest

from hitoban.provenance import replacing, write_json


def _write_many(path, rank: int) -> str | None:
    try:
        for i in range(200):
            write_json(path, {"rank": rank, "i": i, "pad": "x" * 20_000})
    except Exception as error:  # noqa: BLE001 - the test collects what a writer hit
        return f"{type(error).__name__}: {error}"
    return None


def test_writers_of_one_file_at_once_never_collide_and_leave_it_whole(tmp_path):
    """Issue 34: under DDP every rank wrote the same JSON through one fixed temporary name, so one rank's rename
    could take the other's half-written file, or find none and fail. 4 processes (as ranks are) x 200 writes of one
    file: no error, the file is one writer's whole record, no temporary file is left, and the mode is the umask's,
    not mkstemp's private 0600."""
    path = tmp_path / "summary.json"
    with multiprocessing.get_context("fork").Pool(4) as pool:
        errors = [e for e in pool.starmap(_write_many, [(path, rank) for rank in range(4)]) if e]
    assert errors == []
    record = json.loads(path.read_text())
    assert record["i"] == 199 and len(record["pad"]) == 20_000
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_failed_write_leaves_the_old_file_untouched(tmp_path):
    path = tmp_path / "report.json"
    write_json(path, {"good": True})
    with pytest.raises(RuntimeError), replacing(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("the writer dies here")
    assert json.loads(path.read_text()) == {"good": True}
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]
