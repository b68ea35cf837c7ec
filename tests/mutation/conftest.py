"""The mutation harness's one fixture: the README's path built once per session (about 10 s on 2 cores)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mutation_artefacts import build_night


@pytest.fixture(scope="session")
def night(tmp_path_factory, corpus) -> dict[str, Path]:
    """corpus, tok, shards, run (with final/), reports, release and the small inputs the verbs take: never mutated
    (each case damages a copy)."""
    return build_night(corpus, tmp_path_factory.mktemp("night"))
