"""livekit's APM through pre-serialised requests (audio/apm.py) against its public API."""

from __future__ import annotations

import numpy as np
import pytest

from wyoming_pivoice.audio.apm import FRAME, LivekitApm

pytest.importorskip("livekit.rtc")


def _echo_scene(seconds: float = 4.0) -> tuple[np.ndarray, np.ndarray]:
    """A noise reference and its echo 40 ms later at −6 dB, plus a quiet floor."""
    rng = np.random.default_rng(7)
    n = int(seconds * 16000)
    ref = (rng.standard_normal(n) * 3000).clip(-32767, 32767)
    echo = np.zeros(n)
    echo[640:] = 0.5 * ref[:-640]
    mic = echo + rng.standard_normal(n) * 30
    return ref.astype(np.int16), mic.clip(-32767, 32767).astype(np.int16)


def test_the_fast_path_gives_the_public_apis_output_and_cancels() -> None:
    ref, mic = _echo_scene()
    fast = LivekitApm(echo_cancellation=True)
    public = LivekitApm(echo_cancellation=True)
    assert fast._fast is not None  # the internals this was written against
    public._fast = None
    outs: list[np.ndarray] = []
    for i in range(0, len(ref) - FRAME + 1, FRAME):
        render, near = ref[i : i + FRAME].tobytes(), mic[i : i + FRAME]
        a, _ = fast.frame(render, near)
        b, _ = public.frame(render, near)
        assert np.array_equal(a, b)
        outs.append(a)
    out = np.concatenate(outs).astype(np.float64)
    tail = slice(len(out) // 2, None)  # converged
    mic_tail = mic[tail].astype(np.float64)
    erle = 10 * np.log10((mic_tail @ mic_tail) / max(out[tail] @ out[tail], 1.0))
    assert erle > 20


def test_an_error_response_is_raised() -> None:
    apm = LivekitApm(echo_cancellation=True)
    fast = apm._fast
    assert fast is not None
    response = fast._proto.FfiResponse()
    response.apm_process_stream.error = "bad frame"
    with pytest.raises(RuntimeError, match="bad frame"):
        fast._check("apm_process_stream", response.SerializeToString())


def test_a_frame_of_another_size_is_refused_and_the_buffers_stay() -> None:
    apm = LivekitApm(echo_cancellation=True)
    near = np.zeros(FRAME, dtype=np.int16)
    with pytest.raises(ValueError):
        apm.frame(bytes(2 * FRAME + 2), near)
    with pytest.raises(ValueError):
        apm.frame(bytes(2 * FRAME), np.zeros(FRAME + 1, dtype=np.int16))
    out, _ = apm.frame(bytes(2 * FRAME), near)
    assert len(out) == FRAME
