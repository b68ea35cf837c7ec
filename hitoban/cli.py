"""`hitoban <verb>`: one command; the verbs live in hitoban/verbs/ (one module per stage), thin wrappers over library
functions (what tests call).
Lazy imports: `hitoban` (the package) only for `--version`; of hitoban/verbs/, only the module of the verb
that runs (`build_parser`)."""

from __future__ import annotations

import argparse
import importlib
import sys

from hitoban.errors import ExitCode, HitobanError
from hitoban.verbs import VERBS

PIPELINE = {  # the order a night goes in; `hitoban --help` lists the verbs this way
    "start here": ["demo", "doctor"],
    "data": ["corpus", "tokenizer", "shards"],
    "pretraining": ["calibrate", "killtest", "pretrain", "watch", "plot"],
    "several machines": ["federate"],
    "fine-tuning": ["check-mask", "sft", "tone", "chat"],
    "evaluation": ["eval", "compare", "leaks", "pii"],
    "publishing": ["secrets", "card", "upload", "space"],
    "models": ["check-kvcache", "export-llama", "export-gguf", "import"],
}
VERB_NAMES = [name for names in PIPELINE.values() for name in names]
MODULES = {"start here": "start", "data": "data", "pretraining": "pretraining", "several machines": "federated",
           "fine-tuning": "finetune", "evaluation": "measure", "publishing": "publish", "models": "models"}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option shows its default, unless it has none worth showing or its help already says it."""

    def _get_help_string(self, action):
        help_text = action.help or ""
        switch = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
        if switch or action.default is None or action.default == argparse.SUPPRESS or "default" in help_text:
            return help_text
        return super()._get_help_string(action)


class VersionAction(argparse.Action):
    """`--version`, looked up only when asked (importlib.metadata would cost every verb a tenth of a second)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from hitoban import __version__

        print(f"hitoban {__version__}")  # on stdout, as argparse's own version action
        parser.exit()


def import_verbs(names: list[str]) -> None:
    """Import the modules in hitoban/verbs/ that register `names` (each module registers its group's verbs)."""
    for group, verbs in PIPELINE.items():
        if set(verbs) & set(names):
            importlib.import_module(f"hitoban.verbs.{MODULES[group]}")


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """Every verb's parser; or, given `verb` (what `main` runs), that verb's alone: only its module is imported and
    only its options are built, a tenth of a second less for every command (test_startup.py)."""
    ordered = VERB_NAMES if verb is None else [verb]
    import_verbs(ordered)
    epilog = None  # the listing of every verb, for `hitoban --help`
    if verb is None:
        assert sorted(ordered) == sorted(VERBS), f"verbs missing from PIPELINE: {set(VERBS) ^ set(ordered)}"
        width = max(map(len, ordered))
        listing = "\n".join(f"{group}:\n" + "\n".join(f"  {name:<{width}}  {VERBS[name][0]}" for name in names)
                            for group, names in PIPELINE.items())
        epilog = (f"verbs, in the order a night goes:\n{listing}\n\n`hitoban VERB --help` explains each option "
                  "with its default.")
    parser = argparse.ArgumentParser(
        prog="hitoban", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train a small language model overnight on one GPU or Mac, measure it honestly, publish it.",
        epilog=epilog)
    parser.add_argument("--version", action=VersionAction, help="show the installed version and exit")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True, help="one of the verbs below")
    for name in ordered:
        help_text, add_arguments, run = VERBS[name]
        p = sub.add_parser(name, description=help_text, formatter_class=HelpFormatter)
        add_arguments(p)
        p.set_defaults(handler=run)
    return parser


def one_line(message: str) -> str:
    """The message with control characters escaped: a file name holding a newline or an escape sequence must not
    break the one error line or drive the terminal."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in message)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv[0] if argv and argv[0] in VERB_NAMES else None).parse_args(argv)
    args.argv = argv  # the command as given (`pretrain --supervise` relaunches exactly it)
    try:
        return args.handler(args)
    except HitobanError as err:  # something the user can act on: one line and its named exit code
        print(f"hitoban {args.verb}: error: {one_line(str(err))}", file=sys.stderr)
        return int(err.exit_code)
    except KeyboardInterrupt:
        print(f"hitoban {args.verb}: interrupted", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
    # anything else is a bug or an environment failure (CUDA OOM, a torch internal): its traceback is shown


if __name__ == "__main__":
    sys.exit(main())
