"""A streamed synthesis speaks a sentence as soon as its writer says it is done.

Our satellite (standalone, and following in HA mode) sends each phrase its own splitter has
completed as one `synthesize-chunk` ending in a space. The server's splitter alone waits for
the next sentence's first word, so the first sentence of a reply was spoken only once the
second was complete (3.0 s late when the next chunk came 3 s later; session 9)."""

from __future__ import annotations

from wyoming_pivoice.server.synthesize import _Stream


def test_a_chunk_that_ends_a_sentence_with_a_space_is_spoken_at_once() -> None:
    stream = _Stream(None, 4000)
    assert stream.feed("I'm here to help with your kitchen projects. ") == [
        "I'm here to help with your kitchen projects."
    ]
    assert stream.feed('She said "yes!" ') == ['She said "yes!"']
    assert stream.feed("And then? ") == ["And then?"]


def test_an_llms_deltas_are_cut_as_before() -> None:
    """Deltas carry their space in front: the sentence completes with the next word."""
    stream = _Stream(None, 4000)
    out: list[str] = []
    for delta in ["Good", " mor", "ning", ".", " The", " heat", "ing", " is", " on", "."]:
        out += stream.feed(delta)
    assert out == ["Good morning."]
    # "Dr." inside a sentence, as deltas: not a cut.
    stream = _Stream(None, 4000)
    out = []
    for delta in [" Ask", " Dr", ".", " Smith", " today", ".", " Bye", "."]:
        out += stream.feed(delta)
    assert out == ["Ask Dr. Smith today."]
