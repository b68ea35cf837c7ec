"""`hitoban card`: a `huggingface_hub.ModelCard` built only from artefacts traceable to the carded weights.

An artefact is recognised by what it holds (its `kind`, or its shape for older files), never by its file name, and
a number is cited only when its artefact measured *these* weights or a recorded ancestor's (lineage.json: SFT
output -> its base -> the pretraining run), and then the card says which. The chain continues through hashes: the
pretraining run by its `run_id`, its shards by the sha256 of `shards_index.json`, the corpus and the tokenizer by
the sha256s that index records, the kill test by the run's configuration. Two different artefacts of one kind that
both fit are an error listing them (an ambiguous --from); a number with no traceable artefact is "not measured",
with the command that would measure it. Every number shows the (relative) path of its artefact, and
`eval_results.json` repeats the numbers with their sources.
Lazy imports: torch, transformers and the model load only to count a folder's parameters where its header cannot, so
`hitoban card` starts without torch."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

from hitoban.errors import InputError, MissingInputError
from hitoban.files import read_json, read_safetensors_header
from hitoban.provenance import LLAMA_EXPORT_STAGE, ancestors, read_lineage, sha256_file, weights_sha256
from hitoban.release.card_text import CardText
from hitoban.release.formats import check_format, prepare_llama_export
from hitoban.run_folder import run_config

NOT_MEASURED = "not measured"
HOW_TO_MEASURE = {
    "bpc": "hitoban eval bpc MODEL --domain NAME=TEXT", "gen": "hitoban eval gen MODEL --questions FILE",
    "pii": "hitoban pii MODEL --corpus CORPUS", "canary": "hitoban pii --canaries 8 --corpus SMALL.txt",
    "killtest": "hitoban killtest --data SHARDS <the night's pretrain options>",
    "leaks": "hitoban leaks --holdout HOLDOUT --corpus CORPUS CHATS", "run": "hitoban pretrain",
    "manifest": "hitoban corpus", "tokenizer": "hitoban tokenizer", "sft": "hitoban sft", "shards": "hitoban shards",
}
SKIP_FILES = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
              "eval_results.json", "lineage.json", "heartbeat.json", "trainer_state.json"}


class CardError(InputError):
    """The artefacts cannot be attributed unambiguously; the message lists the candidates."""


def artefact_kind(data: dict) -> str | None:
    """What a JSON artefact is, from its `kind` or (files written before kinds existed) its shape."""
    kind = data.get("kind", "")
    known = {"bits-per-char": "bpc", "generation-metrics": "gen", "leak-scan": "leaks", "pii-probe": "pii",
             "pii-canary-control": "canary", "kill-test": "killtest", "pretrain-run": "run", "federated-run": "run",
             "pretrain-summary": "summary", "sft-summary": "sft", "tone-summary": "sft"}
    if kind in known:
        return known[kind]
    shapes = [("bpc", ("records", "window")), ("gen", ("repetition_rate", "topic_rate")),
              ("leaks", ("probes", "corpora")), ("canary", ("planted_model", "clean_model")),
              ("pii", ("tried", "exact")), ("killtest", ("checks", "killed_diff")),
              ("manifest", ("pii_masks", "output", "sources")), ("tokenizer", ("heldout", "sample")),
              ("shards", ("splits", "shards", "tokenizer")), ("run", ("tokens_per_step", "total_steps", "model")),
              ("sft", ("counted_ratio", "best_val_loss"))]
    return next((name for name, keys in shapes if all(k in data for k in keys)), None)


@dataclass
class Artefact:
    kind: str
    path: Path
    data: dict

    @property
    def rel(self) -> str:
        """The path as the user would type it: relative to the working folder when it lies below it."""
        path = os.path.relpath(self.path)
        return path if not path.startswith("..") else str(self.path)


def collect(model_dir: Path, roots: list[Path]) -> dict[str, list[Artefact]]:
    """Every recognisable JSON artefact under the model folder and the --from roots (up to 5 levels deep)."""
    found: dict[str, list[Artefact]] = {}
    seen: set[Path] = set()
    for root in [model_dir, *roots]:
        if not root.exists():
            raise MissingInputError(f"--from {root}: no such folder")
        paths = [root] if root.is_file() else (p for depth in range(6)
                                               for p in root.glob("/".join(["*"] * depth + ["*.json"])))
        for path in paths:
            if (path.name in SKIP_FILES or path.name.endswith(".bin.json") or path.resolve() in seen
                    or not path.is_file()):  # a FIFO or a folder named *.json is no report (and would block)
                continue
            seen.add(path.resolve())
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (ValueError, OSError):
                continue
            kind = artefact_kind(data) if isinstance(data, dict) else None
            if kind == "run":  # a run folder's config.json, of either schema, read as one view
                try:
                    data = run_config(data, str(path))
                except InputError:
                    continue
            if kind:
                found.setdefault(kind, []).append(Artefact(kind, path, data))
    return found


@dataclass
class Provenance:
    """The carded weights and their ancestors: weights hash -> how the card names that model."""

    chain: list[dict]
    names: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)  # kind -> why it is not measured
    export_of: str | None = None  # a verified Llama export: the hitoban weights it computes the same function as

    @property
    def same_model(self) -> set[str]:
        """The weights whose PII probe speaks for these: their own, and for a verified export its source's."""
        return {self.own} | ({self.export_of} if self.export_of else set())

    @property
    def own(self) -> str:
        return self.chain[0]["weights_sha256"]

    def stage(self, stage: str) -> dict | None:
        return next((node for node in self.chain if node.get("stage") == stage), None)


def provenance_of(model_dir: Path, verified_export: bool = False) -> Provenance:
    """The chain of weights behind `model_dir`; `verified_export`: its Llama export check has just passed, so its
    lineage's source weights count as the same model."""
    lineage = read_lineage(model_dir)
    own = weights_sha256(model_dir)
    if lineage is None or lineage.get("weights_sha256") != own:  # no lineage, or weights replaced after it
        lineage = {"stage": "unknown", "weights_sha256": own}
    chain = ancestors(lineage)
    names = {chain[0]["weights_sha256"]: "this model"}
    # a verified export's lineage (checked against its weights above) names the hitoban weights it came from
    source = chain[1]["weights_sha256"] if verified_export and lineage.get("stage") == LLAMA_EXPORT_STAGE and len(
        chain) > 1 else None
    if source is not None:
        names[source] = (f"the hitoban model it was exported from, {chain[1].get('folder', '?')}, whose logits it "
                         "matches to 1e-5")
    for node in chain[1:]:
        names.setdefault(node["weights_sha256"], f"its {node.get('stage', 'base')} base ({node.get('folder', '?')})")
    return Provenance(chain, names, export_of=source)


def pick(found: dict[str, list[Artefact]], kind: str, fits, prov: Provenance, what: str) -> Artefact | None:
    """The one artefact of `kind` that fits; two different ones that both fit are an error listing them."""
    candidates = found.get(kind, [])
    fitting = [a for a in candidates if fits(a)]
    distinct = {json.dumps(a.data, sort_keys=True): a for a in fitting}
    if len(distinct) > 1:
        raise CardError(f"ambiguous --from: {len(distinct)} different {what} artefacts fit "
                        f"{', '.join(prov.names.values())}: {', '.join(sorted(a.rel for a in distinct.values()))}; "
                        "give --from only the folders of this model's results")
    if not fitting:
        others = ", ".join(sorted(a.rel for a in candidates))
        prov.notes[kind] = (f"{NOT_MEASURED} (run `{HOW_TO_MEASURE[kind]}`)" + (
            f"; {others} measured other weights or another run" if others else ""))
        return None
    return fitting[0]


EMBEDDING = "model.embed_tokens.weight"  # HitobanForCausalLM's input embedding (tied to the output when saved once)
CONFIG_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
               "max_position_embeddings", "vocab_size")  # what the card shows of config.json


def safetensors_shapes(model_dir: Path) -> dict[str, list[int]] | None:
    """Tensor name -> shape from the headers of `model.safetensors` (or the shards its index names), None without
    them. A safetensors file starts with its header's length (8 bytes, little-endian) and the JSON header: no tensor
    is read and neither torch nor numpy is imported."""
    single, index = model_dir / "model.safetensors", model_dir / "model.safetensors.index.json"
    if single.exists():
        files = [single]
    elif index.exists():
        weight_map = read_json(index, f"{model_dir}", fields={"weight_map": dict})["weight_map"]
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
    else:
        return None
    shapes = {}
    for path in files:
        shapes.update(_header_shapes(path))
    return shapes


def _header_shapes(path: Path) -> dict[str, list[int]]:
    """One safetensors file's tensor shapes, from the one header reader (hitoban.files), without torch."""
    try:
        return {name: list(entry["shape"]) for name, entry in read_safetensors_header(path).items()}
    except (KeyError, TypeError):
        raise InputError(f"{path}: the safetensors header has no shapes; save the model again") from None


def count_parameters(model_dir: Path) -> tuple[int, int, dict]:
    """(total, non-embedding, config) of a hitoban folder from config.json and the safetensors headers (what
    `model.parameters()` counts: a tied output embedding is saved once, rotary buffers are not saved), so `hitoban
    card` starts without torch; a test keeps it equal to the count of the instantiated model. Anything else (no
    safetensors, another model type, an embedding whose shape disagrees with config.json) is counted the slow way."""
    config = read_json(model_dir / "config.json", f"{model_dir}")
    shapes = safetensors_shapes(model_dir)
    if (shapes and config.get("model_type") in ("hitoban", "llama") and all(k in config for k in CONFIG_KEYS)
            and shapes.get(EMBEDDING) == [config["vocab_size"], config["hidden_size"]]):
        if config.get("tie_word_embeddings", True):  # one parameter, whether or not a copy was saved too
            shapes.pop("lm_head.weight", None)
        total = sum(math.prod(shape) for shape in shapes.values())
        return total, total - math.prod(shapes[EMBEDDING]), config
    return count_parameters_on_meta(model_dir)


def count_parameters_on_meta(model_dir: Path) -> tuple[int, int, dict]:
    """(total, non-embedding, config) from config.json, instantiating the model on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import hitoban.modeling  # noqa: F401  (registers hitoban with the Auto classes)

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    return total, total - embed, config.to_dict()


def _by_weights(found, kind: str, sha_of, prov: Provenance, what: str) -> tuple[Artefact | None, str | None]:
    """The artefact that measured this model, else the nearest ancestor that has one: (artefact, weights hash)."""
    for node in prov.chain:
        sha = node["weights_sha256"]
        artefact = pick(found, kind, lambda a, sha=sha: sha in sha_of(a.data), prov, what)
        if artefact is not None:
            prov.notes.pop(kind, None)
            return artefact, sha
    return None, None


def trace(model_dir: Path, roots: list[Path], verified_export: bool = False
          ) -> tuple[Provenance, dict[str, Artefact | None], dict[str, str]]:
    """Follow the carded weights to every artefact that measured them or the data and run that made them."""
    prov = provenance_of(model_dir, verified_export)
    found = collect(model_dir, roots)
    art: dict[str, Artefact | None] = {}
    measured_on: dict[str, str] = {}
    for kind, what, sha_of in (
            ("bpc", "bits/char", lambda d: {r.get("weights_sha256") for r in d.get("records", [])}),
            ("gen", "generation-metrics", lambda d: {d.get("weights_sha256")}),
            ("sft", "fine-tune summary", lambda d: {d.get("weights_sha256")})):
        art[kind], sha = _by_weights(found, kind, sha_of, prov, what)
        if sha:
            measured_on[kind] = sha
    art["pii"] = pick(found, "pii", lambda a: a.data.get("weights_sha256") in prov.same_model and valid_pii(a.path),
                      prov, "PII probe")
    if art["pii"] is not None and art["pii"].data.get("weights_sha256") != prov.own:
        measured_on["pii"] = art["pii"].data["weights_sha256"]
    art["canary"] = pick(found, "canary", lambda a: True, prov, "canary control")
    node = prov.stage("pretrain")
    if node is None:
        for kind in ("run", "manifest", "tokenizer", "killtest"):
            prov.notes[kind] = f"{NOT_MEASURED} (no pretraining run in this model's lineage.json)"
            art[kind] = None
    else:
        art["run"] = pick(found, "run", lambda a: a.data.get("run_id") == node.get("run_id"), prov, "pretraining run")
        shards = pick(found, "shards", lambda a: sha256_file(a.path) == node.get("data_index_sha256"), prov,
                      "shard index") if "shards" in found else None
        corpus_sha = (shards.data.get("corpus") or {}).get("sha256") if shards else None
        art["manifest"] = pick(found, "manifest", lambda a: a.data["output"].get("sha256") == corpus_sha, prov,
                               "corpus manifest")
        art["tokenizer"] = pick(found, "tokenizer", lambda a: same_tokenizer(a.path.parent, node), prov,
                                "tokenizer meta")
        run_fp = (art["run"].data.get("fingerprint") if art["run"] else None) or {}
        art["killtest"] = pick(found, "killtest", lambda a: bool(run_fp) and same_configuration(
            a.data.get("fingerprint") or {}, run_fp), prov, "kill test")
        if corpus_sha is None and art["manifest"] is None:
            prov.notes["manifest"] += "; the run's shards (shards_index.json) are not under --from"
    training_data = {d["sha256"] for n in prov.chain for d in n.get("data", [])}
    if art.get("manifest"):
        training_data.add(art["manifest"].data["output"]["sha256"])
    # a leak scan is cited by the hash of the bytes it scanned, and only when it could read every held-out record
    art["leaks"] = pick(found, "leaks", lambda a: bool(training_data & {c.get("sha256") for c in a.data["corpora"]})
                        and a.data.get("complete") is True, prov, "leak scan")
    return prov, art, measured_on


def valid_pii(path: Path) -> bool:
    """A PII report the upload gate would read (release.upload.read_pii_report); any other is not cited."""
    from hitoban.release.upload import PIIReportError, read_pii_report

    try:
        read_pii_report(path)
    except PIIReportError:
        return False
    return True


def same_tokenizer(folder: Path, node: dict) -> bool:
    return (folder / "tokenizer.json").exists() and sha256_file(folder / "tokenizer.json") == node.get(
        "tokenizer_sha256")


def same_configuration(killtest: dict, run: dict) -> bool:
    """A kill test speaks for a run when everything but the budget is the same (model, data, every option)."""
    budget = {"total_steps"}
    return {k: v for k, v in killtest.items() if k not in budget} == {k: v for k, v in run.items() if k not in budget}


def build_card(model_dir: str | os.PathLike, repo: str, search: list[str | os.PathLike] = (),
               license: str = "apache-2.0", llama_export: dict | None = None) -> tuple[ModelCard, dict]:
    """Returns (card, numbers): `numbers` is every measured value the card shows, with the file it came from.
    `llama_export`: `model_dir` is a Llama export whose check (formats.prepare_llama_export) has just passed."""
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").exists():
        raise MissingInputError(f"{model_dir}: no config.json; give a from_pretrained model folder")
    prov, art, measured_on = trace(model_dir, [Path(p) for p in search], verified_export=llama_export is not None)
    total, non_embedding, config = count_parameters(model_dir)
    numbers = {"weights_sha256": prov.own, "parameters": total, "non_embedding_parameters": non_embedding,
               "sources": {k: a.rel for k, a in art.items() if a is not None},
               "measured_on": {k: prov.names[v] for k, v in measured_on.items()}}
    if llama_export is not None:
        numbers["format"] = "llama"
        numbers["llama_export"] = {k: llama_export[k] for k in ("max_abs_logit_diff", "greedy_identical", "atol",
                                                                "source_weights_sha256")}
    sections = CardText(model_dir, repo, prov, art, measured_on, numbers, llama_export)
    lines = sections.overview(total, non_embedding, config) + sections.evaluation() + sections.usage()
    lines += sections.training() + sections.data_section() + sections.limitations(total) + sections.licence(license)
    tags = ["hitoban", "japanese", "from-scratch", "llama" if llama_export else "custom_code", "text-generation"]
    data = ModelCardData(language=["ja"], license=license, library_name="transformers",
                         pipeline_tag="text-generation", model_name=repo.split("/")[-1], tags=tags,
                         datasets=sections.hub_datasets() or None, eval_results=sections.eval_results() or None)
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines)), numbers


def write_card(model_dir: str | os.PathLike, repo: str, search: list[str | os.PathLike] = (),
               out: str | os.PathLike | None = None, fmt: str = "hitoban", log=print) -> dict:
    """Write README.md (and eval_results.json, the numbers it shows with their sources) into the model folder;
    with fmt "llama", into its verified Llama export (made beside it when absent), the folder itself searched too."""
    folder, export = Path(model_dir), None
    if check_format(fmt) == "llama":
        folder, export = prepare_llama_export(model_dir, log)
        search = [*search, model_dir]
    card, numbers = build_card(folder, repo, search, llama_export=export)
    out = Path(out) if out else folder / "README.md"
    card.save(out)
    (out.parent / "eval_results.json").write_text(json.dumps(numbers, indent=2, ensure_ascii=False),
                                                  encoding="utf-8")
    kinds = ("run", "manifest", "tokenizer", "bpc", "gen", "leaks", "pii", "canary", "killtest", "sft")
    return {"card": str(out), "measured": sorted(k for k in kinds if k in numbers["sources"]),
            "not_measured": sorted(k for k in kinds if k not in numbers["sources"]), "sources": numbers["sources"]}
