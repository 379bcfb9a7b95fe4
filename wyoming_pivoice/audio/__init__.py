"""The physical ends of the voice chain, no Wyoming: the format (format.py), PCM conversion
(pcm.py), pacing and the audio threads' priority (pacing.py), mic and speaker commands
(commands.py), microphones (mic.py), speakers (speaker.py), the echo canceller (echo.py) and
the real-time core that runs capture, AEC3 and the VAD on its own thread (core.py).

What a host (the lab's bench and room, a test) may use is exported here, imported on first
use (exports.py says why)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..exports import lazy_exports, names

_EXPORTS = {
    ".core": ("Act", "FastBargeIn", "LinearScore", "UtteranceAudio"),
    ".echo": ("EchoCanceller", "load_apm", "tune_linear"),
    ".echomatch": ("normalised_xcorr",),
    ".format": ("CHUNK_BYTES", "CHUNK_SAMPLES", "CHUNK_SECONDS"),
    ".pacing": ("AUDIO_RT_PRIORITY", "Pacer"),
    ".pcm": ("StreamingConverter", "float_to_pcm16"),
    ".speaker": ("NullSink",),
}
if TYPE_CHECKING:  # the same names, for the type checker (tests/test_layout.py: they agree)
    from .core import Act, FastBargeIn, LinearScore, UtteranceAudio
    from .echo import EchoCanceller, load_apm, tune_linear
    from .echomatch import normalised_xcorr
    from .format import CHUNK_BYTES, CHUNK_SAMPLES, CHUNK_SECONDS
    from .pacing import AUDIO_RT_PRIORITY, Pacer
    from .pcm import StreamingConverter, float_to_pcm16
    from .speaker import NullSink

__all__ = names(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
