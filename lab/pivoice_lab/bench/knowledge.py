"""`bench --knowledge`: what local knowledge (server/knowledge.py) costs a turn.

- Indexing: generated household-style notes (`--knowledge-mb`, 10 MB by default, Markdown
  with headings and paragraphs; the shipped corpus of tests/fixtures/knowledge among them, so
  its questions have answers) indexed from nothing, then a rescan that finds nothing changed.
- Per turn: retrieval and prompt assembly (`ConversationStore.prompt` with the notes, the
  embedded model's own tokenizer), for every shipped question, against the same assembly
  without knowledge.
- First phrase: the time from a turn's start (prompt assembly included) to its first phrase
  (the satellite's splitter, MIN_CLAUSE_CHARS) on the embedded model, greedy (temperature 0)
  so that one prompt gives one reply, knowledge on and off alternating turn by turn. Off-topic
  turns retrieve nothing: the same prompt, the same reply, the difference is the retrieval's.
  On-topic turns get the notes: their prompt is longer, so the first token's time (prefill)
  is compared too.

Medians, load average beside.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from wyoming_pivoice.conversation import ConversationStore
from wyoming_pivoice.engines import LlamaChat, LlmSettings
from wyoming_pivoice.server import KnowledgeBase, KnowledgeSettings, TurnNotes
from wyoming_pivoice.text import MIN_CLAUSE_CHARS, PhraseSplitter

from .tables import median, render_table, summarize

FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "knowledge"
REPLY_TOKENS = 48
OFF_TOPIC = ("Tell me a joke.", "Who wrote Hamlet?", "How tall is Mount Everest?")
ON_TOPIC = (
    "What's the password for the guest wifi?",
    "What should the boiler pressure be?",
    "What's the PIN for the television?",
)
_TOPICS = (
    "kitchen", "garden", "boiler", "garage", "attic", "bathroom", "car", "school", "bins",
    "alarm", "pets", "neighbours", "holidays", "insurance", "doctor", "recipes", "bikes",
)  # fmt: skip


def generate_notes(folder: Path, megabytes: float, seed: int = 25) -> int:
    """Write about `megabytes` of Markdown notes made of invented words (a vocabulary of a
    few thousand, Zipf-like use, as prose has) into `folder`; returns the bytes written."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ren", "tu", "sa", "vel", "or", "bin", "dra", "po", "shi"]
    vocab = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(6000)]
    weights = [1 / (rank + 10) for rank in range(len(vocab))]
    folder.mkdir(parents=True, exist_ok=True)
    total, index = 0, 0
    target = int(megabytes * 1024 * 1024)
    while total < target:
        lines = [f"# {rng.choice(_TOPICS).title()} notes {index}"]
        for section in range(rng.randint(8, 20)):
            lines.append(f"\n## {' '.join(rng.choices(vocab, weights, k=3))} {section}")
            for _ in range(rng.randint(1, 3)):
                words = rng.choices(vocab, weights, k=rng.randint(30, 90))
                lines.append("\n" + " ".join(words) + ".")
        text = "\n".join(lines) + "\n"
        (folder / f"generated-{index:04d}.md").write_text(text, encoding="utf-8")
        total += len(text.encode("utf-8"))
        index += 1
    for note in (FIXTURES / "notes").iterdir():
        shutil.copy(note, folder / note.name)
        total += note.stat().st_size
    return total


def _first_phrase(llm: LlamaChat, messages: list[dict[str, str]]) -> tuple[float, str]:
    """Seconds to the first token, and the first phrase, of a greedy reply."""
    splitter = PhraseSplitter(MIN_CLAUSE_CHARS)
    first_token: float | None = None
    start = time.perf_counter()
    text = ""
    for piece in llm.stream(messages, max_tokens=REPLY_TOKENS):
        if first_token is None:
            first_token = time.perf_counter() - start
        text += piece
        phrases = splitter.feed(piece)
        if phrases:
            return first_token, phrases[0]
    return first_token or 0.0, text


def run(megabytes: float = 10.0, rounds: int = 3, workdir: Path | None = None) -> dict[str, Any]:
    if not (FIXTURES / "questions.json").is_file():
        raise SystemExit(
            f"bench --knowledge: its questions are in the repository ({FIXTURES} is missing): "
            "run it from a checkout"
        )
    load_start = [round(x, 2) for x in os.getloadavg()]
    work = Path(tempfile.mkdtemp(prefix="knowledge-bench-", dir=workdir))
    notes = work / "notes"
    written = generate_notes(notes, megabytes)
    settings = KnowledgeSettings(folder=notes, index=work / "data" / "knowledge.sqlite3")
    base = KnowledgeBase(settings)
    start = time.perf_counter()
    base.scan()
    index_s = time.perf_counter() - start
    start = time.perf_counter()
    base.scan()
    rescan_s = time.perf_counter() - start
    stats = base.stats()

    # One thread: two on two shared cores stall each other's token sync (README, *Overhead*).
    llm_settings = replace(LlmSettings(), temperature=0.0, max_tokens=REPLY_TOKENS, threads=1)
    llm = LlamaChat(llm_settings)
    llm.warm_up()
    with_notes = ConversationStore(llm_settings.system_prompt)
    with_notes.notes = TurnNotes(base)
    without = ConversationStore(llm_settings.system_prompt)
    questions = [q["q"] for q in json.loads((FIXTURES / "questions.json").read_text("utf-8"))]

    assembly_on: list[float] = []
    assembly_off: list[float] = []
    retrieved = 0
    for _ in range(rounds):
        for question in questions:
            t0 = time.perf_counter()
            messages = with_notes.prompt(llm, [], question, REPLY_TOKENS)
            t1 = time.perf_counter()
            without.prompt(llm, [], question, REPLY_TOKENS)
            t2 = time.perf_counter()
            assembly_on.append((t1 - t0) * 1000)
            assembly_off.append((t2 - t1) * 1000)
            retrieved += messages[0]["content"] != llm_settings.system_prompt

    phrase: dict[str, dict[str, list[float]]] = {}
    same_reply = {"off_topic": 0, "on_topic": 0}
    turns = {"off_topic": 0, "on_topic": 0}
    with_passages = {"off_topic": 0, "on_topic": 0}
    for kind, texts in (("off_topic", OFF_TOPIC), ("on_topic", ON_TOPIC)):
        cells: dict[str, list[float]] = {
            key: [] for key in ("on", "off", "on_first_token", "off_first_token")
        }
        for round_ in range(rounds):
            for text in texts:
                replies = {}
                order = (with_notes, without) if round_ % 2 == 0 else (without, with_notes)
                for store in order:
                    name = "on" if store is with_notes else "off"
                    t0 = time.perf_counter()
                    messages = store.prompt(llm, [], text, REPLY_TOKENS)
                    first_token, first = _first_phrase(llm, messages)
                    cells[name].append((time.perf_counter() - t0) * 1000)
                    cells[f"{name}_first_token"].append(first_token * 1000)
                    replies[name] = first
                    if store is with_notes:
                        with_passages[kind] += messages[0]["content"] != llm_settings.system_prompt
                turns[kind] += 1
                same_reply[kind] += replies["on"] == replies["off"]
        phrase[kind] = cells
    load_end = [round(x, 2) for x in os.getloadavg()]
    base.close()
    shutil.rmtree(work, ignore_errors=True)

    def delta(kind: str, key: str) -> float | None:
        on, off = median(phrase[kind][f"on{key}"]), median(phrase[kind][f"off{key}"])
        return None if on is None or off is None else round(on - off, 1)

    return {
        "notes": {
            "megabytes": round(written / 1024 / 1024, 2),
            "files": stats.files,
            "passages": stats.passages,
            "index_s": round(index_s, 2),
            "rescan_unchanged_ms": round(rescan_s * 1000, 1),
        },
        "assembly_ms": {
            "with_knowledge": summarize(assembly_on),
            "without": summarize(assembly_off),
            "turns_with_passages": f"{retrieved}/{len(assembly_on)}",
        },
        "first_phrase_ms": {
            kind: {
                "on": summarize(cells["on"]),
                "off": summarize(cells["off"]),
                "on_minus_off": delta(kind, ""),
                "first_token_on_minus_off": delta(kind, "_first_token"),
                "same_first_phrase": f"{same_reply[kind]}/{turns[kind]}",
                "turns_with_passages": f"{with_passages[kind]}/{turns[kind]}",
            }
            for kind, cells in phrase.items()
        },
        "meta": {
            "rounds": rounds,
            "model": llm.name,
            "knowledge_tokens_cap": settings.max_tokens,
            "load_average_start": load_start,
            "load_average_end": load_end,
        },
    }


def render(result: dict[str, Any]) -> str:
    notes, assembly, meta = result["notes"], result["assembly_ms"], result["meta"]

    def cell(summary: dict[str, Any] | None) -> str:
        return "—" if summary is None else f"{summary['median']} (p90 {summary['p90']})"

    lines = [
        "## Local knowledge",
        "",
        f"{notes['megabytes']} MB of notes, {notes['files']} files, {notes['passages']} passages: "
        f"indexed in {notes['index_s']} s, an unchanged rescan {notes['rescan_unchanged_ms']} ms. "
        f"Load average {meta['load_average_start']} → {meta['load_average_end']}, "
        f"{meta['rounds']} rounds, {meta['model']}.",
        "",
        render_table(
            ["per turn (ms)", "median (p90)"],
            [
                ["retrieval + prompt assembly", cell(assembly["with_knowledge"])],
                ["prompt assembly without knowledge", cell(assembly["without"])],
                ["turns with passages", assembly["turns_with_passages"]],
            ],
        ),
        "",
    ]
    rows = []
    for kind, row in result["first_phrase_ms"].items():
        rows.append(
            [
                kind.replace("_", "-"),
                cell(row["on"]),
                cell(row["off"]),
                str(row["on_minus_off"]),
                str(row["first_token_on_minus_off"]),
                row["same_first_phrase"],
                row["turns_with_passages"],
            ]
        )
    lines.append(
        render_table(
            [
                "first phrase (ms)",
                "knowledge on",
                "off",
                "on − off",
                "first token on − off",
                "same first phrase",
                "with passages",
            ],
            rows,
        )
    )
    return "\n".join(lines) + "\n"
