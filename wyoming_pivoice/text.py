"""Cutting streamed text into speakable phrases.

Used twice: the server's streaming synthesis speaks each sentence as soon as it
is complete, and the satellite hands the LLM's first phrase to TTS before the
reply is finished.

Sentence boundaries come from `sentencex` (it knows "Dr.", "U.S.", "e.g.", decimals and
numbered lists); a regex alone cut "Dr. Smith lives on Main St." into one-word phrases.
On top of it, long sentences are cut at a clause so the first words are spoken sooner.
"""

from __future__ import annotations

import re
import unicodedata
from itertools import accumulate

from sentencex import segment

# Clause cuts: first-phrase TTS and streaming synthesis cut a sentence at a clause once the
# phrase is at least this long; shorter clauses stay whole so the voice does not sound choppy.
MIN_CLAUSE_CHARS = 24
# A phrase that reaches this length with no sentence end or clause is cut at a word: it
# bounds the wait for the first audio, and the work per piece fed (the segmenter reads at
# most twice this), whatever a client streams.
MAX_PHRASE_CHARS = 300
LANGUAGE = "en"

# A clause boundary: a comma, semicolon, colon or dash followed by white space; in Chinese
# and Japanese their own marks (，、；： and the ideographic comma), which no space follows.
_CLAUSE_END = re.compile(r"(?:[,;:]|\s[-–—])\s+|[，、；：､]")
# A Chinese or Japanese sentence end: 。！？ (full- and half-width forms) and a closing
# quote or bracket after it. No white space follows it in CJK text, so the sentence is
# complete once any next character has come (sentencex alone waits for a space).
_CJK_END = re.compile(r"[。！？｡]+[」』”’）)】〕〉》]*")
# Markup a small chat model likes to emit and a voice should not read out.
_MARKUP = re.compile(r"[*_#`]+")
_WORD = re.compile(r"\w")
# Text without any of these has no sentence end for the segmenter to find.
_MAYBE_END = re.compile(r"[^\w ,;:'\"()]")
# A segment that ends in a small number and a dot: a list item's number, or "at 7." at the end.
_NUMBER_END = re.compile(r"(?:^|\s)\d{1,3}[.)]\s*$")
# A numbered item at the start of a line.
_LIST_ITEM = re.compile(r"(?:^|\n)[ \t]*\d{1,3}[.)]\s*$")


class PhraseSplitter:
    """Feed text pieces in; get complete phrases out.

    A sentence is complete once white space and the next sentence's first letter or digit
    have arrived: the segmenter needs that much to tell "St. It" from "St. in", so a
    sentence comes out one token after its end, or at `flush`. One wait is longer: after
    a next sentence that opens a quote, the segmenter decides when the quote closes.

    `min_clause_chars`: cut at a clause boundary once the phrase is at least this
    long (0 disables clause cuts: sentences only).
    """

    def __init__(self, min_clause_chars: int = 0, language: str = LANGUAGE) -> None:
        self.min_clause_chars = min_clause_chars
        self.language = language
        self._buffer = ""

    def feed(self, text: str) -> list[str]:
        self._buffer += text
        phrases: list[str] = []
        while True:
            cut = self._next_cut()
            if cut is None:
                return phrases
            phrase = clean(self._buffer[:cut])
            self._buffer = self._buffer[cut:]
            if phrase:
                phrases.append(phrase)

    def _next_cut(self) -> int | None:
        first, complete = self._first_sentence()
        if self.min_clause_chars:
            # Only inside the first sentence: a clause never spans a sentence boundary.
            for clause in _CLAUSE_END.finditer(self._buffer, 0, first):
                if spoken_length(self._buffer[: clause.start()].strip()) >= self.min_clause_chars:
                    return clause.end()
        if complete:
            return first
        if len(self._buffer) > MAX_PHRASE_CHARS:
            space = max(self._buffer.rfind(c, 0, MAX_PHRASE_CHARS) for c in " \t\n")
            return space if space > 0 and self._buffer[:space].strip() else MAX_PHRASE_CHARS
        return None

    def _first_sentence(self) -> tuple[int, bool]:
        """Where the buffer's first sentence ends, and whether it is known to be complete."""
        text = self._buffer[: 2 * MAX_PHRASE_CHARS]
        if not _MAYBE_END.search(text):
            return len(text), False
        end, complete = self._segmented(text)
        cjk = _CJK_END.search(text)
        # sentencex cuts CJK text too, but completes nothing without a space after it, and
        # takes "３．5" for a sentence end: a CJK end inside its sentence, or after a cut
        # it cannot complete, is the sentence end.
        if cjk is not None and text[: cjk.start()].strip() and (cjk.start() < end or not complete):
            # Complete once anything but white space follows: the closing quotes are in it.
            return cjk.end(), bool(text[cjk.end() :].strip())
        return end, complete

    def _segmented(self, text: str) -> tuple[int, bool]:
        """sentencex's first sentence of `text`, and whether it is known to be complete."""
        for end in accumulate(map(len, segment(self.language, text))):
            prefix = text[:end]
            if not prefix.strip():
                continue  # white space between paragraphs belongs to the next sentence
            item = _LIST_ITEM.search(prefix)
            if item and prefix[: item.start()].strip():
                return item.start(), True  # a numbered line begins: the line before it is done
            after = _WORD.search(text, end)
            if _NUMBER_END.search(prefix):
                if after is None:
                    return end, False  # "at 7." or "1." of a list: the next word decides
                if item or after.group().islower():
                    continue  # "1. eggs 2. milk": the numbers of a list, not sentence ends
            # Complete only at white space with a word after it: before that the segmenter
            # may still move the boundary (`said. "` + `Yes!"` puts the quote after it).
            at_space = text[end - 1].isspace() or text[end : end + 1].isspace()
            return end, at_space and after is not None
        return len(text), False

    def flush(self) -> str | None:
        """The rest of the text, at the end of the stream."""
        phrase = clean(self._buffer)
        self._buffer = ""
        return phrase or None


def spoken_length(text: str) -> int:
    """Length as speech: a wide (CJK) character is a syllable, about three Latin letters'
    worth, so one clause threshold serves both scripts."""
    return sum(3 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def clean(text: str) -> str:
    return " ".join(_MARKUP.sub("", text).split())


def split_all(text: str, min_clause_chars: int = 0) -> list[str]:
    splitter = PhraseSplitter(min_clause_chars)
    phrases = splitter.feed(text)
    rest = splitter.flush()
    return [*phrases, rest] if rest else phrases
