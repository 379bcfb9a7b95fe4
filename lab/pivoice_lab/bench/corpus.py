"""The bench corpus: short home commands and questions, spoken by espeak-ng and Piper.

Every utterance is 16 kHz 16-bit mono with silence before and after, so a VAD
sees a clean start and a real end. The corpus is cached in a folder with a
manifest; it is rebuilt only when the texts or the padding change.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import wave
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from wyoming_pivoice.audio import float_to_pcm16

RATE = 16000
PAD_BEFORE_S = 0.5
PAD_AFTER_S = 0.8  # past the 300 ms silence window; the bench mic feeds silence after it anyway
VOICED_DBFS = -35.0  # a 10 ms frame louder than this counts as voiced when we mark speech edges


@dataclass(frozen=True)
class Line:
    id: str
    text: str
    voice: str  # "espeak:<voice>[:<words per minute>]", "piper" or "human:<file>"
    kind: str  # "command" or "question"
    words: tuple[str, ...]  # words the transcript must contain (lower case) to count as heard
    tempo: float = 1.0  # sox tempo (speed without pitch change) after synthesis


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


def _household() -> tuple[Line, ...]:
    """The WER corpus: what a household says to a voice assistant, in rotating voices.

    Each text is spoken by one of VOICES in turn (espeak-ng's American, British, Scottish
    and Caribbean English, a female variant, three speeds, sox tempo on two), so every voice
    meets every kind of sentence; the last line is a real person (CMU ARCTIC).
    """
    lines = []
    for index, (ident, text) in enumerate(HOUSEHOLD_TEXTS):
        voice, tempo = VOICES[index % len(VOICES)]
        kind = "question" if text.endswith("?") else "command"
        lines.append(Line(ident, text, voice, kind, (), tempo))
    lines.append(Line("arctic", ARCTIC_TEXT, f"human:{ARCTIC_WAV}", "statement", ()))
    return tuple(lines)


# (voice, sox tempo): espeak-ng voices ship with espeak-ng itself (no mbrola).
VOICES: tuple[tuple[str, float], ...] = (
    ("espeak:en-us:150", 1.0),
    ("espeak:en-gb:165", 1.0),
    ("espeak:en-us+f3:175", 1.0),
    ("espeak:en-gb-scotland:150", 1.0),
    ("espeak:en-us:130", 1.15),  # slow voice, sped up by sox: a different timbre and rhythm
    ("espeak:en-029:160", 1.0),
    ("espeak:en-gb-x-rp+m3:185", 1.0),
    ("espeak:en-us+f2:150", 0.9),
)

HOUSEHOLD_TEXTS: tuple[tuple[str, str], ...] = (
    ("lock_front", "Lock the front door."),
    ("unlock_back", "Unlock the back door."),
    ("garage_closed", "Is the garage door closed?"),
    ("lock_all", "Lock all the doors and turn off the lights."),
    ("thermo_21", "Set the thermostat to twenty one degrees."),
    ("heat_up", "Turn the heating up by two degrees."),
    ("bedroom_temp", "What is the temperature in the bedroom?"),
    ("living_19", "Set the living room to nineteen degrees at ten tonight."),
    ("timer_10", "Set a timer for ten minutes."),
    ("timer_75", "Set a timer for one hour and fifteen minutes."),
    ("pasta_left", "How much time is left on the pasta timer?"),
    ("egg_cancel", "Cancel the egg timer."),
    ("list_milk", "Add milk to the shopping list."),
    ("list_three", "Add eggs, bread and butter to my shopping list."),
    ("list_what", "What is on my shopping list?"),
    ("list_remove", "Remove bananas from the grocery list."),
    ("kitchen_on", "Turn on the kitchen lights."),
    ("living_off", "Turn off all the lights in the living room please."),
    ("hall_dim", "Dim the hallway lights to thirty percent."),
    ("office_fan", "Switch on the fan in the office."),
    ("call_sarah", "Call Sarah on her mobile."),
    ("text_david", "Send a message to David saying I will be late."),
    ("remind_grandma", "Remind me to call Grandma at six o'clock."),
    ("remind_trash", "Remind me to take out the trash on Tuesday."),
    ("weather", "What is the weather like today?"),
    ("rain", "Will it rain tomorrow morning?"),
    ("leap_is", "Is this a leap year?"),
    ("leap_days", "How many days are there in a leap year?"),
    ("times", "What is twelve times fifteen?"),
    ("sqrt", "What is the square root of one hundred and forty four?"),
    ("wake_730", "Wake me up at seven thirty tomorrow."),
    ("alarm_645", "Set an alarm for six forty five."),
    ("music", "Play some relaxing music in the bedroom."),
    ("pause", "Pause the music."),
    ("volume", "Turn the volume down to four."),
    ("next_song", "Play the next song."),
    ("blinds", "Open the blinds in the kitchen."),
    ("curtains", "Close the curtains in Emma's room."),
    ("vacuum", "Start the vacuum cleaner."),
    ("washing", "Is the washing machine finished?"),
    ("porch", "Turn on the porch light at sunset."),
    ("doorbell", "Did anyone ring the doorbell?"),
    ("camera", "Show me the front door camera."),
    ("time_now", "What time is it right now?"),
    ("date", "What is the date today?"),
    ("boil_egg", "How long does it take to boil an egg?"),
    ("joke", "Can you tell me a short joke?"),
    ("france", "What is the capital city of France?"),
    ("sky", "Why is the sky blue?"),
    ("tv_off", "Turn off the television in the den."),
    ("oven", "Set the oven to two hundred degrees."),
    ("coffee", "Turn on the coffee machine."),
    ("minutes", "How many minutes are in three hours?"),
    ("arm", "Arm the alarm system."),
    ("who_door", "Who is at the front door?"),
    ("mom", "Call Mom."),
    ("bath_fan", "Turn the bathroom fan off in twenty minutes."),
    ("fridge", "Is the fridge door open?"),
)

# CMU ARCTIC a0007 (speaker SLT), the recording pysptk's sdist carries: free for any use
# under CMU's notice (its COPYING). Fetched with pip, never committed.
ARCTIC_PACKAGE = "pysptk==1.0.1"
ARCTIC_WAV = "arctic_a0007.wav"
ARCTIC_TEXT = "And you always want to see it in the superlative degree."


def human_recording(name: str, cache: Path | None = None) -> Path:
    """A recording from the pysptk sdist on PyPI, downloaded once with pip into a cache."""
    cache = (
        cache
        or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        / "wyoming-pivoice"
        / "human"
    )
    target = cache / name
    if target.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pivoice-sdist-") as tmp:
        # --no-binary for pysptk alone: the sdist holds the audio, its build tools are wheels.
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                "pysptk",
                ARCTIC_PACKAGE,
                "-d",
                tmp,
            ],
            check=True,
        )
        (sdist,) = Path(tmp).glob("pysptk-*.tar.gz")
        with tarfile.open(sdist) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith(f"/{name}"))
            source = tar.extractfile(member)
            if source is None:
                raise FileNotFoundError(f"{name} is not a file in {sdist.name}")
            partial = target.with_suffix(".part")
            partial.write_bytes(source.read())
            partial.replace(target)
    return target


HOUSEHOLD: tuple[Line, ...] = _household()


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
    tempo: float = 1.0

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
            elif line.voice.startswith("human:"):
                raw[line.id] = human_recording(line.voice.split(":", 1)[1])
            else:
                _, espeak_voice, *speed = line.voice.split(":")
                subprocess.run(
                    [
                        "espeak-ng",
                        "-v",
                        espeak_voice,
                        "-s",
                        speed[0] if speed else "150",
                        "-w",
                        str(out),
                        line.text,
                    ],
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
                    *(["tempo", "-s", str(line.tempo)] if line.tempo != 1.0 else []),
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
                    tempo=line.tempo,
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
            "from pivoice_lab.bench.corpus import _piper_main; _piper_main()",
        ],
        input=json.dumps(jobs).encode(),
        check=True,
    )


def _piper_main() -> None:
    from wyoming_pivoice.engines import PiperTts, TtsSettings

    tts = PiperTts(TtsSettings())
    for job in json.load(sys.stdin):
        pcm = tts.synthesize(job["text"])
        with wave.open(job["path"], "wb") as wav:
            wav.setframerate(tts.sample_rate)
            wav.setsampwidth(2)
            wav.setnchannels(1)
            wav.writeframes(pcm)
