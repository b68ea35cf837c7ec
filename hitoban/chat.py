"""`hitoban chat MODEL`: a terminal chat with streaming, history and sampling commands (docs/design.md §12)."""

from __future__ import annotations

from collections.abc import Callable

from transformers.generation.streamers import BaseStreamer

from hitoban.evaluation.generation import SAMPLING, reply
from hitoban.modeling.loading import device_for, load_model_and_tokenizer
from hitoban.training.device import decoding_dtype

HELP = ("commands: /reset (forget the conversation), /temp X, /topk N, /penalty X, /tokens N, /settings, /exit")


class Utf8SafeStreamer(BaseStreamer):
    """Streams decoded text, holding back while it ends in U+FFFD (an incomplete byte-fallback character)."""

    def __init__(self, tokenizer, write: Callable[[str], None]):
        self.tokenizer, self.write = tokenizer, write
        self.ids: list[int] = []
        self.emitted = ""
        self.prompt_seen = False

    def put(self, value) -> None:
        if not self.prompt_seen:  # generate() first passes the prompt
            self.prompt_seen = True
            return
        self.ids.extend(value.reshape(-1).tolist())
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return
        if text.startswith(self.emitted):
            self.write(text[len(self.emitted):])
            self.emitted = text

    def end(self) -> None:
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True).rstrip("\ufffd")
        if text.startswith(self.emitted) and len(text) > len(self.emitted):
            self.write(text[len(self.emitted):])
        self.emitted = text


def chat_loop(model, tokenizer, read_line: Callable[[], str | None], write: Callable[[str], None],
              settings: dict | None = None) -> list[dict]:
    """Run until /exit or end of input; returns the final history. Injected I/O keeps it testable."""
    settings = {**SAMPLING, **(settings or {})}
    history: list[dict] = []
    numbers = {"/temp": ("temperature", float), "/topk": ("top_k", int), "/penalty": ("repetition_penalty", float),
               "/tokens": ("max_new_tokens", int)}
    write(HELP + "\n")
    while True:
        line = read_line()
        if line is None or line.strip() == "/exit":
            return history
        line = line.strip()
        if not line:
            continue
        command, _, value = line.partition(" ")
        if command == "/reset":
            history = []
            write("(conversation reset)\n")
        elif command in numbers:
            key, kind = numbers[command]
            try:
                settings[key] = kind(value)
                write(f"({key} = {settings[key]})\n")
            except ValueError:
                write(f"(usage: {command} NUMBER)\n")
        elif command == "/settings":
            shown = ("temperature", "top_k", "repetition_penalty", "max_new_tokens")
            write("(" + ", ".join(f"{k}={settings[k]}" for k in shown) + ")\n")
        elif command.startswith("/"):
            write(HELP + "\n")
        else:
            history.append({"role": "user", "content": line})
            write("assistant> ")
            text, _ = reply(model, tokenizer, history, settings, streamer=Utf8SafeStreamer(tokenizer, write))
            history.append({"role": "assistant", "content": text})
            write("\n")


def run_chat(model_dir: str, precision: str = "auto") -> None:
    device = device_for()
    model, tok = load_model_and_tokenizer(model_dir, device, decoding_dtype(precision, device),
                                          chat_template=True)

    def read_line():
        try:
            return input("you> ")
        except EOFError:
            return None

    chat_loop(model, tok, read_line, lambda s: print(s, end="", flush=True))
