"""Files from a package's source archive on the registry, fetched once and cached under ~/.cache/hitoban.

transformers' common model tests and llama.cpp's `convert_hf_to_gguf.py` (vendored in llama-cpp-python's archive)
are real clients the suite runs unmodified. A package registry is the one network CI reaches; `fetch` returns None
without it, and the tests that need the files skip as `network` tests do.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

CACHE = Path.home() / ".cache" / "hitoban"


def fetch(requirement: str, prefixes: tuple[str, ...], name: str) -> Path | None:
    """Extract every archive member under `prefixes` (paths inside the archive's top folder) to CACHE/name."""
    target = CACHE / name
    if (target / ".complete").exists():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        fetched = subprocess.run([sys.executable, "-m", "pip", "download", requirement, "--no-binary", ":all:",
                                  "--no-deps", "-d", tmp, "-q"], capture_output=True, text=True)
        archives = list(Path(tmp).glob("*.tar.gz"))
        if fetched.returncode or not archives:
            return None
        staging = target.with_suffix(".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        top = archives[0].name[: -len(".tar.gz")]
        with tarfile.open(archives[0]) as tar:
            for member in tar.getmembers():
                inner = member.name[len(top) + 1:]
                if member.isfile() and inner.startswith(prefixes):
                    out = staging / inner
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(tar.extractfile(member).read())
    (staging / ".complete").write_text(requirement)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target
