"""What a command said over a reply becomes: the satellite's own chain (AEC3, Silero, the fast
barge-in, the endpointer) on a scene in the lab's room, the utterance it hands over
transcribed by the server's Whisper (tiny.en, embedded), its key words checked as the room
bench checks them (lab room.words)."""

from __future__ import annotations

import numpy as np
import pytest

from pivoice_lab.bench.room import target_cases
from pivoice_lab.room.words import Take, run_take, score
from tests.helpers import make_speech, read_wav
from wyoming_pivoice.engines import SileroVad
from wyoming_pivoice.satellite import VadSettings

pytestmark = pytest.mark.slow  # AEC3, Silero and Whisper over ~30 s of audio

# A target room of the bench: the echo 6 dB under what plays, 150 ms late, RT60 0.7 s, a
# small speaker (200 Hz high-pass, soft clipping), +100 ppm of drift.
ROOM = target_cases()[0].acoustics(seed=1)
COMMAND = "Lock the front door and close the garage."
WORDS = ("door", "garage")


def _read(path):
    return read_wav(path)[:2]


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    from wyoming_pivoice.engines import AsrSettings, WhisperAsr

    folder = tmp_path_factory.mktemp("words")
    reply = _read(
        make_speech(
            "Sure. Here is a short story about a cat who lived by the sea. Every morning she "
            "walked along the harbour and watched the boats come in with their nets full.",
            folder / "reply.wav", rate=22050, pad_before=0.0, pad_after=0.0,
        )
    )  # fmt: skip
    pcm, _ = _read(make_speech(COMMAND, folder / "user.wav", pad_before=0.0, pad_after=0.0))
    user = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768
    return reply, user, SileroVad(), WhisperAsr(AsrSettings())


# Where in the reply the user starts. One onset is a coin flip: at the echo's level a word is
# heard or lost by how the voice falls against the reply's syllables (AEC3's double-talk
# suppression, Whisper through the echo), and a machine's float kernels tip it. The 0.7 s
# onset alone passed in session 24's CI and failed from session 25 on, with the same pins.
ONSETS_S = (0.5, 0.7, 0.9, 1.2, 1.5, 1.9, 2.4, 3.0)
# Session 26, this room: heard at 6 of the 8 (lost at 0.7 and 1.2 s: the start came 0.4 and
# 0.6 s after the voice, "Lock the front door" under the echo; the clean voice cut the same
# way is heard). Words lost by the chain itself (its audio misplaced, its pre-roll short)
# lose most of them.
HEARD_AT_LEAST = 5


def test_commands_over_the_reply_are_heard_whole(parts):
    """At the echo's level, at onsets through the reply: each is cut and makes no turn of
    its own, and Whisper hears the key words in the utterance the satellite hands over at
    most of them."""
    reply, user, vad, asr = parts
    transcripts = {}
    for onset in ONSETS_S:
        shipped = run_take(Take(ROOM, onset, 0.0, "door", COMMAND, WORDS), reply, user, vad,
                           prerolls_ms=())  # fmt: skip
        assert shipped.started_after_s is not None, onset  # an utterance over the reply: cut
        assert shipped.self_made == 0, onset
        shipped.audio = {"today": shipped.audio["today"]}  # what the satellite sends, alone
        [heard] = score([shipped], asr.transcribe)
        transcripts[onset] = (heard.heard, heard.transcript)
    assert sum(ok for ok, _ in transcripts.values()) >= HEARD_AT_LEAST, transcripts


def test_nothing_is_heard_when_nobody_talks_over_the_reply(parts):
    reply, _, vad, _ = parts
    alone = run_take(Take(ROOM, None), reply, None, vad, VadSettings())
    assert alone.self_made == 0 and alone.audio == {}
