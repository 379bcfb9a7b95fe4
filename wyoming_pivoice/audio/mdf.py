"""SpeexDSP's MDF echo canceller (libspeexdsp, Xiph, BSD) through ctypes: its *linear* output.

AEC3's output is what the VAD, the endpointer and STT get; but AEC3's residual suppression
takes a voice that starts under a loud echo down with the echo (docs/room.md, session 13:
the voice at −26…−34 dBFS in the microphone, AEC3's output over it −56…−61 dBFS, Silero on
it 0.00-0.01 for ~450 ms). `speex_echo_cancellation` is the adaptive filter alone (the
residual suppression lives in Speex's preprocessor, which is not used here): the microphone
less the filter's estimate of the echo, so the user's voice passes at its own level. With
EchoSettings.linear_barge_in the turn policy weighs it beside AEC3's (echo.py, turn_policy.py)
for barge-in only; off by default: it follows neither clock drift nor an echo delay that
moves between replies (docs/room.md, session 14).

The library is Debian's `libspeexdsp1` (the C API has not changed since 1.2). Where it cannot
be loaded `Mdf.load` raises OSError and the canceller goes on without it (the old rule).
"""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np

SPEEX_ECHO_SET_SAMPLING_RATE = 24
_LIBRARY_NAMES = ("libspeexdsp.so.1", "libspeexdsp.so", "libspeexdsp.dylib")
_lib: ctypes.CDLL | None = None


def _library() -> ctypes.CDLL:
    global _lib
    if _lib is not None:
        return _lib
    names = [ctypes.util.find_library("speexdsp"), *_LIBRARY_NAMES]
    errors = []
    for name in filter(None, names):
        try:
            lib = ctypes.CDLL(name)
        except OSError as err:
            errors.append(str(err))
            continue
        lib.speex_echo_state_init.restype = ctypes.c_void_p
        lib.speex_echo_state_init.argtypes = [ctypes.c_int, ctypes.c_int]
        lib.speex_echo_state_destroy.restype = None
        lib.speex_echo_state_destroy.argtypes = [ctypes.c_void_p]
        lib.speex_echo_ctl.restype = ctypes.c_int
        lib.speex_echo_ctl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        lib.speex_echo_cancellation.restype = None
        lib.speex_echo_cancellation.argtypes = [ctypes.c_void_p] + [ctypes.c_void_p] * 3
        _lib = lib
        return lib
    raise OSError("libspeexdsp cannot be loaded: " + "; ".join(errors or ["not found"]))


class Mdf:
    """One Speex echo state: frames of `frame` samples at `rate`, a filter `tail` samples
    long (it must span the echo path's delay and the part of the room's tail to remove)."""

    def __init__(self, frame: int, tail: int, rate: int) -> None:
        self._state: int | None = None
        lib = _library()
        state = lib.speex_echo_state_init(frame, tail)
        if not state:
            raise OSError("speex_echo_state_init failed")
        self._lib, self._state, self.frame = lib, int(state), frame
        value = ctypes.c_int(rate)
        lib.speex_echo_ctl(state, SPEEX_ECHO_SET_SAMPLING_RATE, ctypes.byref(value))
        self._out = np.zeros(frame, dtype=np.int16)

    def process(self, near: np.ndarray, far: np.ndarray) -> np.ndarray:
        """One frame: the microphone `near` less the filter's estimate of the echo of `far`
        (both int16, `frame` samples). The returned array is reused by the next call."""
        near = np.ascontiguousarray(near, dtype=np.int16)
        far = np.ascontiguousarray(far, dtype=np.int16)
        self._lib.speex_echo_cancellation(
            self._state, near.ctypes.data, far.ctypes.data, self._out.ctypes.data
        )
        return self._out

    def close(self) -> None:
        if self._state:
            self._lib.speex_echo_state_destroy(self._state)
            self._state = None

    def __del__(self) -> None:
        self.close()
