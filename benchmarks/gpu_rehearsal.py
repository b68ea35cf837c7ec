"""The GPU check's rehearsal on this CPU: both parts of benchmarks/gpu_check.sh, at small sizes, in an environment
that holds nothing but torch (with the packages torch itself requires) and the carried wheel set.

The GPU machine brings its own torch and little else; whatever the check imports must be in the wheels carried to
it (benchmarks/gpu_requirements.txt). Run here, in a virtualenv without this machine's site-packages, that sees
torch's own distributions through a .pth file and installs the rest with --no-index from the same wheel list, a
missing import fails the rehearsal instead of a lent GPU's minutes. The slow test tier runs it.

    python benchmarks/gpu_rehearsal.py --out OUT [--wheels DIR] [--parts first second]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from importlib.metadata import Distribution, PackageNotFoundError, distribution
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
WHEELS = Path.home() / ".cache" / "hitoban" / f"gpu-wheels-cp{VERSION.replace('.', '')}"


def closure(name: str) -> list[Distribution]:
    """`name`'s distribution and every one it requires (for this interpreter), as installed here."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: dict[str, Distribution] = {}
    todo = [name]
    while todo:
        key = canonicalize_name(todo.pop())
        if key in seen:
            continue
        try:
            seen[key] = found = distribution(key)
        except PackageNotFoundError:  # an optional platform dependency absent here (e.g. CUDA wheels)
            continue
        for text in found.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return list(seen.values())


def torch_only_folder(folder: Path) -> Path:
    """A folder of links to torch's installed files and its requirements' (packages and .dist-info), nothing else."""
    folder.mkdir(parents=True, exist_ok=True)
    for dist in closure("torch"):
        for file in dist.files or []:
            top = file.parts[0]
            if top in ("..", "__pycache__") or (folder / top).exists():
                continue
            (folder / top).symlink_to(Path(dist.locate_file(top)).resolve())
    return folder


def fetch_wheels(wheels: Path) -> None:
    """The carried wheel list for this Python, fetched once (benchmarks/gpu_wheels.sh)."""
    if (wheels / ".complete").exists():
        return
    subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_wheels.sh"), str(wheels), VERSION], check=True)
    (wheels / ".complete").write_text(time.strftime("%Y-%m-%d") + "\n")


def build_env(env: Path) -> dict[str, str]:
    """A virtualenv without this machine's site-packages, torch linked in; returns the environment to run it."""
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    # venv's own old setuptools would shadow the one torch requires (linked below), as the GPU machine's does not
    subprocess.run([str(env / "bin" / "python"), "-m", "pip", "uninstall", "-q", "-y", "setuptools"], check=True)
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(env), "platbase": str(env)}))
    (purelib / "torch-only.pth").write_text(str(torch_only_folder(env / "torch-only")) + "\n")
    keep = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    path = os.pathsep.join([str(other_interpreters_pip(env / "other-pip")), str(env / "bin"), keep.get("PATH", "")])
    return {**keep, "VIRTUAL_ENV": str(env), "PATH": path}


def other_interpreters_pip(folder: Path) -> Path:
    """A `pip` and `pip3` that belong to no interpreter the check runs, on PATH before the venv's own.

    On the lent H200, python3 is /opt/torch/.venv's but the `pip` on PATH was another interpreter's: a bare `pip
    install` saw none of torch's environment and failed. The check must install through `python3 -m pip`.
    """
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("pip", "pip3"):
        shim = folder / name
        shim.write_text("#!/bin/sh\necho \"$0: this pip belongs to another interpreter (as on the lent H200)\" >&2\n"
                        "exit 1\n")
        shim.chmod(0o755)
    return folder


def rehearse(out: Path, wheels: Path = WHEELS, parts: tuple[str, ...] = ("first", "second")) -> dict:
    """Both parts on the CPU; returns {part: (exit code, gpu_check.json, seconds)}."""
    fetch_wheels(wheels)
    environment = {**build_env(out / "env"), "HITOBAN_WHEELS": str(wheels)}
    results = {}
    for part in parts:
        built = out / "first" / "data"
        if part == "second" and (built / "shards" / "shards_index.json").exists():
            # the same data command built these: the second part keeps them, as on a GPU machine still warm
            shutil.copytree(built, out / part / "data")
        started = time.time()
        done = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), str(out / part), part,
                               "--rehearsal"], cwd=REPO, env=environment, capture_output=True, text=True)
        (out / f"{part}.log").write_text(done.stdout + done.stderr, encoding="utf-8")
        report = out / part / "gpu_check.json"
        results[part] = (done.returncode, json.loads(report.read_text()) if report.exists() else None,
                         round(time.time() - started, 1))
        print(f"{part}: exit {done.returncode} in {results[part][2]} s\n{done.stdout[-3000:]}{done.stderr[-2000:]}",
              flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="a new folder: the environment, both parts' results")
    parser.add_argument("--wheels", default=str(WHEELS), help=f"the wheel set for this Python (default: {WHEELS})")
    parser.add_argument("--parts", nargs="+", choices=["first", "second"], default=["first", "second"])
    args = parser.parse_args()
    results = rehearse(Path(args.out).resolve(), Path(args.wheels), tuple(args.parts))
    sys.exit(max(code for code, _, _ in results.values()))


if __name__ == "__main__":
    main()
