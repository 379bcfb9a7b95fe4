"""Cutting streamed text into speakable phrases.

Used twice: the server's streaming synthesis speaks each sentence as soon as it
is complete, and the satellite hands the LLM's first phrase to TTS before the
reply is finished.
"""

from __future__ import annotations

import re

# End of a sentence: terminal punctuation (maybe closed by a quote or bracket) then white space.
_SENTENCE_END = re.compile(r"[.!?…]+[\"')\]]*\s+")
# A clause boundary: a comma, semicolon, colon or dash followed by white space.
_CLAUSE_END = re.compile(r"(?:[,;:]|\s[-–—])\s+")
# Markup a small chat model likes to emit and a voice should not read out.
_MARKUP = re.compile(r"[*_#`]+")


class PhraseSplitter:
    """Feed text pieces in; get complete phrases out.

    `min_clause_chars`: cut at a clause boundary once the phrase is at least this
    long (0 disables clause cuts: sentences only). Short clauses are kept whole so
    the voice does not sound choppy.
    """

    def __init__(self, min_clause_chars: int = 0) -> None:
        self.min_clause_chars = min_clause_chars
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
        sentence = _SENTENCE_END.search(self._buffer)
        best = sentence.end() if sentence else None
        if self.min_clause_chars:
            for clause in _CLAUSE_END.finditer(self._buffer):
                if best is not None and clause.end() >= best:
                    break
                if len(self._buffer[: clause.start()].strip()) >= self.min_clause_chars:
                    best = clause.end()
                    break
        return best

    def flush(self) -> str | None:
        """The rest of the text, at the end of the stream."""
        phrase = clean(self._buffer)
        self._buffer = ""
        return phrase or None


def clean(text: str) -> str:
    return " ".join(_MARKUP.sub("", text).split())


def split_all(text: str, min_clause_chars: int = 0) -> list[str]:
    splitter = PhraseSplitter(min_clause_chars)
    phrases = splitter.feed(text)
    rest = splitter.flush()
    return [*phrases, rest] if rest else phrases
