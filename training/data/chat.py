"""Chat data for SFT and tone fine-tuning: readers, 3LM's filters, holdout exclusion (docs/design.md §10).

Formats (one conversation per line): JSONL `{"messages": [{"role", "content"}, ...]}` or `{"user", "assistant"}`,
TSV `user<TAB>assistant`, and 3LM's line format `<|user|>Q<|assistant|>A<|end|>` (repeated for several turns).
A malformed line is an error naming the file and line, unless `skip_bad` (then counted): a silent drop of most
of the data is how a fine-tune quietly trains on nothing.

Filters, applied to every user/assistant pair of a conversation (one failing pair drops the conversation), in
3LM's order: lengths, exact duplicates, broken translations (user == assistant, or a 6-char n-gram x4 in the
answer), holdout exclusion (exact pairs, then any shared 40-char window: below the 48-char leak probes, so what
survives cannot trip `hitoban leaks`), rare characters.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hitoban.errors import InputError
from hitoban.files import read_text
from hitoban.options import CheckedSettings, option

LINE_FORMAT = re.compile(r"<\|user\|>(.*?)<\|assistant\|>(.*?)<\|end\|>", re.DOTALL)


class ChatDataError(InputError):
    """A malformed chat file or line; the message names the file and line."""


@dataclass
class ChatFilterSettings(CheckedSettings):
    """3LM's chat filters; the ranges are checked when made (the fine-tuning verbs copy them: `same_as`)."""

    max_user_chars: int = option(100, "longer user turns are dropped (3LM)", min=1)
    min_assistant_chars: int = option(4, "shorter replies are dropped (3LM)", min=0)
    max_assistant_chars: int = option(300, "longer replies are dropped (3LM)", min=1)
    dedup: bool = True
    broken_translation: bool = True
    exclude_window: int = option(40, "a pair sharing a window this long with a held-out chat is dropped", min=1)
    min_char_freq: int = option(10, "drop chats with a character rarer than this in the data (3LM: broken text)",
                                min=1)  # 1 disables (3LM used 1 for the tone data)


def normalise(text: str) -> str:
    return " ".join(text.split())


def _check_roles(messages: list[dict], where: str) -> list[dict]:
    if not messages:
        raise ChatDataError(f"{where}: empty conversation")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise ChatDataError(f"{where}: message {i} needs a string 'content'")
        expected = "user" if i % 2 == 0 else "assistant"
        if message.get("role") != expected:
            raise ChatDataError(f"{where}: roles out of order (message {i} is {message.get('role')!r}, expected "
                                f"{expected!r}; conversations alternate user/assistant, starting with user)")
    if messages[-1]["role"] != "assistant":
        raise ChatDataError(f"{where}: no assistant turn answers the last user turn")
    return [{"role": m["role"], "content": normalise(m["content"])} for m in messages]


def parse_line(line: str, suffix: str, where: str) -> list[dict]:
    if suffix == ".jsonl":
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ChatDataError(f"{where}: not valid JSON ({err.msg})") from None
        if isinstance(record, dict) and "messages" in record:
            return _check_roles(record["messages"], where)
        if isinstance(record, dict) and "user" in record:
            if not record.get("assistant"):
                raise ChatDataError(f"{where}: no assistant turn")
            return _check_roles([{"role": "user", "content": record["user"]},
                                 {"role": "assistant", "content": record["assistant"]}], where)
        raise ChatDataError(f"{where}: expected {{'messages': [...]}} or {{'user', 'assistant'}}")
    if suffix == ".tsv":
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 2 or not parts[1].strip():
            raise ChatDataError(f"{where}: expected user<TAB>assistant")
        return _check_roles([{"role": "user", "content": parts[0]}, {"role": "assistant", "content": parts[1]}],
                            where)
    turns = LINE_FORMAT.findall(line)
    if not turns or LINE_FORMAT.sub("", line).strip():
        raise ChatDataError(f"{where}: expected <|user|>Q<|assistant|>A<|end|> (repeated for several turns)")
    messages = []
    for user, assistant in turns:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return _check_roles(messages, where)


def read_conversations(paths: list[str | Path], skip_bad: bool = False) -> tuple[list[list[dict]], dict]:
    """All conversations from the files, in order; returns (conversations, {"bad_lines": n, "files": [...]})."""
    conversations, bad = [], 0
    for path in map(Path, paths):
        found = 0
        for number, line in enumerate(read_text(path, "chat data given to --data").split("\n"), 1):
            if not line.strip():
                continue
            try:
                conversations.append(parse_line(line, path.suffix, f"{path.name}:{number}"))
                found += 1
            except ChatDataError:
                if not skip_bad:
                    raise
                bad += 1
        if found == 0:
            raise ChatDataError(f"{path.name}: no conversations" + (f" ({bad} bad lines skipped)" if bad else ""))
    return conversations, {"bad_lines": bad, "files": [Path(p).name for p in paths]}


def read_holdout_pairs(path: str | Path) -> list[tuple[str, str]]:
    text = read_text(path, "held-out chats given to --exclude")
    return [(normalise(q), normalise(a)) for q, a in LINE_FORMAT.findall(text)]


@dataclass
class ChatFilter:
    settings: ChatFilterSettings = field(default_factory=ChatFilterSettings)
    holdout: list[tuple[str, str]] = field(default_factory=list)
    rejected: Counter = field(default_factory=Counter)

    def __post_init__(self):
        w = self.settings.exclude_window
        self._holdout_pairs = set(self.holdout)
        self._windows = {t[i : i + w] for pair in self.holdout for t in pair for i in range(max(0, len(t) - w + 1))
                         if len(t) >= w}

    def _pair_reason(self, user: str, answer: str) -> str | None:
        s = self.settings
        if len(user) > s.max_user_chars or not s.min_assistant_chars <= len(answer) <= s.max_assistant_chars:
            return "length"
        if s.broken_translation and (user == answer or (len(answer) >= 12 and max(
                Counter(answer[i : i + 6] for i in range(len(answer) - 5)).values()) >= 4)):
            return "broken_translation"
        if (user, answer) in self._holdout_pairs:
            return "holdout_exact"
        w = s.exclude_window
        if self._windows and any(t[i : i + w] in self._windows for t in (user, answer)
                                 for i in range(max(0, len(t) - w + 1))):
            return "holdout_window"
        return None

    def apply(self, conversations: list[list[dict]]) -> list[list[dict]]:
        kept, seen = [], set()
        for messages in conversations:
            pairs = [(messages[i]["content"], messages[i + 1]["content"]) for i in range(0, len(messages), 2)]
            key = tuple(pairs)
            if self.settings.dedup and key in seen:
                self.rejected["duplicate"] += 1
                continue
            seen.add(key)
            reason = next((r for r in (self._pair_reason(u, a) for u, a in pairs) if r), None)
            if reason:
                self.rejected[reason] += 1
                continue
            kept.append(messages)
        if self.settings.min_char_freq > 1:
            counts = Counter(ch for m in kept for message in m for ch in message["content"])
            rare = {ch for ch, n in counts.items() if n < self.settings.min_char_freq}
            before = len(kept)
            kept = [m for m in kept if not any(ch in rare for message in m for ch in message["content"])]
            self.rejected["rare_char"] += before - len(kept)
        return kept

    def report(self) -> dict:
        return {"settings": asdict(self.settings), "rejected": dict(self.rejected),
                "holdout_pairs": len(self.holdout)}
