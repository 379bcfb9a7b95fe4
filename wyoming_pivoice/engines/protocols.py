"""The engine contracts: what the server (and the satellite) need of a model, and nothing
of Wyoming.

Speech to text, text to speech, VAD and wake words are blocking engines: the server runs
their calls in worker threads, one caller at a time (engines/runtime.py `ModelSlot`). The
chat engine is asynchronous, because one of them (the remote engine) is: the local
llama.cpp engine is adapted to it (engines/chat.py), so the server holds one kind.

Every engine class describes itself without loading anything (`describe(settings)`),
so `describe` is answered in Home Assistant's one second while the models still load;
server/info.py only assembles those descriptions. New engines register in registry.py.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

Message = dict[str, str]  # {"role": ..., "content": ...}


class EngineUnavailable(Exception):
    """An engine could not answer for a reason outside this program (a remote engine down,
    slow or refusing): the text says why in one line. The server answers the request and
    logs that line; anything else an engine raises is a bug and is logged with its trace."""


@dataclass(frozen=True)
class EngineDescription:
    """What an engine serves, as Home Assistant's `info` shows it (assembled in server/info.py)."""

    kind: str  # "asr", "tts", "chat", "vad" or "wake"
    engine: str  # the runtime: "faster-whisper", "piper", "llama.cpp" …
    model: str  # the model's name as a user would type it
    languages: tuple[str, ...]
    attribution: str  # who made the model or runtime
    url: str  # where to read about it
    version: str | None = None  # the model's version, when it has one
    description: str = ""  # one line for people; empty: "<engine> <model>"
    speakers: tuple[str, ...] = ()  # a multi-speaker voice's speaker names
    sample_rate: int = 0  # a voice's output rate (0: not a voice)
    # The Wyoming program's name, which Home Assistant shows (keep it when an engine is
    # renamed or swapped); "": pivoice-<engine>.
    program: str = ""

    @property
    def title(self) -> str:
        return self.description or f"{self.engine} {self.model}"

    @property
    def program_name(self) -> str:
        return self.program or f"pivoice-{self.engine}"


class SpeechToText(Protocol):
    """Blocking: run `segments` in a worker thread (the server's ModelSlot does)."""

    @property
    def name(self) -> str: ...

    def segments(
        self, audio: np.ndarray, language: str | None = None, cancel: threading.Event | None = None
    ) -> Iterator[str]:
        """The text of each decoded segment of 16 kHz mono float32 `audio`."""
        ...

    def warm_up(self) -> None: ...


class TextToSpeech(Protocol):
    """Blocking. Text is cut into bounded `pieces` (one inference each) so a long text never
    holds the voice for long: the server gives the voice to another client between pieces."""

    sample_width: int
    channels: int

    @property
    def name(self) -> str: ...

    @property
    def sample_rate(self) -> int: ...

    def speaker_id(self, speaker: str | None) -> int | None:
        """The voice's id for `speaker` (None: the default); ValueError if it has none such."""
        ...

    def pieces(self, text: str) -> list[str]: ...

    def speak(
        self, piece: str, speaker: str | None = None, cancel: threading.Event | None = None
    ) -> Iterator[bytes]:
        """16-bit PCM at `sample_rate` for one piece from `pieces`."""
        ...

    def warm_up(self) -> None: ...


@runtime_checkable
class TokenCounter(Protocol):
    """A chat model's context, in its own tokens: what conversation.py fits a prompt to."""

    @property
    def context_size(self) -> int: ...

    def count_tokens(self, messages: list[Message]) -> int: ...


# Builds a turn's messages once the engine can count tokens (conversation.py fits the
# history to the context there). It runs where the engine's tokenizer is: a worker thread
# for the local model, the loop for a remote one.
PromptBuilder = Callable[[TokenCounter], list[Message]]


class ChatEngine(Protocol):
    """The conversation, on the event loop: one async stream of the reply's text pieces.

    `pause` runs between pieces (audio first, engines/priority.py); leaving the iteration
    early stops the engine at its next piece and frees it.
    """

    @property
    def name(self) -> str: ...

    @property
    def loaded(self) -> bool: ...

    def start_loading(self) -> None: ...

    def reply(
        self,
        prompt: PromptBuilder,
        max_tokens: int | None = None,
        pause: Callable[[], None] | None = None,
        on_prompt: Callable[[Any, list[Message]], None] | None = None,
    ) -> AsyncIterator[str]:
        """The reply's pieces; `on_prompt(engine, messages)` sees the fitted prompt (the
        compute log counts its tokens there)."""
        ...


class Vad(Protocol):
    """Speech probability per fixed-size chunk of 16 kHz mono float32 audio; stateful."""

    def probability(self, chunk: np.ndarray) -> float: ...

    def reset(self) -> None: ...


class WakeDetector(Protocol):
    """A wake word on 16 kHz mono 16-bit PCM, blocking (satellite/wake.py `WakeWord`; the
    satellite's stage contract, satellite/protocols.py, is its async face)."""

    name: str  # as configured
    phrase: str  # as spoken, e.g. "Okay Nabu"

    def detect(self, chunk: bytes) -> bool:
        """True if the word ends in this chunk."""
        ...

    def reset(self) -> None: ...
