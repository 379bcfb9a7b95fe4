"""The offline tools' one scene: a reply played in full (the canceller and the echo estimate
settle, as after the bench's first question), GAP_S of quiet, the same reply again, and the
user's voice over the second at `onset_s` after it starts, at `gain_db` against the echo's
own active level at the microphone (0: the user as loud as the echo; a room without echo —
a headset — puts the voice at HEADSET_DBFS + `gain_db`). offline.py scores the barge-in on
it, words.py what the utterance holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from wyoming.audio import AudioFormat

from wyoming_pivoice.audio import EchoCanceller

from .acoustics import RATE, EchoPath, NoiseFloor, RoomAcoustics, SpeakerPath

LEAD_S = 0.5  # quiet before the first reply
GAP_S = 1.2  # between the two replies (the bench's gap before a new question)
PIECE_S = 0.02  # the speaker thread hands the reference over in 20 ms blocks
HEADSET_DBFS = -30.0  # the user's active level when the microphone hears no echo
NO_ECHO_DB = -60.0  # a room whose echo is this far down is a headset


def active_dbfs(x: np.ndarray) -> float:
    """The level of the voiced 10 ms frames (within 30 dB of the loudest)."""
    frames = x[: len(x) // 160 * 160].reshape(-1, 160).astype(np.float64)
    energy = np.mean(frames**2, axis=1) + 1e-20
    loud = energy[energy > energy.max() * 1e-3]
    return float(10 * np.log10(np.mean(loud)))


@dataclass
class TwoReplies:
    """The scene's signals on the microphone's 16 kHz timeline (sample indices)."""

    pcm: bytes  # the reply as the satellite hands it to the speaker
    fmt: AudioFormat
    played: np.ndarray  # …as the speaker sends it into the room
    first: int  # where each reply starts playing
    second: int
    out: np.ndarray  # all the speaker plays
    mic: np.ndarray  # echo + noise + voice
    voice: np.ndarray  # the user alone
    onset: int | None  # the voice's first sample; None: nobody talks
    echo_db: float  # the echo's active level over the second reply (dBFS)
    end: int | None = None  # the voice's last sample + 1
    user_db: float | None = None  # the voice's active level as mixed

    def feed_reference(
        self, canceller: EchoCanceller, late_s: float = 0.0, second_early_s: float = 0.0
    ) -> None:
        """Both replies handed to `canceller` as the speaker thread hands them: PIECE_S
        blocks, each due when it plays (`late_s` later); the second reply's `second_early_s`
        earlier (the echo's delay moved between replies: a speaker command reopened)."""
        piece = round(self.fmt.rate * PIECE_S) * 2
        for start, early in ((self.first, 0.0), (self.second, second_early_s)):
            for i, offset in enumerate(range(0, len(self.pcm), piece)):
                due = start / RATE + i * PIECE_S + late_s - early
                canceller.reference(self.pcm[offset : offset + piece], self.fmt, due)


def two_replies(
    room: RoomAcoustics,
    reply: tuple[bytes, int],
    user: np.ndarray | None,
    onset_s: float | None,
    gain_db: float = 0.0,
    after_s: float = 1.0,
    gap_s: float = GAP_S,
) -> TwoReplies:
    """The scene through `room`: `reply` (PCM s16le mono, its rate) twice, `user` (16 kHz
    float) over the second at `onset_s`; `after_s` of the room after the second reply, `gap_s`
    between the two."""
    pcm, rate = reply
    fmt = AudioFormat(rate, 2, 1)
    speaker = SpeakerPath(fmt, room)
    played = np.concatenate([speaker.convert(pcm), speaker.flush()])
    first = round(LEAD_S * RATE)
    second = first + len(played) + round(gap_s * RATE)
    total = second + len(played) + round(after_s * RATE)
    out = np.zeros(total, dtype=np.float32)
    out[first : first + len(played)] = played
    out[second : second + len(played)] = played
    echo = EchoPath(room).process(out)
    mic = echo + NoiseFloor(room.noise_dbfs, room.seed).block(total)
    voice = np.zeros(total, dtype=np.float32)
    echo_db = active_dbfs(echo[second : second + len(played)])
    scene = TwoReplies(pcm, fmt, played, first, second, out, mic, voice, None, echo_db)
    if user is not None and onset_s is not None:
        target = echo_db if room.echo_db > NO_ECHO_DB else HEADSET_DBFS
        gain = 10 ** ((target + gain_db - active_dbfs(user)) / 20)
        onset = second + round(onset_s * RATE)
        part = (user * gain)[: total - onset]
        voice[onset : onset + len(part)] = part
        mic += voice
        scene.onset, scene.end = onset, onset + len(part)
        scene.user_db = round(active_dbfs(part), 1)
    return scene
