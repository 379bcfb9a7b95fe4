"""livekit's AudioProcessingModule (WebRTC's APM, AEC3) one 10 ms frame at a time, on the
capture path's clock.

Through livekit's public API each frame costs two AudioFrames, three protobuf requests built
and serialised, three responses parsed and three handles dropped: ~43 µs of a frame's ~130 µs
here, paid on the audio thread while a chunk waits for the VAD (issue 20: the capture path
adds ≤ 10 ms, 8 of them AEC3's 10 ms frames against Silero's 32 ms chunks). The requests of
one APM never change — the same handle, the same two buffers, the same size and rate — so
they are serialised once with livekit's own protobuf classes and sent through livekit's own
FFI library, each frame written into the buffer the request points at. Only a response that
differs from the first frame's is parsed (for its error). Where livekit's internals are not
the ones this was written against, the public API is used (one log line).
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

import numpy as np

from .format import FRAME, RATE

_LOGGER = logging.getLogger(__name__)

FRAME_BYTES = FRAME * 2


class LivekitApm:
    """livekit's APM frame by frame, as aec3.Aec3: `frame(render, near)` → (echo-cancelled
    int16, None); it has no linear output. ImportError/OSError when livekit cannot load."""

    def __init__(
        self,
        echo_cancellation: bool,
        noise_suppression: bool = False,
        high_pass_filter: bool = False,
        auto_gain_control: bool = False,
    ) -> None:
        from livekit import rtc

        self._apm = rtc.AudioProcessingModule(
            echo_cancellation=echo_cancellation,
            noise_suppression=noise_suppression,
            high_pass_filter=high_pass_filter,
            auto_gain_control=auto_gain_control,
        )
        self._delay = echo_cancellation
        self._render = bytearray(FRAME_BYTES)
        self._capture = bytearray(FRAME_BYTES)
        # Views held for the APM's life: a bytearray with a view cannot be resized, so the
        # buffers the requests point at never move, and a frame of another size is an error.
        self._render_view = memoryview(self._render)
        self._near = np.frombuffer(self._capture, dtype=np.int16)  # written in place
        self._fast: _Requests | None = None  # points at the two buffers, which outlive it
        try:
            self._fast = _Requests(self._apm, self._render, self._capture, self._delay)
        except Exception as err:  # livekit's internals moved: its public API, a little slower
            _LOGGER.info("livekit's APM through its public API (%s)", err)

    def frame(self, render: bytes, near: np.ndarray) -> tuple[np.ndarray, None]:
        self._render_view[:] = render
        self._near[:] = near
        if self._fast is not None:
            self._fast.frame()
        else:
            self._public_frame()
        return self._near.copy(), None

    def _public_frame(self) -> None:
        from livekit.rtc import AudioFrame

        self._apm.process_reverse_stream(AudioFrame(self._render, RATE, 1, FRAME))
        if self._delay:
            self._apm.set_stream_delay_ms(0)
        capture = AudioFrame(self._capture, RATE, 1, FRAME)  # processed in place
        self._apm.process_stream(capture)


class _Requests:
    """The three requests of one APM's frame, serialised once (see the module)."""

    def __init__(self, apm: Any, render: bytearray, capture: bytearray, delay: bool) -> None:
        from livekit.rtc._ffi_client import FfiClient
        from livekit.rtc._proto import ffi_pb2 as proto_ffi

        client = FfiClient.instance
        self._lib = client._ffi_lib
        self._proto = proto_ffi
        handle = apm._ffi_handle.handle

        def request(kind: str, buffer: bytearray | None = None, delay_ms: int = 0) -> bytes:
            req = proto_ffi.FfiRequest()
            body = getattr(req, kind)
            body.apm_handle = handle
            if buffer is None:
                body.delay_ms = delay_ms
            else:
                body.data_ptr = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
                body.size = len(buffer)
                body.sample_rate = RATE
                body.num_channels = 1
            return req.SerializeToString()

        steps = [("apm_process_reverse_stream", request("apm_process_reverse_stream", render))]
        if delay:  # AEC3 is told the delay before every capture frame, as the public API does
            steps.append(("apm_set_stream_delay", request("apm_set_stream_delay")))
        steps.append(("apm_process_stream", request("apm_process_stream", capture)))
        self._requests = [data for _, data in steps]  # the pointers below point into these
        self._calls = [(self._pointer(data), len(data), kind) for kind, data in steps]
        self._ok: dict[str, bytes] = {}
        # The response's pointer and length, written by every call: made once.
        self._out = ctypes.POINTER(ctypes.c_ubyte)()
        self._out_len = ctypes.c_size_t()
        self._out_refs = (ctypes.byref(self._out), ctypes.byref(self._out_len))

    @staticmethod
    def _pointer(data: bytes) -> Any:
        return ctypes.cast(ctypes.c_char_p(data), ctypes.POINTER(ctypes.c_ubyte))

    def frame(self) -> None:
        lib, out, out_len = self._lib, self._out, self._out_len
        out_ref, len_ref = self._out_refs
        for pointer, size, kind in self._calls:
            handle = lib.livekit_ffi_request(pointer, size, out_ref, len_ref)
            response = ctypes.string_at(out, out_len.value)
            lib.livekit_ffi_drop_handle(handle)
            if self._ok.get(kind) != response:
                self._check(kind, response)

    def _check(self, kind: str, response: bytes) -> None:
        parsed = self._proto.FfiResponse()
        parsed.ParseFromString(response)
        error = getattr(parsed, kind).error
        if error:
            raise RuntimeError(error)
        self._ok.setdefault(kind, response)
