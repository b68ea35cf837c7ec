"""Allow-listed Hub upload (docs/design.md §16) and Space publishing.

Only files matching the allow-list leave the machine, resolved with `huggingface_hub.utils.filter_repo_objects`
(the function `upload_folder` itself uses), and the exact list that was checked is what is sent. Before anything
is sent: the payload is secret-scanned, the model card must exist, optimizer state / logs / credentials must not
be in the payload, and an exact PII reproduction blocks the upload unless the user overrides it with a reason,
which is recorded in the commit description.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from importlib.resources import files as package_files
from pathlib import Path

from huggingface_hub.utils import filter_repo_objects

from hitoban.errors import CheckFailed, MissingInputError, UsageError
from hitoban.provenance import read_lineage, sha256_file, weights_sha256
from hitoban.release.formats import check_format, llama_export_dir, remote_code_refusals, verified_source
from hitoban.release.secrets import link_outside, scan_files

MODEL_ALLOW = ["model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json", "config.json",
               "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
               "chat_template.jinja", "tokenizer.model", "configuration_*.py", "modeling_*.py", "README.md",
               "LICENSE", "LICENSE.*", "NOTICE", "NOTICE.*", "metrics.json", "eval_results.json",
               "lineage.json"]
SPACE_ALLOW = ["app.py", "requirements.txt", "README.md", "LICENSE", "NOTICE"]
NEVER = ["optimizer*", "*optimizer*.safetensors", "*.pt", "*.pth", "*.ckpt", "training_args.bin", "rng_state*",
         "scheduler*", "trainer_state.json", "train_state.json", "*.jsonl", "*.log", "log*", "heartbeat.json",
         ".env*", "*.pem", "*.key", "id_rsa*", ".netrc", "credentials*"]
WEIGHTS = ["model.safetensors", "model.safetensors.index.json"]


class UploadRefused(CheckFailed):
    """The upload was refused; the message lists every reason and what to do about it."""


@dataclass
class UploadPlan:
    folder: Path
    repo: str
    repo_type: str
    included: list[tuple[str, int]]
    skipped: list[tuple[str, int]]
    refusals: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    override_reason: str | None = None

    def lines(self) -> list[str]:
        out = [f"upload {self.folder} -> {self.repo} ({self.repo_type})"]
        out += [f"  + {path}  {size / 2**20:.2f} MiB" for path, size in self.included]
        out += [f"  - {path}  {size / 2**20:.2f} MiB (skipped: not on the allow-list)" for path, size in self.skipped]
        out.append(f"  total {sum(s for _, s in self.included) / 2**20:.2f} MiB in {len(self.included)} files")
        out += [f"  warning: {w}" for w in self.warnings]
        out += [f"  REFUSED: {r}" for r in self.refusals]
        return out


def _all_files(folder: Path) -> list[tuple[str, int]]:
    """Every file under `folder` as huggingface_hub would read it; links are listed, not followed into folders."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):  # followlinks=False: a linked folder is one entry
        names = sorted(filenames) + sorted(d for d in dirnames if (Path(dirpath) / d).is_symlink())
        dirnames[:] = sorted(d for d in dirnames if not (Path(dirpath) / d).is_symlink())
        for name in names:
            path = Path(dirpath) / name
            rel = path.relative_to(folder).as_posix()
            if not rel.startswith((".git/", ".cache/huggingface/")):
                found.append((rel, path.stat().st_size if path.exists() else 0))
    return sorted(found)


def plan_upload(folder: str | os.PathLike, repo: str, repo_type: str = "model", allow: list[str] | None = None,
                include: list[str] | None = None, pii_report: str | os.PathLike | None = None,
                override_reason: str | None = None, export_of: str | None = None) -> UploadPlan:
    """Resolve the payload and every reason to refuse it (nothing is sent). `export_of`: the folder is a Llama export
    just verified against the hitoban weights with this sha256, whose PII probe then speaks for it; such an upload
    must need no remote code."""
    folder = Path(folder)
    if not folder.is_dir():
        raise MissingInputError(f"{folder}: not a folder")
    if repo.count("/") != 1:
        raise UsageError(f"--repo must be OWNER/NAME, got {repo!r}")
    everything = _all_files(folder)
    sizes = dict(everything)
    patterns = (allow or (MODEL_ALLOW if repo_type == "model" else SPACE_ALLOW)) + list(include or [])
    chosen = set(filter_repo_objects([p for p, _ in everything], allow_patterns=patterns))
    plan = UploadPlan(folder, repo, repo_type, [(p, sizes[p]) for p, _ in everything if p in chosen],
                      [(p, sizes[p]) for p, _ in everything if p not in chosen], override_reason=override_reason)
    names = [p for p, _ in plan.included]

    if repo_type == "model" and not any(p in names for p in WEIGHTS):
        plan.refusals.append("no model weights (model.safetensors) in the folder")
    if repo_type == "space" and "app.py" not in names:
        plan.refusals.append("no app.py in the Space folder")
    if "README.md" not in names:
        plan.refusals.append("no README.md: write the model card first (`hitoban card`)")
    links = [f"{p} -> {target}" for p in names if (target := link_outside(folder, p)) is not None]
    if links:
        plan.refusals.append(f"symbolic link(s) leave the folder and their targets would be uploaded: "
                             f"{'; '.join(links)}; copy the file in or remove the link")
    never = sorted(set(filter_repo_objects(names, allow_patterns=NEVER)))
    if never:
        plan.refusals.append(f"optimizer state, logs or credentials would be uploaded: {never}; remove them from "
                             "--include")
    findings = scan_files(folder, names)
    if findings:
        plan.refusals.append("the secret scan found:\n    " + "\n    ".join(map(str, findings))
                             + "\n    revoke any real key first, then remove it from the files")

    if repo_type == "model":
        own = _own_weights(folder, names)  # hashed once, for both gates
        _check_tokenizer(plan, own)
        _check_pii(plan, Path(pii_report) if pii_report else folder / "pii.json", override_reason,
                   {own} | ({export_of} if export_of else set()))
        if export_of is not None:
            plan.refusals += remote_code_refusals(folder, names)
    return plan


def _own_weights(folder: Path, names: list[str]) -> str | None:
    """The sha256 of the weights the upload would send, or None when it sends none (or they are incomplete)."""
    if not any(p in names for p in WEIGHTS):
        return None
    try:
        return weights_sha256(folder)
    except FileNotFoundError:  # an index whose shard files are missing: no weights to compare
        return None


def _check_tokenizer(plan: UploadPlan, own_weights: str | None) -> None:
    """The tokenizer must be the one the weights were trained with: lineage.json records its sha256 beside the
    weights', and a swapped tokenizer.json would make the published model read other pieces (and its card's
    numbers describe another model)."""
    folder = plan.folder
    lineage, tokenizer = read_lineage(folder), folder / "tokenizer.json"
    if not lineage or not lineage.get("tokenizer_sha256") or not tokenizer.is_file():
        return
    if lineage.get("weights_sha256") != own_weights:
        return  # the lineage is of other weights; the card and the PII gate say so
    found = sha256_file(tokenizer)
    if found != lineage["tokenizer_sha256"]:
        plan.refusals.append(f"tokenizer.json is not the tokenizer these weights were trained with (lineage.json "
                             f"records sha256 {lineage['tokenizer_sha256'][:12]}, the file is {found[:12]}); put "
                             "the run's tokenizer back")


def _check_pii(plan: UploadPlan, pii_path: Path, override_reason: str | None, same_model: set[str | None]) -> None:
    """A model goes out only with a PII probe that measured *these* weights (`same_model`: their sha256, and for a
    verified Llama export its source's) and reproduced nothing exactly; each exception needs --i-know REASON
    (recorded in the commit)."""
    def refuse(reason: str) -> None:
        if override_reason:
            plan.warnings.append(f"{reason} — overridden with --i-know: {override_reason}")
        else:
            plan.refusals.append(reason + "; or pass --i-know REASON (recorded in the commit)")

    if not pii_path.exists():
        refuse(f"no PII probe result ({pii_path.name}): run `hitoban pii MODEL --corpus CORPUS --out "
               f"{pii_path.name}` first")
        return
    pii = json.loads(pii_path.read_text(encoding="utf-8"))
    if pii.get("status") == "not measured" or not pii.get("tried"):
        refuse(f"the PII probe measured nothing ({pii.get('reason', 'tried 0 contacts')})")
        return
    weights = pii.get("weights_sha256")
    if any(p == "model.safetensors" for p, _ in plan.included) and weights not in same_model - {None}:
        refuse(f"{pii_path.name} was measured on other weights ({str(weights)[:12]}…, not this folder's "
               "model.safetensors): probe this model")
        return
    if pii.get("exact", 0) > 0:
        refuse(f"the PII probe reproduced {pii['exact']} contact(s) exactly ({pii.get('exact_masked')}); retrain on "
               "a masked corpus")
    elif pii.get("partial", 0) > 0:
        plan.warnings.append(f"the PII probe found {pii['partial']} partial reproduction(s)")


def execute(plan: UploadPlan, private: bool = True, create_pr: bool = False, message: str | None = None,
            space_sdk: str | None = None) -> dict:
    """create_repo + upload_folder with exactly the checked files; token from the standard HF login."""
    from huggingface_hub import HfApi, get_token

    if plan.refusals:
        raise UploadRefused("\n".join(plan.lines()))
    if get_token() is None:
        raise UploadRefused("no Hugging Face login: run `hf auth login` (or set HF_TOKEN) and try again")
    api = HfApi()
    url = api.create_repo(plan.repo, private=private, exist_ok=True, repo_type=plan.repo_type, space_sdk=space_sdk)
    description = f"Published despite a PII warning: {plan.override_reason}" if plan.override_reason else ""
    commit = api.upload_folder(repo_id=plan.repo, folder_path=plan.folder, repo_type=plan.repo_type,
                               allow_patterns=[p for p, _ in plan.included], create_pr=create_pr,
                               commit_message=message or f"Upload {plan.repo_type} with hitoban",
                               commit_description=description)
    return {"repo": plan.repo, "repo_type": plan.repo_type, "url": str(url), "private": private,
            "files": [p for p, _ in plan.included], "commit_url": commit.commit_url, "pr_url": commit.pr_url,
            "override_reason": plan.override_reason}


def upload_model(folder: str | os.PathLike, repo: str, dry_run: bool = False, private: bool = True,
                 create_pr: bool = False, include: list[str] | None = None, pii_report: str | None = None,
                 override_reason: str | None = None, log=print, fmt: str = "hitoban") -> dict:
    """`hitoban upload`: print the plan; refuse (UploadRefused) or, unless dry-run, upload. With fmt "llama" the
    payload is the folder's Llama export (formats.llama_export_dir), checked against the folder first."""
    export_of = None
    if check_format(fmt) == "llama":
        export = llama_export_dir(folder)
        try:
            checked = verified_source(Path(folder), export)
        except CheckFailed as err:
            raise UploadRefused(f"refusing to upload the Llama export of {folder}: {err}") from err
        log(f"# {export}: verified against {folder} (max |logit diff| {checked['max_abs_logit_diff']:.2g}, greedy "
            "text identical)")
        export_of, pii_report = checked["source_weights_sha256"], pii_report or str(Path(folder) / "pii.json")
        folder = export
    plan = plan_upload(folder, repo, "model", include=include, pii_report=pii_report,
                       override_reason=override_reason, export_of=export_of)
    for line in plan.lines():
        log(line)
    if plan.refusals:
        raise UploadRefused(f"refusing to upload {folder} ({len(plan.refusals)} reason(s) above)")
    if dry_run:
        return {"dry_run": True, "files": [p for p, _ in plan.included], "skipped": [p for p, _ in plan.skipped]}
    return execute(plan, private=private, create_pr=create_pr)


def space_card(repo: str, model: str) -> str:
    """The Space README: YAML from SpaceCardData (sdk gradio pinned to the installed version) + a short body."""
    from importlib.metadata import version

    from huggingface_hub import SpaceCardData

    data = SpaceCardData(title=repo.split("/")[1], sdk="gradio", sdk_version=version("gradio"), app_file="app.py",
                         python_version="3.11", license="apache-2.0", models=[model], emoji="🌙",
                         colorFrom="indigo", colorTo="blue", pinned=False,
                         short_description="Chat with a small Japanese LM trained overnight with hitoban")
    body = (f"# {repo.split('/')[1]}\n\nA demo of [{model}](https://huggingface.co/{model}), a small Japanese "
            "language model trained from scratch in one night with hitoban. Replies are sampled from a "
            "tens-of-millions-parameter model: expect fluent-looking but often wrong text.\n")
    return "---\n" + data.to_yaml() + "\n---\n" + body


def space_source() -> Path:
    """The Space folder: hitoban/spaces in an installed wheel, spaces/ beside hitoban/ in a source checkout
    (located by path: it is data with no __init__.py, which editable installs cannot import)."""
    package = Path(package_files("hitoban").joinpath("__init__.py")).parent
    for candidate in (package / "spaces", package.parent / "spaces"):
        if (candidate / "app.py").is_file():
            return candidate
    raise FileNotFoundError("the Gradio Space files (spaces/app.py) are missing from this hitoban installation")


def stage_space(model: str, repo: str, out: str | os.PathLike) -> Path:
    """Copy the packaged Space and write its card (the model id goes into `models:`, where app.py reads it)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    source = space_source()
    for name in ("app.py", "requirements.txt"):
        shutil.copyfile(source / name, out / name)
    (out / "README.md").write_text(space_card(repo, model), encoding="utf-8")
    return out


def publish_space(repo: str, model: str, dry_run: bool = False, private: bool = True, log=print) -> dict:
    """`hitoban space`: stage the Space in a temp folder, check it like a model upload, then publish it."""
    staging = Path(tempfile.mkdtemp(prefix="hitoban-space-"))
    try:
        stage_space(model, repo, staging)
        plan = plan_upload(staging, repo, "space")
        for line in plan.lines():
            log(line)
        if plan.refusals:
            raise UploadRefused(f"refusing to publish the Space ({len(plan.refusals)} reason(s) above)")
        if dry_run:
            return {"dry_run": True, "files": [p for p, _ in plan.included]}
        return execute(plan, private=private, message=f"Space for {model}", space_sdk="gradio")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
