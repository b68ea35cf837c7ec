"""The exact matcher under the leak scan (evaluation/matching.py): every engine finds a planted probe at any byte
offset and chunk border, and its self-test fails a scanner that does not."""

from __future__ import annotations

import numpy as np
import pytest
from evaluation_helpers import FILLER, HOLDOUT_LINE
from hypothesis import given, settings
from hypothesis import strategies as st

from hitoban.evaluation.leaks import LeakScanError, make_probes, self_test
from hitoban.evaluation.matching import Matcher, scan_bytes_chunks

ENGINES = ["sampled-grams", "hyperscan", "ahocorasick-rs"]


@pytest.mark.parametrize("engine", ENGINES)
def test_self_test_passes_for_each_engine(engine):
    self_test(lambda patterns: Matcher(patterns, engine))


def test_self_test_fails_for_a_scanner_that_misses_chunk_borders():
    class WithinChunkOnly(Matcher):
        """Negative control: drops every match that needed the overlap carried from the previous chunk."""

        def find(self, data):
            return [(pid, end) for pid, end in super().find(data) if end - len(self.patterns[pid]) >= 95]

    with pytest.raises(LeakScanError, match="self-test failed"):
        self_test(lambda patterns: WithinChunkOnly(patterns, "ahocorasick-rs"))


@settings(max_examples=60, deadline=None)
@given(offset=st.integers(min_value=0, max_value=6000), chunk=st.integers(min_value=200, max_value=3000),
       engine=st.sampled_from(ENGINES))
def test_a_planted_probe_is_found_exactly_once_at_any_byte_offset(offset, chunk, engine):
    probe = next(iter(make_probes([HOLDOUT_LINE]))).encode()
    near_miss = probe[:-3] + "。".encode()  # differs in the last character only
    filler = (FILLER * 40).encode()
    data = filler[:offset] + probe + filler[offset:]
    matcher = Matcher([probe, near_miss], engine)
    counts, _ = scan_bytes_chunks((data[i : i + chunk] for i in range(0, len(data), chunk)), matcher)
    assert counts[0] == 1 and counts[1] == 0


def found_at_each_alignment(matcher) -> list[int]:
    probe = matcher.patterns[0]
    filler = (FILLER * 4).encode()
    return [len([1 for pid, _ in matcher.find(filler[:100 + shift] + probe + filler) if pid == 0])
            for shift in range(16)]


def test_sampled_grams_find_a_probe_at_every_alignment_and_the_control_does_not():
    from hitoban.evaluation.matching import SampledGrams

    probe = next(iter(make_probes([HOLDOUT_LINE]))).encode()
    assert found_at_each_alignment(Matcher([probe], "sampled-grams")) == [1] * 16

    matcher = Matcher([probe], "sampled-grams")  # negative control: keep only the grams at offset 0 of the probe
    matcher.grams.keys = {k: [(p, o) for p, o in v if o == 0] for k, v in matcher.grams.keys.items()}
    matcher.grams.keys = {k: v for k, v in matcher.grams.keys.items() if v}
    matcher.grams.sorted_keys = np.array(sorted(matcher.grams.keys), dtype=np.uint64)
    assert found_at_each_alignment(matcher) == [1 if shift % 8 == 4 else 0 for shift in range(16)]
    with pytest.raises(LeakScanError, match=">= 23 bytes"):
        SampledGrams([b"short"])
