"""Publishing verbs: the secret scan, the model card, the allow-listed upload and the Space."""

from __future__ import annotations

import sys

from hitoban.errors import ExitCode
from hitoban.release.options import CardOptions, SecretsOptions, SpaceOptions, UploadOptions
from hitoban.verbs import print_json, verb_of


@verb_of("secrets", "scan files (and --git history) for tokens, keys, passwords, home paths (exit 1 on findings)",
         SecretsOptions)
def _secrets(options: SecretsOptions) -> int:
    from hitoban.release.secrets import scan_all

    report = scan_all(options.dir, git=options.git)
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
    print(f"no secrets found in {report.scanned} file(s) of {options.dir}"
          f"{' and its git history' if options.git else ''}")
    return 0


@verb_of("card", "write the model card (README.md) from the run's artefacts; missing ones say 'not measured'",
         CardOptions)
def _card(options: CardOptions) -> int:
    from hitoban.release.card import write_card

    result = write_card(options.model_dir, options.repo, options.search, options.out, fmt=options.format)
    print(f"model card -> {result['card']}\n  measured: {', '.join(result['measured'])}\n  not measured: "
          f"{', '.join(result['not_measured']) or 'nothing'}")
    return 0


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


@verb_of("upload", "allow-listed upload to the Hub (refuses on secrets, no card, optimizer/logs, PII leaks)",
         UploadOptions)
def _upload(options: UploadOptions) -> int:
    from hitoban.release.upload import upload_model

    return _run_publish("upload", lambda: upload_model(
        options.model_dir, options.repo, options.dry_run, options.private, options.create_pr, options.include,
        options.pii, options.i_know, fmt=options.format))


@verb_of("space", "publish the Gradio chat Space (spaces/) for a model on the Hub", SpaceOptions)
def _space(options: SpaceOptions) -> int:
    from hitoban.release.upload import publish_space

    return _run_publish("space", lambda: publish_space(options.repo, options.model, options.dry_run, options.private))
