"""The demo's inputs: the built-in chats and questions, the pretraining text (built-in prose, Aozora, FineWeb-2 or
the user's files) with a held-out share, the recipe's own input files, and fake contacts for the PII probe.
Lazy imports: faker and the corpus writer load only when the demo builds its inputs."""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

from hitoban.training.data.corpus import builtin_documents

HELD_OUT_EVERY = 7  # every 7th builtin document / dialogue is kept out of training for evaluation


def builtin_chats() -> list[dict]:
    text = files("hitoban.data").joinpath("builtin_chat.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def prepare_data(source: list[str], data: Path, seed_contacts: int, aozora_chars: int):
    """Write the demo's inputs under DIR/data and return the corpus sources. Chats and questions are always the
    built-in ones (SFT needs dialogues); the pretraining text is the built-in prose, Aozora, FineWeb-2 or files."""
    from hitoban.provenance import TEST_DATA_MARKER
    from hitoban.training.data.corpus import hub_source, local_source

    data.mkdir(parents=True, exist_ok=True)
    chats = builtin_chats()
    train_chats = [c for i, c in enumerate(chats) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
    held_chats = [c for i, c in enumerate(chats) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    (data / "chat_train.jsonl").write_text("".join(json.dumps(c, ensure_ascii=False) + "\n" for c in train_chats),
                                           encoding="utf-8")
    (data / "chat_heldout.txt").write_text(
        "".join(f"<|user|>{c['user']}<|assistant|>{c['assistant']}\n" for c in held_chats), encoding="utf-8")
    (data / "questions.jsonl").write_text(files("hitoban.data").joinpath("builtin_questions.jsonl")
                                          .read_text(encoding="utf-8"), encoding="utf-8")
    domains = {"dialogue": data / "chat_heldout.txt"}
    if source == ["builtin"]:
        docs = builtin_documents()
        train = [d for i, d in enumerate(docs) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
        held = [d for i, d in enumerate(docs) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
        (data / "prose_train.txt").write_text("\n\n".join(train) + "\n", encoding="utf-8")
        (data / "prose_heldout.txt").write_text("\n".join(held) + "\n", encoding="utf-8")
        # The training dialogues also go into pretraining as plain text (5 exchanges per document): with so little
        # text, the tokenizer must see their characters and the model their style before SFT can use them.
        blocks = ["\n".join(f"「{c['user']}」「{c['assistant']}」" for c in train_chats[i:i + 5])
                  for i in range(0, len(train_chats), 5)]
        (data / "dialogue_train.txt").write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
        domains["prose"] = data / "prose_heldout.txt"
        write_recipe_inputs(data.parent / "recipe-inputs", train, held, train_chats, held_chats)
        fakes = data / "fake-contacts"  # marked, so secret scans skip the planted contacts and say so
        fakes.mkdir(exist_ok=True)
        (fakes / TEST_DATA_MARKER).write_text("Fake contacts (Faker ja_JP) for the PII probe; nobody's data.\n",
                                              encoding="utf-8")
        (fakes / "notices.txt").write_text(fake_notice(train, seed_contacts), encoding="utf-8")
        licence = "Apache-2.0 (original text written for hitoban)"
        sources = [local_source([str(data / "prose_train.txt")], name="builtin-prose", blank_line_docs=True,
                                license=licence),
                   local_source([str(data / "dialogue_train.txt")], name="builtin-dialogue", blank_line_docs=True,
                                license=licence),
                   local_source([str(data / "fake-contacts" / "notices.txt")], name="builtin-notices",
                                blank_line_docs=True,
                                license="generated: fake contacts (Faker ja_JP) for the PII probe")]
        return sources, domains, train, None
    if source in (["aozora"], ["fineweb2-ja"]):
        return [hub_source(source[0])], domains, None, aozora_chars
    return [local_source(source)], domains, None, None


RECIPE_INPUTS = """# The overnight recipe's inputs, small

Every input the README's recipe names, in its format, made from the demo's built-in text (Apache-2.0). Replace them
with your own, keeping the format:

- `my_texts/`: your pretraining text; a folder = one document per `.txt` file (a single `.txt` file: one document
  per line). `hitoban corpus --input my_texts/ --license "..."`.
- `chats.jsonl`: chat fine-tuning data, one JSON object per line: `{"user": "...", "assistant": "..."}` or
  `{"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}`; also TSV
  (`user<TAB>assistant`) or 3LM's `<|user|>Q<|assistant|>A<|end|>` lines.
- `holdout.txt`: held-out chats never to train on, one per line in 3LM's format `<|user|>Q<|assistant|>A<|end|>`
  (`hitoban sft --exclude`, `hitoban leaks --holdout`, and a bits/char domain).
- `tone.jsonl`: the character-tone data, the same format as `chats.jsonl` (here: a copy of some chats; write your
  character's replies).
- `eval/NAME.txt`: held-out text per domain for bits/char (`--domain NAME=eval/NAME.txt`); the recipe names
  `literature` and `web`, the demo has `prose` and `dialogue`.
- `small.txt`: a little text (~10k characters) for the PII probe's canary control (`hitoban pii --canaries`).
- `questions.jsonl`: fixed evaluation questions, `{"id": "...", "category": "...", "turns": ["..."],
  "keywords": ["...", ...]}` (keywords: the topic-retention metric).
"""


def write_recipe_inputs(folder: Path, prose: list[str], held_prose: list[str], chats: list[dict],
                        held_chats: list[dict]) -> None:
    """A tiny example of every input the README's recipe names, under the recipe's own names."""
    (folder / "my_texts").mkdir(parents=True, exist_ok=True)
    (folder / "eval").mkdir(exist_ok=True)
    for i, text in enumerate(prose):
        (folder / "my_texts" / f"{i:03d}.txt").write_text(text + "\n", encoding="utf-8")
    lines = {"chats.jsonl": [json.dumps(c, ensure_ascii=False) for c in chats],
             "tone.jsonl": [json.dumps(c, ensure_ascii=False) for c in chats[:20]],
             "holdout.txt": [f"<|user|>{c['user']}<|assistant|>{c['assistant']}<|end|>" for c in held_chats],
             "eval/prose.txt": held_prose,
             "eval/dialogue.txt": [f"「{c['user']}」「{c['assistant']}」" for c in held_chats],
             "small.txt": prose}
    for name, rows in lines.items():
        (folder / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    (folder / "questions.jsonl").write_text(files("hitoban.data").joinpath("builtin_questions.jsonl")
                                            .read_text(encoding="utf-8"), encoding="utf-8")
    (folder / "README.md").write_text(RECIPE_INPUTS, encoding="utf-8")


def fake_notice(documents: list[str], seed: int) -> str:
    """One document with three *fake* contacts (Faker ja_JP), so the corpus build has something to mask and the
    PII probe something to try, through its real path (masked-value log -> attack). Real text rarely lacks
    contacts; the built-in prose does, and a probe with nothing to try measures nothing."""
    from faker import Faker

    fake = Faker("ja_JP")
    fake.seed_instance(seed)
    parts = []
    for doc in documents[:3]:
        user = fake.unique.user_name().replace(".", "") + str(fake.random_int(10, 99))
        parts.append(f"{doc[:110]}このお知らせについてのお問い合わせは、{fake.name().replace(' ', '')}さん"
                     f"（{user}@{fake.free_email_domain()}、電話 {fake.numerify('090-####-####')}）までお願いします。")
    return "".join(parts) + "\n"
