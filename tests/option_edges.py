"""What the option tests share: a verb's options at the edges of their ranges, through the real command line."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import strategies as st

from hitoban.cli import build_parser, main
from hitoban.options import from_args


def accepts(verb: str, cls: type, argv: list[str]):
    """The options `hitoban VERB ARGV` would run with (the CLI's parser, then the dataclass's range check)."""
    return from_args(cls, build_parser().parse_args([verb, *argv]))


def check_edges(verb: str, cls: type, required: list[str], edges: dict[str, tuple[list[str], list[str]]],
                capsys) -> None:
    """Each flag takes every value of its first list, and refuses every value of its second with exit 2 and one
    line naming the flag and the value, before anything is read or written (values spelled as the message does)."""
    for flag, (good, bad) in edges.items():
        name = flag.lstrip("-").replace("-", "_")
        for value in good:
            assert float(getattr(accepts(verb, cls, [*required, flag, value]), name)) == float(value), (flag, value)
        for value in bad:
            capsys.readouterr()
            code = main([verb, *required, flag, value])
            lines = capsys.readouterr().err.splitlines()
            assert code == 2 and len(lines) == 1 and f"{flag} {value}:" in lines[0], (flag, value, lines)


def ranged(f: dataclasses.Field) -> bool:
    """Whether a field is a number with a declared range (hitoban/options.py: min, max, above, below)."""
    return bool(set(f.metadata) & {"min", "max", "above", "below"})


def whole_number(f: dataclasses.Field) -> bool:
    """Whether a field holds integers (its annotation, a string under `from __future__ import annotations`)."""
    return "int" in str(f.type) and "float" not in str(f.type)


def in_range(f: dataclasses.Field, top: float = 1e7) -> st.SearchStrategy:
    """Values a field's declared range admits, its edges among them (an open edge's nearest value inside; up to
    `top` where it has none above): integers for an int field, floats otherwise."""
    meta = f.metadata
    low = meta.get("min", meta.get("above", 0))
    high = meta.get("max", meta.get("below", top))
    if whole_number(f):
        edges = [int(low) + ("above" in meta), int(high) - ("below" in meta)]
        return st.one_of(st.sampled_from(edges), st.integers(edges[0], edges[1]))
    inside = st.floats(low, high, exclude_min="above" in meta, exclude_max="below" in meta)
    # an open edge's nearest value inside (above 0: 5e-324, which int() makes 0), a closed edge itself
    edges = [math.nextafter(low, high) if "above" in meta else low,
             math.nextafter(high, low) if "below" in meta else high]
    return st.one_of(st.sampled_from(edges), inside)


def outside(f: dataclasses.Field) -> st.SearchStrategy:
    """Values a field's declared range refuses, on every side it has, its edges among them (min 1 refuses 0 and
    0.999...; above 0 refuses 0 itself): integers for an int field, floats otherwise."""
    meta, sides = f.metadata, []
    whole = whole_number(f)
    if "min" in meta or "above" in meta:
        edge = meta.get("min", meta.get("above"))
        last = edge - 1 if whole and "min" in meta else edge  # the nearest refused value below
        if not whole and "min" in meta:
            last = math.nextafter(edge, -math.inf)
        sides.append(st.just(last))
        sides.append(st.integers(-10**9, int(last)) if whole else st.floats(-1e9, last))
    if "max" in meta or "below" in meta:
        edge = meta.get("max", meta.get("below"))
        first = edge + 1 if whole and "max" in meta else edge
        if not whole and "max" in meta:
            first = math.nextafter(edge, math.inf)
        sides.append(st.just(first))
        sides.append(st.integers(int(first), 10**9) if whole else st.floats(first, 1e9))
    return st.one_of(sides)
