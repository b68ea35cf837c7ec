"""Publishing verbs: the secret scan, the model card, the allow-listed upload and the Space."""

from __future__ import annotations

import sys

from hitoban.errors import ExitCode
from hitoban.verbs import print_json, verb


def _secrets_args(p):
    p.add_argument("dir", nargs="?", default=".", help="folder to scan (default: here)")
    p.add_argument("--git", action="store_true", help="also scan every commit of the git history")


@verb("secrets", "scan files (and --git history) for tokens, keys, passwords, home paths (exit 1 on findings)")(
    _secrets_args)
def _secrets(args) -> int:
    from hitoban.release.secrets import scan_all

    report = scan_all(args.dir, git=args.git)
    findings = report.findings
    for line in report.skipped_lines():
        print(line)
    for finding in findings[:80]:
        print(finding)
    if len(findings) > 80:
        print(f"... and {len(findings) - 80} more")
    if findings:
        print(f"{len(findings)} finding(s). Revoke any real key first (rewriting history does not un-leak it), "
              "then remove it from the files and, with --git findings, from the history.")
        return int(ExitCode.CHECK_FAILED)
    print(f"no secrets found in {report.scanned} file(s) of {args.dir}{' and its git history' if args.git else ''}")
    return 0


def _card_args(p):
    p.add_argument("model_dir", help="the from_pretrained folder to publish")
    p.add_argument("--repo", required=True, help="OWNER/NAME on the Hub (used in the usage snippet)")
    p.add_argument("--from", dest="search", nargs="*", default=[], metavar="DIR",
                   help="folders to search for artefacts (run, corpus, eval, pii results); the model folder is "
                        "always searched")
    p.add_argument("--out", help="default MODEL_DIR/README.md (--format llama: MODEL_DIR-llama/README.md)")
    _format_arg(p)


def _format_arg(p):
    from hitoban.release.formats import FORMAT_HELP, FORMATS

    p.add_argument("--format", choices=FORMATS, default="hitoban", help=FORMAT_HELP)


@verb("card", "write the model card (README.md) from the run's artefacts; missing ones say 'not measured'")(
    _card_args)
def _card(args) -> int:
    from hitoban.release.card import write_card

    result = write_card(args.model_dir, args.repo, args.search, args.out, fmt=args.format)
    print(f"model card -> {result['card']}\n  measured: {', '.join(result['measured'])}\n  not measured: "
          f"{', '.join(result['not_measured']) or 'nothing'}")
    return 0


def _publish_args(p):
    p.add_argument("--dry-run", action="store_true", help="list what would be uploaded and skipped; send nothing")
    visibility = p.add_mutually_exclusive_group()
    visibility.add_argument("--private", dest="private", action="store_true", default=True,
                            help="create the repo private (default)")
    visibility.add_argument("--public", dest="private", action="store_false", help="create the repo public")


def _run_publish(verb_name: str, publish) -> int:
    """Print the result as JSON; a refusal is exit 1 with its reasons on stderr."""
    from hitoban.release.upload import UploadRefused

    try:
        result = publish()
    except UploadRefused as err:
        print(f"hitoban {verb_name}: {err}", file=sys.stderr)
        return int(ExitCode.CHECK_FAILED)
    print_json(result)
    return 0


def _upload_args(p):
    p.add_argument("model_dir", help="the from_pretrained folder, with its model card (README.md from `hitoban card`)")
    p.add_argument("--repo", required=True, help="OWNER/NAME")
    _publish_args(p)
    p.add_argument("--create-pr", action="store_true", help="open a pull request instead of pushing to main")
    p.add_argument("--include", nargs="*", default=[], metavar="PATTERN", help="extra allow-list globs")
    p.add_argument("--pii", help="PII probe JSON (default MODEL_DIR/pii.json)")
    p.add_argument("--i-know", metavar="REASON", help="publish despite an exact PII reproduction; REASON is recorded")
    _format_arg(p)


@verb("upload", "allow-listed upload to the Hub (refuses on secrets, no card, optimizer/logs, PII leaks)")(
    _upload_args)
def _upload(args) -> int:
    from hitoban.release.upload import upload_model

    return _run_publish("upload", lambda: upload_model(args.model_dir, args.repo, args.dry_run, args.private,
                                                       args.create_pr, args.include, args.pii, args.i_know,
                                                       fmt=args.format))


def _space_args(p):
    p.add_argument("--repo", required=True, help="OWNER/NAME of the Space")
    p.add_argument("--model", required=True, help="OWNER/NAME of the model the Space serves")
    _publish_args(p)


@verb("space", "publish the Gradio chat Space (spaces/) for a model on the Hub")(_space_args)
def _space(args) -> int:
    from hitoban.release.upload import publish_space

    return _run_publish("space", lambda: publish_space(args.repo, args.model, args.dry_run, args.private))
