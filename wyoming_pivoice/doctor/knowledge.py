"""`doctor` on local knowledge (`--knowledge DIR`): the notes' index, read as it is.

It reads the server's index without changing it (SQLite read-only): how many notes and
passages it holds, which files it skipped and why, and when it last changed. It never
scans: the server keeps the index up to date while it runs.
"""

from __future__ import annotations

import sqlite3
import time

from ..server.knowledge import KnowledgeSettings, fts5_available
from .base import Check, Finding, Status

KNOWLEDGE = Check("knowledge", "the household notes' index, with --knowledge")


def check_knowledge(settings: KnowledgeSettings) -> Finding:
    folder, index = settings.folder.expanduser(), settings.index.expanduser()
    data: dict = {"folder": str(folder), "index": str(index)}
    if not fts5_available():
        return KNOWLEDGE.finding(
            Status.FAIL,
            "this Python's sqlite3 has no FTS5: the notes cannot be indexed",
            fix="run the server on a Python whose SQLite has FTS5 (Debian's and the "
            "official images do)",
            data=data,
        )
    if not folder.is_dir():
        return KNOWLEDGE.finding(
            Status.WARN,
            f"the notes folder {folder} does not exist",
            fix=f"create it and put .txt or .md notes in it: mkdir -p {folder}",
            data=data,
        )
    if not index.is_file():
        return _not_yet(folder, data)
    try:
        with sqlite3.connect(f"file:{index}?mode=ro", uri=True) as db:
            files = db.execute("SELECT path, passages, skipped FROM files").fetchall()
            (passages,) = db.execute("SELECT COUNT(*) FROM passage").fetchone()
            meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.Error as err:
        return KNOWLEDGE.finding(
            Status.FAIL,
            f"cannot read the index {index}: {err}",
            fix="delete it: the server builds it again from the notes",
            data=data,
        )
    if not files and "updated" not in meta:
        return _not_yet(folder, data)
    indexed = [path for path, count, _ in files if count >= 0]
    skipped = {path: reason for path, count, reason in files if count < 0}
    updated = float(meta["updated"]) if "updated" in meta else None
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(updated)) if updated else "never"
    data.update(
        files=len(indexed), passages=int(passages), skipped=skipped, updated=updated,
        tokenizer=meta.get("tokenizer"),
    )  # fmt: skip
    message = f"{_count(len(indexed), 'note')}, {_count(passages, 'passage')}, last update {when}"
    if meta.get("folder") not in (None, str(folder.resolve())):
        return KNOWLEDGE.finding(
            Status.WARN,
            f"the index {index} is of another folder ({meta.get('folder')})",
            fix="give each notes folder its own --knowledge-index; the server rebuilds it",
            data=data,
        )
    if skipped:
        names = ", ".join(f"{path} ({reason})" for path, reason in list(skipped.items())[:3])
        more = f" and {len(skipped) - 3} more" if len(skipped) > 3 else ""
        return KNOWLEDGE.finding(
            Status.WARN,
            f"{message}; skipped {len(skipped)}: {names}{more}",
            fix="notes are UTF-8 .txt or .md files under the size limit (docs/knowledge.md)",
            data=data,
        )
    if not indexed:
        return KNOWLEDGE.finding(
            Status.WARN, f"{folder} holds no notes", fix="add .txt or .md notes", data=data
        )
    return KNOWLEDGE.finding(Status.OK, message, data=data)


def _not_yet(folder: object, data: dict) -> Finding:
    return KNOWLEDGE.finding(
        Status.INFO,
        f"{folder} is not indexed yet",
        fix="start the server with the same --knowledge (and --knowledge-index): it "
        "indexes the notes within seconds",
        data=data,
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
