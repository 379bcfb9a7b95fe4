"""What the satellite tells Home Assistant about itself in answer to `describe`."""

from __future__ import annotations

from wyoming.audio import AudioFormat
from wyoming.info import (
    Attribution,
    Info,
    MicProgram,
    Satellite,
    SndProgram,
    WakeModel,
    WakeProgram,
)

from .. import __version__
from ..audio.format import CHANNELS, RATE, WIDTH

TTS_RATE = 22050  # what HA asks its TTS for on Wyoming satellites (_TTS_SAMPLE_RATE)
ATTRIBUTION = Attribution(name="wyoming-pivoice", url="https://github.com/wyoming-pivoice")


def satellite_info(
    name: str,
    area: str | None,
    remote_wake: bool,
    wake_name: str | None = None,
    wake_phrase: str | None = None,
) -> Info:
    """Info with a satellite program (so HA sets up an assist satellite), mic and snd.

    HA's Wyoming integration loads no STT/TTS/conversation platforms for an Info that
    holds an installed satellite, so this endpoint describes only the satellite.
    With a local wake word it is listed under `wake`, whose model `phrase` HA uses to
    resolve our `detection{name}`.
    """
    wake: list[WakeProgram] = []
    if wake_name is not None:
        wake.append(
            WakeProgram(
                name="microwakeword",
                attribution=Attribution(
                    name="microWakeWord", url="https://github.com/kahrendt/microWakeWord"
                ),
                installed=True,
                description="Local wake word (pymicro-wakeword)",
                version=None,
                models=[
                    WakeModel(
                        name=wake_name,
                        attribution=ATTRIBUTION,
                        installed=True,
                        description=wake_phrase or wake_name,
                        version=None,
                        languages=["en"],
                        phrase=wake_phrase,
                    )
                ],
            )
        )
    return Info(
        satellite=Satellite(
            name=name,
            attribution=ATTRIBUTION,
            installed=True,
            description="Pi voice satellite (wyoming-pivoice)",
            version=__version__,
            area=area,
            # With remote wake HA's own VAD ends the command; otherwise ours does.
            has_vad=not remote_wake,
            active_wake_words=[wake_name] if wake_name is not None else [],
            max_active_wake_words=1 if wake_name is not None else 0,
            supports_trigger=True,
        ),
        mic=[
            MicProgram(
                name="pivoice-mic",
                attribution=ATTRIBUTION,
                installed=True,
                description="Microphone, 16 kHz mono 16-bit",
                version=__version__,
                mic_format=AudioFormat(rate=RATE, width=WIDTH, channels=CHANNELS),
            )
        ],
        snd=[
            SndProgram(
                name="pivoice-snd",
                attribution=ATTRIBUTION,
                installed=True,
                description="Speaker, plays audio at the rate each stream announces",
                version=__version__,
                snd_format=AudioFormat(rate=TTS_RATE, width=2, channels=1),
            )
        ],
        wake=wake,
    )
