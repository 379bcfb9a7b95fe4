"""Local knowledge (server/knowledge.py): the shipped household corpus is found by questions
phrased unlike its notes, files that change are re-indexed, bad files are skipped with one line
each, and the notes fit the prompt after the system prompt, before history, trimmed first.

Logic only: the prompt tests count tokens with a stand-in (four characters a token); the real
tokenizer, template escaping and the real server are tests/test_knowledge_server.py's.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from wyoming_pivoice import compute_log
from wyoming_pivoice.conversation import ConversationStore, build
from wyoming_pivoice.server import cli as server_cli
from wyoming_pivoice.server.knowledge import (
    INSTRUCTION,
    KnowledgeBase,
    KnowledgeError,
    KnowledgeSettings,
    Passage,
    TurnNotes,
    default_index,
    fit_notes,
    query_words,
    split_passages,
)

FIXTURES = Path(__file__).parent / "fixtures" / "knowledge"
OFF_TOPIC = json.loads((FIXTURES / "unanswerable.json").read_text(encoding="utf-8"))
SYSTEM = "You are a helpful voice assistant."


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> KnowledgeBase:
    index = tmp_path_factory.mktemp("index") / "knowledge.sqlite3"
    base = KnowledgeBase(KnowledgeSettings(folder=FIXTURES / "notes", index=index))
    base.scan()
    return base


def notes_in(tmp_path: Path, **settings: object) -> tuple[Path, KnowledgeBase]:
    folder = tmp_path / "notes"
    folder.mkdir(exist_ok=True)
    index = tmp_path / "data" / "knowledge.sqlite3"
    return folder, KnowledgeBase(KnowledgeSettings(folder=folder, index=index, **settings))  # type: ignore[arg-type]


def answers(passage: Passage, question: dict[str, str]) -> bool:
    return passage.path == question["file"] and question["has"] in passage.text


@pytest.mark.parametrize("name", ["questions.json", "held_out.json"])
def test_the_shipped_corpus_is_found_by_questions_phrased_otherwise(
    corpus: KnowledgeBase, name: str
) -> None:
    """questions.json: the set the synonyms and threshold were tuned on; held_out.json: 24
    questions written afterwards and measured once before any change for them."""
    questions = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    assert len(questions) >= 20
    top1 = top3 = 0
    for question in questions:
        found = corpus.retrieve(question["q"])
        top1 += bool(found) and answers(found[0], question)
        top3 += any(answers(p, question) for p in found[:3])
    print(f"\n{name}: top-1 {top1}/{len(questions)}, top-3 {top3}/{len(questions)}")
    assert top3 / len(questions) >= 0.9
    assert top1 / len(questions) >= 0.6


def test_off_topic_turns_mostly_retrieve_nothing(corpus: KnowledgeBase) -> None:
    retrieving = [q for q in OFF_TOPIC if corpus.retrieve(q)]
    print(f"\noff-topic turns with passages: {len(retrieving)}/{len(OFF_TOPIC)}: {retrieving}")
    assert len(retrieving) <= len(OFF_TOPIC) // 2  # 8 of 20 (docs/knowledge.md)
    for text in ("Tell me a joke.", "Who wrote Hamlet?", "Hello!", "今天天气怎么样？", "the"):
        assert corpus.retrieve(text) == [], text


def test_chinese_is_found_without_spaces(corpus: KnowledgeBase) -> None:
    assert query_words("奶奶在哪里？") == ["奶奶", "奶在"]
    [best, *_] = corpus.retrieve("奶奶住在哪里？")
    assert best.path == "奶奶.txt" and "幸福路" in best.text


def test_a_follow_up_uses_the_last_exchange(corpus: KnowledgeBase) -> None:
    previous = "How do guests get on our wifi? Use the Lindenhof-Guest network."
    found = corpus.retrieve("And what is the password?", previous)
    assert all(p.path == "wifi.md" for p in found[:2])  # alone: the alarm's password first
    assert any("marmalade-otter-42" in p.text for p in found)
    # Words of its own win: a new topic is not pulled back to the last one.
    [best, *_] = corpus.retrieve("When do the bins go out?", previous)
    assert best.path == "bins.md"
    # No words of its own to look for: the last exchange's passages.
    [best, *_] = corpus.retrieve("What about it?", "Where is the boiler's reset button?")
    assert best.path == "boiler.md"


def test_markdown_passages_keep_their_heading_path() -> None:
    text = "# Boiler\nIntro.\n\n## Reset\nHold the button.\n\nFive seconds.\n## Pressure\n1.5 bar\n"
    assert split_passages(text, "boiler", markdown=True, max_chars=900) == [
        ("Boiler", "Intro."),
        ("Boiler > Reset", "Hold the button.\nFive seconds."),
        ("Boiler > Pressure", "1.5 bar"),
    ]
    plain = split_passages("One.\nstill one.\n\nTwo.", "car", markdown=False, max_chars=900)
    assert plain == [("car", "One. still one."), ("car", "Two.")]
    long = " ".join(f"Sentence number {i} is here." for i in range(200))
    pieces = split_passages(long, "long", markdown=False, max_chars=300)
    assert len(pieces) > 10 and all(len(body) <= 300 for _, body in pieces)
    assert "".join(body.replace(" ", "") for _, body in pieces) == long.replace(" ", "")


def test_changed_new_and_deleted_files_are_reindexed(tmp_path: Path) -> None:
    folder, base = notes_in(tmp_path)
    note = folder / "wifi.md"
    note.write_text("# Wi-Fi\nThe guest password is otter-one.\n", encoding="utf-8")
    assert base.scan()
    assert "otter-one" in base.retrieve("guest wifi password")[0].text
    assert not base.scan()  # nothing changed: nothing done
    note.write_text("# Wi-Fi\nThe guest password is badger-two now.\n", encoding="utf-8")
    os.utime(note, ns=(note.stat().st_mtime_ns + 10**9,) * 2)  # a new mtime on any clock
    (folder / "sub").mkdir()
    (folder / "sub" / "bins.txt").write_text("Bins go out on Tuesday.", encoding="utf-8")
    assert base.scan()
    [found] = base.retrieve("guest wifi password")
    assert "badger-two" in found.text and "otter-one" not in found.text
    assert base.retrieve("when do the bins go out")[0].path == "sub/bins.txt"
    note.unlink()
    assert base.scan()
    assert base.retrieve("guest wifi password") == []
    stats = base.stats()
    assert (stats.files, stats.passages) == (1, 1) and stats.updated is not None


def test_the_scanner_thread_picks_up_edits_without_a_restart(tmp_path: Path) -> None:
    from .helpers import wait_until

    folder, base = notes_in(tmp_path, rescan_seconds=0.05)
    base.start()
    try:
        (folder / "alarm.txt").write_text("The alarm code is 9173.", encoding="utf-8")
        wait_until(lambda: base.retrieve("alarm code"), "the new note is indexed", timeout=10)
    finally:
        base.stop()


def test_bad_files_are_skipped_with_one_line_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder, base = notes_in(tmp_path, max_file_bytes=10_000)
    (folder / "good.md").write_text("# Good\nThe fuse box is under the stairs.", encoding="utf-8")
    (folder / "huge.txt").write_text("fuse " * 5000, encoding="utf-8")
    (folder / "binary.txt").write_bytes(b"fuse\x00\x01\x02" * 10)
    (folder / "latin1.txt").write_bytes("fuse caf\xe9 cr\xe8me".encode("latin-1"))
    (folder / "photo.jpg").write_bytes(b"\xff\xd8\xff")
    (folder / ".hidden.md").write_text("fuse", encoding="utf-8")
    (folder / "gone.md").symlink_to(tmp_path / "nowhere.md")  # unreadable, also for root
    os.mkfifo(folder / "pipe.txt")  # reading it would block the scanner for ever
    root = os.geteuid() == 0  # root reads a mode-0 file
    if not root:
        unreadable = folder / "secret.md"
        unreadable.write_text("fuse", encoding="utf-8")
        unreadable.chmod(0)
    with caplog.at_level(logging.INFO, "wyoming_pivoice.server.knowledge"):
        base.scan()
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    expected = {"huge.txt", "binary.txt", "latin1.txt", "photo.jpg", "gone.md", "pipe.txt"}
    if not root:
        expected.add("secret.md")
    assert sorted(m.split()[2].rstrip(":") for m in skipped) == sorted(expected), skipped
    assert [p.path for p in base.retrieve("fuse")] == ["good.md"]
    caplog.clear()
    with caplog.at_level(logging.INFO, "wyoming_pivoice.server.knowledge"):
        assert not base.scan()  # the same files again: not one more line
    assert not caplog.records
    assert base.stats().skipped == len(expected)


def test_the_index_is_bounded(tmp_path: Path) -> None:
    folder, base = notes_in(tmp_path, max_files=5, max_passages=7, max_total_bytes=2000)
    for i in range(8):
        paragraphs = "\n\n".join(f"Note {i} paragraph {j} about the garden." for j in range(3))
        (folder / f"n{i}.txt").write_text(paragraphs, encoding="utf-8")
    base.scan()
    stats = base.stats()
    assert stats.files <= 5 and stats.passages == 7


def test_the_index_lives_outside_the_notes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    with pytest.raises(KnowledgeError, match="inside the notes folder"):
        KnowledgeBase(KnowledgeSettings(folder=folder, index=folder / "index.sqlite3"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    index = default_index(folder)
    assert index.parent == tmp_path / "data" / "wyoming-pivoice"
    assert default_index(tmp_path / "other") != index


def test_a_missing_folder_is_not_fatal_and_is_indexed_once_it_exists(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder, base = notes_in(tmp_path)
    folder.rmdir()
    with caplog.at_level(logging.INFO, "wyoming_pivoice.server.knowledge"):
        assert not base.scan()
        assert not base.scan()
    assert len(caplog.records) == 1 and "does not exist" in caplog.records[0].getMessage()
    folder.mkdir()
    (folder / "tv.md").write_text("# TV\nThe TV PIN is 2580.", encoding="utf-8")
    assert base.scan() and base.retrieve("tv pin")


def test_the_server_option(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    server_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["server", "--knowledge", str(tmp_path), "--knowledge-tokens", "99"])
    settings = server_cli.settings_from_args(args).knowledge
    assert settings is not None and settings.folder == tmp_path and settings.max_tokens == 99
    assert not settings.index.is_relative_to(tmp_path)
    assert server_cli.settings_from_args(parser.parse_args(["server"])).knowledge is None
    bad = parser.parse_args(
        ["server", "--knowledge", str(tmp_path), "--knowledge-index", str(tmp_path / "i.db")]
    )
    with caplog.at_level(logging.ERROR):
        assert server_cli.run(bad) == 2  # one line, before anything loads or listens
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert line.startswith("--knowledge: the knowledge index") and "inside the notes" in line


def history_messages(history: list[tuple[str, str]]) -> list[dict[str, str]]:
    return [
        {"role": role, "content": text}
        for pair in history
        for role, text in zip(("user", "assistant"), pair, strict=True)
    ]


class FourCharTokens:
    """Counts four characters a token: control flow only (the real tokenizer is elsewhere)."""

    context_size = 512

    def count_tokens(self, messages: list[dict[str, str]]) -> int:
        return sum(len(m["content"]) // 4 + 4 for m in messages)

    def prompt_tokens(self, messages: list[dict[str, str]]) -> list[int]:  # an exact counter
        return [0] * self.count_tokens(messages)


def test_notes_go_after_the_system_prompt_and_before_history(corpus: KnowledgeBase) -> None:
    store = ConversationStore(SYSTEM)
    store.notes = TurnNotes(corpus)
    earlier = [("Hello there.", "Hi! How can I help?")]
    messages = store.prompt(FourCharTokens(), earlier, "What's the guest wifi password?", 64)
    system = messages[0]["content"]
    assert system.startswith(SYSTEM + "\n\n" + INSTRUCTION)
    assert "marmalade-otter-42" in system
    assert [m["content"] for m in messages[1:]] == [
        "Hello there.",
        "Hi! How can I help?",
        "What's the guest wifi password?",
    ]
    # Nothing matches: the prompt is what it was without knowledge.
    plain = store.prompt(FourCharTokens(), earlier, "Tell me a joke.", 64)
    assert plain[0]["content"] == SYSTEM


def test_notes_are_trimmed_before_history_and_capped(corpus: KnowledgeBase) -> None:
    engine = FourCharTokens()
    history = [("What is a boiler?" * 5, "A heater." * 5)]
    question = "How do I reset the boiler and what should its pressure be?"
    passages = corpus.retrieve(question)
    assert len(passages) == 3
    _, kept, tokens = fit_notes(engine, SYSTEM, history, question, 10_000, passages, None)
    assert kept == passages and tokens > 0
    # A budget with room for the history and about one passage: the rest go, history stays.
    alone = engine.count_tokens([*history_messages(history), {"role": "user", "content": question}])
    budget = alone + engine.count_tokens([{"role": "system", "content": SYSTEM}]) + tokens // 2
    system, kept, _ = fit_notes(engine, SYSTEM, history, question, budget, passages, None)
    assert 1 <= len(kept) < 3 and kept[0].source == passages[0].source
    assert engine.count_tokens(build(system, history, question)) <= budget
    store = ConversationStore(SYSTEM)
    store.notes = TurnNotes(corpus)
    small = FourCharTokens()
    small.context_size = 300
    messages = store.prompt(small, history, question, 64)
    assert len(messages) == 4  # the history is still there
    assert small.count_tokens(messages) <= 300 - 64 - 8
    # The cap of their own (the local model's exact count): notes within it.
    system, kept, tokens = fit_notes(engine, SYSTEM, [], question, 10_000, passages, 90)
    assert tokens <= 90 and kept and kept[0].text.endswith("…")
    assert fit_notes(engine, SYSTEM, [], question, 10_000, passages, 5)[1] == []


def test_the_compute_log_records_what_was_retrieved(corpus: KnowledgeBase, tmp_path: Path) -> None:
    path = tmp_path / "compute.jsonl"
    log = compute_log.open_log(path)
    try:
        store = ConversationStore(SYSTEM)
        store.notes = TurnNotes(corpus)
        store.prompt(FourCharTokens(), [], "Which switch is the kitchen on?", 64)
        store.prompt(FourCharTokens(), [], "Tell me a joke.", 64)
    finally:
        log.close()
        compute_log.open_log(None)
    first, second = compute_log.read_knowledge(path)
    assert "fuse-box.md#Fuse box > Which switch is which" in first.passages
    assert first.tokens > 0 and len(first.scores) == len(first.passages) and first.found >= 1
    assert (second.passages, second.tokens, second.found) == ([], 0, 0)
    assert compute_log.read(path) == []  # the other readers see only loads and computes
    text = path.read_text(encoding="utf-8")
    assert "kitchen sockets" not in text  # sources, never the notes' text


def test_a_copy_of_the_corpus_reopens_without_reindexing(tmp_path: Path) -> None:
    folder = tmp_path / "notes"
    shutil.copytree(FIXTURES / "notes", folder)
    settings = KnowledgeSettings(folder=folder, index=tmp_path / "data" / "k.sqlite3")
    first = KnowledgeBase(settings)
    assert first.scan()
    first.close()
    again = KnowledgeBase(settings)
    assert again.stats().passages > 20
    assert not again.scan()  # the index persisted: nothing to redo
    assert again.retrieve("guest wifi password")


def test_doctor_reports_the_index(tmp_path: Path) -> None:
    from wyoming_pivoice.doctor.base import Status
    from wyoming_pivoice.doctor.knowledge import check_knowledge

    folder, base = notes_in(tmp_path)
    settings = base.settings
    assert check_knowledge(settings).status is Status.INFO  # not indexed yet: says so
    (folder / "tv.md").write_text("# TV\nThe TV PIN is 2580.\n\nNetflix: Family.", "utf-8")
    base.scan()
    finding = check_knowledge(settings)
    assert finding.status is Status.OK, finding
    assert finding.message.startswith("1 note, 1 passage, last update 20")
    (folder / "scan.pdf").write_bytes(b"%PDF")
    base.scan()
    finding = check_knowledge(settings)
    assert (
        finding.status is Status.WARN and "scan.pdf (is not a .txt or .md note)" in finding.message
    )
    missing = KnowledgeSettings(folder=tmp_path / "nowhere", index=settings.index)
    assert check_knowledge(missing).status is Status.WARN


def test_doctor_cli_with_knowledge(tmp_path: Path, corpus: KnowledgeBase) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "wyoming_pivoice", "doctor", "--json", "--no-audio",
         "--knowledge", str(corpus.settings.folder),
         "--knowledge-index", str(corpus.settings.index)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    report = json.loads(done.stdout)
    [finding] = [c for c in report["checks"] if c["check"] == "knowledge"]
    assert finding["status"] == "OK" and finding["data"]["files"] == 23, finding


def test_the_addon_option(tmp_path: Path) -> None:
    import yaml

    from .test_addon import ADDON, DEFAULT_SERVER, parses, run_addon

    options = {**yaml.safe_load((ADDON / "config.yaml").read_text())["options"], "knowledge": True}
    server, _, _, _ = run_addon(tmp_path, options, satellite=False)
    assert server == [
        *DEFAULT_SERVER,
        "--knowledge", "/share/pivoice/knowledge", "--knowledge-index", "/data/knowledge.sqlite3",
    ]  # fmt: skip
    parses(server)


def test_the_bench_generates_notes_that_index_within_the_bounds(tmp_path: Path) -> None:
    from pivoice_lab.bench import knowledge as bench

    written = bench.generate_notes(tmp_path / "notes", 0.2)
    assert written >= 0.2 * 1024 * 1024
    base = KnowledgeBase(
        KnowledgeSettings(folder=tmp_path / "notes", index=tmp_path / "data" / "k.sqlite3")
    )
    base.scan()
    stats = base.stats()
    assert stats.skipped == 0 and stats.passages > 300
    # The shipped corpus is among them, and still found among the generated notes.
    assert any("marmalade-otter-42" in p.text for p in base.retrieve("guest wifi password"))
    summary = {"median": 4.2, "p90": 17.3, "n": 94}
    row = {
        "on": summary, "off": summary, "on_minus_off": 1.0, "first_token_on_minus_off": 0.5,
        "same_first_phrase": "6/6", "turns_with_passages": "0/6",
    }  # fmt: skip
    text = bench.render(
        {
            "notes": {"megabytes": 0.2, "files": 30, "passages": 400, "index_s": 0.1,
                      "rescan_unchanged_ms": 1.0},
            "assembly_ms": {"with_knowledge": summary, "without": summary,
                            "turns_with_passages": "94/94"},
            "first_phrase_ms": {"off_topic": row, "on_topic": row},
            "meta": {"rounds": 1, "model": "m", "knowledge_tokens_cap": 320,
                     "load_average_start": [1.0], "load_average_end": [1.0]},
        }
    )  # fmt: skip
    assert "| retrieval + prompt assembly" in text and "4.2 (p90 17.3)" in text
    assert "| off-topic" in text and "6/6" in text
