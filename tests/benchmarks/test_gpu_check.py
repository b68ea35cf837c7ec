"""benchmarks/gpu_check.sh, rehearsed on the CPU from the carried wheels alone (benchmarks/gpu_rehearsal.py).

A lent GPU gives 15 minutes; an import missing from the wheels carried to it would spend them. The rehearsal runs
both parts of the check, at small sizes, in a virtualenv holding only torch (and what torch requires) plus
benchmarks/gpu_requirements.txt's wheels, installed with --no-index as on the GPU.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from conftest import REPO


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow(seconds=410)  # fetches ~45 MB of wheels once (cached), builds a virtualenv, both parts
def test_both_parts_of_the_gpu_check_run_from_the_carried_wheels_alone(tmp_path):
    results = load("gpu_rehearsal").rehearse(tmp_path)
    for part, stages in (("first", ["env", "data", "doctor", "pretrain"]),
                         ("second", ["data", "killtest", "model", "night"])):
        code, report, seconds = results[part]
        assert report is not None, (tmp_path / f"{part}.log").read_text()[-3000:]
        assert [s["stage"] for s in report["stages"]] == stages
        failed = {s["stage"]: s["tail"][-800:] for s in report["stages"] if s["exit"] != 0}
        assert code == 0 and not failed, failed
        assert not any(r.startswith("(no result") for r in (s["result"] for s in report["stages"]))
        assert seconds < 480  # the part's budget on the GPU holds here too, at the rehearsal's sizes
    doctor = json.loads((tmp_path / "first" / "doctor" / "doctor.json").read_text())
    assert doctor["passed"] and len(doctor["checks"]) == 8


def test_the_rehearsal_environment_holds_torch_and_what_it_requires_and_nothing_else(tmp_path):
    """The negative side of the rehearsal: the linked folder must not leak this machine's other packages."""
    folder = load("gpu_rehearsal").torch_only_folder(tmp_path / "torch-only")
    names = {p.name for p in folder.iterdir()}
    assert "torch" in names and any(n.startswith("torch-") and n.endswith(".dist-info") for n in names)
    for leaked in ("transformers", "accelerate", "numpy", "hitoban", "datasets", "gradio"):
        assert leaked not in names


def test_a_part_out_of_time_reports_its_stages_as_not_run_and_fails(tmp_path):
    """The part's deadline is kept: with no time left no stage starts, each says so in the report, the exit is 1."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--out", str(tmp_path),
                           "--part", "first", "--seconds", "1"], capture_output=True, text=True, timeout=60)
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert done.returncode == 1 and [s["exit"] for s in report["stages"]] == [None] * 4
    assert all(s["result"].startswith("not run") for s in report["stages"])
    assert "not run" in (tmp_path / "gpu_check.md").read_text()


def test_the_carried_requirements_pin_nothing_that_torch_itself_requires():
    """The GPU machine's torch chooses its own requirements' versions: a pin beside them can conflict with a torch
    we never ran (the first lent H200's torch 2.11 needs setuptools<82; the list pinned 84 and the install
    stopped). Read from this machine's torch metadata, so a new requirement of torch's is caught too."""
    from importlib.metadata import requires

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    required = [Requirement(text) for text in requires("torch") or []]
    torchs = {canonicalize_name(r.name) for r in required if r.marker is None or r.marker.evaluate({"extra": ""})}
    pinned = {canonicalize_name(Requirement(line).name)
              for line in (REPO / "benchmarks" / "gpu_requirements.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    assert "setuptools" in torchs  # the rule is checked against a requirement list that names the H200's conflict
    assert not pinned & torchs, pinned & torchs


def test_the_check_installs_with_its_own_interpreters_pip(tmp_path):
    """On the H200 `pip` on PATH was another interpreter's; the rehearsal puts such a pip first, and the script
    must never call a bare pip (negative control: the shim refuses)."""
    import re
    import subprocess

    code = [line for line in (REPO / "benchmarks" / "gpu_check.sh").read_text().splitlines()
            if not line.lstrip().startswith("#")]
    assert not [line for line in code if re.search(r"(?<!-m )\bpip3?\s", line)], "gpu_check.sh calls a bare pip"
    shims = load("gpu_rehearsal").other_interpreters_pip(tmp_path / "other")
    refused = subprocess.run([str(shims / "pip"), "install", "x"], capture_output=True, text=True)
    assert refused.returncode == 1 and "another interpreter" in refused.stderr
