"""Secret scan before anything leaves the machine (docs/design.md §15): file contents, file names and, with
`--git`, history.

Why our own rules instead of detect-secrets: detect-secrets 1.5 has no Hugging Face token plugin, no home-path
or forbidden-file-name rules, and its entropy plugins flag every base64/hex blob (tokenizer vocabularies, sha256
manifests) — so it would need all of hitoban's rules on top and a long allow-list below. These rules are 3LM's,
one compiled regex each, reported as `path:line [rule] masked-snippet`; the secret itself is never printed.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from hitoban.errors import InputError, MissingInputError
from hitoban.provenance import TEST_DATA_MARKER

RULES: dict[str, re.Pattern] = {
    "hf-token": re.compile(r"\bhf_[A-Za-z0-9]{20,}"),
    "openai-key": re.compile(r"\bsk-[A-Za-z0-9_-]{20,}"),
    "github-token": re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),
    "aws-access-key": re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    "google-api-key": re.compile(r"\bAIza[0-9A-Za-z_-]{35}"),
    "slack-token": re.compile(r"\bxox[baprs]-[0-9A-Za-z-]{10,}"),
    "private-key": re.compile(r"-----BEGIN (?:[A-Z]+ )*PRIVATE KEY-----"),
    "authorization-header": re.compile(r"Authorization['\"]?\s*[:=]\s*['\"]?(?:Bearer|Basic)\s+[A-Za-z0-9._~+/=-]{8,}",
                                       re.IGNORECASE),
    "assigned-secret": re.compile(
        r"(?i)\b(?:api_?key|secret|password|passwd|access_token)\b['\"]?\s*[:=]\s*['\"][^'\"\s{}$]{12,}['\"]"),
    "home-path": re.compile(r"/(?:Users|home)/[A-Za-z0-9._-]+/"),
    "email": re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b"),
}
# Each rule without its word-boundary assertions: it matches wherever the rule does (and more), and Python's re finds
# a pattern that starts with a literal by a fast search, which a leading \b rules out (a clean 460 kB tokenizer.json:
# 30 ms for all rules instead of 200). Only a text that one of these matches is read line by line for that rule.
ANYWHERE = {rule: re.compile(pattern.pattern.replace(r"\b", ""), pattern.flags) for rule, pattern in RULES.items()}
HISTORY_EXEMPT = {"home-path", "email"}  # commit metadata always has them
EMAIL_ALLOWED = re.compile(r"@(?:[\w-]+\.)*(?:example\.(?:com|org|net|jp)|users\.noreply\.github\.com)$|"
                           r"@(?:[\w-]+\.)*(?:test|invalid|localhost)$", re.IGNORECASE)
FORBIDDEN_NAMES = {".env", ".env.local", ".netrc", "credentials", "credentials.json", "id_rsa", "id_dsa",
                   "id_ecdsa", "id_ed25519", ".htpasswd"}
FORBIDDEN_SUFFIXES = {".pem", ".key", ".p12", ".pfx", ".keystore"}
SKIP_DIRS = {".git", "__pycache__", ".ruff_cache", ".venv", "venv", "node_modules", ".pytest_cache"}
BINARY_SUFFIXES = {".safetensors", ".bin", ".npy", ".npz", ".model", ".png", ".jpg", ".jpeg", ".gif", ".webp",
                   ".zip", ".gz", ".parquet", ".mp4", ".pdf", ".woff", ".woff2", ".pt", ".u8", ".u16", ".u32"}
MAX_BYTES = 8 * 2**20
# a reviewed line can opt out, as with detect-secrets' pragma (which is honoured too)
ALLOW_MARKERS = ("hitoban: allow-secret", "pragma: allowlist secret")


@dataclass(frozen=True, order=True)
class Finding:
    path: str
    line: int
    rule: str
    snippet: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} [{self.rule}] {self.snippet}"


def mask_secret(secret: str) -> str:
    """Keep just enough to recognise the secret (4 chars), hide the rest."""
    return secret[:4] + "*" * min(max(len(secret) - 4, 4), 24)


def scan_text(text: str, path: str, exempt: set[str] = frozenset()) -> list[Finding]:
    """Every rule's matches, line by line. A rule whose ANYWHERE pattern matches nowhere in the whole text cannot
    match in a line of it (no rule anchors on a line's start or end, and a line's neighbours are line breaks, which
    are not word characters), so the line-by-line pass runs only the rules that may: one search per rule for a clean
    file (a tokenizer.json, an 8 MiB corpus) instead of one per rule per line."""
    rules = [(rule, pattern) for rule, pattern in RULES.items() if rule not in exempt and ANYWHERE[rule].search(text)]
    findings = []
    if not rules:
        return findings
    for number, line in enumerate(text.splitlines(), 1):
        if any(marker in line for marker in ALLOW_MARKERS):
            continue
        for rule, pattern in rules:
            for m in pattern.finditer(line):
                if rule == "email" and EMAIL_ALLOWED.search(m.group(0)):
                    continue
                snippet = (line[:m.start()][-20:] + mask_secret(m.group(0)) + line[m.end():][:20]).strip()
                findings.append(Finding(path, number, rule, snippet[:70]))
    return findings


def link_outside(root: str | os.PathLike, rel: str) -> Path | None:
    """Where `rel` really is, when a symbolic link (the file or a folder above it) takes it out of `root`: an
    upload would read and send that file, so it is refused by name. None for an ordinary file or a link inside."""
    root = Path(root).resolve()
    target = (root / rel).resolve()
    return None if target == root or root in target.parents else target


def scan_files(root: str | os.PathLike, relative_paths: list[str]) -> list[Finding]:
    """Names and contents of the given files, links followed as an upload would follow them (binaries and files
    over 8 MiB: names only); a link that leaves `root` is a finding of its own."""
    findings = []
    for rel in relative_paths:
        path = Path(root) / rel
        if path.name in FORBIDDEN_NAMES or path.suffix in FORBIDDEN_SUFFIXES:
            findings.append(Finding(rel, 0, "forbidden-file", path.name))
        outside = link_outside(root, rel)
        if outside is not None:
            findings.append(Finding(rel, 0, "link-outside-folder", f"-> {outside}"))
            continue
        if not path.is_file() or path.suffix in BINARY_SUFFIXES or path.stat().st_size > MAX_BYTES:
            continue
        findings += scan_text(path.read_text(encoding="utf-8", errors="replace"), rel)
    return sorted(set(findings))




@dataclass
class ScanReport:
    findings: list[Finding]
    scanned: int
    ignored: list[str]  # left out by .gitignore (git work trees only)
    test_data: list[str]  # under a folder marked with TEST_DATA_MARKER

    def skipped_lines(self) -> list[str]:
        lines = []
        for what, paths in (("git-ignored", self.ignored), ("marked test data (fake canaries)", self.test_data)):
            if paths:
                folders = sorted({p.split("/")[0] for p in paths})
                lines.append(f"skipped {len(paths)} {what} file(s) in {', '.join(folders[:6])}"
                             + (" ..." if len(folders) > 6 else ""))
        return lines


def _walk(root: Path) -> list[str]:
    relative_paths = []
    for dirpath, dirnames, filenames in os.walk(root):  # a linked folder is listed as one entry, not entered
        linked = sorted(d for d in dirnames if (Path(dirpath) / d).is_symlink())
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".venv")
                             and d not in linked)
        relative_paths += [(Path(dirpath) / name).relative_to(root).as_posix() for name in sorted(filenames) + linked]
    return relative_paths


def _git_visible(root: Path) -> set[str] | None:
    """Files git tracks or would track (not ignored), relative to `root`; None outside a git work tree."""
    try:
        listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], capture_output=True, timeout=120, check=True).stdout
    except (subprocess.CalledProcessError, FileNotFoundError, subprocess.TimeoutExpired):
        return None
    return {name for name in listed.decode("utf-8", "replace").split("\0") if name}


def scan_report(root: str | os.PathLike = ".", respect_gitignore: bool = True) -> ScanReport:
    """Contents and names of every file under `root` (skipping caches and virtualenvs), except what .gitignore
    leaves out in a git work tree and folders marked as planted test data; the report names what it skipped."""
    root = Path(root)
    if not root.is_dir():
        raise MissingInputError(f"{root}: not a directory")
    paths = _walk(root)
    visible = _git_visible(root) if respect_gitignore else None
    ignored = [p for p in paths if visible is not None and p not in visible]
    marked = {Path(p).parent.as_posix() for p in paths if Path(p).name == TEST_DATA_MARKER}
    test_data = [p for p in paths if p not in ignored and any(p == m or p.startswith(f"{m}/") or m == "."
                                                               for m in marked)]
    chosen = [p for p in paths if p not in ignored and p not in test_data]
    return ScanReport(scan_files(root, chosen), len(chosen), ignored, test_data)


def scan_directory(root: str | os.PathLike, respect_gitignore: bool = True) -> list[Finding]:
    return scan_report(root, respect_gitignore).findings


def scan_git_history(root: str | os.PathLike, timeout: int = 300) -> list[Finding]:
    """Every line ever added in any commit on any ref (`git log -p --all`), reported as `commit:path:line`."""
    try:
        log = subprocess.run(["git", "-C", str(root), "log", "-p", "--all", "--no-color", "--unified=0",
                              "--format=commit %H"], capture_output=True, text=True, errors="replace",
                             timeout=timeout, check=True).stdout
    except subprocess.CalledProcessError as err:
        raise InputError(f"{root}: git log failed ({err.stderr.strip()}); is it a git repository?") from err
    findings, commit, path, line_no = [], "", "", 0
    for line in log.splitlines():
        if line.startswith("commit "):
            commit = line.split()[1][:10]
        elif line.startswith("+++ "):
            path = line[6:] if line.startswith("+++ b/") else line[4:]
            name = Path(path).name
            if name in FORBIDDEN_NAMES or Path(path).suffix in FORBIDDEN_SUFFIXES:
                findings.append(Finding(f"{commit}:{path}", 0, "forbidden-file", name))
        elif line.startswith("@@"):
            m = re.search(r"\+(\d+)", line)
            line_no = int(m.group(1)) if m else 0
        elif line.startswith("+") and path and Path(path).suffix not in BINARY_SUFFIXES:
            for finding in scan_text(line[1:], f"{commit}:{path}", HISTORY_EXEMPT):
                findings.append(Finding(finding.path, line_no, finding.rule, finding.snippet))
            line_no += 1
    return sorted(set(findings))


def scan(root: str | os.PathLike = ".", git: bool = False) -> list[Finding]:
    findings = scan_directory(root)
    return findings + scan_git_history(root) if git else findings


def scan_all(root: str | os.PathLike = ".", git: bool = False) -> ScanReport:
    """The working tree (as `scan_report`) and, with `git`, every commit of the history."""
    report = scan_report(root)
    if git:
        report.findings = report.findings + scan_git_history(root)
    return report
