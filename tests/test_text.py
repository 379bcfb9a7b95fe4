import re

import pytest
from wyoming.tts import SynthesizeChunk, SynthesizeStart, SynthesizeStop

from wyoming_pivoice.text import MAX_PHRASE_CHARS, MIN_CLAUSE_CHARS, PhraseSplitter, split_all

from .helpers import exchange, read_until


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


# Token-sized pieces the way an LLM streams them: words with their leading space, digits and
# punctuation one by one.
_TOKEN = re.compile(r"\s*(?:[A-Za-z']+|\d|[^\sA-Za-z\d])|\s+")

TEXTS = [
    "Dr. Smith lives on Main St. in the U.S. He likes it there.",
    "It is 3.5 degrees. Version 2.0 is out. The price is $4.99 today.",
    "Bring fruit, e.g. apples or pears. Mr. Jones left at 5 p.m. today.",
    "Here is the list:\n1. Eggs\n2. Milk\n3. Bread",
    'Well... I am not sure. She said "Hello there." Then she left. Really? Yes!',
    "Sure, I can turn on the kitchen lights, and also the hall lights, right now. Done.",
]


# The corpus the splitters were compared on (abbreviations, numbers, lists, ellipses,
# quotes): each text with the segmentations a listener would accept.
CORPUS: list[tuple[str, list[list[str]]]] = [
    ("Dr. Smith lives on Main St. in the U.S.", [["Dr. Smith lives on Main St. in the U.S."]]),
    (
        "Dr. Smith lives on Main St. in the U.S. He likes it there.",
        [["Dr. Smith lives on Main St. in the U.S.", "He likes it there."]],
    ),
    (
        "Mr. Jones arrived at 9 a.m. and left at 5 p.m. today.",
        [["Mr. Jones arrived at 9 a.m. and left at 5 p.m. today."]],
    ),
    (
        "The meeting is at 10 a.m. tomorrow. Be on time.",
        [["The meeting is at 10 a.m. tomorrow.", "Be on time."]],
    ),
    (
        "Bring fruit, e.g. apples or pears. Thanks!",
        [["Bring fruit, e.g. apples or pears.", "Thanks!"]],
    ),
    (
        "Temperatures vary, i.e. from 5 to 10 degrees. Dress warmly.",
        [["Temperatures vary, i.e. from 5 to 10 degrees.", "Dress warmly."]],
    ),
    ("It is 3.5 degrees. Version 2.0 is out.", [["It is 3.5 degrees.", "Version 2.0 is out."]]),
    ("The price is $4.99 today. Buy now!", [["The price is $4.99 today.", "Buy now!"]]),
    (
        "Pi is approximately 3.14159. That is enough digits.",
        [["Pi is approximately 3.14159.", "That is enough digits."]],
    ),
    (
        "It costs 1,000.50 dollars. That is a lot.",
        [["It costs 1,000.50 dollars.", "That is a lot."]],
    ),
    ("The time is 12:30. Dinner is at 7.", [["The time is 12:30.", "Dinner is at 7."]]),
    (
        "You need: 1. eggs 2. milk 3. bread.",
        [
            ["You need: 1. eggs 2. milk 3. bread."],
            ["You need:", "1. eggs", "2. milk", "3. bread."],
            ["You need: 1. eggs", "2. milk", "3. bread."],
        ],
    ),
    (
        "Here is the list:\n1. Eggs\n2. Milk\n3. Bread",
        [
            ["Here is the list:", "1. Eggs", "2. Milk", "3. Bread"],
            ["Here is the list: 1. Eggs", "2. Milk", "3. Bread"],
            ["Here is the list: 1. Eggs 2. Milk 3. Bread"],
        ],
    ),
    (
        "Well... I am not sure. Let me think.",
        [
            ["Well...", "I am not sure.", "Let me think."],
            ["Well... I am not sure.", "Let me think."],
        ],
    ),
    ("Wait… what?", [["Wait… what?"], ["Wait…", "what?"]]),
    ('She said "Hello there." Then she left.', [['She said "Hello there."', "Then she left."]]),
    ('"Is it ready?" he asked. "Yes!"', [['"Is it ready?" he asked.', '"Yes!"']]),
    ("Really? Yes! It works.", [["Really?", "Yes!", "It works."]]),
    ("Is it 5 p.m. already? I think so.", [["Is it 5 p.m. already?", "I think so."]]),
    (
        "The U.S. and the U.K. are allies. They trade a lot.",
        [["The U.S. and the U.K. are allies.", "They trade a lot."]],
    ),
    ("I live on Elm St. It is quiet.", [["I live on Elm St.", "It is quiet."]]),
    ("See you at 8 p.m. Goodbye.", [["See you at 8 p.m.", "Goodbye."]]),
    (
        "Prof. Brown teaches at MIT. She is great.",
        [["Prof. Brown teaches at MIT.", "She is great."]],
    ),
    ("Mrs. Lee and Ms. Park joined us. We ate.", [["Mrs. Lee and Ms. Park joined us.", "We ate."]]),
    (
        "The file is named report.pdf and it is ready.",
        [["The file is named report.pdf and it is ready."]],
    ),
    ("The score was 2-1. What a game!", [["The score was 2-1.", "What a game!"]]),
    ("Hello! How can I help you today?", [["Hello!", "How can I help you today?"]]),
    (
        "Turn on the lights. The kitchen lights are on now.",
        [["Turn on the lights.", "The kitchen lights are on now."]],
    ),
    ("Ask Bob. He knows the way.", [["Ask Bob.", "He knows the way."]]),
    ("It's 10 a.m. in New York. Good morning.", [["It's 10 a.m. in New York.", "Good morning."]]),
]


def streamed(text: str, pieces: list[str], min_clause_chars: int = 0) -> list[str]:
    assert "".join(pieces) == text
    splitter = PhraseSplitter(min_clause_chars)
    phrases = [phrase for piece in pieces for phrase in splitter.feed(piece)]
    rest = splitter.flush()
    return [*phrases, rest] if rest else phrases


def test_abbreviations_stay_inside_their_sentence() -> None:
    assert split_all("Dr. Smith lives on Main St. in the U.S. He likes it there.") == [
        "Dr. Smith lives on Main St. in the U.S.",
        "He likes it there.",
    ]
    assert split_all("Bring fruit, e.g. apples or pears. See you at 10 a.m. tomorrow.") == [
        "Bring fruit, e.g. apples or pears.",
        "See you at 10 a.m. tomorrow.",
    ]


def test_decimals_and_versions_are_not_cut() -> None:
    assert split_all("It is 3.5 degrees. Version 2.0 is out. Pi is about 3.14159.") == [
        "It is 3.5 degrees.",
        "Version 2.0 is out.",
        "Pi is about 3.14159.",
    ]


def test_numbered_lists_keep_their_numbers() -> None:
    assert split_all("Here is the list:\n1. Eggs\n2. Milk\n3. Bread") == [
        "Here is the list:",
        "1. Eggs",
        "2. Milk",
        "3. Bread",
    ]
    assert split_all("You need: 1. eggs 2. milk 3. bread.") == [
        "You need: 1. eggs 2. milk 3. bread."
    ]
    assert split_all("Dinner is at 7. Then we go home.") == ["Dinner is at 7.", "Then we go home."]


@pytest.mark.parametrize(("text", "accepted"), CORPUS)
def test_corpus_streamed_token_by_token(text: str, accepted: list[list[str]]) -> None:
    assert streamed(text, _TOKEN.findall(text)) in accepted


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("min_clause_chars", [0, MIN_CLAUSE_CHARS])
def test_streamed_equals_whole_text(text: str, min_clause_chars: int) -> None:
    whole = split_all(text, min_clause_chars)
    assert streamed(text, _TOKEN.findall(text), min_clause_chars) == whole
    assert streamed(text, list(text), min_clause_chars) == whole  # character by character


def test_a_sentence_comes_out_with_the_next_word_not_later() -> None:
    splitter = PhraseSplitter()
    assert splitter.feed("Dr. Smith lives on Main St.") == []  # "St." may go on
    assert splitter.feed(" in the U.S.") == []
    assert splitter.feed(" He") == ["Dr. Smith lives on Main St. in the U.S."]
    # After an opening quote the segmenter cannot tell whose it is until the quote closes.
    assert splitter.feed(' likes it. "Yes') == []
    assert splitter.feed('!"') == ["He likes it."]
    assert splitter.flush() == '"Yes!"'


@pytest.mark.parametrize("text", ["word " * 400, "Dr. " * 400, "x" * 700])
def test_a_runaway_sentence_is_cut_at_a_word_and_loses_nothing(text: str) -> None:
    phrases = split_all(text, MIN_CLAUSE_CHARS)
    assert all(len(p) <= MAX_PHRASE_CHARS for p in phrases)
    assert "".join(phrases).replace(" ", "") == text.replace(" ", "")
    assert streamed(text, list(text), MIN_CLAUSE_CHARS) == phrases


async def test_streaming_synthesis_speaks_one_audio_run_per_sentence(server_port: int) -> None:
    """The issue's check: abbreviations do not make the server speak "Dr." alone."""

    async def runs(text: str) -> int:
        events = [
            SynthesizeStart().event(),
            *[SynthesizeChunk(text=piece).event() for piece in _TOKEN.findall(text)],
            SynthesizeStop().event(),
        ]
        replies = await exchange(server_port, events, until="synthesize-stopped")
        starts = [e for e in replies if e.type == "audio-start"]
        stops = [e for e in replies if e.type == "audio-stop"]
        assert len(starts) == len(stops)
        assert sum(len(e.payload or b"") for e in replies if e.type == "audio-chunk") > 0
        return len(starts)

    assert await runs("Dr. Smith lives on Main St.") == 1
    assert await runs("Dr. Smith lives on Main St. in the U.S. He likes it there.") == 2


# --- Chinese and Japanese: their own punctuation, no white space -------------------------

CHINESE = "你好！今天天气很好，我们去公园散步吧。明天可能会下雨，记得带伞。"
JAPANESE = "こんにちは。今日はいい天気ですね！公園に散歩に行きましょう、明日は雨かもしれないので、傘を忘れないでください。"  # noqa: E501
CJK_TEXTS = [
    CHINESE,
    JAPANESE,
    "他说：“明天见。”然后就走了。你呢？",
    "「おはよう」と言った。元気？はい！",
    "温度是３．５度｡风很大；出门请多穿衣服，戴上帽子、围巾和手套。",
    "Sure. 好的，我来打开厨房的灯。Done!",
]


def test_chinese_is_cut_at_its_own_sentence_ends_as_it_streams() -> None:
    splitter = PhraseSplitter()
    out: list[tuple[int, list[str]]] = []
    for i, char in enumerate(CHINESE):  # the case: character by character
        if phrases := splitter.feed(char):
            out.append((i, phrases))
    # Each sentence comes out with the next character, not at the end of the reply.
    assert out == [
        (CHINESE.index("今"), ["你好！"]),
        (CHINESE.index("明"), ["今天天气很好，我们去公园散步吧。"]),
    ]
    assert splitter.flush() == "明天可能会下雨，记得带伞。"


def test_chinese_and_japanese_clauses_are_cut_once_long_enough() -> None:
    # A wide character counts as a syllable (three letters): 24 letters ≈ 8 characters.
    assert split_all("我们明天早上七点钟出发去爬山，记得带水。", MIN_CLAUSE_CHARS) == [
        "我们明天早上七点钟出发去爬山，",
        "记得带水。",
    ]
    assert split_all("今天天气很好，我们去公园吧。", MIN_CLAUSE_CHARS) == [
        "今天天气很好，我们去公园吧。"  # its first clause is too short to stand alone
    ]
    assert split_all(JAPANESE, MIN_CLAUSE_CHARS) == [
        "こんにちは。",
        "今日はいい天気ですね！",
        "公園に散歩に行きましょう、",
        "明日は雨かもしれないので、",
        "傘を忘れないでください。",
    ]


def test_full_width_forms_and_closing_quotes() -> None:
    assert split_all("他说：“明天见。”然后就走了。你呢？") == [
        "他说：“明天见。”",
        "然后就走了。",
        "你呢？",
    ]
    assert split_all("「おはよう」と言った。元気？はい！") == [
        "「おはよう」と言った。",
        "元気？",
        "はい！",
    ]
    # ３．５ is a number, not a sentence end; ｡ (half-width) is one.
    assert split_all("温度是３．５度｡风很大。")[0] == "温度是３．５度｡"


@pytest.mark.parametrize("text", CJK_TEXTS)
@pytest.mark.parametrize("min_clause_chars", [0, MIN_CLAUSE_CHARS])
def test_cjk_streamed_equals_whole_text(text: str, min_clause_chars: int) -> None:
    whole = split_all(text, min_clause_chars)
    assert len(whole) >= 2
    assert streamed(text, list(text), min_clause_chars) == whole
    pairs = [text[i : i + 2] for i in range(0, len(text), 2)]  # two characters a token
    assert streamed(text, pairs, min_clause_chars) == whole
    assert "".join(whole).replace(" ", "") == text.replace(" ", "")


async def test_chinese_streamed_to_the_server_is_spoken_sentence_by_sentence(
    server_port: int,
) -> None:
    """The issue's check, with the embedded (English) voice: Chinese text streamed with
    synthesize-start/chunk/stop comes back as several audio runs, the first before the
    text ends (the rest of the text is sent only once the first audio has begun)."""
    from wyoming.client import AsyncTcpClient

    first, rest = CHINESE[:4], CHINESE[4:]  # "你好！今": the first sentence and one more
    async with AsyncTcpClient("127.0.0.1", server_port) as client:
        await client.write_event(SynthesizeStart().event())
        for char in first:
            await client.write_event(SynthesizeChunk(text=char).event())
        replies = await read_until(client, "audio-start", timeout=60)  # before the text ends
        for char in rest:
            await client.write_event(SynthesizeChunk(text=char).event())
        await client.write_event(SynthesizeStop().event())
        replies += await read_until(client, "synthesize-stopped", timeout=120)
    starts = [e for e in replies if e.type == "audio-start"]
    stops = [e for e in replies if e.type == "audio-stop"]
    assert len(starts) == len(stops) == 3  # 你好！ / 今天…吧。 / 明天…伞。
    assert sum(len(e.payload or b"") for e in replies if e.type == "audio-chunk") > 0
