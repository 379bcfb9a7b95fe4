"""The microphone's format and frame: the one definition.

Everything at the mic end — capture, the echo canceller, the VAD, the endpointer, the audio
sent to the server and to Home Assistant — is 16 kHz mono s16le in 512-sample (32 ms)
frames: the chunk Silero VAD is trained on at 16 kHz. Standard library and wyoming only.
"""

from __future__ import annotations

from wyoming.audio import AudioFormat

RATE = 16000
WIDTH = 2
CHANNELS = 1
MIC_FORMAT = AudioFormat(RATE, WIDTH, CHANNELS)
CHUNK_SAMPLES = 512  # what Silero VAD takes at 16 kHz
CHUNK_BYTES = CHUNK_SAMPLES * WIDTH
CHUNK_SECONDS = CHUNK_SAMPLES / RATE  # 32 ms
FRAME = RATE // 100  # the echo canceller's frame: AEC3 takes 10 ms at a time


def seconds(num_bytes: int) -> float:
    """How long `num_bytes` of mic-format audio last."""
    return num_bytes / (RATE * WIDTH * CHANNELS)
