"""Every verb that reads an artefact of the README's path, with the arguments the harness runs it with.

`a` is the pristine set of artefacts (inputs a verb needs besides the damaged one), `m` the damaged copy, `o` the
case's own --out. Gates name the members they vouch for: `shards --verify` every byte the index hashes, `upload`
the weights and the card its PII and provenance gates certify (and no link may leave the folder).
"""

from __future__ import annotations

from mutation_artefacts import NIGHT
from mutation_harness import Verb

RUN_FILES = ("config.json", "log.jsonl", "heartbeat.json", "summary.json", "CURRENT", "LOCK")
MODEL_FILES = ("config.json", "model.safetensors", "generation_config.json")
MODEL_AND_TOKENIZER = (*MODEL_FILES, "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
TRAINING_SHARDS = ("shards_index.json", "train_000.bin")  # a pretrain per case (seconds): what every start reads
RESUMED_FILES = ("config.json", "log.jsonl", "CURRENT", "ckpt-B/train_state.json", "ckpt-B/model.safetensors",
                 "ckpt-B/COMPLETE")  # the newest slot (CURRENT names it) and what a resume reads first
SHARDS = ["--shard-tokens", "12000", "--val-every", "4", "--context", "32"]
VERBS = [
    Verb("tokenizer", "corpus", lambda m, o, a: ["tokenizer", "--corpus", str(m), "--out", str(o), "--vocab-size",
                                                 "2500", "--max-chars", "200000", "--context", "64"]),
    Verb("shards", "corpus", lambda m, o, a: ["shards", "--corpus", str(m), "--tokenizer", str(a["tok"]), "--out",
                                              str(o), *SHARDS]),
    Verb("shards", "tok", lambda m, o, a: ["shards", "--corpus", str(a["corpus"]), "--tokenizer", str(m), "--out",
                                           str(o), *SHARDS]),
    Verb("check-mask", "tok", lambda m, o, a: ["check-mask", "--tokenizer", str(m)]),
    Verb("shards --verify", "shards", lambda m, o, a: ["shards", "--verify", str(m)],
         certifies=("shards_index.json", "*.bin", "*.domains.u8", "tokenizer/tokenizer.json")),
    Verb("pretrain", "shards", lambda m, o, a: ["pretrain", "--data", str(m), "--out", str(o),
                                                *NIGHT[:NIGHT.index("--steps")], "--steps", "1",
                                                *NIGHT[NIGHT.index("--steps") + 2:]], members=TRAINING_SHARDS),
    Verb("watch", "run", lambda m, o, a: ["watch", str(m), "--once"], members=RUN_FILES),
    Verb("plot", "run", lambda m, o, a: ["plot", str(m), "--out", str(o)], members=RUN_FILES),
    Verb("pretrain --resume auto", "run", lambda m, o, a: ["pretrain", "--data", str(a["shards"]), "--out", str(m),
                                                           *NIGHT, "--resume", "auto"], writes_input=True,
         members=RESUMED_FILES),
    Verb("eval bpc", "final", lambda m, o, a: ["eval", "bpc", str(m), "--domain", f"prose={a['prose']}", "--out",
                                               str(o / "bpc.json")], members=MODEL_AND_TOKENIZER + ("lineage.json",)),
    Verb("eval gen", "final", lambda m, o, a: ["eval", "gen", str(m), "--questions", str(a["questions"]), "--out",
                                               str(o / "gen.json")], members=MODEL_AND_TOKENIZER),
    Verb("chat", "final", lambda m, o, a: ["chat", str(m)], stdin="こんにちは\n/exit\n", members=MODEL_AND_TOKENIZER),
    Verb("check-kvcache", "final", lambda m, o, a: ["check-kvcache", "--model", str(m), "--steps", "2"],
         members=MODEL_FILES),
    Verb("export-llama", "final", lambda m, o, a: ["export-llama", str(m), str(o / "llama")],
         members=MODEL_AND_TOKENIZER + ("lineage.json",)),
    Verb("card", "reports", lambda m, o, a: ["card", str(a["final"]), "--repo", "me/tiny", "--from", str(m), "--out",
                                             str(o / "README.md")]),
    Verb("card", "final", lambda m, o, a: ["card", str(m), "--repo", "me/tiny", "--from", str(a["reports"]), "--out",
                                           str(o / "README.md")]),
    Verb("upload --dry-run", "release", lambda m, o, a: ["upload", str(m), "--repo", "me/tiny", "--dry-run"],
         certifies=("model.safetensors", "README.md", "pii.json"), ships_links=True),
]
VERBS += [
    Verb("leaks", "corpus", lambda m, o, a: ["leaks", "--holdout", str(a["holdout"]), "--corpus", str(m), "--out",
                                             str(o / "leaks.json")]),
    Verb("pii", "final", lambda m, o, a: ["pii", str(m), "--corpus", str(a["corpus"]), "--samples", "20",
                                          "--max-new-tokens", "4", "--out", str(o / "pii.json")],
         members=MODEL_AND_TOKENIZER + ("lineage.json",)),
    Verb("pii", "corpus", lambda m, o, a: ["pii", str(a["final"]), "--corpus", str(m), "--samples", "20",
                                           "--max-new-tokens", "4", "--out", str(o / "pii.json")]),
    Verb("export-gguf", "final", lambda m, o, a: ["export-gguf", str(m), str(o / "model.gguf")],
         members=MODEL_AND_TOKENIZER),
    Verb("sft", "final", lambda m, o, a: ["sft", str(m), "--data", str(a["chats"]), "--out", str(o / "sft"),
                                          "--max-steps", "1", "--batch-size", "2", "--cpu", "--min-char-freq", "1"],
         members=MODEL_AND_TOKENIZER + ("lineage.json",)),
]
VERBS += [
    Verb("compare", "final", lambda m, o, a: ["compare", str(m), str(a["final"]), "--max-new-tokens", "4", "--out",
                                              str(o / "compare")], members=MODEL_AND_TOKENIZER),
    Verb("tone", "final", lambda m, o, a: ["tone", str(m), "--data", str(a["chats"]), "--out", str(o / "tone"),
                                           "--max-steps", "1", "--batch-size", "2", "--cpu", "--min-char-freq", "1"],
         members=MODEL_AND_TOKENIZER + ("lineage.json",)),
    Verb("calibrate", "shards", lambda m, o, a: ["calibrate", "--data", str(m), "--candidate", "tiny:2", "--steps",
                                                 "1", "--warmup", "0", "--cpu", "--context", "32"],
         members=TRAINING_SHARDS),
]
SKIPS = {"run": ("final/*",)}  # final/ is an artefact of its own
