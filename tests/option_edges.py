"""What the option tests share: a verb's options at the edges of their ranges, through the real command line."""

from __future__ import annotations

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
