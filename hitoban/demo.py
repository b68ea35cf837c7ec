"""`hitoban demo`: the whole night in minutes, from corpus to a model that is ready to publish.

Every stage is the real one (the same library functions the verbs call), just small: corpus -> tokenizer ->
shards (+ verify) -> calibrate -> pretrain, SIGKILLed halfway and resumed, checked bit for bit against an
uninterrupted run -> chat SFT -> bits/char and generation metrics -> leak scan -> PII probe with canaries ->
model card -> upload dry run -> `from_pretrained` in a process that cannot import hitoban. Each stage prints one
line and its time; `report.md` links every JSON and PNG.
Lazy imports: each stage imports its library when it runs, so `hitoban demo --help` starts without torch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from hitoban.demo_data import HELD_OUT_EVERY, prepare_data
from hitoban.errors import CheckFailed, OutputExistsError, UsageError
from hitoban.options import argv_for, checked_against
from hitoban.provenance import write_json
from hitoban.run_folder import RunFolder
from hitoban.start_options import DEMO_STAGES, DemoOptions

REPO_ID = "your-name/hitoban-demo"


@dataclass
class DemoSettings:
    vocab_size: int = 2000
    context: int = 128
    batch_size: int = 16
    pretrain_steps: int = 300
    pretrain_lr: float = 3e-3
    sft_steps: int = 120
    sft_lr: float = 1e-3
    questions: int = 10
    gen_max_new_tokens: int = 120
    calibrate_steps: int = 3
    canaries: int = 8
    canary_steps: int = 200
    aozora_chars: int = 300_000
    seed_contacts: int = 7

    @classmethod
    def quick(cls) -> DemoSettings:
        """For CI: fewer steps everywhere; the canary training keeps its length (it must still show extraction)."""
        return cls(pretrain_steps=120, sft_steps=30, questions=4, gen_max_new_tokens=40, calibrate_steps=2)


class Stages:
    """Runs named stages, printing one line each with its time, and keeps the table for the summary."""

    def __init__(self, log):
        self.log, self.rows, self.number = log, [], 0

    def run(self, name: str, fn):
        self.number += 1
        started = time.time()
        self.log(f"[{self.number:>2}] {name} ...")
        summary, value = fn()
        seconds = time.time() - started
        self.rows.append({"stage": name, "result": summary, "seconds": round(seconds, 1)})
        self.log(f"[{self.number:>2}] {name:<12} {summary}  ({seconds:.1f} s)")
        return value


def pretrain_options(settings: DemoSettings, cpu: bool, seed: int) -> list[str]:
    """The demo night's `hitoban pretrain` options (the kill test runs exactly these)."""
    from hitoban.training.pretrain.options import PretrainConfig

    return argv_for(PretrainConfig, preset="tiny", batch_size=settings.batch_size, context=settings.context,
                    lr=settings.pretrain_lr, warmup_frac=0.05, seed=seed,
                    eval_every=max(settings.pretrain_steps // 6, 10), eval_batches=4, cpu=cpu)


def pretrain_with_kill(shards: Path, out: Path, settings: DemoSettings, cpu: bool, seed: int, log) -> dict:
    """The real kill test (`hitoban killtest`'s harness) on the demo's configuration: its killed-and-resumed run
    is the demo's model (out/run), checked against two uninterrupted runs and a dropped-optimizer control."""
    from hitoban.evaluation.plots import plot_killtest
    from hitoban.training.pretrain.killtest import run_killtest, train_losses

    result = run_killtest(shards, out / "killtest", pretrain_options(settings, cpu, seed),
                          steps=settings.pretrain_steps, kills=2, killed_run=out / "run", log=lambda *_: None)
    shutil.copy2(out / "killtest" / "killtest.json", out / "killtest.json")
    plot_killtest(result, out / "killtest.png")
    for name in ("base1", "base2", "noopt"):  # only the reports are kept; the run itself is out/run
        shutil.rmtree(out / "killtest" / name, ignore_errors=True)
    losses, _ = train_losses(out / "run")
    evals = RunFolder(out / "run").records("eval")
    return {**result, "loss_first": losses[min(losses)], "loss_last": losses[max(losses)],
            "val_losses": [(r["step"], r["val_loss"]) for r in evals]}


def validation_summary(val_losses: list[tuple[int, float]]) -> str:
    """Validation loss, first -> best -> last, and what it means when it rose again (memorisation)."""
    if not val_losses:
        return "no validation split"
    best_step, best = min(val_losses, key=lambda sv: sv[1])
    last_step, last = val_losses[-1]
    text = f"val loss {val_losses[0][1]:.2f} -> best {best:.2f} at step {best_step}"
    if last > best + 0.05:
        text += (f" -> {last:.2f} at step {last_step}: it rose again, the model is memorising the small training "
                 "text (final/ keeps the best-validation weights)")
    return text


def check_from_pretrained(release: Path) -> str:
    """Load and generate in a fresh process where `import hitoban` fails: only the saved remote code is used."""
    code = (
        "import sys; sys.modules['hitoban'] = None\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        f"path = {str(release)!r}\n"
        "tok = AutoTokenizer.from_pretrained(path, trust_remote_code=True)\n"
        "model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)\n"
        "ids = tok.apply_chat_template([{'role': 'user', 'content': 'こんにちは'}], add_generation_prompt=True,"
        " return_tensors='pt', return_dict=True)\n"
        "out = model.generate(**ids, max_new_tokens=30, do_sample=False,"
        " eos_token_id=tok.convert_tokens_to_ids('<|end|>'), pad_token_id=tok.pad_token_id)\n"
        "new = out[0, ids['input_ids'].shape[1]:]\n"
        "print('RESULT|' + type(model).__module__ + '|' + str(len(new)) + '|' + tok.decode(new,"
        " skip_special_tokens=True))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode:
        raise RuntimeError(f"from_pretrained(trust_remote_code=True) failed:\n{done.stderr[-3000:]}")
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT|")][-1]
    _, module, generated, text = result.split("|", 3)
    if not module.startswith("transformers_modules"):
        raise RuntimeError(f"the model loaded from {module}, not from the remote code saved with it")
    if not text.strip():  # say why, rather than print ''
        return (f"(an empty reply: the model generated {generated} token(s) and ended with <|end|>; a tiny model on "
                "tiny data often answers a greeting by ending the turn)")
    return text


DEMO_MARKER = "HITOBAN_DEMO"
STAGES = DEMO_STAGES


class DemoRun:
    """One demo into `out`: a method per stage, each returning (one-line summary, value for report.json)."""

    def __init__(self, out: Path, source: list[str], settings: DemoSettings, cpu: bool, seed: int, log):
        from hitoban.modeling.loading import device_for  # torch: loaded once the demo runs, not at `--help`

        self.out, self.source, self.settings, self.cpu, self.seed, self.log = out, source, settings, cpu, seed, log
        self.device = device_for(cpu)  # every stage that runs a model runs it here: --cpu means the CPU throughout
        self.release = out / "release"
        self.sources, self.domains, self.prose_train, self.target = prepare_data(
            source, out / "data", settings.seed_contacts, settings.aozora_chars)

    def corpus(self):
        from hitoban.training.data.corpus import build_corpus
        from hitoban.training.data.filters import FilterSettings

        m = build_corpus(self.sources, self.out / "corpus", target_chars=self.target, seed=self.seed,
                         settings=FilterSettings(min_chars=50), progress=False)
        rejected = sum(m["filters"]["rejected"].values())
        return f"{m['total_documents']} documents, {m['total_chars']:,} chars ({rejected} rejected)", m["total_chars"]

    def tokenizer(self):
        from hitoban.training.data.corpus import iter_corpus
        from hitoban.training.data.tokenizer import train_tokenizer_from_corpus

        # SentencePiece needs a piece for every character, and other sources than the built-in text can have more
        # distinct characters than the demo's small vocabulary.
        distinct = len({ch for record in iter_corpus(self.out / "corpus") for ch in record["text"]})
        meta = train_tokenizer_from_corpus(self.out / "corpus", self.out / "tokenizer",
                                           vocab_size=min(max(self.settings.vocab_size, distinct + 500), 16000),
                                           seed=self.seed, model_max_length=256, heldout_every=HELD_OUT_EVERY,
                                           hard_vocab_limit=False)
        cpt = meta["heldout"]["chars_per_token"]
        return f"{meta['vocab_size']:,} pieces, {cpt} chars/token on held-out documents", meta["vocab_size"]

    def shards(self):
        from hitoban.training.data.shards import build_shards, verify_shards

        build_shards(self.out / "corpus", self.out / "tokenizer", self.out / "shards", shard_tokens=20_000,
                     val_every=8, context=self.settings.context, seed=self.seed, progress=False)
        splits = verify_shards(self.out / "shards", self.out / "tokenizer", full=True)["splits"]
        return (f"{', '.join(f'{s} {n:,} tokens' for s, n in splits.items())}; verified (sha256, boundaries, "
                "tokenizer)"), splits

    def calibrate(self):
        from hitoban.training.pretrain.calibrate import calibrate
        from hitoban.training.pretrain.options import CalibrateOptions

        options = CalibrateOptions(candidate=[f"tiny:{self.settings.batch_size}"], hours=8.0,
                                   data=str(self.out / "shards"), context=self.settings.context,
                                   steps=self.settings.calibrate_steps, warmup=1, cpu=self.cpu, compile="off",
                                   out=str(self.out / "calibration.json"))
        result = calibrate(options, log=lambda *_: None)
        row = result["results"][0]
        return (f"tiny x batch {row['batch']}: {row['tok_per_sec']:,.0f} tok/s -> {row['tokens_in_budget']:,} "
                f"tokens in 8 h (D/N {row['d_over_n']:.0f})"), row["tok_per_sec"]

    def pretrain(self):
        from hitoban.evaluation.plots import plot_run

        result = pretrain_with_kill(self.out / "shards", self.out, self.settings, self.cpu, self.seed, self.log)
        plot_run(self.out / "run", self.out / "plots")
        if not result["passed"]:
            failed = [name for name, ok in result["checks"].items() if not ok]
            raise CheckFailed(f"the kill test failed ({', '.join(failed)}): see {self.out}/killtest.json")
        same = ("bit-identical to" if result["killed_bit_identical"] else
                f"max |diff| {result['killed_diff']:.1e} ({result['mode']}) from")
        return (f"train loss {result['loss_first']:.2f} -> {result['loss_last']:.2f} in {result['steps']} steps; "
                f"{validation_summary(result['val_losses'])}; SIGKILLed at steps {result['killed_at_steps']} (once "
                f"mid-save), resumed {result['resumes']}x, {same} an uninterrupted run; dropped-optimizer control "
                "detected"), result

    def sft(self):
        from hitoban.training.finetune.options import FinetuneOptions
        from hitoban.training.finetune.sft import finetune

        steps = self.settings.sft_steps
        options = FinetuneOptions(base=str(self.out / "run" / "final"), data=[str(self.out / "data" /
                                  "chat_train.jsonl")], out=str(self.out / "sft"), lr=self.settings.sft_lr,
                                  max_steps=steps, batch_size=8, val_frac=0.1, eval_steps=max(steps // 4, 5),
                                  seed=self.seed, min_char_freq=1, cpu=self.cpu)
        summary = finetune(options, quiet=True, log=lambda *_: None)
        self.release.mkdir()
        for item in (self.out / "sft").iterdir():  # the model, without the Trainer's checkpoints and arguments
            if item.is_file() and item.name != "summary.json" and not item.name.startswith("training_args"):
                shutil.copy2(item, self.release / item.name)
        return (f"{summary['train_conversations']} conversations, val loss {summary['first_val_loss']:.3f} -> "
                f"{summary['best_val_loss']:.3f} ({summary['counted_ratio']:.0%} of tokens counted)"), summary

    def eval(self):
        from hitoban.evaluation.bpc import cross_domain, write_outputs
        from hitoban.evaluation.generation import SAMPLING, evaluate_generation

        with warnings.catch_warnings():  # short domains are flagged in the table (⚠) and the JSON instead
            warnings.simplefilter("ignore", UserWarning)
            result = cross_domain([self.out / "run" / "final", self.release], self.domains, max_chars=None,
                                  shards=self.out / "shards", device=self.device)
        write_outputs(result, self.out / "eval" / "bpc.json")
        gen = evaluate_generation(self.release, self.out / "data" / "questions.jsonl", self.out / "eval" / "gen.json",
                                  {**SAMPLING, "max_new_tokens": self.settings.gen_max_new_tokens},
                                  limit=self.settings.questions, device=self.device)
        mine = {r["domain"]: r["bits_per_char"] for r in result["records"] if r["model"] == "release"}
        metrics = {k: gen[k] for k in ("repetition_rate", "topic_rate", "broken_rate", "avg_reply_len")}
        return (", ".join(f"{d} {v:.2f}" for d, v in mine.items()) + " bits/char; repetition "
                f"{gen['repetition_rate']}, topic {gen['topic_rate']}, broken {gen['broken_rate']}"), \
            {"bits_per_char": mine, "generation": metrics}

    def leaks(self):
        from hitoban.evaluation.leaks import scan_for_leaks

        data = self.out / "data"
        result = scan_for_leaks(data / "chat_heldout.txt", [self.out / "corpus", data / "chat_train.jsonl"],
                                out=self.out / "eval" / "leaks.json")
        verdict = "LEAKED" if result["leaked"] else "no held-out text in the corpus or SFT data"
        coverage = result["coverage"]
        return (f"{coverage['probed_lines']} of {coverage['lines']} held-out lines probed ({result['probes']} probes, "
                f"{result['whole_turns']} whole turns; self-test passed): {verdict}"), result["leaked"]

    def pii(self):
        from hitoban.evaluation import privacy as pii
        from hitoban.training.data.corpus import iter_corpus

        probe = pii.probe_model(self.release, [self.out / "corpus"], progress=False, out=self.out / "eval" / "pii.json",
                                device=self.device)
        shutil.copy2(self.out / "eval" / "pii.json", self.release / "pii.json")  # the upload checks it (not sent)
        # The control plants canaries into a *small* copy (~10k chars, the built-in prose's size): it asks whether
        # the probe can see memorisation, which a tiny model only shows on a little text.
        texts, size = [], 0
        records = iter_corpus(self.out / "corpus") if self.prose_train is None else (
            {"text": t} for t in self.prose_train)
        for record in records:
            texts.append(record["text"][:2000])
            size += len(texts[-1])
            if size >= 10_000:
                break
        canary = pii.canary_control(texts, self.out / "pii-canaries", count=self.settings.canaries,
                                    steps=self.settings.canary_steps, seed=self.seed, log=lambda *_: None)
        rows = ", ".join(f"{r['exact']}/{r['canaries']} at {r['repetitions']}x"
                         for r in canary["planted_model"]["by_repetitions"])
        tried = (f"{probe['tried']} corpus contacts tried ({probe['mining']['from_masked_log']} from the masked-value "
                 f"log), {probe['exact']} exact" if probe["status"] == "measured"
                 else "probe NOT MEASURED (no contact to try)")
        return (f"{tried}; canaries extracted {rows}, clean model {canary['clean_model']['exact_total']}"), {
                    "probe": {k: probe[k] for k in ("status", "tried", "exact", "partial")},
                    "canary_sensitive": canary["sensitive"]}

    def card(self):
        from hitoban.release.card import write_card

        result = write_card(self.release, REPO_ID, [self.out])
        return f"README.md; not measured: {', '.join(result['not_measured']) or 'nothing'}", result["measured"]

    def upload(self):
        from hitoban.release.upload import UploadRefused, upload_model

        lines: list[str] = []
        try:
            result = upload_model(self.release, REPO_ID, dry_run=True, log=lines.append)
        except UploadRefused:  # a dry run: the refusal and its reasons are the result to show
            (self.out / "upload-dry-run.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
            reasons = [line.strip()[len("REFUSED: "):] for line in lines if line.strip().startswith("REFUSED")]
            return f"REFUSED (nothing sent): {reasons[0][:160]}", {"refused": reasons}
        (self.out / "upload-dry-run.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        size = sum((self.release / f).stat().st_size for f in result["files"])
        return (f"{len(result['files'])} files ({size / 2**20:.1f} MiB) would be uploaded, "
                f"{len(result['skipped'])} skipped; nothing sent"), result

    def load(self):
        text = check_from_pretrained(self.release)
        shown = text if text.startswith("(an empty reply") else repr(text[:60])
        return f"AutoModelForCausalLM (remote code, no hitoban) says: {shown}", text


@checked_against(DemoOptions, "seed")
def run_demo(out: str | os.PathLike = "hitoban-demo", source: list[str] | None = None, quick: bool = False,
             cpu: bool | None = None, seed: int = 0, until: str | None = None, force: bool = False,
             log=print) -> dict:
    """Run the stages (all, or up to `until`) into `out`, which must be new or empty (or, with `force`, an earlier
    demo's folder, replaced); returns the report that is also written as report.json and report.md."""
    import torch

    if until is not None and until not in STAGES:
        raise UsageError(f"--until must be one of {', '.join(STAGES)}")
    started = time.time()
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        if not force:
            raise OutputExistsError(f"{out} already exists and is not empty; pass --force to replace an earlier demo, "
                                    "or choose another --out")
        if not (out / DEMO_MARKER).exists():
            raise OutputExistsError(f"{out} is not a folder `hitoban demo` made (no {DEMO_MARKER}); --force only "
                                    "replaces earlier demos. Choose another --out")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / DEMO_MARKER).write_text("made by `hitoban demo`; `hitoban demo --force` may replace this folder\n",
                                   encoding="utf-8")
    source = source or ["builtin"]
    settings = DemoSettings.quick() if quick else DemoSettings()
    cpu = cpu if cpu is not None else not (torch.cuda.is_available() or torch.backends.mps.is_available())
    device = "cpu" if cpu else ("cuda" if torch.cuda.is_available() else "mps")
    report: dict = {"kind": "demo", "schema": 1, "source": source, "quick": quick, "settings": asdict(settings),
                    "device": device}
    log(f"hitoban demo -> {out} (source {' '.join(source)}, {'quick' if quick else 'full'}, {report['device']})")
    demo, stages = DemoRun(out, source, settings, cpu, seed, log), Stages(log)
    with quiet_transformers():  # one line per stage: no per-save progress bars or library notes on stderr
        for name in STAGES[:STAGES.index(until) + 1] if until else STAGES:
            report[name] = stages.run(name, getattr(demo, name))
    report["stages"] = stages.rows
    report["seconds"] = round(time.time() - started, 1)
    write_json(out / "report.json", report)
    write_report(out, report)
    log("\n" + summary_table(report))
    log(f"\ndone in {report['seconds']:.0f} s. Report: {out / 'report.md'}"
        + (f"; model: {demo.release} (chat with `hitoban chat {demo.release}`)" if demo.release.exists() else ""))
    return report


@contextmanager
def quiet_transformers():
    """transformers' own progress bars (every save and load) and info notes, off for the demo, restored after."""
    from transformers.utils import logging as hf_logging

    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def summary_table(report: dict) -> str:
    lines = ["| stage | result | seconds |", "|---|---|---:|"]
    lines += [f"| {r['stage']} | {r['result']} | {r['seconds']} |" for r in report["stages"]]
    return "\n".join(lines)


LINKS = [("corpus manifest", "corpus/manifest.json"), ("tokenizer stats", "tokenizer/tokenizer_meta.json"),
         ("shard index", "shards/shards_index.json"), ("calibration", "calibration.json"),
         ("pretraining log", "run/log.jsonl"), ("kill + resume check", "killtest.json"),
         ("SFT summary", "sft/summary.json"), ("bits/char (JSON)", "eval/bpc.json"),
         ("bits/char (table)", "eval/bpc.md"), ("generation metrics", "eval/gen.json"),
         ("leak scan", "eval/leaks.json"),
         ("PII probe", "eval/pii.json"), ("canary control", "pii-canaries/canary_control.json"),
         ("model card", "release/README.md"), ("upload dry run", "upload-dry-run.txt")]


def write_report(out: Path, report: dict) -> Path:
    """report.md: the summary table, links to every artefact, and the figures inline."""
    lines = ["# hitoban demo report", "", f"Source: {' '.join(report['source'])}; device: {report['device']}; "
             f"{'quick' if report['quick'] else 'full'} settings; {report['seconds']:.0f} s in all.", "",
             summary_table(report), "", "## Artefacts", ""]
    lines += [f"- [{label}]({path})" for label, path in LINKS if (out / path).exists()]
    figures = sorted(out.glob("plots/*.png")) + sorted(out.glob("eval/*.png"))
    if figures:
        lines += ["", "## Figures", ""]
        lines += [f"![{p.stem}]({p.relative_to(out).as_posix()})" for p in figures]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
