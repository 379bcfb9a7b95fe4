"""The bench corpus: short home commands and questions, spoken by espeak-ng and Piper.

Every utterance is 16 kHz 16-bit mono with silence before and after, so a VAD
sees a clean start and a real end. The corpus is cached in a folder with a
manifest; it is rebuilt only when the texts or the padding change.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import wave
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..audio import float_to_pcm16

RATE = 16000
PAD_BEFORE_S = 0.5
PAD_AFTER_S = 0.8  # past the 300 ms silence window; the bench mic feeds silence after it anyway
VOICED_DBFS = -35.0  # a 10 ms frame louder than this counts as voiced when we mark speech edges


@dataclass(frozen=True)
class Line:
    id: str
    text: str
    voice: str  # "espeak:<voice>" or "piper"
    kind: str  # "command" or "question"
    words: tuple[str, ...]  # words the transcript must contain (lower case) to count as heard


LINES: tuple[Line, ...] = (
    Line("kitchen", "Turn on the kitchen lights.", "espeak:en-us", "command", ("kitchen", "light")),
    Line("time", "What time is it right now?", "piper", "question", ("time",)),
    Line("timer", "Set a timer for ten minutes.", "piper", "command", ("timer", "minutes")),
    Line("weather", "What is the weather like today?", "piper", "question", ("weather",)),
    Line(
        "living",
        "Turn off all the lights in the living room please.",
        "espeak:en-us",
        "command",
        ("lights", "living"),
    ),
    Line(
        "leap",
        "How many days are there in a leap year?",
        "espeak:en-us",
        "question",
        ("days", "year"),
    ),
    Line(
        "music",
        "Play some relaxing music in the bedroom.",
        "piper",
        "command",
        ("music", "bedroom"),
    ),
    Line("joke", "Can you tell me a short joke?", "piper", "question", ("joke",)),
    Line(
        "door",
        "Lock the front door and close the garage.",
        "espeak:en-us",
        "command",
        ("door", "garage"),
    ),
    Line(
        "france", "What is the capital city of France?", "piper", "question", ("capital", "france")
    ),
    Line(
        "thermostat",
        "Set the thermostat to twenty one degrees and turn on the fan in the office.",
        "espeak:en-us",
        "command",
        ("thermostat", "fan"),
    ),
    Line(
        "milk",
        "Remind me to buy milk, eggs and bread when I get home this evening.",
        "piper",
        "command",
        ("milk", "bread"),
    ),
    Line("sky", "Why is the sky blue?", "espeak:en-us", "question", ("sky", "blue")),
    Line(
        "hallway",
        "Dim the hallway lights to thirty percent.",
        "piper",
        "command",
        ("hallway", "light"),
    ),
)


@dataclass(frozen=True)
class Utterance:
    id: str
    text: str
    voice: str
    kind: str
    words: tuple[str, ...]
    path: str
    duration_s: float  # whole file, silence included
    speech_start_s: float  # first voiced 10 ms frame
    speech_end_s: float  # end of the last voiced 10 ms frame

    @property
    def speech_s(self) -> float:
        return self.speech_end_s - self.speech_start_s

    def samples(self) -> np.ndarray:
        """The whole file as float32 in [-1, 1]."""
        return read_wav_float(Path(self.path))

    def pcm(self) -> bytes:
        """The utterance as 16-bit PCM, as a microphone gives it."""
        return float_to_pcm16(self.samples())

    def heard(self, transcript: str) -> bool:
        """True when the transcript has every key word (a loose check of the ASR, not a WER)."""
        lowered = transcript.lower()
        return all(word in lowered for word in self.words)


def read_wav_float(path: Path) -> np.ndarray:
    with wave.open(str(path), "rb") as wav:
        if wav.getframerate() != RATE or wav.getsampwidth() != 2 or wav.getnchannels() != 1:
            raise ValueError(f"{path} is not 16 kHz 16-bit mono")
        pcm = wav.readframes(wav.getnframes())
    return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0


def speech_edges(samples: np.ndarray, rate: int = RATE) -> tuple[float, float]:
    """(start, end) in seconds of the span of 10 ms frames above VOICED_DBFS."""
    frame = rate // 100
    count = samples.size // frame
    if count == 0:
        return 0.0, 0.0
    frames = samples[: count * frame].reshape(count, frame)
    rms = np.sqrt(np.mean(frames.astype(np.float64) ** 2, axis=1)) + 1e-12
    voiced = np.flatnonzero(20 * np.log10(rms) > VOICED_DBFS)
    if voiced.size == 0:
        return 0.0, 0.0
    return voiced[0] * frame / rate, (voiced[-1] + 1) * frame / rate


def _fingerprint(lines: tuple[Line, ...]) -> str:
    blob = json.dumps([[asdict(line) for line in lines], PAD_BEFORE_S, PAD_AFTER_S, RATE, 2])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def build(
    folder: Path, limit: int | None = None, lines: tuple[Line, ...] = LINES
) -> list[Utterance]:
    """Make (or reuse) the corpus WAVs in `folder`; the first `limit` lines if given."""
    chosen = lines[:limit] if limit else lines
    folder.mkdir(parents=True, exist_ok=True)
    manifest_path = folder / "manifest.json"
    fingerprint = _fingerprint(chosen)
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("fingerprint") == fingerprint and all(
            Path(item["path"]).is_file() for item in manifest["utterances"]
        ):
            return [_utterance(item) for item in manifest["utterances"]]

    raw: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="pivoice-corpus-") as tmp:
        piper_jobs = []
        for line in chosen:
            out = Path(tmp) / f"{line.id}.raw.wav"
            raw[line.id] = out
            if line.voice == "piper":
                piper_jobs.append({"text": line.text, "path": str(out)})
            else:
                espeak_voice = line.voice.split(":", 1)[1]
                subprocess.run(
                    ["espeak-ng", "-v", espeak_voice, "-s", "150", "-w", str(out), line.text],
                    check=True,
                )
        if piper_jobs:
            _piper_in_subprocess(piper_jobs)
        utterances = []
        for line in chosen:
            path = folder / f"{line.id}.wav"
            subprocess.run(
                [
                    "sox",
                    "-V1",
                    "-G",
                    str(raw[line.id]),
                    "-r",
                    str(RATE),
                    "-c",
                    "1",
                    "-b",
                    "16",
                    str(path),
                    "pad",
                    str(PAD_BEFORE_S),
                    str(PAD_AFTER_S),
                ],
                check=True,
            )
            samples = read_wav_float(path)
            start, end = speech_edges(samples)
            utterances.append(
                Utterance(
                    id=line.id,
                    text=line.text,
                    voice=line.voice,
                    kind=line.kind,
                    words=line.words,
                    path=str(path),
                    duration_s=samples.size / RATE,
                    speech_start_s=start,
                    speech_end_s=end,
                )
            )
    manifest_path.write_text(
        json.dumps(
            {"fingerprint": fingerprint, "utterances": [asdict(u) for u in utterances]}, indent=1
        )
    )
    return utterances


def _utterance(item: dict) -> Utterance:
    return Utterance(**{**item, "words": tuple(item["words"])})


def _piper_in_subprocess(jobs: list[dict]) -> None:
    """Speak with Piper in a child process, so the bench process never holds the voice
    (its peak RSS is reported as the satellite's)."""
    subprocess.run(
        [
            sys.executable,
            "-c",
            "from wyoming_pivoice.bench.corpus import _piper_main; _piper_main()",
        ],
        input=json.dumps(jobs).encode(),
        check=True,
    )


def _piper_main() -> None:
    from ..engines.tts import PiperTts, TtsSettings

    tts = PiperTts(TtsSettings())
    for job in json.load(sys.stdin):
        pcm = tts.synthesize(job["text"])
        with wave.open(job["path"], "wb") as wav:
            wav.setframerate(tts.sample_rate)
            wav.setsampwidth(2)
            wav.setnchannels(1)
            wav.writeframes(pcm)
