"""The test suite's own machinery under pytest-xdist: a session fixture is built once for all workers."""

from __future__ import annotations

import threading
import time

import conftest
import pytest


class Factory:
    """What `built_once` reads of pytest's tmp_path_factory, for one worker of a run rooted at `root`."""

    def __init__(self, root, worker):
        self.base = root / f"popen-{worker}"
        self.base.mkdir(parents=True, exist_ok=True)

    def getbasetemp(self):
        return self.base


def test_workers_asking_at_once_build_a_session_folder_once_and_share_it(tmp_path, monkeypatch):
    monkeypatch.setattr(conftest, "WORKERS", 2)
    builds, folders = [], []

    def build(folder):
        builds.append(folder)
        time.sleep(0.3)  # long enough for the other worker to ask meanwhile
        (folder / "made").write_text(str(len(builds)))

    workers = [threading.Thread(target=lambda w=w: folders.append(conftest.built_once(Factory(tmp_path, w), "x",
                                                                                        build)))
               for w in ("gw0", "gw1")]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(builds) == 1 and folders[0] == folders[1] == tmp_path / "x"
    assert (tmp_path / "x" / "made").read_text() == "1"


def test_a_failed_build_leaves_no_mark_and_the_next_worker_builds_again(tmp_path, monkeypatch):
    monkeypatch.setattr(conftest, "WORKERS", 2)

    def broken(folder):
        (folder / "half").write_text("half-written")
        raise RuntimeError("the build failed")

    with pytest.raises(RuntimeError):
        conftest.built_once(Factory(tmp_path, "gw0"), "x", broken)
    folder = conftest.built_once(Factory(tmp_path, "gw1"), "x", lambda f: (f / "made").write_text("ok"))
    assert sorted(p.name for p in folder.iterdir()) == ["made"]  # the half-written build was removed first


def test_one_process_builds_in_a_folder_of_its_own_each_time(tmp_path_factory, monkeypatch):
    monkeypatch.setattr(conftest, "WORKERS", 1)
    first = conftest.built_once(tmp_path_factory, "x", lambda f: None)
    assert conftest.built_once(tmp_path_factory, "x", lambda f: None) != first
