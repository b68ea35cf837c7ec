"""Training-data reader: memory-mapped shards, batches as a pure function of (seed, step) (docs/design.md §5).

`batch(seed, step, batch_size, ctx)` draws, with `numpy.random.default_rng([seed, step])`, a shard for each row
(proportional to shard tokens) and a random offset in it; a row is a window of ctx + 1 tokens (inputs and
next-token targets), which may cross document boundaries. Nothing about the data position needs saving: any
process given (seed, step) builds the same array, which is what makes exact resume and DDP consistent.
Under DDP each rank takes its contiguous slice of the global batch, so the global batch equals the single-process one;
a federated machine takes any range of the rows (`rows`, which `batch` is a slice of), so the machines of a round
train the single run's rows.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from hitoban.training.data.shards import ShardError, load_index, shard_file, verify_shards


class ShardReader:
    """Random-access reader over one split of a shard folder. Cheap checks (sizes, boundaries) run on open."""

    def __init__(self, folder: str | os.PathLike, split: str = "train", verify: bool = True):
        self.folder = Path(folder)
        self.index = load_index(self.folder)
        if verify:
            verify_shards(self.folder, full=False)
        self.split = split
        self.shards = [s for s in self.index["shards"] if s["split"] == split]
        if not self.shards:
            raise ShardError(f"{self.folder}: no {split} shards")
        dtype = np.dtype(self.index["dtype"]).newbyteorder("<")
        self.arrays = [np.memmap(shard_file(self.folder, s["name"]), dtype=dtype, mode="r") for s in self.shards]
        self.tokens = np.array([len(a) for a in self.arrays], dtype=np.int64)
        self.domains = self.index["domains"]
        self.vocab_size = self.index["tokenizer"]["vocab_size"]
        self.end_id = self.index["tokenizer"]["end_id"]

    @property
    def total_tokens(self) -> int:
        return int(self.tokens.sum())

    def _draw(self, seed: int, step: int, batch_size: int, ctx: int) -> tuple[np.ndarray, np.ndarray]:
        """(shard, offset) of every row of global batch (seed, step): the night's one random draw."""
        usable = self.tokens - ctx - 1
        if (usable < 0).all():
            raise ShardError(f"every {self.split} shard is shorter than one window of {ctx + 1} tokens")
        weights = np.where(usable >= 0, self.tokens, 0).astype(np.float64)
        rng = np.random.default_rng([seed, step])
        shard_ids = rng.choice(len(self.arrays), size=batch_size, p=weights / weights.sum())
        return shard_ids, rng.integers(0, usable[shard_ids] + 1)

    def batch(self, seed: int, step: int, batch_size: int, ctx: int, rank: int = 0, world_size: int = 1) -> np.ndarray:
        """int64 array (batch_size // world_size, ctx + 1): this rank's rows of global batch (seed, step)."""
        if batch_size % world_size:
            raise ValueError(f"global batch {batch_size} is not divisible by {world_size} processes")
        per_rank = batch_size // world_size
        first = step * batch_size + rank * per_rank
        return self.rows(seed, np.arange(first, first + per_rank), batch_size, ctx)

    def rows(self, seed: int, positions: np.ndarray, global_batch: int, ctx: int) -> np.ndarray:
        """int64 rows (len(positions), ctx + 1) at budget positions of the night's batches: position p is row
        p % global_batch of global batch (seed, p // global_batch). A DDP rank's slice is one such range, and a
        federated task another, cut wherever the task is: machines train exactly the rows a single machine at that
        global batch would."""
        steps, places = np.divmod(np.asarray(positions, dtype=np.int64), global_batch)
        out = np.empty((len(steps), ctx + 1), dtype=np.int64)
        for step in np.unique(steps):
            shard_ids, offsets = self._draw(seed, int(step), global_batch, ctx)
            for i in np.flatnonzero(steps == step):
                r = places[i]
                out[i] = self.arrays[shard_ids[r]][offsets[r] : offsets[r] + ctx + 1]
        return out

    def domain_documents(self, max_tokens: int) -> dict[str, list[np.ndarray]]:
        """Whole documents per domain, in file order, until the next one would pass `max_tokens` (at least one):
        a domain is never cut mid-document."""
        parts: dict[str, list[np.ndarray]] = {}
        sizes: dict[str, int] = {}
        full: set[str] = set()
        for ids, domain in self.documents():
            if domain in full:
                continue
            if domain in parts and sizes[domain] + len(ids) > max_tokens:
                full.add(domain)
                continue
            parts.setdefault(domain, []).append(ids)
            sizes[domain] = sizes.get(domain, 0) + len(ids)
        return parts

    def domain_streams(self, max_tokens: int) -> dict[str, np.ndarray]:
        """Concatenated whole documents per domain, at most `max_tokens` each (per-domain validation loss)."""
        return {d: np.concatenate(docs) for d, docs in self.domain_documents(max_tokens).items()}

    def documents(self) -> Iterator[tuple[np.ndarray, str]]:
        """(token ids incl. the closing <|end|>, domain name) for every document, in file order (val/test)."""
        for shard, array in zip(self.shards, self.arrays):
            domain_ids = (np.fromfile(shard_file(self.folder, shard["domains_file"]), dtype=np.uint8)
                          if "domains_file" in shard else None)
            ends = np.flatnonzero(np.asarray(array) == self.end_id)
            if domain_ids is not None and (len(domain_ids) != len(ends) or (
                    len(domain_ids) and domain_ids.max() >= len(self.domains))):
                raise ShardError(f"{shard['domains_file']}: {len(domain_ids)} domain ids for {len(ends)} documents, "
                                 "or an unknown one; rebuild the shards (`hitoban shards`)")
            start = 0
            for i, end in enumerate(ends):
                yield np.asarray(array[start : end + 1], dtype=np.int64), (
                    self.domains[domain_ids[i]] if domain_ids is not None else "all")
                start = end + 1
