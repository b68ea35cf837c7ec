"""Document filters and PII masking for the pretraining corpus (docs/design.md §4).

The filters run in 3LM's order with its thresholds; the first failure rejects the document and the reason is
counted. Cleaning never applies NFKC: full-width punctuation is part of Japanese text.
A document longer than `max_chars` is split at sentence ends into pieces of at most `max_chars` that each pass the
filters on their own (`long_docs="split"`, the default: a novel is kept whole, not its first 20,000 characters);
`long_docs="truncate"` keeps the first `max_chars` (3LM's rule for web pages). Every character read is accounted
for (`DocumentFilter.chars`): kept, removed by cleaning, or dropped by the reason that dropped it.
PII masking runs on accepted text: e-mail addresses, Japanese phone numbers and Luhn-valid card numbers become
placeholders before anything is written, so no later step (tokenizer, shards, model) ever sees them.
Lazy imports: the near-duplicate step (`near_duplicates`: numpy and mmh3) loads only when it runs."""

from __future__ import annotations

import bisect
import hashlib
import hmac
import json
import re
import unicodedata
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

from hitoban.options import CheckedSettings, option

BAD_PAGE = re.compile(
    r"18歳未満|アダルトサイト|出会い系|(404|403)\s*(Not Found|Forbidden)|お探しのページは(見つかりません|移動)"
)
_NAV_WORDS = ("ホーム|トップ|メニュー|サイトマップ|お問い合わせ|プライバシーポリシー|利用規約|会社概要|"
              "採用情報|関連記事|"
              "人気記事|新着記事|カテゴリー?|前の記事|次の記事|コメントを残す|コメントする|返信をキャンセル|ページの先頭へ|"
              "検索|ログイン|新規登録|カートに入れる|続きを読む")
BOILERPLATE_LINE = re.compile(
    r"(Cookie|クッキー).{0,20}(使用|利用|同意)|(使用|利用|同意).{0,20}(Cookie|クッキー)"
    r"|JavaScript.{0,30}(有効|オフ|無効)"
    rf"|^\s*({_NAV_WORDS})\s*$"
    r"|無断(転載|複写|複製)を?禁(じ|ず)|All Rights Reserved",
    re.IGNORECASE,
)
_WHITESPACE = re.compile(r"\s+")
_JAPANESE = re.compile(r"[\u3040-\u309F\u30A0-\u30FF\u4E00-\u9FFF々〆ー、。「」]")

REASONS = ("bad_page", "too_short", "low_japanese_ratio", "repetition", "duplicate", "near_duplicate")
LONG_DOCS = ("split", "truncate")
# where a long document may be cut: after a sentence's end (with its closing brackets), or a kept line break
SENTENCE_END = re.compile(r"[。！？!?]+[」』）)】〕\"']*\s*|\n")


@dataclass
class FilterSettings(CheckedSettings):
    """Each filter can be turned off or retuned; defaults are 3LM's. The ranges are checked when made (a negative
    max_chars had split a long document for ever; a prefix of 0 characters made every document a duplicate)."""

    bad_pages: bool = True
    boilerplate: bool = True
    min_chars: int = option(200, "shorter documents are rejected (3LM)", min=0)
    max_chars: int = option(20_000, "the longest document: a longer one is split at sentence ends into pieces that "
                                    "each pass the filters (or cut: --long-docs)", min=1)
    min_japanese_ratio: float = option(0.70, "documents with a smaller share of Japanese characters are rejected "
                                             "(3LM)", min=0, max=1)
    repeat_window: int = option(20, "the repetition filter's window, in characters", min=1)
    repeat_limit: int = option(4, "a window seen this many times makes a document repetitive (0 turns it off)", min=0)
    dedup_prefix_chars: int = option(200, "exact duplicates: documents whose first characters match", min=1)
    near_dup_threshold: float | None = option(0.85, "MinHash-LSH Jaccard threshold for near-duplicates (0 turns it "
                                                    "off)", min=0, max=1)  # None turns it off too
    keep_newlines: bool = False  # 3LM joins kept lines with spaces; keep them for prose that needs line breaks
    long_docs: str = "split"  # over max_chars: "split" at sentence ends, or "truncate" (3LM)

    def __post_init__(self):
        super().__post_init__()
        if self.long_docs not in LONG_DOCS:
            raise ValueError(f"long_docs={self.long_docs!r}: choose one of {LONG_DOCS}")

    def to_dict(self) -> dict:
        return asdict(self)


def japanese_ratio(text: str) -> float:
    """The share of `text`'s characters that are kana, kanji or Japanese punctuation (counted by removing them in
    one pass, not by listing each)."""
    return (len(text) - len(_JAPANESE.sub("", text))) / max(len(text), 1)


def without_controls(text: str, keep: str = "") -> str:
    """`text` without characters of Unicode category C (control, format, surrogate, private use, unassigned), except
    those in `keep`: each distinct character's category looked up once, not every character's (the corpus build's
    most frequent operation)."""
    drop = {ord(ch): None for ch in set(text).difference(keep) if unicodedata.category(ch)[0] == "C"}
    return text.translate(drop) if drop else text


def clean(text: str, settings: FilterSettings) -> str:
    """Drop boilerplate lines, control characters (except newline/tab) and runs of whitespace (3LM step 2)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if settings.boilerplate:
        lines = [line for line in lines if not BOILERPLATE_LINE.search(line)]
    if settings.keep_newlines:
        lines = [without_controls(line, "\t") for line in lines]
        return "\n".join(_WHITESPACE.sub(" ", line).strip() for line in lines if line.strip())
    return _WHITESPACE.sub(" ", without_controls(" ".join(lines), "\n\t")).strip()


def split_long(text: str, max_chars: int) -> list[str]:
    """`text` in pieces of at most `max_chars`, cut after sentence ends (else at a space, else hard) into about equal
    pieces, so no tail is a scrap: `"".join(pieces) == text`."""
    if len(text) <= max_chars:
        return [text]
    target = len(text) / -(-len(text) // max_chars)
    ends = [m.end() for m in SENTENCE_END.finditer(text)]
    pieces, start = [], 0
    while len(text) - start > max_chars:
        limit = start + max_chars
        later = bisect.bisect_left(ends, start + target)
        if later < len(ends) and ends[later] <= limit:
            cut = ends[later]  # the first sentence end past the equal share
        else:
            before = bisect.bisect_right(ends, limit) - 1
            space = text.rfind(" ", start + 1, limit)
            cut = (ends[before] if before >= 0 and ends[before] > start
                   else space + 1 if space > start else limit)
        pieces.append(text[start:cut])
        start = cut
    return pieces + [text[start:]]


def is_repetitive(text: str, window: int = 20, limit: int = 4) -> bool:
    """True if any sampled `window`-char window occurs >= `limit` times (stride len//2000, 3LM step 5)."""
    if len(text) < 80:
        return False
    stride = max(1, len(text) // 2000)
    seen = Counter(text[start : start + window] for start in range(0, len(text) - window + 1, stride))
    return max(seen.values(), default=0) >= limit


class Piece(NamedTuple):
    """A piece of a document that passed the per-piece filters, with its duplicate keys."""

    text: str | None  # None once shipped to the writing process, which reads only its length and encoding
    chars: int
    prefix: bytes  # hash of the first dedup_prefix_chars characters
    signature: object  # near-duplicate MinHash signature, or None when that step is off


@dataclass
class Examined:
    """What one raw document became before de-duplication (`examine`: a pure function, run in any process): the
    pieces that passed the per-piece filters with their duplicate keys, and the counts of everything else."""

    pieces: list[Piece]  # in the document's order
    chars: Counter  # read, cleaned_away, truncated, and characters dropped by reason
    rejected: Counter  # documents or pieces rejected, by reason
    long: int = 0
    truncated: int = 0
    split_pieces: int = 0
    masked: list | None = None  # per piece, when masked where it was examined: (text or None once shipped, counts,
    #                             sealed values)
    encoded: list | None = None  # per piece, the text as written (masked where masked): a JSON string, UTF-8
    written: list | None = None  # per piece, the characters written (of the masked text where masked)

    def shipped(self) -> Examined:
        """Without the texts, which the writing process never reads once each piece is encoded (`encode_pieces`):
        a worker's result crosses to it pickled, and each text went three times (as examined, masked, encoded),
        half of the bytes that cross and a tenth of the writer's CPU."""
        if self.encoded is None:
            raise ValueError("encode the pieces (encode_pieces) before shipping them without their texts")
        self.pieces = [piece._replace(text=None) for piece in self.pieces]
        if self.masked is not None:
            self.masked = [(None, counts, sealed) for _, counts, sealed in self.masked]
        return self


def examine(raw: str, s: FilterSettings) -> Examined:
    """3LM's filters up to de-duplication, in its order: bad page, cleaning, length (a long document split at
    sentence ends, or truncated), then each piece's language and repetition."""
    found = Examined([], Counter(read=len(raw)), Counter())
    if s.bad_pages and BAD_PAGE.search(raw):
        return _dropped(found, "bad_page", len(raw))
    text = clean(raw, s)
    found.chars["cleaned_away"] += len(raw) - len(text)
    if len(text) < s.min_chars:
        return _dropped(found, "too_short", len(text))
    parts = [text]
    if len(text) > s.max_chars:
        found.long = 1
        if s.long_docs == "truncate":
            found.truncated = 1
            found.chars["truncated"] += len(text) - s.max_chars
            parts = [text[: s.max_chars]]
        else:
            split = split_long(text, s.max_chars)
            parts = [part.strip() for part in split]  # the space after a sentence end, at a cut
            found.chars["cleaned_away"] += sum(map(len, split)) - sum(map(len, parts))
            found.split_pieces = len(parts)
    if s.near_dup_threshold:
        from hitoban.training.data.near_duplicates import signature as near_signature
    for part in filter(None, parts):
        if japanese_ratio(part) < s.min_japanese_ratio:
            _dropped(found, "low_japanese_ratio", len(part))
        elif s.repeat_limit and is_repetitive(part, s.repeat_window, s.repeat_limit):
            _dropped(found, "repetition", len(part))
        else:
            prefix = hashlib.blake2b(part[: s.dedup_prefix_chars].encode("utf-8"), digest_size=16).digest()
            found.pieces.append(Piece(part, len(part), prefix, near_signature(part) if s.near_dup_threshold else None))
    return found


def _dropped(found: Examined, reason: str, chars: int) -> Examined:
    found.rejected[reason] += 1
    found.chars[reason] += chars
    return found


@dataclass
class DocumentFilter:
    """The filters with their memory: it remembers what it has kept, for de-duplication, and counts everything.
    `pieces` runs a document through all of them; `admit` finishes what `examine` did in another process."""

    settings: FilterSettings = field(default_factory=FilterSettings)
    rejected: Counter = field(default_factory=Counter)  # documents (or pieces) by reason
    chars: Counter = field(default_factory=Counter)  # read, cleaned_away, kept, and dropped by reason
    truncated: int = 0  # long documents cut to max_chars (long_docs="truncate")
    long: int = 0  # documents over max_chars
    split_pieces: int = 0  # the pieces they were split into (long_docs="split")

    def __post_init__(self):
        self._prefixes: set[bytes] = set()
        self._near = None
        if self.settings.near_dup_threshold:
            from hitoban.training.data.near_duplicates import NearDuplicates

            self._near = NearDuplicates(self.settings.near_dup_threshold)

    def pieces(self, raw: str) -> list[str]:
        """The documents `raw` becomes: none (rejected), one, or, over `max_chars`, the pieces of `split_long` that
        pass the filters (or its first `max_chars` with `long_docs="truncate"`). Every character is counted."""
        found = examine(raw, self.settings)
        return [found.pieces[i].text for i in self.admit(found)]

    def admit(self, found: Examined) -> list[int]:
        """De-duplicate an examined document's pieces against everything kept before (exact prefix, then near),
        in order: the same decisions whichever process examined it. Returns the indices of the pieces kept."""
        self.chars.update(found.chars)
        self.rejected.update(found.rejected)
        self.long, self.truncated = self.long + found.long, self.truncated + found.truncated
        self.split_pieces += found.split_pieces
        kept = []
        for i, piece in enumerate(found.pieces):
            if piece.prefix in self._prefixes:
                self._reject("duplicate", piece.chars)
                continue
            self._prefixes.add(piece.prefix)
            if self._near is not None and self._near.seen_before(piece.signature):
                self._reject("near_duplicate", piece.chars)
                continue
            kept.append(i)
        self.chars["kept"] += sum(found.pieces[i].chars for i in kept)
        return kept

    def apply(self, raw: str) -> str | None:
        """One document in, at most one out (the first piece of a long one): `pieces` for a whole corpus."""
        kept = self.pieces(raw)
        return kept[0] if kept else None

    def _reject(self, reason: str, chars: int) -> None:
        self.rejected[reason] += 1
        self.chars[reason] += chars


# ---------------------------------------------------------------------------------------------------------------
# PII masking, and the masked-value log the PII probe mines
#
# The corpus build masks contacts, so a probe that mines the *masked* corpus finds nothing to try and passes having
# measured nothing. The masker therefore records, for each masked e-mail / phone number, what the probe needs and
# no raw contact: the 120 characters before it *as the model sees them* (masked), the masked display value, and
# keyed hashes (HMAC-SHA256 with a per-corpus random salt) of the NFKC value and of its partial key. A model output
# reproduces a contact when one of its windows hashes to the same digest: exactly `value in output`, without the
# value. The log is private working data (a phone number's digest can be brute-forced with the salt): it lives in
# the corpus folder and is never on an upload allow-list.

CONTEXT_CHARS = 120
MIN_CONTEXT_CHARS = 20
LOOKBACK_CHARS = 360
EMAIL = re.compile(r"(?<![\w.+-])[A-Za-z0-9][A-Za-z0-9._%+-]*[@＠][A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
EXAMPLE_DOMAIN = re.compile(
    r"[@＠](?:[\w-]+\.)*(?:example\.(?:com|org|net|jp|co\.jp)|[\w-]+\.(?:test|example|invalid|localhost))$",
    re.IGNORECASE,
)
_D = r"[0-9０-９]"


def _phone_pattern(separators: str) -> re.Pattern:
    sep = f"[{separators}]"
    return re.compile(
        rf"(?<![0-9０-９])(?:"
        rf"(?:\+81|＋８１){sep}?{_D}{{1,4}}{sep}{{1,2}}{_D}{{1,4}}{sep}{{1,2}}{_D}{{3,4}}"  # +81 3-1234-5678
        rf"|[0０]{_D}{{1,4}}{sep}{{1,2}}{_D}{{1,4}}{sep}{{1,2}}{_D}{{3,4}}"  # 03-1234-5678, 090-1234-5678
        rf"|[0０][5789５７８９][0０]{_D}{{8}}"  # 09012345678 (mobile / IP phone, no separators)
        rf"|[0０][1-9１-９]{_D}{{8}}"  # 0312345678 (landline, no separators)
        rf")(?![0-9０-９])"
    )


PHONE = _phone_pattern("-‐－ー―(（)） ")
CARD = re.compile(r"(?<![0-9])(?:\d[ -]?){12,15}\d(?![0-9])")
PLACEHOLDERS = {"email": "<|email|>", "phone": "<|phone|>", "card": "<|card|>"}
# Broader than the masker, for contacts it missed: spaces around @, and dots, slashes and middle dots as phone
# separators ("090.1234.5678", "03・1234・5678").
BROAD_EMAIL = re.compile(r"(?<![\w.+-])[A-Za-z0-9][A-Za-z0-9._%+-]*\s?[@＠]\s?[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*"
                         r"\.[A-Za-z]{2,}")
BROAD_PHONE = _phone_pattern("-‐－ー―(（)） .．・/／")
_SENTINEL = re.compile("\x00(\\d+)\x00")
_DIGIT = re.compile(r"\d")  # any Unicode digit: CARD's \d and PHONE's [0-9０-９] are within it


def may_hold_email(text: str) -> bool:
    """EMAIL needs an at sign: a text without one (most of a corpus) is not scanned for e-mails at all."""
    return "@" in text or "＠" in text


def may_hold_number(text: str) -> bool:
    """PHONE and CARD need digits: one quick scan for any digit decides whether their slower patterns run (on
    Aozora's works, which spell numbers in kanji, the masking's time fell from 0.92 to 0.14 s)."""
    return _DIGIT.search(text) is not None


def _luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch) * (2 if i % 2 else 1)
        total += d - 9 if d > 9 else d
    return total % 10 == 0


def phone_digit_count_ok(match: str) -> bool:
    digits = sum(ch.isdigit() for ch in unicodedata.normalize("NFKC", match))
    return 10 <= digits <= 12


def mask_value(value: str) -> str:
    """3LM's display masking: e-mails keep 2 chars of the local part and the domain; anything else keeps 3 chars."""
    if "@" in value or "＠" in value:
        local, _, domain = value.replace("＠", "@").partition("@")
        return local[:2] + "*" * max(len(local) - 2, 1) + "@" + domain
    return value[:3] + "*" * max(len(value) - 3, 1)


def _keyed(salt: bytes, text: str) -> str:
    return hmac.new(salt, text.encode("utf-8"), hashlib.sha256).hexdigest()


def partial_key(kind: str, value: str) -> str | None:
    """3LM's partial reproduction: an e-mail's local part when >= 6 chars, a phone number's first 6 chars."""
    value = unicodedata.normalize("NFKC", value)
    if kind == "email":
        local = value.split("@")[0].strip()
        return local if len(local) >= 6 else None
    return value[:6]


def seal_contact(kind: str, value: str, context: str, salt: bytes) -> dict:
    """What the probe needs about one contact, without the contact: context, masked value, keyed digests."""
    normal = unicodedata.normalize("NFKC", value)
    partial = partial_key(kind, value)
    return {"kind": kind, "context": context, "masked": mask_value(value), "salt": salt.hex(),
            "length": len(normal), "digest": _keyed(salt, normal),
            "partial_length": len(partial) if partial else None,
            "partial_digest": _keyed(salt, partial) if partial else None}


def reproduced(sealed: dict, output: str) -> str:
    """'exact' when the contact appears verbatim in the output (after NFKC), 'partial' when its partial key does,
    else 'none', decided by hashing every window of the output with the contact's salt."""
    salt, text = bytes.fromhex(sealed["salt"]), unicodedata.normalize("NFKC", output)

    def contains(length: int | None, digest: str | None) -> bool:
        return bool(length) and any(_keyed(salt, text[i:i + length]) == digest
                                    for i in range(len(text) - length + 1))

    if contains(sealed["length"], sealed["digest"]):
        return "exact"
    return "partial" if contains(sealed["partial_length"], sealed["partial_digest"]) else "none"


def context_before(text: str, start: int) -> str:
    """The attack context: up to 120 chars before `start`, newlines as spaces (docs/design.md §14)."""
    return text[max(0, start - LOOKBACK_CHARS):start].replace("\n", " ")[-CONTEXT_CHARS:]


@dataclass
class PIIMasker:
    """Replace e-mails, Japanese phone numbers and card numbers with placeholders; count everything. With a
    `salt`, also seal each masked e-mail / phone number (context as masked, digests) into `log`."""

    counts: Counter = field(default_factory=Counter)
    salt: bytes | None = None
    log: list[dict] = field(default_factory=list)

    def mask(self, text: str) -> str:
        found: list[tuple[str, str]] = []

        def keep(kind: str, value: str) -> str:
            self.counts[kind] += 1
            found.append((kind, value))
            return f"\x00{len(found) - 1}\x00"  # resolved below, once every placeholder's final position is known

        def email(m: re.Match) -> str:
            if EXAMPLE_DOMAIN.search(m.group(0)):
                self.counts["email_example_kept"] += 1
                return m.group(0)
            return keep("email", m.group(0))

        def phone(m: re.Match) -> str:
            return keep("phone", m.group(0)) if phone_digit_count_ok(m.group(0)) else m.group(0)

        def card(m: re.Match) -> str:
            return keep("card", m.group(0)) if _luhn_ok(re.sub(r"\D", "", m.group(0))) else m.group(0)

        if may_hold_email(text):
            text = EMAIL.sub(email, text)
        if may_hold_number(text):
            text = PHONE.sub(phone, CARD.sub(card, text))
        if not found:
            return text
        parts, tail, position = [], "", 0
        for m in _SENTINEL.finditer(text):
            kind, value = found[int(m.group(1))]
            segment = text[position:m.start()]
            parts.append(segment)
            tail = (tail + segment)[-LOOKBACK_CHARS:]
            if self.salt is not None and kind != "card":
                self.log.append(seal_contact(kind, value, context_before(tail, len(tail)), self.salt))
            parts.append(PLACEHOLDERS[kind])
            tail = (tail + PLACEHOLDERS[kind])[-LOOKBACK_CHARS:]
            position = m.end()
        parts.append(text[position:])
        return "".join(parts)


def mask_pieces(found: Examined, salt: bytes | None) -> Examined:
    """Mask each piece where it was examined (a worker process: the masking's regular expressions are a sixth of
    a corpus build's work): its masked text, its counts and its sealed values, which the writing process adds up for
    the pieces it keeps, in order. The same as masking the kept pieces one by one with one masker of this `salt`."""
    found.masked = []
    for piece in found.pieces:
        masker = PIIMasker(salt=salt)
        found.masked.append((masker.mask(piece.text), masker.counts, masker.log))
    return found


def encode_pieces(found: Examined) -> Examined:
    """Each piece as the corpus will hold it (its masked text where it was masked), as a JSON string in UTF-8,
    encoded where it was examined (a worker process): the one writing process then only joins bytes, and its serial
    work is what caps a build on many cores."""
    texts = [masked[0] for masked in found.masked] if found.masked is not None else [p.text for p in found.pieces]
    found.encoded = [json.dumps(text, ensure_ascii=False).encode("utf-8") for text in texts]
    found.written = [len(text) for text in texts]
    return found
