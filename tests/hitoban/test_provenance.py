"""hitoban/provenance.py's whole-or-nothing writes: many writers of one file, and a writer that fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hitoban.provenance import replacing, write_json

WRITER = """
import sys
from hitoban.provenance import write_json
path, rank = sys.argv[1], int(sys.argv[2])
for i in range(200):
    write_json(path, {"rank": rank, "i": i, "pad": "x" * 20_000})
"""


def test_writers_of_one_file_at_once_never_collide_and_leave_it_whole(tmp_path):
    """Issue 34: under DDP every rank wrote the same JSON through one fixed temporary name, so one rank's rename
    could take the other's half-written file, or find none and fail. 4 processes (as ranks are) x 200 writes of one
    file: no error, the file is one writer's whole record, no temporary file is left, and the mode is the umask's,
    not mkstemp's private 0600."""
    path = tmp_path / "summary.json"
    # Separate interpreters, as ranks are (a forked pool here could inherit a lock held by one of torch's threads)
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(rank)], stderr=subprocess.PIPE,
                                text=True) for rank in range(4)]
    errors = [(w.wait(timeout=300), w.stderr.read()) for w in writers]
    assert [e for e in errors if e[0]] == []
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


def _folder(tmp_path):
    """A folder with sharded weights, an index and every tokenizer file (bytes only: identity is content)."""
    folder = tmp_path / "model"
    folder.mkdir()
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    for i, name in enumerate(shards):
        (folder / name).write_bytes(bytes([i]) * 64)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": shards[0], "b": shards[1]}}))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                 "tokenizer.model"):
        (folder / name).write_text(name)
    (folder / "config.json").write_text("{}")
    return folder


def test_identity_is_the_content_of_every_weight_and_tokenizer_file(tmp_path):
    """Issue 35.1, over every file: changing any weight or tokenizer file's bytes, or adding a weight file, changes
    the identity; files outside it (config, card) do not; an index naming a missing shard has no identity."""
    from hitoban.provenance import TOKENIZER_IDENTITY_FILES, model_identity, weight_files, weights_sha256

    folder = _folder(tmp_path)
    before = model_identity(folder)
    for name in weight_files(folder) + list(TOKENIZER_IDENTITY_FILES):
        original = (folder / name).read_bytes()
        (folder / name).write_bytes(original + b" ")
        assert model_identity(folder) != before, name
        (folder / name).write_bytes(original)
    assert model_identity(folder) == before
    (folder / "config.json").write_text('{"x": 1}')
    (folder / "README.md").write_text("card")
    assert model_identity(folder) == before
    (folder / "model.safetensors").write_bytes(b"other weights beside the shards")
    assert weights_sha256(folder) != before["weights_sha256"]
    (folder / "model.safetensors").unlink()
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="missing shard"):
        weights_sha256(folder)


def test_a_single_weights_file_is_identified_by_its_own_sha256(tmp_path):
    """`sha256sum model.safetensors` keeps naming a single-file model, as every recorded artefact does."""
    import hashlib

    from hitoban.provenance import weights_sha256

    (tmp_path / "model.safetensors").write_bytes(b"weights")
    assert weights_sha256(tmp_path) == hashlib.sha256(b"weights").hexdigest()
    (tmp_path / "model-00001-of-00001.safetensors").write_bytes(b"more")
    assert weights_sha256(tmp_path) != hashlib.sha256(b"weights").hexdigest()


def test_a_lineage_that_is_not_an_object_is_a_named_error(tmp_path):
    from hitoban.provenance import read_lineage

    assert read_lineage(tmp_path) is None
    for text in ("[1]", "{not json", '"x"'):
        (tmp_path / "lineage.json").write_text(text)
        with pytest.raises(ValueError, match="not a lineage record"):
            read_lineage(tmp_path)
