"""Guards against tiny.en looping on a short command: a decoding cap and one copy kept."""

from __future__ import annotations

from wyoming_pivoice.engines.asr import collapse_repeats, max_tokens


def test_a_phrase_the_decoder_repeats_is_kept_once() -> None:
    loop = "turn on the kitchen lights " * 6 + "turn on the"
    assert collapse_repeats(loop.strip()) == "turn on the kitchen lights"
    twice = "Turn off the living room lamp. Turn off the living room lamp."
    assert collapse_repeats(twice) == "Turn off the living room lamp."
    # the decoding cap ended the loop mid-word (the household corpus's "porch", session 26)
    cut = "turn on the porridge light at sunset " * 2 + "turn on the por"
    assert collapse_repeats(cut) == "turn on the porridge light at sunset"
    # a sound start, then a loop: the start stays
    assert collapse_repeats("What time is it? " + "it's " * 8) == "What time is it? it's"


def test_what_people_say_twice_stays() -> None:
    for said in (
        "I said no, no, no.",
        "la la la la",
        "it is what it is",
        "Set a timer for ten minutes.",
        "play the song again, play the song",  # a repeat that is not a loop to the end
        "turn it on turn it on now",  # a shorter last word that is no piece of the phrase
        "",
    ):
        assert collapse_repeats(said) == said


def test_the_decoding_cap_grows_with_the_audio_up_to_one_window() -> None:
    assert max_tokens(0.5) == 20
    assert max_tokens(2.0) == 32
    # a fast talker says ≈ 4 words (≈ 6 tokens) a second: the cap leaves room
    assert max_tokens(5.0) > 6 * 5.0
    assert max_tokens(30.0) == max_tokens(45.0) == 256
