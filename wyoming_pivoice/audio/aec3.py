"""WebRTC's AEC3 with its own linear filter's output (native/aec3: `pivoice_aec3`, built from
the webrtc-audio-processing 1.3 source in webrtc-noise-gain's sdist; see its build.sh).

The linear output is the microphone less AEC3's adaptive filter's estimate of the echo, taken
before AEC3's residual-echo suppressor: a voice that starts over a loud reply passes it at its
own level, where the suppressor takes it apart for 300-500 ms (docs/room.md, sessions 13-15).
One AEC3 gives both outputs, in place of livekit's APM (echo.py, EchoSettings.linear_filter
"aec3"; off by default). Measured (session 15): its linear filter does not track ±100 ppm of
drift either (6-10 dB where SpeexDSP's MDF has 3-9), nor an echo delay that moves between
replies (3-6 dB): AEC3 re-finds the delay in whole 4 ms blocks, the filter re-adapts within.
Where the extension is not installed, constructing `Aec3` raises ImportError.

Unlike livekit's APM it takes AEC3's config (`config`: EchoCanceller3Config fields by their
dotted path, pivoice_aec3.CONFIG_FIELDS), so the lab can tune the residual-echo suppressor
(its dominant-nearend detection and tunings); EchoSettings.canceller "aec3" runs it in place
of livekit's with no linear rule (off by default; docs/room.md, session 15 aec3sup).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# AEC3's linear filters' length in 4 ms blocks after the delay it estimates (0: AEC3's 13).
FILTER_BLOCKS = 0
# EchoCanceller3Config fields set on every AEC3 made here (the lab's knobs; {}: AEC3's defaults).
CONFIG: dict[str, float | int | bool] = {}


class Aec3:
    """One APM with AEC3 (noise suppression and gain control off): 16 kHz mono, 10 ms frames.
    `frame` takes one render frame and the capture frame of the same instant and returns
    (echo-cancelled, linear output), int16."""

    def __init__(
        self,
        high_pass_filter: bool,
        linear_output: bool = True,
        filter_blocks: int | None = None,
        config: dict[str, float | int | bool] | None = None,
    ) -> None:
        import pivoice_aec3

        blocks = FILTER_BLOCKS if filter_blocks is None else filter_blocks
        self._aec: Any = pivoice_aec3.Aec3(
            high_pass_filter=high_pass_filter,
            linear_output=linear_output,
            filter_blocks=blocks,
            config=dict(CONFIG if config is None else config),
        )

    def frame(self, render: bytes, near: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        self._aec.process_reverse(np.frombuffer(render, dtype=np.int16))
        self._aec.set_stream_delay_ms(0)
        out, linear = self._aec.process(np.ascontiguousarray(near, dtype=np.int16))
        return out, linear

    def statistics(self) -> dict[str, float | None]:
        """AEC3's own ERL, ERLE (dB) and delay (ms) estimates."""
        return dict(self._aec.statistics())
