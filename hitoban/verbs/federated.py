"""`hitoban federate serve|join|keys`: one model trained by several machines (DiLoCo on Flower). Flower is an
optional extra (`pip install 'hitoban[federated]'`); without it the verb says so, and `--help` works either way."""

from __future__ import annotations

from hitoban.errors import UsageError
from hitoban.verbs import print_json, verb


def _federate_args(p):
    from hitoban.options import add_options
    from hitoban.training.federated.options import JoinOptions, KeysOptions, ServeOptions

    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True, help="serve, join or keys (each has "
                           "its own --help)")
    for name, cls, text in (
            ("serve", ServeOptions, "start the server: Flower's SuperLink and hitoban's rounds; resumes after a crash "
                                    "with the same command"),
            ("join", JoinOptions, "this machine trains the server's tasks (Flower's SuperNode); dials out, so home "
                                  "NAT is fine"),
            ("keys", KeysOptions, "make the CA, the server's TLS certificate and a key pair per machine")):
        add_options(sub.add_parser(name, description=text, help=text, formatter_class=p.formatter_class), cls)


def _require_flower() -> None:
    try:
        import flwr  # noqa: F401
    except ImportError:
        raise UsageError("hitoban federate needs Flower: pip install 'hitoban[federated]'") from None


@verb("federate", "train one model on several machines over the internet (DiLoCo on Flower): serve, join, keys")(
    _federate_args)
def _federate(args) -> int:
    from hitoban.options import from_args

    if args.action == "keys":
        from hitoban.training.federated.keys import make_keys
        from hitoban.training.federated.options import KeysOptions

        options = from_args(KeysOptions, args)
        print_json(make_keys(options.out, options.machine, options.host, options.days))
        return 0
    _require_flower()
    from hitoban.training.federated import launch
    from hitoban.training.federated.options import JoinOptions, ServeOptions

    if args.action == "serve":
        summary = launch.serve(from_args(ServeOptions, args))
        print_json({k: summary[k] for k in ("rounds", "tokens_seen", "best_val", "resumes", "per_machine")})
        return 0
    return launch.join(from_args(JoinOptions, args))
