"""Local knowledge: the household's own notes, found by the user's words and put in the prompt.

A folder of plain-text and Markdown notes (`--knowledge DIR`) is split into passages — a
Markdown section with its heading path, or a paragraph of plain text under its file's name —
and indexed into SQLite's FTS5 (Python's own sqlite3) with BM25 ranking, in a database kept
outside the notes folder (`--knowledge-index`). A scanner thread compares each file's mtime
and size every few seconds and re-indexes what changed, so notes edited while the server
runs are found on the next turn after the scan; turns never wait for it.

Words are indexed by FTS5's `unicode61` tokenizer with the Porter stemmer ("passwords" finds
"password"); Chinese, Japanese and Korean have no spaces between words, so every run of CJK
characters is indexed and queried as its overlapping character pairs (bigrams, as Lucene's
CJK analyzer does). FTS5's `trigram` tokenizer handles both without that step but cannot
match a two-character Chinese word and ranked English worse on the shipped corpus
(docs/knowledge.md has the figures).

Everything stays on this machine: passages go into the prompt only, which goes to the local
model or to a configured `--llm-url`, and are logged only at debug level.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import sqlite3
import stat
import threading
import time
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import compute_log
from ..options import opt

_LOGGER = logging.getLogger(__name__)

SUFFIXES = (".txt", ".md", ".markdown", ".text")
SCHEMA_VERSION = "1"


@dataclass(frozen=True)
class KnowledgeSettings:
    folder: Path = opt(
        flag="--knowledge",
        type=Path,
        metavar="DIR",
        help="a folder of .txt and .md notes; each turn's prompt gets the passages that match "
        "its words (docs/knowledge.md). Re-read when files change",
    )
    index: Path = opt(  # the SQLite database (never inside `folder`)
        flag="--knowledge-index",
        type=Path,
        metavar="PATH",
        help="the notes' search index (SQLite); default: "
        "$XDG_DATA_HOME/wyoming-pivoice/knowledge-<hash of DIR>.sqlite3 (never inside DIR)",
    )
    max_files: int = 5000
    max_file_bytes: int = 4 * 1024 * 1024
    max_total_bytes: int = 64 * 1024 * 1024
    max_passages: int = 200_000
    max_passage_chars: int = 900
    passages: int = 3  # at most this many per turn
    max_tokens: int = opt(  # at most this many prompt tokens of notes per turn
        320,
        "--knowledge-tokens",
        help="most prompt tokens the notes may take in one turn (the local model's count)",
    )
    # A passage must score at least `min_match` times what one word found in only one
    # passage of the index scores, matched once (FTS5's bm25() is negative, better is lower,
    # and grows with the index's size: the threshold scales with it). Measured on
    # tests/fixtures/knowledge (docs/knowledge.md): 0.8 keeps every answer found there,
    # held-out questions included; 1.0 lost 2 of 24 held-out answers for 2 of 20 off-topic turns.
    min_match: float = 0.8
    rescan_seconds: float = 5.0
    tokenizer: str = "unicode61"  # or "trigram"


def default_index(folder: Path) -> Path:
    """Beside the user's data ($XDG_DATA_HOME/wyoming-pivoice), one database per folder."""
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    digest = hashlib.sha1(str(folder.expanduser().resolve()).encode()).hexdigest()[:8]
    return base / "wyoming-pivoice" / f"knowledge-{digest}.sqlite3"


@dataclass(frozen=True)
class Passage:
    path: str  # relative to the notes folder
    heading: str
    text: str
    score: float = 0.0

    @property
    def source(self) -> str:
        return f"{self.path}#{self.heading}" if self.heading else self.path

    def as_note(self) -> str:
        return f"[{self.heading}] {self.text}" if self.heading else self.text


@dataclass(frozen=True)
class IndexStats:
    files: int
    passages: int
    skipped: int
    updated: float | None  # wall-clock time of the last change to the index
    scanned: float | None  # wall-clock time of the last finished scan


# --- splitting notes into passages ---------------------------------------------------------

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+")


def split_passages(text: str, title: str, markdown: bool, max_chars: int) -> list[tuple[str, str]]:
    """(heading, body) passages of one note: Markdown by section (a section too long for one
    passage by paragraph, each under the section's heading path); plain text by paragraph
    under the file's title. A paragraph longer than `max_chars` is cut at sentence ends."""
    sections: list[tuple[str, list[str]]] = []
    path: list[str] = []
    lines: list[str] = []
    heading = title
    for line in text.splitlines():
        match = _HEADING.match(line) if markdown else None
        if match:
            sections.append((heading, lines))
            level = len(match.group(1))
            path = [*path[: level - 1], match.group(2)]
            heading = " > ".join(p for p in path if p) or title
            lines = []
        else:
            lines.append(line)
    sections.append((heading, lines))

    passages: list[tuple[str, str]] = []
    for name, body_lines in sections:
        paragraphs = [p.strip() for p in re.split(r"\n\s*\n", "\n".join(body_lines))]
        paragraphs = [" ".join(p.split()) if not markdown else p for p in paragraphs if p]
        if not paragraphs:
            continue
        whole = "\n".join(paragraphs)
        if markdown and len(whole) <= max_chars:
            passages.append((name, whole))
            continue
        group = ""
        for paragraph in paragraphs:
            for piece in _cut(paragraph, max_chars):
                if markdown and group and len(group) + 1 + len(piece) <= max_chars:
                    group += "\n" + piece
                    continue
                if group:
                    passages.append((name, group))
                group = piece
        if group:
            passages.append((name, group))
    return passages


def _cut(paragraph: str, max_chars: int) -> list[str]:
    if len(paragraph) <= max_chars:
        return [paragraph]
    pieces: list[str] = []
    current = ""
    for sentence in _SENTENCE_END.split(paragraph):
        while len(sentence) > max_chars:  # one endless sentence: cut at a space
            cut = sentence.rfind(" ", 0, max_chars)
            cut = cut if cut > max_chars // 2 else max_chars
            pieces.append(sentence[:cut].strip())
            sentence = sentence[cut:].strip()
        if current and len(current) + 1 + len(sentence) > max_chars:
            pieces.append(current)
            current = sentence
        else:
            current = f"{current} {sentence}".strip()
    if current:
        pieces.append(current)
    return [p for p in pieces if p]


# --- words: what is indexed and what a query asks for --------------------------------------

STOP_WORDS = frozenset(
    """a about above after again all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers him his how i if in into is it its itself
    just me more most my myself no nor not now of off on once only or other our ours out
    over own same she should so some such than that the their theirs them then there these
    they this those through to too under until up very was we were what when where which
    while who whom why will with would you your yours please tell know need want again
    remind let us again okay ok hey hi hello thanks thank also get got find give say said
    s t d ll m re ve it's what's whats where's wheres how's hows can't cant don't dont""".split()  # noqa: SIM905 — read as prose
)
# Chinese function words: a query's bigrams made of them alone are dropped.
CJK_STOP = (
    "请问",
    "告诉",
    "一下",
    "什么",
    "怎么",
    "怎样",
    "哪里",
    "哪儿",
    "哪个",
    "多少",
    "我们",
    "你们",
    "他们",
    "是不是",
    "可以",
    "知道",
    "的",
    "了",
    "吗",
    "呢",
    "吧",
    "啊",
    "是",
    "我",
    "你",
    "他",
    "她",
    "它",
    "在",
    "和",
    "有",
    "要",
    "把",
    "给",
    "就",
    "也",
    "都",
    "还",
    "这",
    "那",
    "个",
    "请",
    "帮",
    "下",
)
_CJK_STOP = re.compile("|".join(re.escape(w) for w in sorted(CJK_STOP, key=len, reverse=True)))
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_WORDS = re.compile(rf"[{_CJK}]+|[^\W_]+(?:['’][^\W_]+)*", re.UNICODE)
_IS_CJK = re.compile(rf"[{_CJK}]")


def _fold(text: str) -> str:
    """Case and width folded; hyphenated words also joined ("wi-fi" → "wi-fi wifi")."""
    text = unicodedata.normalize("NFKC", text).casefold()
    return _HYPHENATED.sub(lambda m: m.group(0) + " " + m.group(0).replace("-", ""), text)


_HYPHENATED = re.compile(r"\b[^\W\d_]+(?:-[^\W\d_]+)+\b")
# Household words that notes and questions spell differently: each also asks for the others.
SYNONYMS: tuple[tuple[str, ...], ...] = (
    ("wifi", "wlan", "internet", "network", "online", "broadband", "router"),
    ("password", "passcode", "pin", "code", "combination"),
    ("bin", "bins", "rubbish", "trash", "garbage", "waste", "refuse", "recycling"),
    ("fuse", "breaker", "circuit", "switch", "rcd", "trip", "tripped", "electricity", "power"),
    ("phone", "number", "mobile", "call", "ring", "telephone", "landline", "contact"),
    ("heating", "boiler", "radiator", "radiators", "thermostat"),
    ("tv", "television", "telly"),
    ("doctor", "gp", "surgery"),
    ("guest", "guests", "visitor", "visitors", "visiting", "friend"),
    ("disarm", "off", "unset"),
    ("key", "keys"),
    ("bottle", "bottles", "glass", "jars"),
    ("detector", "detectors", "alarm", "alarms"),
    ("mower", "lawnmower"),
    ("bike", "bikes", "bicycle", "bicycles", "cycle"),
    ("fuel", "petrol", "gas", "diesel"),
)
_SYNONYMS = {word: group for group in SYNONYMS for word in group}


def index_terms(text: str) -> str:
    """The text FTS5's unicode61 indexes: CJK runs become their bigrams, the rest stays."""
    out: list[str] = []
    for word in _WORDS.findall(_fold(text)):
        if _IS_CJK.match(word):
            out.extend(_bigrams(word))
        else:
            out.append(word.replace("’", "'"))
    return " ".join(out)


def _bigrams(run: str) -> list[str]:
    if len(run) < 2:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)]


def query_words(text: str) -> list[str]:
    """The words of `text` worth looking for: stop words dropped; CJK runs as bigrams (a lone
    character kept as itself), function words dropped."""
    words: list[str] = []
    for word in _WORDS.findall(_fold(text)):
        if _IS_CJK.match(word):
            words.extend(_cjk_query(word))
            continue
        word = word.replace("’", "'")
        if (word in STOP_WORDS and word not in _SYNONYMS) or (len(word) < 2 and not word.isdigit()):
            continue
        words.append(word.split("'")[0] if word.endswith("'s") else word)
    return list(dict.fromkeys(words))  # once each, in order


def _cjk_query(run: str) -> list[str]:
    """A CJK run's bigrams, less those made only of function words ("在哪" of "住在哪里");
    one with a content character stays ("住在": the index has it)."""
    stop = [False] * len(run)
    for match in _CJK_STOP.finditer(run):
        stop[match.start() : match.end()] = [True] * (match.end() - match.start())
    if len(run) == 1:
        return [] if stop[0] else [run]
    return [run[i : i + 2] for i in range(len(run) - 1) if not (stop[i] and stop[i + 1])]


def expanded(words: list[str]) -> list[str]:
    """The words and their household synonyms (SYNONYMS)."""
    more = [s for w in words for s in _SYNONYMS.get(w, ())]
    return list(dict.fromkeys([*words, *more]))


def match_expression(words: Iterable[str], tokenizer: str = "unicode61") -> str | None:
    """An FTS5 query: any of the words (OR, ranked by BM25), Latin words of 3+ letters also
    as a prefix ("pass" finds "password", "bin" "bins"), a lone CJK character as the start
    of a bigram; None when there is nothing to find."""
    terms: list[str] = []
    for word in words:
        quoted = '"' + word.replace('"', '""') + '"'
        if tokenizer == "trigram":
            if len(word) >= 3:
                terms.append(quoted)
        elif (len(word) >= 3 and not _IS_CJK.match(word)) or (
            len(word) == 1 and _IS_CJK.match(word)
        ):
            terms.append(quoted + "*")  # a lone CJK character: the bigrams it begins
        else:
            terms.append(quoted)
    return " OR ".join(terms) if terms else None


# --- the index -----------------------------------------------------------------------------


class KnowledgeError(RuntimeError):
    """The knowledge index cannot be used (no FTS5, an unusable path): one line for the user."""


def fts5_available() -> bool:
    try:
        sqlite3.connect(":memory:").execute("CREATE VIRTUAL TABLE t USING fts5(x)")
    except sqlite3.OperationalError:
        return False
    return True


class KnowledgeBase:
    """The index of one notes folder. `scan` (blocking: the scanner thread's) brings it up to
    date; `search` and `retrieve` are safe from any thread, also while a scan writes (WAL)."""

    def __init__(self, settings: KnowledgeSettings) -> None:
        self.settings = settings
        self.folder = settings.folder.expanduser().resolve()
        index = settings.index.expanduser().resolve()
        if index.is_relative_to(self.folder):
            raise KnowledgeError(
                f"the knowledge index {index} is inside the notes folder; "
                "give --knowledge-index a path outside it"
            )
        if not fts5_available():
            raise KnowledgeError(
                "this Python's sqlite3 has no FTS5; install a Python built with it "
                "(Debian's and the official images have it)"
            )
        self.index_path = index
        try:
            index.parent.mkdir(parents=True, exist_ok=True)
            self._read = self._connect()
            self._prepare()
        except (OSError, sqlite3.Error) as err:
            raise KnowledgeError(f"cannot open the knowledge index {index}: {err}") from err
        self._read_lock = threading.Lock()
        self._scan_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.scanned: float | None = None
        self._passages: int | None = None  # the index's, for the threshold
        self._said: set[str] = set()  # folder warnings, each said once

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.index_path, check_same_thread=False, timeout=5.0)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        return db

    def _prepare(self) -> None:
        db = self._read
        tokenize = "trigram" if self.settings.tokenizer == "trigram" else "porter unicode61"
        wanted = {"schema": SCHEMA_VERSION, "folder": str(self.folder), "tokenizer": tokenize}
        db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        have = dict(db.execute("SELECT key, value FROM meta").fetchall())
        if any(have.get(k) != v for k, v in wanted.items()):
            # Another folder, tokenizer or layout: start afresh.
            db.executescript("DROP TABLE IF EXISTS files; DROP TABLE IF EXISTS passage;")
            db.execute("DROP TABLE IF EXISTS fts")
            db.execute("DELETE FROM meta")
        db.executescript(
            """
            CREATE TABLE IF NOT EXISTS files (
                path TEXT PRIMARY KEY, mtime_ns INTEGER, size INTEGER,
                passages INTEGER, skipped TEXT);
            CREATE TABLE IF NOT EXISTS passage (
                id INTEGER PRIMARY KEY, path TEXT, heading TEXT, text TEXT);
            CREATE INDEX IF NOT EXISTS passage_path ON passage(path);
            """
        )
        db.execute(
            f"CREATE VIRTUAL TABLE IF NOT EXISTS fts USING fts5(title, body, tokenize='{tokenize}')"
        )
        db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", wanted.items())
        db.commit()

    # -- scanning --

    def start(self) -> None:
        """Scan now and then every `rescan_seconds`, on a daemon thread of its own."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="knowledge-scan", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.scan()
            except Exception:  # a scan must never end the scanner: the next one tries again
                _LOGGER.exception("Knowledge scan of %s failed", self.folder)
            self._stop.wait(self.settings.rescan_seconds)

    def _walk(self) -> Iterable[Path]:
        for root, dirs, files in os.walk(self.folder):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(files):
                if not name.startswith("."):
                    yield Path(root) / name

    def scan(self) -> bool:
        """Bring the index up to date with the folder; True if anything changed."""
        with self._scan_lock:
            db = self._connect()
            try:
                changed = self._scan(db)
            finally:
                db.close()
            self.scanned = time.time()
            if changed:
                self._passages = None
            return changed

    def _scan(self, db: sqlite3.Connection) -> bool:
        s = self.settings
        known = {
            row[0]: (row[1], row[2], row[3])
            for row in db.execute("SELECT path, mtime_ns, size, passages FROM files")
        }
        seen: set[str] = set()
        paths: list[Path] = []
        if not self.folder.is_dir():
            self._say_once(f"Knowledge folder {self.folder} does not exist (yet)")
        else:
            for path in self._walk():
                if len(paths) >= s.max_files:
                    self._say_once(
                        f"Knowledge folder has more than {s.max_files} files: the rest is not "
                        "indexed"
                    )
                    break
                paths.append(path)
        total_bytes = 0
        passages_total = sum(p for _, _, p in known.values() if p > 0)
        changed = False
        for path in paths:
            rel = path.relative_to(self.folder).as_posix()
            seen.add(rel)
            try:
                st = path.stat()
            except OSError as err:
                if known.get(rel) != (0, 0, -1):  # said once, until it changes
                    changed |= self._skip(db, rel, 0, 0, known, f"cannot be read ({err.strerror})")
                continue
            old = known.get(rel)
            if old is not None and old[0] == st.st_mtime_ns and old[1] == st.st_size:
                total_bytes += st.st_size if old[2] >= 0 else 0
                continue
            if old is not None and old[2] > 0:
                passages_total -= old[2]
            reason = self._refuse(path, st, total_bytes)
            if reason:
                changed |= self._skip(db, rel, st.st_mtime_ns, st.st_size, known, reason)
                continue
            try:
                with path.open("rb") as note:  # at most the bound, even if it grew meanwhile
                    raw = note.read(s.max_file_bytes + 1)
            except OSError as err:
                reason = f"cannot be read ({err.strerror})"
                changed |= self._skip(db, rel, st.st_mtime_ns, st.st_size, known, reason)
                continue
            text = _decode(raw)
            if text is None:
                changed |= self._skip(
                    db, rel, st.st_mtime_ns, st.st_size, known, "is not UTF-8 text"
                )
                continue
            title = path.stem.replace("_", " ").replace("-", " ")
            markdown = path.suffix.lower() in (".md", ".markdown")
            passages = split_passages(text, title, markdown, s.max_passage_chars)
            room = s.max_passages - passages_total
            if len(passages) > room:
                _LOGGER.warning(
                    "Knowledge: %s cut to %d passages (at most %d in all)",
                    rel,
                    max(room, 0),
                    s.max_passages,
                )
                passages = passages[: max(room, 0)]
            self._replace(db, rel, title, passages)
            db.execute(
                "INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, NULL)",
                (rel, st.st_mtime_ns, st.st_size, len(passages)),
            )
            db.commit()
            passages_total += len(passages)
            total_bytes += st.st_size
            changed = True
            _LOGGER.info("Knowledge: indexed %s (%d passages)", rel, len(passages))
        for rel in set(known) - seen:
            self._replace(db, rel, "", [])
            db.execute("DELETE FROM files WHERE path = ?", (rel,))
            db.commit()
            changed = True
            _LOGGER.info("Knowledge: %s is gone, forgotten", rel)
        if changed:
            db.execute("INSERT OR REPLACE INTO meta VALUES ('updated', ?)", (repr(time.time()),))
            db.commit()
        return changed

    def _say_once(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            _LOGGER.warning("%s", message)

    def _refuse(self, path: Path, st: os.stat_result, total_bytes: int) -> str | None:
        s, size = self.settings, st.st_size
        if path.suffix.lower() not in SUFFIXES:
            return "is not a .txt or .md note"
        if not stat.S_ISREG(st.st_mode):  # a FIFO or a device would block or never end
            return "is not a regular file"
        if size > s.max_file_bytes:
            return f"is over {s.max_file_bytes // 1024} KiB"
        if total_bytes + size > s.max_total_bytes:
            return f"would take the notes past {s.max_total_bytes // (1024 * 1024)} MiB"
        return None

    def _skip(
        self,
        db: sqlite3.Connection,
        rel: str,
        mtime_ns: int,
        size: int,
        known: dict[str, tuple[int, int, int]],
        reason: str,
    ) -> bool:
        """One log line per file and change: a skipped file is remembered with its stat."""
        _LOGGER.warning("Knowledge: skipped %s: it %s", rel, reason)
        if known.get(rel, (None, None, 0))[2] > 0:
            self._replace(db, rel, "", [])
        db.execute(
            "INSERT OR REPLACE INTO files VALUES (?, ?, ?, -1, ?)", (rel, mtime_ns, size, reason)
        )
        db.commit()
        return True

    def _replace(
        self, db: sqlite3.Connection, rel: str, title: str, passages: list[tuple[str, str]]
    ) -> None:
        ids = [row[0] for row in db.execute("SELECT id FROM passage WHERE path = ?", (rel,))]
        db.executemany("DELETE FROM fts WHERE rowid = ?", [(i,) for i in ids])
        db.execute("DELETE FROM passage WHERE path = ?", (rel,))
        trigram = self.settings.tokenizer == "trigram"
        for heading, body in passages:
            cursor = db.execute(
                "INSERT INTO passage (path, heading, text) VALUES (?, ?, ?)", (rel, heading, body)
            )
            name = heading if title.casefold() in heading.casefold() else f"{title} {heading}"
            if trigram:
                db.execute(
                    "INSERT INTO fts (rowid, title, body) VALUES (?, ?, ?)",
                    (cursor.lastrowid, _fold(name), _fold(body)),
                )
            else:
                db.execute(
                    "INSERT INTO fts (rowid, title, body) VALUES (?, ?, ?)",
                    (cursor.lastrowid, index_terms(name), index_terms(body)),
                )

    # -- searching --

    def search(
        self, text: str, limit: int | None = None, threshold: float | None = None
    ) -> list[Passage]:
        """The passages that best match `text`'s words, best first, BM25 (title words count
        double), only those scoring `threshold` or better (default: `self.threshold()`)."""
        words = query_words(text)
        if self.settings.tokenizer == "trigram":  # CJK runs as they are, at least 3 long
            words = [w for w in words if not _IS_CJK.match(w)]
            words += [
                r
                for w in _WORDS.findall(_fold(text))
                if _IS_CJK.match(w)
                for r in _CJK_STOP.split(w)
                if len(r) >= 3
            ]
        expression = match_expression(expanded(words), self.settings.tokenizer)
        if expression is None:
            return []
        limit = limit or self.settings.passages
        query = (
            "SELECT p.path, p.heading, p.text, bm25(fts, 2.0, 1.0) AS score FROM fts "
            "JOIN passage p ON p.id = fts.rowid WHERE fts MATCH ? ORDER BY score LIMIT ?"
        )
        with self._read_lock:
            try:
                rows = self._read.execute(query, (expression, limit)).fetchall()
            except sqlite3.Error as err:
                _LOGGER.warning("Knowledge search failed: %s", err)
                return []
        if threshold is None:
            threshold = self.threshold()
        return [Passage(*row) for row in rows if row[3] <= threshold]

    def threshold(self) -> float:
        """The BM25 score a passage must reach: `min_match` times the IDF FTS5 gives a word
        found in one passage of the index."""
        count = self._passages
        if count is None:  # counted once per scan, not per search
            with self._read_lock:
                (count,) = self._read.execute("SELECT COUNT(*) FROM passage").fetchone()
            self._passages = count
        rare = math.log(max(count - 0.5, 1.0) / 1.5) if count > 2 else 0.0
        return -self.settings.min_match * rare

    def retrieve(self, text: str, previous: str = "") -> list[Passage]:
        """The passages for a turn: by its own words, with the last exchange's words adding
        to their scores for a follow-up ("and the password?" after the guest Wi-Fi; only
        passages that match the turn's own words count, so a new topic stays new); a turn
        with no words of its own to find ("what about it?") takes the last exchange's."""
        count = self.settings.passages
        if not previous:
            return self.search(text, count)
        if not query_words(text):
            return self.search(previous, count)
        own = self.search(text, count * 8, threshold=0.0)
        before = {p.source: p.score for p in self.search(previous, count * 8, threshold=0.0)}
        threshold = self.threshold()
        scored = [(p.score + before.get(p.source, 0.0), p) for p in own]
        ranked = sorted((s, p) for s, p in scored if s <= threshold)
        return [p for _, p in ranked[:count]]

    def stats(self) -> IndexStats:
        with self._read_lock:
            files, skipped = self._read.execute(
                "SELECT COALESCE(SUM(passages >= 0), 0), COALESCE(SUM(passages < 0), 0) FROM files"
            ).fetchone()
            (passages,) = self._read.execute("SELECT COUNT(*) FROM passage").fetchone()
            row = self._read.execute("SELECT value FROM meta WHERE key = 'updated'").fetchone()
        return IndexStats(
            int(files), int(passages), int(skipped), float(row[0]) if row else None, self.scanned
        )

    def close(self) -> None:
        self.stop()
        with self._read_lock:
            self._read.close()


def open_knowledge(settings: KnowledgeSettings) -> KnowledgeBase:
    """The index of `settings.folder` (KnowledgeError: one line to show the user)."""
    return KnowledgeBase(settings)


def _decode(raw: bytes) -> str | None:
    """The note's text, or None for a binary file (a NUL byte) or one that is not UTF-8."""
    if b"\x00" in raw[:8192]:
        return None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        if err.start >= len(raw) - 3:  # cut mid-character at the size limit
            return raw[: err.start].decode("utf-8-sig", "ignore")
        return None


# --- the prompt ----------------------------------------------------------------------------

INSTRUCTION = (
    "Notes from this household's own files follow. If they answer the question, answer "
    "from them and repeat names, numbers and passwords exactly as written."
)


def fit_notes(
    engine: Any,
    system_prompt: str,
    history: list[tuple[str, str]],
    user_text: str,
    budget: int,
    passages: list[Passage],
    max_tokens: int | None,
) -> tuple[str, list[Passage], int]:
    """The system prompt with as many of `passages` (best first) as fit: the whole prompt
    within `budget` tokens and the notes within `max_tokens` (None: no cap of their own),
    counted by the engine's own tokenizer. The notes are trimmed before anything else of the
    prompt; when not even the best passage fits whole, as much of its start as fits.
    Returns (system prompt, passages kept, their tokens)."""
    if not passages:
        return system_prompt, [], 0

    def tokens(system: str) -> int:
        return int(engine.count_tokens(build(system, history, user_text)))

    base = tokens(system_prompt)
    room = budget - base if max_tokens is None else min(budget - base, max_tokens)
    if room <= 0:
        return system_prompt, [], 0
    kept = list(passages)
    while kept:
        system = with_notes(system_prompt, kept)
        used = tokens(system) - base
        if used <= room:
            return system, kept, used
        if len(kept) == 1:
            break
        kept.pop()
    best = kept[0]
    low, high = 0, len(best.text)  # the longest start of the best passage that fits
    while high - low > 1:
        middle = (low + high) // 2
        cut = Passage(best.path, best.heading, best.text[:middle] + "…", best.score)
        if tokens(with_notes(system_prompt, [cut])) - base <= room:
            low = middle
        else:
            high = middle
    if low < 40:  # a few words of a note answer nothing
        return system_prompt, [], 0
    cut = Passage(best.path, best.heading, best.text[:low] + "…", best.score)
    system = with_notes(system_prompt, [cut])
    return system, [cut], tokens(system) - base


def build(system: str, history: list[tuple[str, str]], user_text: str) -> list[dict[str, str]]:
    from ..conversation import build as build_messages

    return build_messages(system, history, user_text)


class TurnNotes:
    """The hook conversation.py calls when it builds a turn's prompt (`notes_prompt`):
    retrieval, fitting by tokens, and the compute log's record of what was retrieved."""

    def __init__(self, base: KnowledgeBase) -> None:
        self.base = base

    def notes_prompt(
        self,
        engine: Any,
        system_prompt: str,
        history: list[tuple[str, str]],
        user_text: str,
        budget: int,
    ) -> str:
        start = time.perf_counter()
        previous = " ".join(history[-1]) if history else ""
        found = self.base.retrieve(user_text, previous)
        # A cap of their own only where the engine counts exactly (the local model): a
        # remote engine's count is an estimate, and its machine reads prompts fast.
        exact = getattr(engine, "prompt_tokens", None) is not None
        cap = self.base.settings.max_tokens if exact else None
        system, kept, tokens = fit_notes(
            engine, system_prompt, history, user_text, budget, found, cap
        )
        seconds = time.perf_counter() - start
        compute_log.current().record_knowledge(
            [p.source for p in kept],
            [round(p.score, 3) for p in kept],
            tokens,
            seconds,
            found=len(found),
        )
        _LOGGER.info(
            "Knowledge: %d of %d passages retrieved in the prompt, %d tokens, %.1f ms",
            len(kept),
            len(found),
            tokens,
            seconds * 1000,
        )
        _LOGGER.debug("Knowledge for %r: %s", user_text, [p.source for p in kept])
        return system


def with_notes(system_prompt: str, passages: list[Passage]) -> str:
    """The system prompt followed by the notes: after the system prompt (its KV cache stays
    reusable) and before the history. Their text goes through the same escaping as the
    user's (the engine escapes every message's content)."""
    if not passages:
        return system_prompt
    notes = "\n".join(f"- {p.as_note()}" for p in passages)
    return f"{system_prompt}\n\n{INSTRUCTION}\n{notes}"
