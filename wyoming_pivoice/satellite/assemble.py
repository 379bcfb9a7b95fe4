"""The satellite's ends, built once for both modes from SatelliteSettings: the speaker sink,
the endpointer, the echo canceller between them and the microphone (on the audio core's
thread: audio/core.cancel_echo), and the local wake word.

Both fronts take what is built here; neither opens a device, a canceller or a VAD itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..audio.core import CoreSource, cancel_echo
from ..audio.echo import EchoCanceller, open_canceller
from .endpoint import Endpointer
from .protocols import AudioSink, AudioSource, WakeDetector
from .settings import SatelliteSettings
from .turns import Playback


@dataclass
class Devices:
    source: AudioSource  # what the listener reads: the mic, echo-cancelled when AEC is on
    sink: AudioSink
    endpointer: Endpointer
    canceller: EchoCanceller | None


def assemble(
    settings: SatelliteSettings,
    source: AudioSource | None = None,
    sink: AudioSink | None = None,
) -> Devices:
    """The devices the settings name (`source`/`sink`: a host's own, e.g. the bench's)."""
    from ..audio.mic import open_source
    from ..audio.speaker import open_sink

    sink = sink or open_sink(settings.snd)
    endpointer = Endpointer(settings.vad)
    # The microphone hears the speaker: the canceller takes what the sink plays out of it,
    # so neither a barge-in nor what HA hears (a follow-up, its wake word) carries the reply.
    canceller = open_canceller(settings.echo)
    mic = cancel_echo(source or open_source(settings.mic), sink, endpointer, canceller)
    return Devices(mic, sink, endpointer, canceller)


def wake_word(name: str | None) -> WakeDetector | None:
    """The local wake word `name` (None: none); raises wake.WakeWordError."""
    if not name:
        return None
    from .wake import WakeWord

    return WakeWord(name)


def cut_on_interrupt(source: AudioSource, playback: Playback, allowed: Callable[[], bool]) -> None:
    """Barge-in without waiting for the event loop: when the turn policy says INTERRUPT on
    the audio core's thread, the speaker is cut there and then, if `allowed()` (a snapshot
    the front keeps, read on that thread); a voice over the reply that may be the user's
    holds it there, and it plays on if it was not (turn_policy.suspect). Without the core
    (no AEC) or a sink that can be cut, the loop's own stop is the barge-in."""
    if not isinstance(source, CoreSource) or not playback.can_cut:
        return

    def interrupt() -> bool:
        return allowed() and playback.cut_now()

    def hold() -> bool:
        return allowed() and playback.hold_now()

    source.on_interrupt = interrupt
    source.on_hold = hold
    source.on_release = playback.release_now
