"""Reshaping the code must not change what it trains: the tests' tiny nights (three pretraining runs, one resumed;
two federated tasks; the doctor's in-memory model) give bit-identical weights, checkpoints and logged losses with
this checkout and with the baseline commit's code, run side by side on this machine (so the CPU kind does not
matter). The baseline is the commit before the third reshaping of the house (issue 36); its code is taken from
this repository's own history with `git archive` and laid out as `setup.py` installs it."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

BASELINE = "712a309"  # One safetensors header reader (the last commit before issue 36)
ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("unchanged_driver.py")
AREAS = {"modeling": "modeling", "training": "training", "evaluation": "evaluation", "release": "release",
         "spaces": "spaces"}


def baseline_package(into: Path) -> Path:
    """The baseline's `hitoban` package as an install lays it out: hitoban/ with the area folders inside."""
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", BASELINE], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.fail(f"the baseline commit {BASELINE} is not in this clone's history ({error}); clone with history "
                    "(not --depth 1) to compare against it")
    source = into / "source"
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(source, filter="data")
    package = into / "site" / "hitoban"
    shutil.copytree(source / "hitoban", package)
    for area, folder in AREAS.items():
        shutil.copytree(source / folder, package / area)
    return into / "site"


def run_driver(data: Path, out: Path, pythonpath: str | None) -> dict:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    done = subprocess.run([sys.executable, str(DRIVER), str(data), str(out)], capture_output=True, text=True, env=env,
                          cwd=out.parent, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow(seconds=80)
def test_training_is_bit_identical_to_the_baseline_commit(tiny_shards, tmp_path):
    site = baseline_package(tmp_path / "baseline")
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    old = run_driver(tiny_shards, tmp_path / "old", str(site))
    new = run_driver(tiny_shards, tmp_path / "new", None)
    assert Path(old.pop("code")).is_relative_to(site.resolve()), "the baseline run did not use the baseline code"
    assert not Path(new.pop("code")).is_relative_to(site.resolve())
    assert set(old) == set(new)
    for name in old:
        assert new[name] == old[name], f"{name} changed against {BASELINE}"


def load_driver():
    import importlib.util

    spec = importlib.util.spec_from_file_location("unchanged_driver", DRIVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_comparison_sees_a_change():
    """Negative control: the driver's digest changes when the training does (another seed), and is the same for
    the same run twice, so equal digests above mean equal training, not a driver that reads nothing."""
    import numpy as np

    from hitoban.training.tiny import train_tiny

    driver = load_driver()
    first = driver.tiny_model()
    stream = np.random.default_rng(3).integers(0, 300, size=5000)
    other, _ = train_tiny(stream, 300, 12, seed=6, context=32, batch=4, max_positions=64)
    assert driver.digest_tensors(dict(other.state_dict())) != first["weights"]
    assert driver.tiny_model() == first
