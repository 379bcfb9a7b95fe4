"""The models we suggest for a Raspberry Pi 5, by name: what `--llm-model`, `--voice` and
`--asr-model` take besides a path, what `doctor` and the add-on's option lists show.

Sizes are the files' sizes on the Hugging Face Hub; RAM is what the loaded model needs
(file + llama.cpp's 2048-token context cache, or the runtime's working set), rounded up;
speeds are published Pi 5 figures, each with its source (`speed_source`): we have no Pi 5
here, so none of them is our measurement (`bench` on a Pi gives yours). Any other Hub file
works too, as `owner/repo:file.gguf`; any Piper voice by its name; any faster-whisper name.
"""

from __future__ import annotations

from dataclasses import dataclass

SPECPICKS = "specpicks.com, 'Best SBC for local LLM inference: Pi 5 vs Pi 4' (2026), Pi 5 8 GB"
SEED_ZH = "the second source design: Pi 5 8 GB, Qwen2.5 0.5B/1.5B, whole-reply time"
SEED_EN = "the first source design: Pi 5 8 GB, phi-3-mini Q4_K_M, first token"
PIPER = "Piper's README (made for the Raspberry Pi 4); medium voices are 22.05 kHz, ~63 MB"
WHISPER = "the first source design: tiny.en 150-160 ms for 3-5 s of audio on a Pi 5"


@dataclass(frozen=True)
class CatalogueEntry:
    name: str  # what the user types
    stage: str  # "llm", "voice" or "asr"
    repo: str  # Hugging Face repository
    files: tuple[str, ...]  # inside it; the first is the model file
    size_mb: int
    ram_mb: int
    speed: str  # expected on a Pi 5, from `speed_source`
    speed_source: str
    licence: str
    languages: tuple[str, ...]
    note: str = ""
    revision: str = "main"

    @property
    def model_file(self) -> str:
        return self.files[0]


# Qwen2.5 answers in 29 languages (its model card); the list here is what we tested or
# what the household sections of docs/models.md use.
_QWEN_LANGUAGES = ("en", "zh", "ja", "ko", "de", "fr", "es", "it", "ru", "pt", "vi", "th", "ar")

LLMS = (
    CatalogueEntry(
        "qwen2.5-0.5b-instruct-q4_k_m",
        "llm",
        "bartowski/Qwen2.5-0.5B-Instruct-GGUF",
        ("Qwen2.5-0.5B-Instruct-Q4_K_M.gguf",),
        size_mb=398,
        ram_mb=520,
        speed="whole short reply ≈ 4.8 s",
        speed_source=SEED_ZH,
        licence="Apache-2.0",
        languages=_QWEN_LANGUAGES,
        note="the smallest model that answers household questions; Chinese and English",
    ),
    CatalogueEntry(
        "qwen2.5-1.5b-instruct-q4_k_m",
        "llm",
        "bartowski/Qwen2.5-1.5B-Instruct-GGUF",
        ("Qwen2.5-1.5B-Instruct-Q4_K_M.gguf",),
        size_mb=986,
        ram_mb=1200,
        speed="5-7 tokens/s (Qwen2 1.5B Q4); whole reply ≈ 8.3 s",
        speed_source=f"{SPECPICKS}; {SEED_ZH}",
        licence="Apache-2.0",
        languages=_QWEN_LANGUAGES,
        note="the suggested default for a Pi 5 with 4 GB or more",
    ),
    CatalogueEntry(
        "llama-3.2-1b-instruct-q4_k_m",
        "llm",
        "bartowski/Llama-3.2-1B-Instruct-GGUF",
        ("Llama-3.2-1B-Instruct-Q4_K_M.gguf",),
        size_mb=808,
        ram_mb=1000,
        speed="8-12 tokens/s (1.1B-class Q4)",
        speed_source=SPECPICKS,
        licence="Llama 3.2 Community License",
        languages=("en", "de", "fr", "it", "pt", "hi", "es", "th"),
    ),
    CatalogueEntry(
        "phi-3-mini-4k-instruct-q4",
        "llm",
        "microsoft/Phi-3-mini-4k-instruct-gguf",
        ("Phi-3-mini-4k-instruct-q4.gguf",),
        size_mb=2390,
        ram_mb=3200,
        speed="3-4 tokens/s; first token 200-300 ms",
        speed_source=f"{SPECPICKS}; {SEED_EN}",
        licence="MIT",
        languages=("en",),
        note="the first source design's model; best answers here, slowest",
    ),
)


def _piper(name: str, size_mb: int, licence: str, note: str = "") -> CatalogueEntry:
    return CatalogueEntry(
        name,
        "voice",
        PIPER_REPO,
        piper_files(name),
        size_mb=size_mb,
        ram_mb=size_mb + 90,
        speed="faster than real time",
        speed_source=PIPER,
        licence=licence,
        languages=(name.split("-")[0],),
        note=note,
    )


PIPER_REPO = "rhasspy/piper-voices"
_CARD = "per voice: its MODEL_CARD in rhasspy/piper-voices"


def piper_files(name: str) -> tuple[str, str]:
    """A Piper voice's files in rhasspy/piper-voices: `zh_CN-huayan-medium` lives in
    `zh/zh_CN/huayan/medium/` (wyoming-piper's names)."""
    parts = name.split("-")
    if len(parts) != 3 or "_" not in parts[0]:
        raise ValueError(f"{name!r} is not a Piper voice name like en_US-lessac-medium")
    locale, speaker, quality = parts
    folder = f"{locale.split('_')[0]}/{locale}/{speaker}/{quality}"
    return (f"{folder}/{name}.onnx", f"{folder}/{name}.onnx.json")


VOICES = (
    _piper("en_US-lessac-medium", 63, _CARD),
    _piper("en_GB-alan-medium", 63, _CARD),
    _piper("zh_CN-huayan-medium", 63, _CARD, "the second source design's voice"),
    _piper("de_DE-thorsten-medium", 63, _CARD),
)

WHISPERS = (
    CatalogueEntry(
        "tiny.en",
        "asr",
        "Systran/faster-whisper-tiny.en",
        ("model.bin",),
        size_mb=75,
        ram_mb=150,
        speed="150-160 ms for a 3-5 s command",
        speed_source=WHISPER,
        licence="MIT",
        languages=("en",),
        note="embedded",
    ),
    CatalogueEntry(
        "base",
        "asr",
        "Systran/faster-whisper-base",
        ("model.bin",),
        size_mb=145,
        ram_mb=300,
        speed="about twice tiny's time",
        speed_source="the first source design (quantized base: latency nearly doubles)",
        licence="MIT",
        languages=("multilingual",),
        note="multilingual: Chinese, Japanese, German …",
    ),
    CatalogueEntry(
        "small",
        "asr",
        "Systran/faster-whisper-small",
        ("model.bin",),
        size_mb=485,
        ram_mb=900,
        speed="several times base's",
        speed_source="Whisper's paper: small has 244 M parameters, base 74 M",
        licence="MIT",
        languages=("multilingual",),
    ),
)

ENTRIES = (*LLMS, *VOICES, *WHISPERS)


def find(stage: str, name: str) -> CatalogueEntry | None:
    return next((e for e in ENTRIES if e.stage == stage and e.name == name.lower()), None)


def names(stage: str) -> list[str]:
    return [e.name for e in ENTRIES if e.stage == stage]


# The reply style the server asks for, in the pipeline's language (--language). The model
# answers in the language it is spoken to, but a prompt in that language keeps it there.
SYSTEM_PROMPTS = {
    "en": (
        "You are a helpful voice assistant running on a Raspberry Pi. "
        "Answer in one or two short spoken sentences, without lists or markup."
    ),
    "zh": "你是运行在树莓派上的语音助手。请用一两句简短的口语化中文回答，不要使用列表或标记。",
    "ja": (
        "あなたはラズベリーパイで動く音声アシスタントです。"
        "箇条書きや記号を使わず、短い話し言葉の一、二文で答えてください。"
    ),
    "de": (
        "Du bist ein hilfreicher Sprachassistent auf einem Raspberry Pi. "
        "Antworte in ein oder zwei kurzen gesprochenen Sätzen, ohne Listen oder Formatierung."
    ),
}

# A voice for a language when --language is given and --voice is not (embedded is English).
DEFAULT_VOICES = {"zh": "zh_CN-huayan-medium", "de": "de_DE-thorsten-medium"}
