"""Word error rate: the normaliser, the alignment and the corpus it scores (no model here)."""

from __future__ import annotations

from dataclasses import dataclass

from pivoice_lab.bench import corpus, wer


def test_normaliser_treats_spelled_and_written_numbers_alike() -> None:
    pairs = [
        ("Set the thermostat to twenty one degrees.", "set the thermostat to 21 degrees"),
        ("Set an alarm for six forty five.", "Set an alarm for 6:45"),
        ("Wake me up at seven thirty tomorrow.", "wake me up at 7:30 tomorrow!"),
        ("Remind me to call Grandma at six o'clock.", "Remind me to call grandma at 6 o'clock"),
        ("Dim the hallway lights to thirty percent.", "Dim the hallway lights to 30%."),
        ("What is the square root of one hundred and forty four?", "What's the square root of 144"),
    ]
    for reference, hypothesis in pairs:
        assert wer.normalise(reference) == wer.normalise(hypothesis), (reference, hypothesis)


def test_errors_are_counted_over_all_reference_words() -> None:
    result = wer.score(
        [
            ("lock", "Lock the front door.", "Like the front door"),  # 1 substitution
            ("timer", "Set a timer for ten minutes.", "Set a timer for 10 minutes."),
            ("leap", "Is this a leap year?", "is the sleep here"),  # 3 errors of 5
            ("silent", "Pause the music.", ""),  # nothing heard: every word is missed
        ]
    )
    assert (result["errors"], result["words"]) == (1 + 0 + 4 + 3, 4 + 6 + 5 + 3)
    assert result["wer"] == round(8 / 18, 4)
    assert result["exact"] == 1
    assert result["per_utterance"]["lock"]["errors"] == 1
    assert result["per_utterance"]["silent"]["wer"] == 1.0


def test_household_corpus_has_many_voices_and_a_real_person() -> None:
    lines = corpus.HOUSEHOLD
    assert len(lines) >= 50
    assert len({line.text for line in lines}) == len(lines)
    assert len({line.voice for line in lines if line.voice.startswith("espeak:")}) >= 6
    assert any(line.tempo != 1.0 for line in lines)
    assert [line.voice for line in lines if line.voice.startswith("human:")] == [
        f"human:{corpus.ARCTIC_WAV}"
    ]
    words = " ".join(line.text.lower() for line in lines)
    for topic in ("lock", "thermostat", "timer", "list", "twenty", "sarah"):
        assert topic in words


def test_bench_wer_section_scores_every_path_and_renders() -> None:
    import argparse

    from pivoice_lab.bench.cli import add_parser, options_from_args

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    options = options_from_args(parser.parse_args(["bench", "--wer"]))
    assert options.wer and not options.latency  # --wer alone skips the latency bench

    @dataclass
    class Clip:
        id: str
        text: str
        voice: str = "espeak:en-us"

    clips = [Clip("lock", "Lock the front door."), Clip("thermo", "Set the thermostat to 21.")]
    section = wer.section(
        clips,
        {
            "satellite": {"lock": "Like the front door", "thermo": "set the thermostat to 21"},
            "server": {
                "lock": "Lock the front door.",
                "thermo": "Set the thermostat to twenty one.",
            },
        },
    )
    assert section["overall"]["satellite"]["errors"] == 1
    assert section["overall"]["server"]["wer"] == 0.0
    assert section["per_utterance"]["lock"]["satellite"]["errors"] == 1
    text = "\n".join(wer.render({**section, "turns": {"lock": 1, "thermo": 2}}))
    assert "| satellite |" in text and "Like the front door" in text
    assert "1 utterance(s) not heard as exactly one turn" in text
