"""The publishing verbs' options, defined once (hitoban/options.py's mechanism): `hitoban secrets`, `card`, `upload`
and `space`. Standard library only at import: `secrets`, `card` and `upload --dry-run` start without torch."""

from __future__ import annotations

from dataclasses import dataclass

from hitoban.options import Checked, option
from hitoban.release.formats import FORMAT_HELP, FORMATS


@dataclass(kw_only=True)
class SecretsOptions(Checked):
    """`hitoban secrets`: a scan of files (and the git history) for what must never be published."""

    dir: str = option(".", "folder to scan", positional=True, nargs="?")
    git: bool = option(False, "also scan every commit of the git history")


@dataclass(kw_only=True)
class FormatOptions(Checked):
    """What is published: the hitoban folder itself or its verified Llama export (release/formats.py)."""

    format: str = option("hitoban", FORMAT_HELP, choices=FORMATS)


@dataclass(kw_only=True)
class CardOptions(FormatOptions):
    """`hitoban card`: the model card written from the run's artefacts."""

    model_dir: str = option(help="the from_pretrained folder to publish", positional=True)
    repo: str = option(help="OWNER/NAME on the Hub (used in the usage snippet)")
    search: list[str] = option(help="folders to search for artefacts (run, corpus, eval, pii results); the model "
                                    "folder is always searched", factory=list, flag="--from", nargs="*",
                               metavar="DIR")
    out: str | None = option(None, "default MODEL_DIR/README.md (--format llama: MODEL_DIR-llama/README.md)")


@dataclass(kw_only=True)
class PublishOptions(Checked):
    """What every push to the Hub asks: a dry run first, and who may see the repo."""

    repo: str = option(help="OWNER/NAME")
    dry_run: bool = option(False, "list what would be uploaded and skipped; send nothing")
    private: bool = option(True, "create the repo private (default)", off="--public",
                           off_help="create the repo public")


@dataclass(kw_only=True)
class UploadOptions(PublishOptions, FormatOptions):
    """`hitoban upload`: the allow-listed upload of a model folder."""

    model_dir: str = option(help="the from_pretrained folder, with its model card (README.md from `hitoban card`)",
                            positional=True)
    create_pr: bool = option(False, "open a pull request instead of pushing to main")
    include: list[str] = option(help="extra allow-list globs", factory=list, nargs="*", metavar="PATTERN")
    pii: str | None = option(None, "PII probe JSON (default MODEL_DIR/pii.json)")
    i_know: str | None = option(None, "publish despite an exact PII reproduction; REASON is recorded",
                                metavar="REASON")


@dataclass(kw_only=True)
class SpaceOptions(PublishOptions):
    """`hitoban space`: the Gradio chat Space for a model on the Hub."""

    repo: str = option(help="OWNER/NAME of the Space")
    model: str = option(help="OWNER/NAME of the model the Space serves")
