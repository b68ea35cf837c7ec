"""`hitoban leaks`: exact scan of corpora for held-out text (docs/design.md §13), dialogues included.

A held-out item is a line of a text file (chat markers split it into turns, 3LM's line format) or a JSONL record
(`messages`, or `user`/`assistant`). It is probed three ways, each exact:
- line: 3 probes of 48 chars (start, middle, end) of the whole item, markers removed, each extended to >= 96 UTF-8
  bytes (3LM's construction);
- turn: the same 3 probes inside every turn of >= 48 chars, so a probe never straddles a turn boundary, which
  only matches text joined exactly as the holdout joins it;
- whole-turn: a dialogue's shorter turns (>= 23 bytes each) matched whole, and found only when all of them occur
  in order, each within 64 bytes of the previous one (what separates turns in plain text, 3LM's markers or JSON);
  where only one turn is long enough to match, that turn counts on its own if it has >= 24 chars.
The report says how many items were probed, how, and which could not be and why.

Corpora: text files are scanned as bytes; `.jsonl` files and `hitoban corpus` folders (documents.jsonl) are parsed
and their strings scanned, so JSON escapes (`\\u3042`, `\\"`) cannot hide a leak. Each corpus is read in chunks
that overlap by (longest pattern - 1) bytes, every candidate is confirmed byte for byte and counted once per
offset: no false negatives, no false positives. Before every scan a self-test runs this whole path on planted
text: a needle across chunk borders, and a dialogue of short turns written as ASCII-escaped JSONL.

The byte-level search engines live in `evaluation/matching.py`.
Lazy imports: the corpus reader loads only when a corpus is scanned, so `hitoban leaks` starts without torch."""

from __future__ import annotations

import codecs
import hashlib
import json
import queue
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hitoban.evaluation.matching import LeakScanError, Matcher, scan_bytes_chunks
from hitoban.files import read_text
from hitoban.provenance import write_json
from hitoban.training.data.markers import MARKERS
from hitoban.training.data.options import ENCODING

CHUNK = 16 * 2**20
MIN_WHOLE_TURN_BYTES = 23  # the fast engine's minimum, so whole turns never force a slower engine
MIN_SINGLE_TURN_CHARS = 24  # a lone short item is evidence on its own only from this length
CHAIN_GAP_BYTES = 64  # turns of one dialogue count as "together" when at most this far apart


def make_probes(lines: Iterable[str], length: int = 48, per_line: int = 3, min_bytes: int = 96) -> dict[str, int]:
    """probe text -> first line number (1-based): 3LM's construction on each whole line, markers removed."""
    probes: dict[str, int] = {}
    for number, raw in enumerate(lines, 1):
        for probe in _cut(" ".join(MARKERS.sub(" ", raw).split()), length, per_line, min_bytes):
            probes.setdefault(probe, number)
    return probes


def _cut(text: str, length: int, per_line: int, min_bytes: int) -> list[str]:
    if len(text) < length:
        return []
    probes = []
    for i in range(per_line):
        start = round((len(text) - length) * i / max(per_line - 1, 1))
        end = start + length
        while len(text[start:end].encode("utf-8")) < min_bytes and end < len(text):
            end += 1
        if len(text[start:end].encode("utf-8")) >= min_bytes:
            probes.append(text[start:end])
    return probes


def split_turns(raw: str) -> list[str]:
    return [" ".join(turn.split()) for turn in MARKERS.split(raw) if turn.strip()]


# Chat records as hitoban and the common datasets write them: a list of turns under one key, or one field per turn.
TURN_LISTS = ("messages", "conversations", "conversation", "dialogue", "turns")
TURN_TEXT_KEYS = ("content", "value", "text")  # OpenAI/HF messages, ShareGPT (from/value), plain turn objects
FIELD_SETS = (("user", "assistant"), ("prompt", "response"), ("prompt", "completion"), ("prompt", "chosen"),
              ("instruction", "input", "output"), ("question", "answer"), ("input", "output"), ("text",))


@dataclass
class Holdout:
    """Held-out items as lists of turns (one per line, [] for a blank line) and the lines no reader understood."""

    items: list[list[str]]
    unreadable: list[int] = field(default_factory=list)

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def _turn_text(turn) -> str | None:
    """A turn's text: a string, or an object's content/value/text (a string, or a list of text parts)."""
    if isinstance(turn, str):
        return turn
    if not isinstance(turn, dict):
        return None
    for key in TURN_TEXT_KEYS:
        value = turn.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, list) and value and all(isinstance(v, dict) and isinstance(v.get("text"), str)
                                                     for v in value):
            return " ".join(v["text"] for v in value)
    return None


def record_turns(record) -> list[str] | None:
    """The turns of one JSONL chat record in any format `TURN_LISTS` / `FIELD_SETS` name; None when it is not one
    of them (then it is counted as unreadable, never dropped in silence)."""
    if not isinstance(record, dict):
        return None
    for key in TURN_LISTS:
        if key in record:
            turns = record[key]
            texts = [_turn_text(t) for t in turns] if isinstance(turns, list) and turns else [None]
            return None if None in texts else [" ".join(t.split()) for t in texts]
    for keys in FIELD_SETS:
        if keys[0] in record and all(k in record for k in keys if k != "input"):
            values = [record[k] for k in keys if k in record]
            if not all(isinstance(v, str) for v in values):
                return None
            return [" ".join(v.split()) for v in values if v.strip()]
    return None


def read_holdout(path: Path) -> Holdout:
    """Held-out items as lists of turns: text lines (markers split turns) or JSONL chat records in any format
    `record_turns` reads; a record it cannot read is listed in `unreadable`."""
    if path.suffix != ".jsonl":
        return Holdout([split_turns(line) for line in read_text(path, "holdout").splitlines()])
    holdout = Holdout([])
    for number, line in enumerate(read_text(path, "holdout").splitlines(), 1):
        if not line.strip():
            holdout.items.append([])
            continue
        try:
            turns = record_turns(json.loads(line))
        except ValueError:
            turns = None
        if turns is None:
            holdout.unreadable.append(number)
        holdout.items.append(turns or [])
    return holdout


@dataclass
class ProbePlan:
    """What is searched for and how each hit maps back to held-out items."""

    probes: dict[str, tuple[str, int]] = field(default_factory=dict)  # text -> (line | turn, item)
    whole: list[str] = field(default_factory=list)  # whole-turn patterns
    chains: list[tuple[int, list[int], list[int]]] = field(default_factory=list)  # item, whole ids, max gap before
    singles: dict[int, list[int]] = field(default_factory=dict)  # whole id -> items it proves on its own
    coverage: dict = field(default_factory=dict)
    _ids: dict[str, int] = field(default_factory=dict)

    def whole_id(self, text: str) -> int:
        if text not in self._ids:
            self._ids[text] = len(self.whole)
            self.whole.append(text)
        return self._ids[text]


def plan_probes(items: list[list[str]], length: int = 48, per_line: int = 3, min_bytes: int = 96,
                unreadable: list[int] | None = None) -> ProbePlan:
    """Probes for every item, and the coverage: what was probed how, and every item that was not and why (a
    record no reader understood, `unreadable`, counts as unprobed)."""
    plan, how, unprobed = ProbePlan(), Counter(), Counter()
    unreadable = sorted(unreadable or [])
    examples: list[int] = []
    for number, turns in enumerate(items, 1):
        ways = set()
        for probe in _cut(" ".join(" ".join(turns).split()), length, per_line, min_bytes):
            plan.probes.setdefault(probe, ("line", number))
            ways.add("line")
        for turn in turns:
            for probe in _cut(turn, length, per_line, min_bytes):
                plan.probes.setdefault(probe, ("turn", number))
                ways.add("turn")
        short = [(i, t) for i, t in enumerate(turns) if len(t) < length]
        usable = [(i, t) for i, t in short if len(t.encode("utf-8")) >= MIN_WHOLE_TURN_BYTES]
        if len(usable) >= 2:
            gaps = [0] + [CHAIN_GAP_BYTES + sum(len(turns[k].encode("utf-8")) for k in range(a + 1, b))
                          for (a, _), (b, _) in zip(usable, usable[1:])]
            plan.chains.append((number, [plan.whole_id(t) for _, t in usable], gaps))
            ways.add("whole-turn")
        elif len(usable) == 1 and len(short) == len(turns) and len(usable[0][1]) >= MIN_SINGLE_TURN_CHARS:
            plan.singles.setdefault(plan.whole_id(usable[0][1]), []).append(number)
            ways.add("whole-turn")
        how.update(ways)
        if not ways and turns:
            longest = max(map(len, turns))
            unprobed[f"too short: longest turn {'< 8' if longest < 8 else '< 24' if longest < 24 else '< 48'} "
                     "chars, too few turns to match in order"] += 1
            examples.append(number)
    if unreadable:
        unprobed["unreadable: not a chat record hitoban reads"] = len(unreadable)
    lines = sum(1 for t in items if t) + len(unreadable)
    plan.coverage = {"lines": lines, "probed_lines": lines - len(examples) - len(unreadable), "by": dict(how),
                     "unprobed_lines": len(examples) + len(unreadable), "unprobed": dict(unprobed),
                     "unprobed_examples": sorted(examples + unreadable)[:20], "unreadable_lines": len(unreadable),
                     "unreadable_examples": unreadable[:20]}
    return plan


def _file_chunks(path: Path, chunk: int, digest=None) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while block := f.read(chunk):
            if digest is not None:
                digest.update(block)
            yield block


def _strings(value, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for item in value.values():
            _strings(item, out)
    elif isinstance(value, list):
        for item in value:
            _strings(item, out)


def jsonl_text_chunks(path: Path, chunk: int, digest=None, encoding: str = ENCODING, counted: dict | None = None
                      ) -> Iterator[bytes]:
    """The strings of every JSONL record (decoded: no escapes), one record per line, in ~`chunk`-byte blocks."""
    block, size, read = [], 0, 0
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if digest is not None:
                digest.update(line)
            if not line.strip():
                read += len(line)
                continue
            try:
                record = json.loads(line.decode(encoding))
            except UnicodeDecodeError as err:
                raise LeakScanError(f"{path.name}:{number}: not valid {encoding} text at byte offset "
                                    f"{read + err.start}; pass --encoding ENCODING") from None
            except ValueError as err:
                raise LeakScanError(f"{path.name}:{number}: not JSON ({err})") from err
            read += len(line)
            if counted is not None:
                counted["text_bytes"] = read
            parts: list[str] = []
            _strings(record, parts)
            text = ("\n".join(parts) + "\n").encode("utf-8")
            block.append(text)
            size += len(text)
            if size >= chunk:
                yield b"".join(block)
                block, size = [], 0
    if block:
        yield b"".join(block)


def decoded_chunks(path: Path, chunk: int, digest=None, encoding: str = ENCODING, counted: dict | None = None
                   ) -> Iterator[bytes]:
    """A text corpus as UTF-8 blocks: checked as UTF-8 (and passed on as read), or decoded from `encoding` and
    re-encoded, so that held-out text is compared with text, not with bytes in another encoding. An undecodable
    byte (another encoding, a binary file) stops the scan with its offset: a scan that read nothing as text must
    not report "no leak". `counted["text_bytes"]` is what was read as text."""
    decoder = codecs.getincrementaldecoder(encoding)("strict")
    as_read = codecs.lookup(encoding).name == "utf-8"  # checked, then passed on untouched
    offset = 0
    for block in _file_chunks(path, chunk, digest):
        pending = len(decoder.getstate()[0])
        try:
            text = decoder.decode(block)
        except UnicodeDecodeError as err:
            raise LeakScanError(f"{path.name}: not valid {encoding} text at byte offset {offset - pending + err.start}"
                                f" ({err.reason}); the scan compares text, so it cannot read this file: pass "
                                "--encoding ENCODING for a corpus in another encoding (e.g. shift_jis, cp932), or "
                                "leave binary files out") from None
        offset += len(block)
        if counted is not None:
            counted["text_bytes"] = offset - len(decoder.getstate()[0])
        yield block if as_read else text.encode("utf-8")
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise LeakScanError(f"{path.name}: ends inside a {encoding} character (a truncated file?); the last bytes "
                            "are not text") from None


def corpus_chunks(path: Path, chunk: int, digest=None, encoding: str = ENCODING, counted: dict | None = None
                  ) -> Iterator[bytes]:
    if path.suffix == ".jsonl":
        return jsonl_text_chunks(path, chunk, digest, encoding, counted)
    return decoded_chunks(path, chunk, digest, encoding, counted)


def read_ahead(chunks: Iterator[bytes], depth: int = 2) -> Iterator[bytes]:
    """`chunks`, in order, produced by a background thread up to `depth` ahead: file reads and sha256 release the
    GIL, so with a free second core the reading and hashing of the next chunk (a fifth of a 200 MB scan's time on
    one core) overlap NumPy's scan of this one. An error in the producer is raised here; leaving early stops it."""
    slots: queue.Queue = queue.Queue(depth)
    stop, done = threading.Event(), object()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                slots.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for block in chunks:
                if not put(block):
                    return
            put(done)
        except BaseException as err:  # handed to the consumer, which raises it
            put(err)
        finally:
            getattr(chunks, "close", lambda: None)()

    thread = threading.Thread(target=produce, name="hitoban-leaks-read-ahead", daemon=True)
    thread.start()
    try:
        while (item := slots.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()


def chain_found(plan: ProbePlan, chain: tuple[int, list[int], list[int]], positions: dict[int, list[int]]) -> bool:
    """Do the chain's turns occur in order, each starting within its gap after the previous one's end?"""
    _, ids, gaps = chain
    lengths = [len(plan.whole[i].encode("utf-8")) for i in ids]
    ends = np.array(sorted(positions.get(ids[0], [])), dtype=np.int64)
    for pid, length, gap in zip(ids[1:], lengths[1:], gaps[1:]):
        if not len(ends):
            return False
        own_ends = np.array(sorted(positions.get(pid, [])), dtype=np.int64)
        starts = own_ends - length
        first = np.searchsorted(ends, starts - gap, side="left")  # earliest previous end within the gap
        ok = (first < len(ends)) & (ends[np.minimum(first, len(ends) - 1)] <= starts)
        ends = own_ends[ok]
    return bool(len(ends))


SELF_TEST_LINE = ("吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。"
                  "何でも薄暗いじめじめした所で泣いていた事だけは記憶している。")
SELF_TEST_DIALOGUE = ["週末はどこかへ出かけましたか？", "近所の公園を少し散歩しました。",
                      "それはいいですね、天気も良かったし。"]


def self_test(matcher_factory, chunk: int = 8192) -> None:
    """The whole scan path on planted text must find exactly what was planted: a needle across chunk borders and
    at both ends (4 times), an absent one never, and a held-out dialogue of short turns inside an ASCII-escaped
    JSONL chat file (whole turns in order). A scanner blind to JSONL or to short turns fails here."""
    needle = SELF_TEST_LINE.encode()
    absent = "この文はどこにも埋め込まれていない検査用の文字列です。念のため長くしておく。".encode()
    filler = ("ただの詰め物の文章です。" * 2000).encode()
    data = needle + filler[: chunk - 10] + needle + filler + needle + filler[:777] + needle
    matcher = matcher_factory([needle, absent])
    counts, _ = scan_bytes_chunks((data[i : i + chunk] for i in range(0, len(data), chunk)), matcher)
    if counts[0] != 4 or counts[1] != 0:
        raise LeakScanError(f"scanner self-test failed ({matcher.engine}): planted 4, found {counts[0]}; "
                            f"absent found {counts[1]}")
    plan = plan_probes([[SELF_TEST_LINE], SELF_TEST_DIALOGUE])
    greeting = [{"role": "user", "content": "こんにちは"}, {"role": "assistant", "content": "どうも"}]
    chats = [{"messages": greeting}] * 300
    chats.insert(150, {"messages": [{"role": role, "content": text} for role, text in
                                    zip(("user", "assistant", "user"), SELF_TEST_DIALOGUE)]})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "chats.jsonl"
        path.write_text("".join(json.dumps(c) + "\n" for c in chats), encoding="utf-8")  # ASCII escapes
        patterns = [p.encode() for p in plan.probes] + [w.encode() for w in plan.whole]
        matcher = matcher_factory(patterns)
        track = set(range(len(plan.probes), len(patterns)))
        _, positions = scan_bytes_chunks(corpus_chunks(path, chunk), matcher, track)
    found = {offset - len(plan.probes): pos for offset, pos in positions.items()}
    if not plan.chains or not chain_found(plan, plan.chains[0], found):
        raise LeakScanError(f"scanner self-test failed ({matcher.engine}): a held-out dialogue of short turns "
                            "planted in a JSONL chat file was not found")


def corpus_identity(corpus: Path) -> tuple[Path, str | None]:
    """(file to scan, the sha256 its manifest claims, or None): a `hitoban corpus` folder's documents.jsonl. The
    report records the hash of the bytes scanned; the manifest's is kept beside it only to say whether they agree."""
    if corpus.is_dir():
        path = corpus / "documents.jsonl"
        manifest = corpus / "manifest.json"
        if not path.is_file() or not manifest.is_file():
            raise LeakScanError(f"{corpus}: not a hitoban corpus folder (documents.jsonl + manifest.json)")
        from hitoban.training.data.corpus import load_manifest  # the corpus's one reader (fields checked there)

        return path, load_manifest(corpus)["output"]["sha256"]
    if not corpus.is_file():
        raise LeakScanError(f"{corpus}: no such corpus file (or folder without documents.jsonl)")
    return corpus, None


def scan_for_leaks(holdout: str | Path, corpora: list[str | Path], engine: str | None = None,
                   chunk: int = CHUNK, length: int = 48, per_line: int = 3, progress=None,
                   out: str | Path | None = None, encoding: str = ENCODING) -> dict:
    """Scan every corpus for held-out items; returns the report (`leaked` true on any hit), also written to `out`."""
    holdout = Path(holdout)
    if not holdout.is_file():
        raise LeakScanError(f"{holdout}: holdout file not found")
    read = read_holdout(holdout)
    items = read.items
    plan = plan_probes(items, length, per_line, unreadable=read.unreadable)
    if not plan.probes and not plan.whole:
        raise LeakScanError(f"{holdout.name}: no holdout item is long enough to probe; nothing to probe")

    def factory(patterns):
        return Matcher(patterns, engine)

    self_test(factory)
    probe_list = list(plan.probes)
    patterns = [p.encode("utf-8") for p in probe_list] + [w.encode("utf-8") for w in plan.whole]
    track = set(range(len(probe_list), len(patterns)))
    report = {"kind": "leak-scan", "schema": 3, "holdout": holdout.name, "holdout_sha256": _sha256(holdout),
              "holdout_lines": len(items), "probe_chars": length, "probes": len(probe_list),
              "whole_turns": len(plan.whole), "coverage": plan.coverage, "corpora": []}
    for corpus in map(Path, corpora):
        path, manifest_sha = corpus_identity(corpus)
        matcher = factory(patterns)
        digest, counted = hashlib.sha256(), {"text_bytes": 0}
        start = time.perf_counter()
        # a corpus folder's documents.jsonl is hitoban's own UTF-8; --encoding is for the user's text files
        chunks = corpus_chunks(path, chunk, digest, encoding if path.name != "documents.jsonl" else "utf-8", counted)
        counts, positions = scan_bytes_chunks(read_ahead(chunks), matcher, track)
        seconds = time.perf_counter() - start
        row = _corpus_row(plan, probe_list, counts, positions)
        size = path.stat().st_size
        scanned = digest.hexdigest()  # the bytes actually read: what the card cites, never the manifest's claim
        report["corpora"].append({"corpus": corpus.name, "sha256": scanned, "manifest_sha256": manifest_sha,
                                  "matches_manifest": None if manifest_sha is None else manifest_sha == scanned,
                                  "bytes": size,
                                  "text_bytes": counted["text_bytes"], "encoding": encoding,
                                  "engine": matcher.engine, "seconds": round(seconds, 3),
                                  "mib_per_s": round(size / 2**20 / max(seconds, 1e-9), 1), **row})
        if progress:
            progress(report["corpora"][-1])
    report["leaked"] = any(c["affected_holdout_lines"] for c in report["corpora"])
    report["complete"] = not read.unreadable  # a scan that could not read some held-out records proves nothing of them
    if out:
        write_json(out, report)
    return report


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _corpus_row(plan: ProbePlan, probe_list: list[str], counts: Counter, positions: dict[int, list[int]]) -> dict:
    """Which held-out items a corpus contains, and how each was found."""
    found: dict[str, set[int]] = {"line": set(), "turn": set(), "whole-turn": set()}
    hits = {probe_list[pid]: n for pid, n in counts.items() if pid < len(probe_list)}
    for probe in hits:
        how, item = plan.probes[probe]
        found[how].add(item)
    whole_positions = {pid - len(probe_list): pos for pid, pos in positions.items()}
    for wid, items in plan.singles.items():
        if whole_positions.get(wid):
            found["whole-turn"].update(items)
    for chain in plan.chains:
        if chain_found(plan, chain, whole_positions):
            found["whole-turn"].add(chain[0])
    return {"hit_probes": len(hits), "affected_holdout_lines": sorted(set().union(*found.values())),
            "found_by": {how: sorted(items) for how, items in found.items() if items},
            "examples": [{"probe": p, "count": n} for p, n in sorted(hits.items(), key=lambda kv: -kv[1])[:5]]}
