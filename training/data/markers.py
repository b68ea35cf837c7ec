"""The chat/document markers as strings, as a regular expression and as a tokenizer must hold them, in a leaf module
(the standard library and hitoban.errors only).

`hitoban leaks` and `hitoban shards --verify` need these and nothing else of the tokenizer; importing them from
`hitoban.training.data.tokenizer` would load transformers (seconds) for a regular expression. `tokenizer`
re-exports them.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from hitoban.errors import InputError

UNK, USER, ASSISTANT, END = "<|unk|>", "<|user|>", "<|assistant|>", "<|end|>"
SPECIAL_TOKENS = [UNK, USER, ASSISTANT, END]
# The markers as they appear in text, for code that measures or scans what lies between them (bits/char, the leak
# scan); 3LM's own files also end documents with <|endoftext|>.
MARKERS = re.compile(r"<\|(?:user|assistant|end|endoftext|unk)\|>")


def require_markers(where: object, token_to_id: Callable[[str], int | None]) -> None:
    """Refuse a tokenizer in which a marker is not one token (`token_to_id` gives None): every document boundary and
    chat turn would be wrong. One check for both loaders (tokenizers' own in shards, AutoTokenizer's elsewhere)."""
    for marker in SPECIAL_TOKENS:
        if token_to_id(marker) is None:
            raise InputError(f"{where}: tokenizer has no single token for {marker}; it is not a hitoban tokenizer")
