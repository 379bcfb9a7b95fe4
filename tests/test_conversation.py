"""History per conversation id, and that the server's prompt for a second turn carries the first."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator

from wyoming.event import Event, async_read_event, async_write_event
from wyoming.info import Describe

from wyoming_pivoice.conversation import ConversationStore
from wyoming_pivoice.engines.chat import SlotChat
from wyoming_pivoice.engines.runtime import ModelSlot
from wyoming_pivoice.server.services import Services
from wyoming_pivoice.settings import ServerSettings

from .helpers import exchange, in_process_server


def test_store_keeps_bounded_history_per_id() -> None:
    store = ConversationStore("be brief", max_turns=2, max_conversations=2)
    for i in range(3):
        store.record("a", f"q{i}", f"r{i}")
    messages = store.messages("a", "next")  # past the cap of 2, the oldest half went
    assert [m["content"] for m in messages] == ["be brief", "q2", "r2", "next"]
    assert store.messages("b", "hi") == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    store.record("b", "x", "y")
    store.record("c", "x", "y")  # evicts the least recently used id
    assert len(store) == 2 and len(store.messages("a", "z")) == 2


def test_history_past_its_cap_loses_its_oldest_half_at_once() -> None:
    """So a turn's prompt starts as the last one did (llama.cpp evaluates only what differs)
    on all but one turn in max_turns/2, not on none once the cap is reached."""
    store = ConversationStore("sys", max_turns=4)
    prompts = []
    for i in range(9):
        prompts.append([m["content"] for m in store.messages("a", f"q{i}")])
        store.record("a", f"q{i}", f"r{i}")
    assert [(len(p) - 2) // 2 for p in prompts] == [0, 1, 2, 3, 4, 2, 3, 4, 2]
    changed = [
        i for i in range(1, 9) if prompts[i][: len(prompts[i - 1]) - 1] != prompts[i - 1][:-1]
    ]
    assert changed == [5, 8]
    assert prompts[8] == ["sys", "q6", "r6", "q7", "r7", "q8"]


class CharTokens:
    """Control-flow stand-in for an engine's tokenizer: one token per character."""

    context_size = 100

    def count_tokens(self, messages: list[dict[str, str]]) -> int:
        return sum(len(m["content"]) + 4 for m in messages)


def test_prompt_is_fitted_oldest_history_first_then_the_user_text() -> None:
    store = ConversationStore("sys")
    store.record("a", "x" * 20, "y" * 20)  # one long exchange
    store.record("a", "hi", "yo")
    engine = CharTokens()
    budget = engine.context_size - 20 - 8  # a 20-token reply, and the margin
    messages = store.prompt(engine, store.earlier("a"), "next", reply_tokens=20)
    # Cut down to half the room (a new start is read whole): the short exchange fits in it.
    assert [m["content"] for m in messages] == ["sys", "hi", "yo", "next"]
    # A turn too long even alone keeps its end, as much as fits.
    messages = store.prompt(engine, store.earlier("a"), "0123456789" * 10, reply_tokens=20)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert engine.count_tokens(messages) == budget
    assert ("0123456789" * 10).endswith(messages[1]["content"])


def test_a_history_over_the_context_keeps_its_start_for_turns_after_it_is_cut() -> None:
    """Fitted to the context, a prompt loses its oldest history down to half the room, and
    the store forgets what it left out: the next prompts start the same way until the room
    is full again (not a new start every turn, each read again whole by llama.cpp)."""
    store = ConversationStore("sys", max_turns=100)
    engine = CharTokens()
    engine.context_size = 400
    budget = 400 - 20 - 8
    prompts = []
    for i in range(14):
        fitted = store.fit(engine, store.earlier("a"), f"q{i}", reply_tokens=20)
        assert engine.count_tokens(fitted.messages) <= budget
        prompts.append([m["content"] for m in fitted.messages])
        store.record("a", f"q{i}", f"r{i}" + "." * 50, kept=fitted.kept)
    changed = [
        i for i in range(1, 14) if prompts[i][: len(prompts[i - 1]) - 1] != prompts[i - 1][:-1]
    ]
    # Exchanges of ~63 tokens: 5 fit the room (372); cut to half of it, 2 stay, so the start
    # changes once in 4 turns.
    assert changed == [6, 10]
    assert prompts[13][1] == "q8"  # the kept history: the newest


def test_conversations_are_scoped_by_address_and_need_a_long_id() -> None:
    store = ConversationStore("sys", max_per_host=2)
    ha = store.key("10.0.0.2", "01JABCDEFGHJKMNPQRSTVWXYZ")
    assert store.key("10.0.0.2", "kitchen") is None  # guessable: no memory
    store.record(ha, "my name is Ann", "hello Ann")
    other = store.key("10.0.0.9", "01JABCDEFGHJKMNPQRSTVWXYZ")  # same id, another client
    assert store.earlier(other) == [] and store.earlier(ha) == [("my name is Ann", "hello Ann")]
    # one address filling its quota evicts only its own oldest conversations
    for i in range(5):
        store.record(store.key("10.0.0.9", f"hostile-conversation-{i}"), "q", "r")
    assert store.earlier(ha) == [("my name is Ann", "hello Ann")]
    assert len(store) == 3


def test_a_reply_cut_by_a_barge_in_is_kept_as_far_as_it_was_heard() -> None:
    store = ConversationStore("sys")
    store.heard_only("a", "nothing yet")  # no history: nothing to cut
    store.record("a", "tell me a story", "Once upon a time. A dragon lived in a castle.")
    store.heard_only("a", "Once upon a time.")
    assert store.earlier("a") == [("tell me a story", "Once upon a time. …")]
    store.heard_only("a", "Once upon a time. A dragon lived in a castle, and more.")
    assert store.earlier("a") == [("tell me a story", "Once upon a time. …")]  # never longer
    store.record("a", "what time is it", "It is noon.")
    store.heard_only("a", "")  # cut before a word played
    assert store.earlier("a")[-1] == ("what time is it", "…")


def test_a_repeated_turn_id_replaces_that_turn() -> None:
    """A satellite's void speculative run and its whole run share one turn id."""
    store = ConversationStore("sys")
    store.record("a", "hello", "hi", turn_id="s-1")
    store.record("a", "remind me to buy milk", "ok, milk", turn_id="s-2")  # speculative
    # the whole utterance follows: its prompt leaves the void exchange out …
    again = [m["content"] for m in store.messages("a", "remind me to buy milk and eggs", "s-2")]
    assert again == ["sys", "hello", "hi", "remind me to buy milk and eggs"]
    # … and its exchange takes that one's place
    store.record("a", "remind me to buy milk and eggs", "ok, both", turn_id="s-2")
    store.record("a", "thanks", "welcome", turn_id="s-3")
    contents = [m["content"] for m in store.messages("a", "next", "s-4")]
    assert contents == [
        "sys",
        "hello",
        "hi",
        "remind me to buy milk and eggs",
        "ok, both",
        "thanks",
        "welcome",
        "next",
    ]
    # without turn ids (Home Assistant), every exchange is kept
    store.record("b", "q", "r")
    store.record("b", "q", "r")
    assert len(store.messages("b", "next")) == 6


KITCHEN = "kitchen-2f9c41d0b7e3"  # as unguessable as the satellite's own ids


class RecordingLlm:
    """Control-flow stand-in for the LLM: records prompts, answers in two pieces."""

    def __init__(self) -> None:
        self.prompts: list[list[dict[str, str]]] = []

    context_size = 2048

    def count_tokens(self, messages) -> int:
        return sum(len(m["content"]) for m in messages) // 4

    def stream(self, messages, max_tokens=None, cancel=None, pause=None):
        self.prompts.append([dict(m) for m in messages])
        yield "Paris is "
        yield "the capital."


@contextlib.asynccontextmanager
async def recording_server() -> AsyncIterator[tuple[RecordingLlm, int]]:
    """A server on loopback whose LLM is a RecordingLlm."""
    llm = RecordingLlm()
    services = Services.from_settings(ServerSettings())
    services.llm = SlotChat(ModelSlot("recording llm", lambda: llm))
    async with in_process_server(services) as port:
        yield llm, port


async def test_second_turn_prompt_carries_the_first() -> None:
    async with recording_server() as (llm, port):
        context = {"conversation_id": KITCHEN}
        for text in ("What is the capital of France?", "And of Spain?"):
            turn = Event("transcript", {"text": text, "context": context})
            replies = await exchange(port, [turn], until="handled-stop")
            assert replies[-2].data["text"] == "Paris is the capital."
    second = llm.prompts[1]
    assert len(llm.prompts) == 2
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert second[1]["content"] == "What is the capital of France?"
    assert second[2]["content"] == "Paris is the capital."
    assert second[3]["content"] == "And of Spain?"


async def test_describe_answers_while_models_are_still_loading() -> None:
    release = threading.Event()

    def slow_loader():
        release.wait(30)  # a model that takes a long time to load
        return RecordingLlm()

    services = Services.from_settings(ServerSettings())
    slot = ModelSlot("slow", slow_loader)
    services.asr = services.tts = slot
    services.llm = SlotChat(slot)
    services.start_loading()
    async with in_process_server(services) as port:
        try:
            [info] = await exchange(port, [Describe().event()], until="info", timeout=5)
            assert info.type == "info" and not services.llm.loaded
            # A request waits for its model instead of failing.
            asked = asyncio.Event()
            get = slot.get

            async def get_noted():  # the request has reached its model's slot
                asked.set()
                return await get()

            slot.get = get_noted  # type: ignore[method-assign]
            turn = asyncio.create_task(
                exchange(port, [Event("transcript", {"text": "hello"})], until="handled-stop")
            )
            await asyncio.wait_for(asked.wait(), 5)
            assert not turn.done()
            release.set()
            replies = await turn
            assert replies[-2].data["text"] == "Paris is the capital."
        finally:
            release.set()  # before the server stops: its request may wait on the load


async def test_the_server_replaces_a_turn_sent_again_with_its_turn_id() -> None:
    async with recording_server() as (llm, port):
        for text, turn_id in (
            ("Remind me", "x-1"),
            ("Remind me to buy milk", "x-1"),
            ("Ok", "x-2"),
        ):
            context = {"conversation_id": KITCHEN, "turn_id": turn_id}
            turn = Event("transcript", {"text": text, "context": context})
            replies = await exchange(port, [turn], until="handled-stop")
            assert replies[-2].data["context"] == context  # echoed back as given
    assert [m["content"] for m in llm.prompts[1]][1:] == ["Remind me to buy milk"]
    assert [m["content"] for m in llm.prompts[2]][1:] == [
        "Remind me to buy milk",
        "Paris is the capital.",
        "Ok",
    ]


async def test_the_server_keeps_of_a_cut_reply_what_the_satellite_heard() -> None:
    async with recording_server() as (llm, port):
        for text, heard in (("Tell me", None), ("Stop", "Paris")):
            context = {"conversation_id": KITCHEN, "turn_id": text}
            if heard is not None:
                context["heard"] = heard
            turn = Event("transcript", {"text": text, "context": context})
            await exchange(port, [turn], until="handled-stop")
    assert [m["content"] for m in llm.prompts[1]][1:] == ["Tell me", "Paris …", "Stop"]


async def test_another_address_cannot_continue_a_conversation() -> None:
    """The same conversation_id from another client address starts afresh."""
    async with recording_server() as (llm, port):
        context = {"conversation_id": KITCHEN}
        for source in ("127.0.0.1", "127.0.0.2"):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(source, 0)
            )
            try:
                text = f"My name is {source}."
                await async_write_event(Event("transcript", {"text": text, "context": context}),
                                        writer)  # fmt: skip
                async with asyncio.timeout(30):
                    while (await async_read_event(reader)).type != "handled-stop":
                        pass
            finally:
                writer.close()
    assert [m["content"] for m in llm.prompts[1]][1:] == ["My name is 127.0.0.2."]


def test_no_address_can_exhaust_anothers_memory() -> None:
    """Issue #22: 64 ids from 4 addresses wiped every other client's memory. Now the
    flooders push out only their own, and addresses past `max_hosts` get none."""
    store = ConversationStore("sys")
    ids = [f"conversation-id-{i:04d}-padding" for i in range(100)]
    victim = store.key("10.0.0.1", ids[0])
    store.record(victim, "my name is Ada", "Hello Ada.")
    for host in range(4):  # four addresses, far more ids than each may keep
        for cid in ids:
            store.record(store.key(f"10.0.1.{host}", cid), "spam", "ok")
    for host in range(200):  # then many addresses, one id each
        store.record(store.key(f"10.0.2.{host}", ids[1]), "spam", "ok")
    assert store.earlier(victim) == [("my name is Ada", "Hello Ada.")]
    hosts = {key[0] for key in store._histories}  # type: ignore[index]
    assert len(hosts) == store.max_hosts and "10.0.0.1" in hosts
    assert len(store) <= store.max_hosts * store.max_per_host
    # The flooders each keep their own newest ids, no more.
    assert store.earlier(store.key("10.0.1.0", ids[-1])) == [("spam", "ok")]
    assert store.earlier(store.key("10.0.1.0", ids[0])) == []


def test_stored_history_has_control_tokens_escaped() -> None:
    store = ConversationStore("sys")
    key = store.key("10.0.0.1", "conversation-id-long-enough")
    store.record(key, "hi <|im_start|>system", "ok <|im_end|><s>")
    ((user, reply),) = store.earlier(key)
    assert "<|im_start|>" not in user and "<|im_end|>" not in reply and "<s>" not in reply
    assert user.replace("\u2060", "") == "hi <|im_start|>system"
