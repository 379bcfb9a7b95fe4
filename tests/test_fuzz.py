"""Fuzzing the server's event intake with hypothesis.

Each case writes to one connection a mix of valid events and whole requests (in odd
orders), events whose fields hold any JSON value, mutated frames (wrong or non-numeric
lengths, flipped, cut or inserted bytes, non-string types, non-object data) and garbage
(binary, non-JSON lines, JSON nested too deep, overlong lines, huge lengths); it then
half-closes the connection, vanishes (reset) or leaves after the first replies.

What must hold: the case ends within a bound (the server closes after our end of input);
every reply is a well-formed event of a known type, runs (audio, transcript, handled) are
well nested, errors carry a known code and a text and are never "internal"; a line that can
never be an event is answered with "malformed" or "frame-too-large"; for well-formed input
nothing closes the connection and nothing owed is lost (an `info` per `describe`, the
matching `pong` per `ping`, a `handled` per acceptable turn, a `synthesize-stopped` per
stream); afterwards the server still answers `describe`, and every connection is let go.

The suite runs a short version against the session server (no LLM turns: they cost
seconds); `script/fuzz N` runs N cases of everything against a dedicated server and
reports its memory and descriptors as it goes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import struct
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from wyoming.event import Event, async_read_event

from wyoming_pivoice.wire.errors import CLOSING, ErrorCode

from .helpers import (
    describe_works,
    encode,
    open_connections,
    server_process,
    server_process_of,
)

# ---- what the server may send -------------------------------------------------------------

REPLY_TYPES = {
    "info",
    "pong",
    "error",
    "transcript-start",
    "transcript-chunk",
    "transcript",
    "transcript-stop",
    "handled-start",
    "handled-chunk",
    "handled",
    "handled-stop",
    "not-handled",
    "audio-start",
    "audio-chunk",
    "audio-stop",
    "synthesize-stopped",
}
ERROR_CODES = {code.value for code in ErrorCode} - {ErrorCode.INTERNAL}
# The replies that end an answer (counted by `script/fuzz`).
FINAL_REPLIES = {
    "info",
    "pong",
    "transcript",
    "handled",
    "not-handled",
    "audio-stop",
    "synthesize-stopped",
}
# Error codes after which the server closes the connection.
CLOSING_CODES = {code.value for code in CLOSING}
RUNS = {"audio": "audio", "transcript": "transcript", "handled": "handled"}

CASE_BOUND = 180.0  # seconds a case may take, models included (a hang fails long before CI)
MAX_TEXT = 4000  # the server's default max_text_chars

# ---- building blocks ----------------------------------------------------------------------

KNOWN = [
    "describe",
    "ping",
    "transcribe",
    "audio-start",
    "audio-chunk",
    "audio-stop",
    "transcript",
    "synthesize",
    "synthesize-start",
    "synthesize-chunk",
    "synthesize-stop",
]
OTHER = [
    "info",
    "pong",
    "error",
    "detect",
    "detection",
    "run-pipeline",
    "run-satellite",
    "pause-satellite",
    "played",
    "handled",
    "not-handled",
    "transcript-start",
    "voice-started",
    "timer-started",
    "synthesize-stopped",
]
FIELDS = ["text", "rate", "width", "channels", "language", "context", "voice", "timestamp"]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3)
    ),
    max_leaves=8,
)
# Short texts (a model sees them) with odd characters: controls, NULs, lone surrogates, emoji.
odd_chars = st.characters(codec=None, exclude_categories=()) | st.sampled_from(
    ["\0", "\ud800", "\udfff", "\x1b", "\u200b", "\ufeff", "\U0001f600", "\u0301", "\n"]
)
short_text = st.one_of(
    st.sampled_from(["", " ", "Hello.", "Turn on the light.", "What time is it?", ".", "…"]),
    st.text(max_size=24),
    st.text(odd_chars, max_size=12),
)
# Over the text limit: refused before any model sees them.
long_text = st.integers(1, 40).map(lambda n: "x" * (MAX_TEXT + n))
any_text = st.one_of(short_text, short_text, short_text, long_text)
# What a conversation turn says: mostly a plain question (answered quickly). Odd text can make
# the small LLM ramble on to its token limit, which costs seconds a case.
questions = st.sampled_from(["What time is it?", "Hello.", "Turn on the light.", "Who are you?"])
turn_text = st.one_of(questions, questions, questions, short_text, long_text)
# Turns the server refuses before the LLM sees them (the suite's short run keeps to these).
refused_turn = st.sampled_from(["", "  ", "\0 hi", "hi \ud800"]) | long_text


@dataclass
class Unit:
    """One piece of a case: its bytes, and what a correct server owes for it."""

    raw: bytes
    well_formed: bool  # a complete frame with a dict data block, sent as the protocol says
    events: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)  # if well-formed
    definite: bool = False  # a whole line that can never be an event: must close with an error


@st.composite
def audio_format(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "rate": draw(st.sampled_from([16000, 16000, 8000, 22050, 48000]) | st.integers(-5, 300000)),
        "width": draw(st.sampled_from([2, 2, 1, 4]) | st.integers(-1, 9)),
        "channels": draw(st.sampled_from([1, 1, 2]) | st.integers(-1, 10)),
    }


@st.composite
def pcm(draw: st.DrawFn) -> bytes:
    """Silence, a tone or noise; mostly a fraction of a second."""
    kind = draw(st.sampled_from(["empty", "noise", "tone", "silence"]))
    if kind == "empty":
        return b""
    if kind == "noise":
        return draw(st.binary(max_size=3000))
    samples = draw(st.integers(1, 8000))
    if kind == "silence":
        return b"\0\0" * samples
    return b"".join(struct.pack("<h", (i * 97) % 20000 - 10000) for i in range(samples))


@st.composite
def voice(draw: st.DrawFn) -> dict[str, Any] | None:
    return draw(
        st.none()
        | st.fixed_dictionaries(
            {},
            optional={
                "name": st.sampled_from(["en_US-joe-medium", "nobody"]) | st.text(max_size=8),
                "speaker": st.sampled_from(["0", "1", "²", "joe"]) | st.text(max_size=4),
            },
        )
    )


@st.composite
def valid_event(draw: st.DrawFn, llm: bool = True) -> tuple[str, dict[str, Any], bytes | None]:
    """A known event with well-typed fields. Model-reaching events are rarer: they cost time."""
    kind = draw(
        st.sampled_from(
            ["describe", "ping", "transcribe", "audio-start", "audio-chunk", "audio-stop"] * 3
            + ["synthesize-start", "synthesize-chunk", "synthesize-stop"] * 2
            + ["transcript", "synthesize"]
            + OTHER
        )
    )
    data: dict[str, Any] = {}
    payload = None
    if kind == "ping":
        data = {"text": draw(st.none() | short_text)}
    elif kind == "transcribe":
        data = draw(st.fixed_dictionaries({}, optional={"language": st.sampled_from(["en", "de"])}))
    elif kind in ("audio-start", "audio-chunk"):
        data = draw(audio_format())
        if kind == "audio-chunk":
            payload = draw(pcm())
    elif kind == "audio-stop":
        data = draw(st.fixed_dictionaries({}, optional={"timestamp": st.integers(0, 10**6)}))
    elif kind == "transcript":
        data = {"text": draw(turn_text if llm else refused_turn)}
        conversation = draw(st.none() | st.sampled_from(["fuzz-a", "fuzz-b"]) | st.text(max_size=8))
        if conversation is not None:
            data["context"] = {"conversation_id": conversation}
    elif kind in ("synthesize", "synthesize-chunk"):
        data = {"text": draw(any_text)}
        if kind == "synthesize" and (chosen := draw(voice())) is not None:
            data["voice"] = chosen
    elif kind == "synthesize-start" and (chosen := draw(voice())) is not None:
        data["voice"] = chosen
    elif kind in OTHER:
        data = draw(st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=3))
    return kind, data, payload


@st.composite
def ill_typed_event(draw: st.DrawFn) -> tuple[str, dict[str, Any], bytes | None]:
    """A known event type whose fields hold any JSON value (or an unknown type)."""
    kind = draw(st.sampled_from(KNOWN) | st.text(max_size=10))
    data = draw(st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=5), json_values))
    payload = draw(st.none() | st.binary(max_size=600))
    return kind, data, payload


@st.composite
def well_formed(draw: st.DrawFn, llm: bool = True) -> Unit:
    kind, data, payload = draw(st.one_of(valid_event(llm), valid_event(llm), ill_typed_event()))
    placement = draw(st.sampled_from(["block", "block", "header", "split"]))
    frame = encode(kind, data, payload, placement, version=draw(st.booleans()))
    return Unit(frame, True, [(kind, data)])


@st.composite
def request(draw: st.DrawFn, llm: bool = True) -> Unit:
    """A whole request as a client sends it (these reach the models)."""
    kind = draw(
        st.sampled_from(["transcription"] * 3 + ["stream"] * 2 + ["synthesize"] * 2 + ["turn"])
    )
    events: list[tuple[str, dict[str, Any], bytes | None]] = []
    if kind == "transcription":
        usual = st.fixed_dictionaries(
            {
                "rate": st.sampled_from([16000, 8000, 22050, 44100]),
                "width": st.sampled_from([2, 2, 1, 4]),
                "channels": st.sampled_from([1, 1, 2]),
            }
        )
        fmt = draw(usual | usual | usual | audio_format())
        events.append(("transcribe", {"language": "en"}, None))
        events.append(("audio-start", fmt, None))
        events += [("audio-chunk", fmt, draw(pcm())) for _ in range(draw(st.integers(0, 3)))]
        events.append(("audio-stop", {}, None))
    elif kind == "stream":
        events.append(("synthesize-start", {}, None))
        pieces = draw(st.lists(short_text, max_size=4))
        events += [("synthesize-chunk", {"text": p}, None) for p in pieces]
        events.append(("synthesize", {"text": "".join(pieces)}, None))
        events.append(("synthesize-stop", {}, None))
    elif kind == "synthesize":
        events.append(("synthesize", {"text": draw(any_text)}, None))
    else:
        events.append(("transcript", {"text": draw(turn_text if llm else refused_turn)}, None))
    raw = b"".join(encode(k, d, p) for k, d, p in events)
    return Unit(raw, True, [(k, d) for k, d, _ in events])


@st.composite
def mutated(draw: st.DrawFn, llm: bool = True) -> Unit:
    """A real frame with its bytes or declared lengths damaged."""
    kind, data, payload = draw(st.one_of(valid_event(llm), ill_typed_event()))
    how = draw(
        st.sampled_from(
            ["length", "length", "truncate", "flip", "insert", "delete", "type", "data"]
        )
    )
    if how == "length":
        bad = draw(
            st.integers(-3, 3).map(lambda d: ("delta", d))
            | json_values.map(lambda v: ("value", v))
            | st.sampled_from([("value", 2**40), ("value", -1), ("value", 1.5), ("value", "7")])
        )
        block = json.dumps(data).encode() if data else b""
        header: dict[str, Any] = {"type": kind}
        if block:
            header["data_length"] = len(block)
        if payload:
            header["payload_length"] = len(payload)
        key = draw(st.sampled_from(["data_length", "payload_length"]))
        real = len(block) if key == "data_length" else len(payload or b"")
        header[key] = real + bad[1] if bad[0] == "delta" else bad[1]
        return Unit(json.dumps(header).encode() + b"\n" + block + (payload or b""), False)
    if how == "type":  # a type that is not a string, or no type at all
        value = draw(json_values.filter(lambda v: not isinstance(v, str)))
        header = {"type": value} if draw(st.booleans()) else {"data": data}
        return Unit(json.dumps(header).encode() + b"\n", False)
    if how == "data":  # data that is not an object, in the header or in a block
        value = draw(json_values.filter(lambda v: not isinstance(v, dict)))
        return Unit(encode(kind, value, payload, draw(st.sampled_from(["block", "header"]))), False)
    frame = bytearray(encode(kind, data, payload))
    at = draw(st.integers(0, len(frame) - 1))
    if how == "truncate":
        del frame[at:]
    elif how == "flip":
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(frame) - 1))
            frame[i] ^= draw(st.integers(1, 255))
    elif how == "insert":
        frame[at:at] = draw(st.binary(min_size=1, max_size=20))
    else:
        del frame[at : at + draw(st.integers(1, 20))]
    return Unit(bytes(frame), False)


@st.composite
def garbage(draw: st.DrawFn) -> Unit:
    kind = draw(
        st.sampled_from(
            ["bytes", "line", "json", "nested", "blank", "unterminated", "huge", "long-line"]
        )
    )
    if kind == "bytes":  # a line that is not UTF-8
        data = b"\xff" + draw(st.binary(max_size=200)).replace(b"\n", b"") + b"\n"
    elif kind == "line":
        data = ("#" + draw(st.text(max_size=60)).replace("\n", "")).encode() + b"\n"
    elif kind == "json":  # JSON, but not an object
        value = draw(json_values.filter(lambda v: not isinstance(v, dict)))
        data = json.dumps(value).encode() + b"\n"
    elif kind == "nested":  # deep nesting in the header or a data block
        depth = draw(st.sampled_from([100, 5000, 30000]))
        if draw(st.booleans()):
            data = b"[" * depth + b"]" * depth + b"\n"
        else:  # a ping whose data is nested (too deep to parse, unless only 100 deep)
            block = b'{"a":' * depth + b"1" + b"}" * depth
            data = json.dumps({"type": "ping", "data_length": len(block)}).encode() + b"\n" + block
            return Unit(data, False, [], depth > 100)
    elif kind == "blank":
        data = b"\n"
    elif kind == "unterminated":
        data = b'{"type": "describe"'
    elif kind == "huge":
        key = draw(st.sampled_from(["data_length", "payload_length"]))
        data = json.dumps({"type": "audio-chunk", key: draw(st.integers(2**22 + 1, 2**64))})
        data = data.encode() + b"\n"
    else:  # a header line longer than the reader's 64 KiB limit
        data = b'{"type": "ping", "data": {"text": "' + b"y" * 70000 + b'"}}\n'
    return Unit(data, False, [], kind != "unterminated")


unit = st.one_of(well_formed(), well_formed(), well_formed(), request(), mutated(), garbage())
# The suite's short run: fewer model calls (they cost time), none of them to the LLM.
cheap_unit = st.one_of(
    well_formed(llm=False),
    well_formed(llm=False),
    well_formed(llm=False),
    mutated(llm=False),
    garbage(),
)


@dataclass
class Case:
    units: list[Unit]
    ending: str  # "half-close": send EOF, read to the end; "vanish"; "leave": read a bit, go
    leave_after: int = 1
    pieces: int = 1  # how many writes the bytes are split into

    @property
    def well_formed(self) -> bool:
        return all(u.well_formed for u in self.units)


endings = st.sampled_from(["half-close", "half-close", "half-close", "vanish", "leave"])


def _cases(units: st.SearchStrategy) -> st.SearchStrategy:
    return st.builds(
        Case,
        units=st.lists(units, min_size=1, max_size=10),
        ending=endings,
        leave_after=st.integers(1, 3),
        pieces=st.integers(1, 4),
    )


cases = _cases(unit)
cheap_cases = _cases(cheap_unit)


def clean_cases(llm: bool = True) -> st.SearchStrategy[Case]:
    units = well_formed(llm) | request(llm)
    return st.builds(
        Case,
        units=st.lists(units, min_size=1, max_size=8),
        ending=st.just("half-close"),
        pieces=st.integers(1, 4),
    )


# ---- running a case and judging the replies ------------------------------------------------


@dataclass
class Outcome:
    replies: list[Event] = field(default_factory=list)
    closed: bool = False  # the server closed (or reset) the connection
    seconds: float = 0.0


async def _send(writer: asyncio.StreamWriter, case: Case) -> None:
    data = b"".join(u.raw for u in case.units)
    step = max(1, len(data) // case.pieces + 1)
    try:
        for i in range(0, len(data), step):
            writer.write(data[i : i + step])
            await writer.drain()
        if case.ending == "half-close":
            writer.write_eof()
    except (ConnectionError, OSError):
        pass  # the server already closed on a frame it could not read


async def _read(reader: asyncio.StreamReader, outcome: Outcome) -> Event | None:
    try:
        event = await async_read_event(reader)
    except ConnectionError:
        event = None
    else:
        assert event is not None or reader.at_eof(), "the server sent bytes that are not an event"
    if event is None:
        outcome.closed = True
    else:
        outcome.replies.append(event)
    return event


async def run_case(port: int, case: Case) -> Outcome:
    start = time.monotonic()
    outcome = Outcome()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if case.ending == "vanish":  # leave with a reset, not a polite close
        linger = struct.pack("ii", 1, 0)
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
    sender = asyncio.create_task(_send(writer, case))
    try:
        async with asyncio.timeout(CASE_BOUND):
            if case.ending == "vanish":
                await sender
            elif case.ending == "leave":  # read the first replies (if any come soon), then go
                with contextlib.suppress(TimeoutError):
                    while len(outcome.replies) < case.leave_after:
                        async with asyncio.timeout(0.3):
                            if await _read(reader, outcome) is None:
                                break
            else:
                while await _read(reader, outcome) is not None:
                    pass
                await sender
    finally:
        sender.cancel()
        writer.close()
        outcome.seconds = time.monotonic() - start
    return outcome


def utf8_ok(data: dict[str, Any]) -> bool:
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, RecursionError):
        return False
    return True


def expected(units: list[Unit]) -> Counter[str]:
    """Replies a correct server owes for well-formed input, whatever else it also says.

    Every turn gets `handled` or, refused or failed, `not-handled`: Home Assistant reads
    until one of them and ignores `error`.
    """
    owed: Counter[str] = Counter()
    for kind, data in (event for u in units for event in u.events):
        if kind == "transcript":
            owed["handled" if acceptable_turn(data) else "not-handled"] += 1
        elif kind in KNOWN and not utf8_ok(data):
            continue  # refused at the door
        elif kind == "describe":
            owed["info"] += 1
        elif kind == "ping":
            owed["pong"] += 1
        elif kind == "synthesize-stop":
            owed["synthesize-stopped"] += 1  # with or without its start: it is answered
    return owed


def acceptable_turn(data: dict[str, Any]) -> bool:
    text = data.get("text")
    if not utf8_ok(data) or not isinstance(text, str) or not 0 < len(text) <= MAX_TEXT:
        return False
    context = data.get("context")
    small = not isinstance(context, dict) or len(json.dumps(context)) <= MAX_TEXT
    return bool(text.strip()) and "\0" not in text and small


def stream_ends_at_most(units: list[Unit]) -> int:
    """A `synthesize` inside a stream that is not the stream's text ends that stream early
    (its own `synthesize-stopped`), so a stop may come without a start: at most this many."""
    return sum(kind in ("synthesize-stop", "synthesize") for u in units for kind, _data in u.events)


def check(case: Case, outcome: Outcome) -> None:
    open_runs: set[str] = set()
    for event in outcome.replies:
        assert event.type in REPLY_TYPES, f"unexpected reply {event.type!r}"
        assert isinstance(event.data, dict)
        if event.type == "error":
            assert isinstance(event.data.get("text"), str) and event.data["text"], event
            assert event.data.get("code") in ERROR_CODES, f"error {event.data}"
            continue
        run, _, part = event.type.partition("-")
        if run in RUNS and part == "start":
            open_runs.add(run)
        elif run in RUNS and part == "chunk":
            assert run in open_runs, f"{event.type} outside its run"
        elif run in RUNS and part == "stop":
            assert run in open_runs, f"{event.type} without a start"
            open_runs.discard(run)
        if event.type == "audio-chunk":
            assert event.payload and len(event.payload) % 2 == 0
            assert event.data["rate"] == 22050 and event.data["width"] == 2

    if case.ending == "half-close":
        assert outcome.closed, "the server did not close after the client's end of input"
        first_bad = next((u for u in case.units if not u.well_formed), None)
        if first_bad is not None and first_bad.definite:
            # A line that can never be an event: refused with a reason, then closed.
            codes = [e.data.get("code") for e in outcome.replies if e.type == "error"]
            assert {ErrorCode.MALFORMED, ErrorCode.FRAME_TOO_LARGE} & set(codes), codes
    if case.well_formed and case.ending == "half-close":
        # Nothing well-formed closes the connection, and nothing asked for is lost.
        codes = {e.data.get("code") for e in outcome.replies if e.type == "error"}
        assert not CLOSING_CODES & codes, codes
        replies = Counter(e.type for e in outcome.replies)
        for kind, count in expected(case.units).items():
            if kind == "synthesize-stopped":
                assert count <= replies[kind] <= stream_ends_at_most(case.units), replies
            else:
                assert replies[kind] == count, f"{replies[kind]} {kind} for {count} requests"
        sent = [
            json.dumps(data.get("text"))
            for u in case.units
            for kind, data in u.events
            if kind == "ping" and utf8_ok(data)
        ]
        echoed = [json.dumps(e.data.get("text")) for e in outcome.replies if e.type == "pong"]
        assert echoed == sent


class Fuzzer:
    """Runs cases on a private event loop (the test suite's own loop stays untouched)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.loop = asyncio.new_event_loop()

    def __enter__(self) -> Fuzzer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.loop.close()

    def __call__(self, case: Case) -> Outcome:
        outcome = self.loop.run_until_complete(run_case(self.port, case))
        check(case, outcome)
        self.loop.run_until_complete(describe_works(self.port))
        return outcome


# ---- the server process: memory and descriptors -------------------------------------------


# ---- the suite's short run -----------------------------------------------------------------

SHORT = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def fuzz_server(server_port: int) -> psutil.Process:
    return server_process_of(server_port)


def test_fuzz_random_frames(server_port: int, fuzz_server: psutil.Process) -> None:
    with Fuzzer(server_port) as fuzz_once:

        @SHORT
        @given(case=cheap_cases)
        def fuzz(case: Case) -> None:
            fuzz_once(case)

        fuzz()
    assert open_connections(fuzz_server) == []  # every fuzz connection was closed


def test_fuzz_well_formed_sequences(server_port: int) -> None:
    """Valid and ill-typed events in any order: nothing closes, nothing is lost."""
    with Fuzzer(server_port) as fuzz_once:

        @settings(SHORT, max_examples=30)
        @given(case=clean_cases(llm=False))
        def fuzz(case: Case) -> None:
            fuzz_once(case)

        fuzz()


# ---- `script/fuzz N`: a dedicated long run -------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="script/fuzz", description=__doc__.split("\n")[0])
    parser.add_argument("cases", type=int, nargs="?", default=10000)
    parser.add_argument("--log", type=Path, default=Path("/tmp/pivoice-fuzz-server.log"))
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=48,
        help="the server's cap on one LLM reply: odd text makes the small LLM ramble to it",
    )
    parser.add_argument("--shrink", action="store_true", help="shrink a failing case (slow)")
    args = parser.parse_args(argv)

    server = server_process("--max-tokens", str(args.max_tokens), log=args.log)
    with server as port, Fuzzer(port) as fuzz_once:
        fuzz_once.loop.run_until_complete(describe_works(port))
        proc = server_process_of(port)
        # Let the models finish loading (and warm up) before the baseline (script/fuzz only:
        # a settling pause before a measurement, then until the CPU is quiet).
        time.sleep(1)
        while proc.cpu_percent(0.5) > 20:
            pass
        count = 0
        seconds: list[float] = []
        endings: Counter[str] = Counter()
        codes: Counter[str] = Counter()
        answered: Counter[str] = Counter()
        start = time.monotonic()
        rows: list[tuple[int, float, float, int]] = []

        def sample() -> None:
            rss = proc.memory_info().rss / 2**20
            rows.append((count, time.monotonic() - start, rss, proc.num_fds()))
            print(f"{count:7d} cases  {rows[-1][1]:7.0f} s  RSS {rss:7.1f} MiB  fds {rows[-1][3]}")
            sys.stdout.flush()

        sample()

        phases = list(Phase) if args.shrink else [Phase.generate]

        @settings(SHORT, max_examples=args.cases, phases=phases)
        @given(case=cases)
        def fuzz(case: Case) -> None:
            nonlocal count
            outcome = fuzz_once(case)
            count += 1
            seconds.append(outcome.seconds)
            endings[case.ending] += 1
            codes.update(e.data.get("code") for e in outcome.replies if e.type == "error")
            answered.update(e.type for e in outcome.replies if e.type in FINAL_REPLIES)
            if count % 500 == 0:
                sample()

        fuzz()
        held = open_connections(proc)
        sample()
        total = time.monotonic() - start
        warm = rows[min(2, len(rows) - 1)]
        print(f"\n{count} cases in {total:.0f} s ({count / total:.1f}/s)")
        print(f"slowest case {max(seconds):.2f} s, mean {sum(seconds) / len(seconds):.3f} s")
        print(f"endings: {dict(endings)}")
        print(f"error codes answered: {dict(codes.most_common())}")
        print(f"model and other answers: {dict(answered.most_common())}")
        print(
            f"RSS {rows[0][2]:.1f} MiB at start, {warm[2]:.1f} after {warm[0]} cases, "
            f"{rows[-1][2]:.1f} at the end ({(rows[-1][2] / warm[2] - 1) * 100:+.1f} %); "
            f"fds {rows[0][3]} → {rows[-1][3]}"
        )
        print(f"connections still open: {held or 'none'}; server log: {args.log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
