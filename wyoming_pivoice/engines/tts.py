"""Text to speech with Piper, in bounded pieces.

Piper's memory grows with the length of one inference (about 22 MiB of RSS per second of
speech here), and text without sentence ends is one inference: 4000 characters of "9 9 9 …"
passed 8 GB. So text is cut into pieces of at most `MAX_PIECE_PHONEMES` phonemes — at
sentence ends, else after a clause's punctuation, else at a word gap, else anywhere — and
each piece is one inference. Piper speaks a piece from its phonemes (its `[[ … ]]` raw
phoneme blocks), so the phonemes are computed once.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..memory import ShrinkingSession, trim
from ..models import ModelStore, cached_voice, local_voice, resolve_voice
from ..options import Addon, opt
from .protocols import EngineDescription

# One inference speaks at most this many phonemes: about 12 s of speech at the embedded
# voice's pace. A normal sentence is one piece; only a run-on text is cut inside a sentence.
MAX_PIECE_PHONEMES = 160
_CLAUSE_PHONEMES = set(",;:")


@dataclass(frozen=True)
class TtsSettings:
    voice: str = opt(
        "embedded",
        "--voice",
        help="'embedded' (en_US-joe-medium), a path to an .onnx voice, or a Piper voice name "
        "(zh_CN-huayan-medium …, rhasspy/piper-voices), downloaded once",
        addon=Addon("str"),
    )
    speaker: str | None = opt(  # a name from the voice's speaker map, or an id
        None,
        "--tts-speaker",
        help="speaker name or id of a multi-speaker voice",
        addon=Addon("str?"),
    )
    length_scale: float | None = opt(
        None,
        "--tts-length-scale",
        type=float,
        help="< 1 speaks faster",
        addon=Addon("float(0.2,4.0)?"),
    )
    voice_dirs: tuple[str, ...] = opt(
        (), "--voice-dir", append=True, help="folder to look for voices by name in (repeatable)"
    )
    # Keep onnxruntime's memory arena between runs: ≈ 13 % faster synthesis, but the
    # process grows by hundreds of MiB over varied sentences (see memory.py).
    keep_arena: bool = opt(
        False,
        "--tts-keep-arena",
        help="keep onnxruntime's memory arena between sentences: ≈ 13%% faster, "
        "but the server grows by hundreds of MiB over time",
    )
    spin_threads: bool = False  # True: onnxruntime's spinning pool (the bench's baseline)
    engine: str = "piper"  # its name in engines/registry.py
    store: ModelStore = field(default_factory=ModelStore)  # where named voices download to


class PiperTts:
    """Loads one Piper voice; `sentences` is blocking and must run in a worker thread."""

    sample_width = 2
    channels = 1

    def __init__(self, settings: TtsSettings) -> None:
        from piper import SynthesisConfig

        self.settings = settings
        self.model_path = resolve_voice(
            settings.voice, [Path(d) for d in settings.voice_dirs], settings.store
        )
        self.voice = _load_voice(self.model_path, settings.spin_threads)
        if not settings.keep_arena:
            self.voice.session = ShrinkingSession(self.voice.session)
        self._config_cls = SynthesisConfig
        config = json.loads(Path(f"{self.model_path}.json").read_text(encoding="utf-8"))
        self.language = (config.get("language") or {}).get("code", "en_US")
        self.speaker_ids: dict[str, int] = dict(config.get("speaker_id_map") or {})

    @property
    def name(self) -> str:
        return self.model_path.stem

    @classmethod
    def describe(cls, settings: TtsSettings) -> EngineDescription:
        """From the voice's .onnx.json if it is here; a named voice not downloaded yet is
        described from its name (`zh_CN-huayan-medium`: zh_CN, 22050 Hz as every medium voice)."""
        dirs = [Path(d) for d in settings.voice_dirs]
        path = local_voice(settings.voice, dirs) or cached_voice(settings.voice, settings.store)
        if path is None:
            name = Path(settings.voice.rpartition(":")[2]).name.removesuffix(".onnx")
            language = name.split("-")[0]
            return EngineDescription(
                kind="tts",
                engine="piper",
                model=name,
                languages=(language,),
                attribution="rhasspy",
                url="https://github.com/OHF-Voice/piper1-gpl",
                description=f"Piper {name}",
                sample_rate=16000 if name.endswith(("-x_low", "-low")) else 22050,
            )
        config = json.loads(Path(f"{path}.json").read_text(encoding="utf-8"))
        language = (config.get("language") or {}).get("code") or config.get("espeak", {}).get(
            "voice", "en"
        )
        return EngineDescription(
            kind="tts",
            engine="piper",
            model=path.stem,
            languages=(language,),
            attribution="rhasspy",
            url="https://github.com/OHF-Voice/piper1-gpl",
            description=f"Piper {path.stem}",
            version=config.get("piper_version"),  # the Piper release it was trained with
            speakers=tuple((config.get("speaker_id_map") or {}).keys()),
            sample_rate=int(config["audio"]["sample_rate"]),
        )

    @property
    def sample_rate(self) -> int:
        return int(self.voice.config.sample_rate)

    def speaker_id(self, speaker: str | None) -> int | None:
        speaker = speaker if speaker is not None else self.settings.speaker
        if speaker is None or not self.speaker_ids:
            return None
        if speaker in self.speaker_ids:
            return self.speaker_ids[speaker]
        if speaker.isdigit() and int(speaker) < len(self.speaker_ids):
            return int(speaker)
        raise ValueError(f"voice {self.name} has no speaker {speaker!r}")

    def pieces(self, text: str) -> list[str]:
        """`text` as phoneme strings of at most MAX_PIECE_PHONEMES each, in order."""
        pieces: list[str] = []
        for sentence in self.voice.phonemize(text):
            pieces.extend("".join(p).strip() for p in cut_phonemes(sentence, MAX_PIECE_PHONEMES))
        return [p for p in pieces if p]

    def speak(
        self, piece: str, speaker: str | None = None, cancel: threading.Event | None = None
    ) -> Iterator[bytes]:
        """16-bit mono PCM at `sample_rate` for one piece from `pieces` (one inference)."""
        config = self._config_cls(
            speaker_id=self.speaker_id(speaker), length_scale=self.settings.length_scale
        )
        try:
            for chunk in self.voice.synthesize(f"[[{piece}]]", syn_config=config):
                if cancel is not None and cancel.is_set():
                    return
                yield chunk.audio_int16_bytes
        finally:
            if not self.settings.keep_arena:
                trim()

    def sentences(
        self, text: str, speaker: str | None = None, cancel: threading.Event | None = None
    ) -> Iterator[bytes]:
        """Yield 16-bit mono PCM at `sample_rate`, one buffer per piece."""
        for piece in self.pieces(text):
            if cancel is not None and cancel.is_set():
                return
            yield from self.speak(piece, speaker, cancel)

    def warm_up(self) -> None:
        """One short sentence, so onnxruntime's first-run cost is paid at start."""
        self.synthesize("Ready.")

    def synthesize(self, text: str, speaker: str | None = None) -> bytes:
        return b"".join(self.sentences(text, speaker))


def _load_voice(path: Path, spin: bool) -> Any:
    """What `PiperVoice.load` does, with onnxruntime's idle threads sleeping instead of
    spinning: a spinning pool burns the cores the LLM decodes on beside it, and one preempted
    thread holds up the others. `bench --knobs --knob-parts tts --load 4`, see docs/room.md."""
    import onnxruntime
    from piper import PiperVoice
    from piper.config import PiperConfig

    options = onnxruntime.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    config = json.loads(Path(f"{path}.json").read_text(encoding="utf-8"))
    return PiperVoice(
        config=PiperConfig.from_dict(config),
        session=onnxruntime.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        ),
    )


def cut_phonemes(phonemes: list[str], limit: int) -> list[list[str]]:
    """Cut one sentence's phonemes into runs of at most `limit`: after the last clause
    punctuation in the window if there is one, else at its last word gap, else at `limit`."""
    runs: list[list[str]] = []
    rest = phonemes
    while len(rest) > limit:
        window = rest[:limit]
        cut = next(
            (i + 1 for i in range(limit - 1, limit // 3, -1) if window[i] in _CLAUSE_PHONEMES),
            None,
        )
        if cut is None:
            cut = next((i for i in range(limit - 1, 0, -1) if window[i] == " "), limit)
        runs.append(rest[:cut])
        rest = rest[cut:]
    runs.append(rest)
    return runs
