"""The chat/document markers as strings and as a regular expression, in a leaf module of the standard library only.

`hitoban leaks` and `hitoban shards --verify` need these and nothing else of the tokenizer; importing them from
`hitoban.training.data.tokenizer` would load transformers (seconds) for a regular expression. `tokenizer`
re-exports them.
"""

from __future__ import annotations

import re

UNK, USER, ASSISTANT, END = "<|unk|>", "<|user|>", "<|assistant|>", "<|end|>"
SPECIAL_TOKENS = [UNK, USER, ASSISTANT, END]
# The markers as they appear in text, for code that measures or scans what lies between them (bits/char, the leak
# scan); 3LM's own files also end documents with <|endoftext|>.
MARKERS = re.compile(r"<\|(?:user|assistant|end|endoftext|unk)\|>")
