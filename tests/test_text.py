from wyoming_pivoice.text import PhraseSplitter, split_all


def test_sentences_cut_only_at_sentence_ends() -> None:
    text = "Hello there! The weather is 3.5 degrees. **Bold** words? end"
    assert split_all(text) == ["Hello there!", "The weather is 3.5 degrees.", "Bold words?", "end"]


def test_clauses_cut_once_long_enough() -> None:
    text = "Sure, I can turn on the kitchen lights, and also the hall lights. Done."
    assert split_all(text, min_clause_chars=20) == [
        "Sure, I can turn on the kitchen lights,",
        "and also the hall lights.",
        "Done.",
    ]


def test_streamed_tokens_give_the_same_phrases_as_whole_text() -> None:
    text = "It is sunny today, with a light breeze from the west. Enjoy your walk!"
    splitter = PhraseSplitter(min_clause_chars=12)
    phrases: list[str] = []
    for i in range(0, len(text), 3):  # token-sized pieces
        phrases += splitter.feed(text[i : i + 3])
    rest = splitter.flush()
    assert [*phrases, rest] == split_all(text, min_clause_chars=12)
    # The first phrase is ready before the reply is finished.
    assert phrases[0] == "It is sunny today,"


def test_no_phrase_until_a_boundary() -> None:
    splitter = PhraseSplitter()
    assert splitter.feed("Still talking without an end") == []
    assert splitter.flush() == "Still talking without an end"
    assert splitter.flush() is None
