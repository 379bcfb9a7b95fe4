"""Silero VAD on onnxruntime (no torch), chunk by chunk with its recurrent state carried."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..audio.format import CHUNK_SAMPLES, RATE
from ..models import silero_vad_onnx
from .protocols import EngineDescription

CONTEXT_SAMPLES = 64  # Silero v5+ sees the previous chunk's last 64 samples


class SileroVad:
    """Speech probability for each 512-sample chunk of 16 kHz mono float32 audio.

    Two ONNX layouts exist: the silero-vad package's (`input`, `state`, `sr`) and
    the one faster-whisper ships (`input` of 576 samples, `h`, `c`). Both carry
    recurrent state and a 64-sample context between calls, which we keep here.
    """

    def __init__(self, model_path: Path | None = None) -> None:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        # One thread: a 32 ms chunk is tiny and the cores belong to ASR and the LLM.
        options.inter_op_num_threads = 1
        options.intra_op_num_threads = 1
        self.model_path = model_path or silero_vad_onnx()
        self.session = onnxruntime.InferenceSession(
            str(self.model_path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        inputs = {i.name for i in self.session.get_inputs()}
        self._split_state = "h" in inputs  # faster-whisper's layout
        self.reset()

    @classmethod
    def describe(cls, _settings: object = None) -> EngineDescription:
        return EngineDescription(
            kind="vad",
            engine="onnxruntime",
            model="silero-vad",
            languages=(),
            attribution="Silero Team",
            url="https://github.com/snakers4/silero-vad",
        )

    def reset(self) -> None:
        self._context = np.zeros(CONTEXT_SAMPLES, dtype=np.float32)
        if self._split_state:
            self._h = np.zeros((1, 1, 128), dtype=np.float32)
            self._c = np.zeros((1, 1, 128), dtype=np.float32)
        else:
            self._state = np.zeros((2, 1, 128), dtype=np.float32)

    def probability(self, chunk: np.ndarray) -> float:
        if chunk.shape != (CHUNK_SAMPLES,):
            raise ValueError(f"Silero VAD takes {CHUNK_SAMPLES} samples, got {chunk.shape}")
        window = np.concatenate([self._context, chunk.astype(np.float32, copy=False)])
        self._context = window[-CONTEXT_SAMPLES:]
        if self._split_state:
            probs, self._h, self._c = self.session.run(
                None, {"input": window[np.newaxis, :], "h": self._h, "c": self._c}
            )
        else:
            probs, self._state = self.session.run(
                None,
                {
                    "input": window[np.newaxis, :],
                    "state": self._state,
                    "sr": np.array(RATE, dtype=np.int64),
                },
            )
        return float(np.asarray(probs).reshape(-1)[0])


# How old Silero's recurrent state may grow (32 ms chunks: 0.5 s). Carried through a reply,
# the state has read AEC3's output for seconds (its suppressed echo, the leaks) and then
# reads a voice at the echo's level, which the suppressor takes apart, as not speech for
# hundreds of ms. Offline (lab room.offline, 5 rooms, 180 voices over a reply; session 21)
# the same AEC3 output read by a state at most 0.5 s old decided 146/180 within 300 ms of the
# onset instead of 133/180, and no barge-in on the echo alone; live it reads AEC3's leaks as
# speech too, which the turn policy's residual test must keep out (VadSettings.state_span).
STATE_SPAN_CHUNKS = 16


class RecentSileroVad:
    """Silero whose recurrent state is never older than `span` chunks: two states run side by
    side, each started afresh every `span` chunks, half a span apart, and the one with the
    longer history (half a span to a span) answers. Costs two Silero runs a chunk."""

    def __init__(self, model_path: Path | None = None, span: int = STATE_SPAN_CHUNKS) -> None:
        if span < 2:
            raise ValueError(f"the state's span must be at least 2 chunks, got {span}")
        first = SileroVad(model_path)
        self.model_path = first.model_path
        self._vads = (first, SileroVad(first.model_path))
        self.span = span
        self._count = 0  # chunks since reset()

    describe = SileroVad.describe

    def reset(self) -> None:
        for vad in self._vads:
            vad.reset()
        self._count = 0

    def probability(self, chunk: np.ndarray) -> float:
        half = self.span // 2
        # Chunks each state has read since it last started afresh.
        ages = (self._count % self.span, (self._count + half) % self.span)
        probabilities = [vad.probability(chunk) for vad in self._vads]
        self._count += 1
        for vad, age in zip(self._vads, ages, strict=True):
            if age + 1 == self.span:
                vad.reset()
        return probabilities[0 if ages[0] >= ages[1] else 1]


def silero_vad(state_span: int) -> SileroVad | RecentSileroVad:
    """The satellite endpointer's VAD (VadSettings.state_span): Silero with its state carried
    through the stream (0), or never older than `state_span` chunks."""
    return RecentSileroVad(span=state_span) if state_span else SileroVad()
