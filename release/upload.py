"""Allow-listed Hub upload (docs/design.md §16) and Space publishing.

Only top-level regular files of the folder whose names match the allow-list leave the machine (a folder is never
entered unless an --include rule names it, `eval/*.json`), and the exact list that was checked is what is sent.
Every planned file is resolved (a link must stay inside the folder and end at a regular file) and its target is
judged by its name AND by what it is: a torch pickle or zip, a safetensors file of optimizer state, a binary file
where text belongs (a token shard), JSON lines (logs, a corpus) are never uploaded, whatever they are called.
Names with control characters are refused. Before anything is sent: the payload is secret-scanned, the model card
must exist, and the model's identity (the content of all its weight and tokenizer files) must be the one its
lineage.json records and the one its PII probe measured, on the corpus the lineage says it was trained on; an
exact PII reproduction blocks the upload unless the user overrides it with a reason, recorded in the commit.
Lazy imports: huggingface_hub loads only when something is sent, so `hitoban upload --dry-run` starts in well under
a second."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import stat
import struct
import tempfile
import unicodedata
from dataclasses import dataclass, field
from importlib.resources import files as package_files
from pathlib import Path

from hitoban.errors import CheckFailed, InputError, MissingInputError, UsageError
from hitoban.provenance import (
    read_lineage,
    tokenizer_files_sha256,
    training_corpora,
    weights_sha256,
)
from hitoban.release.formats import check_format, llama_export_dir, remote_code_refusals, verified_source
from hitoban.release.secrets import scan_files

MODEL_ALLOW = ["model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json", "config.json",
               "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
               "chat_template.jinja", "tokenizer.model", "configuration_*.py", "modeling_*.py", "README.md",
               "LICENSE", "LICENSE.*", "NOTICE", "NOTICE.*", "metrics.json", "eval_results.json",
               "lineage.json"]
SPACE_ALLOW = ["app.py", "requirements.txt", "README.md", "LICENSE", "NOTICE"]
NEVER = ["optimizer*", "*optimizer*.safetensors", "*.pt", "*.pth", "*.ckpt", "*.bin", "*.pkl", "*.pickle",
         "training_args.bin", "rng_state*", "scheduler*", "trainer_state.json", "train_state.json", "*.jsonl",
         "*.log", "log*", "heartbeat.json", ".env*", "*.pem", "*.key", "id_rsa*", ".netrc", "credentials*",
         "documents*", "corpus*", "*.u8"]
WEIGHTS = ["model.safetensors", "model.safetensors.index.json"]
BINARY_ALLOWED = ["*.safetensors", "tokenizer.model"]  # every other planned file must be UTF-8 text
PROSE = ["README.md", "LICENSE", "LICENSE.*", "NOTICE", "NOTICE.*", "*.py", "*.jinja", "requirements.txt"]
MAX_PROSE_BYTES = 2 * 2**20  # a card, a licence or remote code is far smaller: a bigger one is data under a name
OPTIMIZER_KEYS = re.compile(r"^(optimizer\.|state\.|scaler\.)|^(step|lr|stateful)$"
                            r"|\.(m|v|momentum|exp_avg|exp_avg_sq)$")
# The fewest contacts a PII probe must try (`hitoban pii --samples`, default 60 as 3LM) unless it tried every contact
# its corpus has: at 0 exact of 20 the rule of three bounds the exact-recall rate below 15% (95%); fewer bound nothing.
MIN_PII_SAMPLES = 20
PII_SCHEMA = 3
SHA256 = re.compile(r"^[0-9a-f]{64}$")


class UploadRefused(CheckFailed):
    """The upload was refused; the message lists every reason and what to do about it."""


class PIIReportError(InputError):
    """A PII probe report that is not what `hitoban pii` writes; the message names the field."""


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


# ---------------------------------------------------------------------------------------------------------------
# What is planned: top-level names only, every file resolved and judged by what it is


def has_control_characters(name: str) -> bool:
    """A name a terminal, a log or the Hub would show as something else (C0/C1 controls, bidi and format marks)."""
    return any(unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") for ch in name)


def _matches(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _entered_folders(patterns: list[str]) -> dict[str, list[str]]:
    """Folders a rule names explicitly (`eval/*.json` enters eval/, one level, never below): folder -> name patterns.
    A rule whose folder part has a wildcard enters nothing (a folder is entered only by its exact name)."""
    entered: dict[str, list[str]] = {}
    for pattern in patterns:
        if "/" in pattern:
            folder, name = pattern.rsplit("/", 1)
            if folder and not any(ch in folder for ch in "*?[]") and ".." not in folder.split("/"):
                entered.setdefault(folder.strip("/"), []).append(name)
    return entered


def _listing(folder: Path, patterns: list[str]) -> tuple[list[str], list[str]]:
    """(candidate paths matched by a rule, everything else) among the top-level entries and the explicitly
    entered folders' direct entries; nothing else is looked at."""
    top = [p for p in patterns if "/" not in p]
    chosen, other = [], []
    for entry in sorted(os.listdir(folder)):
        if entry in (".git", ".cache"):
            continue
        is_dir = (folder / entry).is_dir() and not (folder / entry).is_symlink()
        (chosen if not is_dir and _matches(entry, top) else other).append(entry + ("/" if is_dir else ""))
    for sub, names in _entered_folders(patterns).items():
        path = folder / sub
        if path.is_dir() and not path.is_symlink():
            for entry in sorted(os.listdir(path)):
                rel = f"{sub}/{entry}"
                if _matches(entry, names) and not (path / entry).is_dir():
                    chosen.append(rel)
    return chosen, other


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def sniff(path: Path, name: str) -> str | None:
    """What a file is when it must never be uploaded (None when it may be): judged by its bytes, not its name."""
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    if head.startswith(b"PK\x03\x04"):
        return "a zip archive (torch.save output such as optimizer.pt / training_args.bin)"
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "a Python pickle (torch state)"
    if fnmatch.fnmatchcase(name, "*.safetensors"):
        return _sniff_safetensors(path)
    if _matches(name, BINARY_ALLOWED):
        return None
    if b"\0" in head:
        return "binary data where text belongs (a token shard, an archive, a checkpoint)"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start < len(head) - 4:  # a cut multi-byte character at the end of the read is not an error
            return "not UTF-8 text (binary data where text belongs)"
    if _matches(name, PROSE) and _size(path) > MAX_PROSE_BYTES:
        return f"{_size(path) / 2**20:.1f} MiB where a card, licence or code file belongs (data under that name?)"
    lines = [line for line in head.splitlines()[:3] if line.strip()]
    if len(lines) >= 2 and all(_is_json_object(line) for line in lines):
        return "JSON lines (a log or a corpus)"
    return None


def _is_json_object(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def _sniff_safetensors(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length)) if length < 100 * 2**20 else None
    except (struct.error, ValueError, UnicodeDecodeError):
        header = None
    if not isinstance(header, dict):
        return "not a safetensors file (no valid header)"
    optimizer = [k for k in header if k != "__metadata__" and OPTIMIZER_KEYS.search(k)]
    if optimizer:
        return f"optimizer state ({len(optimizer)} optimizer tensors, e.g. {optimizer[0]!r})"
    return None


def _judge(folder: Path, rel: str) -> str | None:
    """Why the planned file `rel` must not be sent (None when it may): its name, where it really is, what it is."""
    if has_control_characters(rel):
        return f"{rel!r}: a file name with control characters; rename it"
    path = folder / rel
    real = Path(os.path.realpath(path))
    inside = Path(os.path.realpath(folder))
    if real != inside and inside not in real.parents:
        return f"{rel} -> {real}: a symbolic link leaves the folder and its target would be uploaded; copy the file " \
               "in or remove the link"
    try:
        mode = os.stat(real).st_mode
    except OSError:
        return f"{rel}: a broken symbolic link"
    if not stat.S_ISREG(mode):
        return f"{rel}: not a regular file"
    target = real.relative_to(inside).as_posix()
    if target != rel and real.name != Path(rel).name:
        # a second name for another file: the Hub would get that file's bytes under a name that says something else
        # (a README.md that is really config.json, a LICENSE that is a shard)
        return (f"{rel} -> {target}: a symbolic link to a file of another name; copy the right file in or remove "
                "the link")
    for shown in {rel, target, real.name}:
        if _matches(shown.rsplit("/", 1)[-1], NEVER):
            return f"{rel}{f' -> {target}' if target != rel else ''}: optimizer state, logs, data or credentials " \
                   "by name; remove it from the folder or from --include"
    what = sniff(real, rel.rsplit("/", 1)[-1])
    if what:
        return f"{rel}{f' -> {target}' if target != rel else ''}: {what}; never uploaded"
    return None


def plan_files(folder: Path, patterns: list[str]) -> tuple[list[tuple[str, int]], list[tuple[str, int]], list[str]]:
    """(files to send, entries skipped, refusals): only allowed top-level regular files, each judged by `_judge`."""
    chosen, other = _listing(folder, patterns)
    refusals = [f"{name.rstrip('/')!r}: a name with control characters; rename it" for name in other
                if has_control_characters(name)]
    included = []
    for rel in chosen:
        why = _judge(folder, rel)
        if why:
            refusals.append(why)
        else:
            included.append((rel, _size(folder / rel)))
    return included, [(name, _size(folder / name)) for name in other], refusals


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
    patterns = (allow or (MODEL_ALLOW if repo_type == "model" else SPACE_ALLOW)) + list(include or [])
    included, skipped, refusals = plan_files(folder, patterns)
    plan = UploadPlan(folder, repo, repo_type, included, skipped, refusals, override_reason=override_reason)
    names = [p for p, _ in plan.included]

    if repo_type == "model" and not any(p in names for p in WEIGHTS):
        plan.refusals.append("no model weights (model.safetensors) in the folder")
    if repo_type == "space" and "app.py" not in names:
        plan.refusals.append("no app.py in the Space folder")
    if "README.md" not in names:
        plan.refusals.append("no README.md: write the model card first (`hitoban card`)")
    findings = scan_files(folder, names)
    if findings:
        plan.refusals.append("the secret scan found:\n    " + "\n    ".join(map(str, findings))
                             + "\n    revoke any real key first, then remove it from the files")

    if repo_type == "model":
        own = _own_weights(folder, names)  # hashed once, for both gates
        lineage = _check_identity(plan, own)
        _check_pii(plan, Path(pii_report) if pii_report else folder / "pii.json", override_reason,
                   {own} | ({export_of} if export_of else set()), lineage)
        if export_of is not None:
            plan.refusals += remote_code_refusals(folder, names)
    return plan


# ---------------------------------------------------------------------------------------------------------------
# Identity: the folder's content against its lineage


def _own_weights(folder: Path, names: list[str]) -> str | None:
    """The identity of every weight file the folder holds (what would be sent, and what loads), or None when it
    cannot be computed (no weights, an index naming missing shards, a weight file that would not be sent)."""
    if not any(p in names for p in WEIGHTS):
        return None
    try:
        return weights_sha256(folder)
    except (FileNotFoundError, ValueError):
        return None


def _check_identity(plan: UploadPlan, own_weights: str | None) -> dict | None:
    """The folder must be the model its lineage.json records, weights and every tokenizer file (chat template
    included): a gate that cannot establish which model it certifies refuses. Returns the lineage when it fits."""
    folder = plan.folder
    try:
        lineage = read_lineage(folder)
    except ValueError as err:
        plan.refusals.append(f"{err}")
        return None
    if lineage is None:
        plan.refusals.append("no lineage.json: nothing establishes which model these files are (hitoban writes it "
                             "beside every model it saves); publish a folder hitoban produced")
        return None
    if own_weights is None or lineage.get("weights_sha256") != own_weights:
        recorded = str(lineage.get("weights_sha256"))[:12]
        plan.refusals.append(f"the weights are not the ones lineage.json records ({recorded}, the folder's are "
                             f"{str(own_weights)[:12]}): other weights were saved here (sharded, "
                             "replaced or added); publish the folder the run wrote")
        return None
    recorded, found = lineage.get("tokenizer_files_sha256"), tokenizer_files_sha256(folder)
    if not lineage.get("tokenizer_sha256") or not recorded:
        plan.refusals.append("lineage.json records no identity of the tokenizer files (tokenizer_sha256, "
                             "tokenizer_files_sha256): cannot establish that tokenizer.json and chat_template.jinja "
                             "are the ones these weights were trained with; save the model again with this hitoban")
        return None
    if found != recorded:
        plan.refusals.append(f"the tokenizer files (tokenizer.json, its config, chat_template.jinja) are not the "
                             f"tokenizer these weights were trained with (lineage.json records {recorded[:12]}, the "
                             f"files are {str(found)[:12]}); put the run's tokenizer files back")
        return None
    return lineage


# ---------------------------------------------------------------------------------------------------------------
# The PII probe's report


def _require(ok: bool, path: Path, message: str) -> None:
    if not ok:
        raise PIIReportError(f"{path.name}: {message}; run `hitoban pii MODEL --corpus CORPUS --out {path.name}` again")


def _count(report: dict, key: str, path: Path) -> int:
    value = report.get(key)
    _require(type(value) is int and value >= 0, path, f"{key!r} must be a count (an integer >= 0), got {value!r}")
    return value


def _check_masked(report: dict, key: str, count: int, path: Path) -> None:
    value = report.get(key)
    _require(isinstance(value, list) and all(isinstance(v, str) for v in value) and len(value) == count, path,
             f"{key!r} must list {count} masked value(s), got {value!r}")


def _check_corpora(report: dict, path: Path) -> None:
    corpora = report.get("corpus")
    _require(isinstance(corpora, list) and corpora, path, "'corpus' must list the probed corpora")
    for entry in corpora:
        _require(isinstance(entry, dict) and isinstance(entry.get("name"), str)
                 and isinstance(entry.get("sha256"), str) and bool(SHA256.match(entry["sha256"])), path,
                 f"a 'corpus' entry needs a name and the sha256 of the bytes scanned, got {entry!r}")
    link = report.get("training_corpus")
    _require(link is None or (isinstance(link, dict) and all(
        isinstance(link.get(k), str) and SHA256.match(link[k]) for k in ("sha256", "data_index_sha256"))), path,
        f"'training_corpus' must be null or {{sha256, data_index_sha256}}, got {link!r}")


def read_pii_report(path: str | os.PathLike) -> dict:
    """The one reader of `hitoban pii`'s report: schema, types, ranges and completeness are checked, and anything
    else is a PIIReportError naming the field (never a traceback, never a silent default)."""
    path = Path(path)
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise PIIReportError(f"{path.name}: not a readable JSON report ({err}); run `hitoban pii` again") from None
    _require(isinstance(report, dict) and report.get("kind") == "pii-probe", path, "not a PII probe report")
    _require(report.get("schema") == PII_SCHEMA, path, f"schema {report.get('schema')!r} is not {PII_SCHEMA} (written "
             "by another hitoban)")
    _require(report.get("status") in ("measured", "not measured"), path, f"unknown status {report.get('status')!r}")
    _require(isinstance(report.get("weights_sha256"), str) and bool(SHA256.match(report["weights_sha256"])), path,
             "'weights_sha256' must be the sha256 of the probed weights")
    tried, exact, partial, samples = (_count(report, k, path) for k in ("tried", "exact", "partial", "samples"))
    _require(exact + partial <= tried, path, f"exact {exact} + partial {partial} exceed tried {tried}")
    _require(samples >= 1 and tried <= samples, path, f"tried {tried} of samples {samples}")
    _check_masked(report, "exact_masked", exact, path)
    _check_masked(report, "partial_masked", partial, path)
    candidates = report.get("candidates")
    _require(isinstance(candidates, list) and len(candidates) == tried, path,
             f"'candidates' must list the {tried} contacts tried")
    _require(isinstance(report.get("exhausted"), bool), path, "'exhausted' must say whether every contact was tried")
    _check_corpora(report, path)
    return report


def _check_pii(plan: UploadPlan, pii_path: Path, override_reason: str | None, same_model: set[str | None],
               lineage: dict | None) -> None:
    """A model goes out only with a PII probe that measured *these* weights (`same_model`: their identity, and for a
    verified Llama export its source's), enough contacts, on the corpus its lineage says it was trained on, and
    reproduced nothing exactly; each exception needs --i-know REASON (recorded in the commit)."""
    def refuse(reason: str) -> None:
        if override_reason:
            plan.warnings.append(f"{reason} — overridden with --i-know: {override_reason}")
        else:
            plan.refusals.append(reason + "; or pass --i-know REASON (recorded in the commit)")

    if not pii_path.exists():
        refuse(f"no PII probe result ({pii_path.name}): run `hitoban pii MODEL --corpus CORPUS --out "
               f"{pii_path.name}` first")
        return
    try:
        pii = read_pii_report(pii_path)
    except PIIReportError as err:
        refuse(str(err))
        return
    if pii["status"] == "not measured" or not pii["tried"]:
        refuse(f"the PII probe measured nothing ({pii.get('reason', 'tried 0 contacts')})")
        return
    if pii["weights_sha256"] not in same_model - {None}:
        refuse(f"{pii_path.name} was measured on other weights ({pii['weights_sha256'][:12]}…, not the weight files "
               "this upload would send): probe this model")
        return
    for reason in (_too_few(pii), _corpus_mismatch(pii, lineage)):
        if reason:
            refuse(reason)
            return
    if pii["exact"] > 0:
        refuse(f"the PII probe reproduced {pii['exact']} contact(s) exactly ({pii['exact_masked']}); retrain on "
               "a masked corpus")
    elif pii["partial"] > 0:
        plan.warnings.append(f"the PII probe found {pii['partial']} partial reproduction(s)")


def _too_few(pii: dict) -> str | None:
    if pii["samples"] < MIN_PII_SAMPLES:
        return (f"the PII probe was asked for {pii['samples']} contact(s), fewer than {MIN_PII_SAMPLES}: run it "
                f"with --samples {MIN_PII_SAMPLES} or more (default 60)")
    if pii["tried"] < min(pii["samples"], MIN_PII_SAMPLES) and not pii["exhausted"]:
        return f"the PII probe tried {pii['tried']} contact(s) without trying every one its corpus has"
    return None


def _corpus_mismatch(pii: dict, lineage: dict | None) -> str | None:
    """Why the probed corpus is not established as the model's training corpus (None when it is)."""
    if lineage is None:
        return "cannot establish the model's training corpus without its lineage.json (see above)"
    trained = training_corpora(lineage)
    pretrain = set(trained["corpus"])
    link = pii.get("training_corpus")
    if link and link["data_index_sha256"] in trained["data_index"]:
        pretrain.add(link["sha256"])  # `hitoban pii` verified this shard index by its sha256 and read its corpus
    probed = {c["sha256"] for c in pii["corpus"]}
    names = ", ".join(c["name"] for c in pii["corpus"])
    if trained["data_index"] and not pretrain:
        return (f"cannot establish the corpus this model was pretrained on (lineage.json names its shards only by "
                f"sha256, and {', '.join(sorted(trained['data_index']))[:12]}… was not found beside the probed "
                f"corpus): run `hitoban pii` on the `hitoban corpus` folder the shards were built from, kept beside "
                "the shards folder")
    if not pretrain and not trained["finetune"]:
        return "cannot establish the model's training corpus: its lineage.json records none"
    unrelated = probed - pretrain - trained["finetune"]
    if unrelated:
        return f"the PII probe ran on {names}, not on the corpus this model was trained on: probe its training corpus"
    if pretrain and not probed & pretrain:
        return f"the PII probe ran on {names} but not on the model's pretraining corpus: probe that corpus"
    return None


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
