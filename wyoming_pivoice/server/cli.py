"""`wyoming-pivoice server`: command-line options → ServerSettings."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..catalogue import DEFAULT_VOICES, SYSTEM_PROMPTS, names
from ..engines.asr import AsrSettings
from ..engines.llm import LlmSettings
from ..engines.remote_llm import FALLBACKS, RemoteLlmSettings
from ..engines.tts import TtsSettings
from ..models import EMBEDDED, ModelStore
from ..settings import DEFAULT_SERVER_URI, ServerSettings, ZeroconfSettings
from ..startup import server_uri
from .knowledge import KnowledgeSettings, default_index
from .limits import Limits


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "server",
        help="serve ASR, conversation and TTS over Wyoming",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--uri",
        type=server_uri,
        default=DEFAULT_SERVER_URI,
        help="tcp://HOST:PORT, unix://PATH or stdio://",
    )

    models = parser.add_argument_group("models by name and language")
    models.add_argument(
        "--language",
        default=None,
        help="the household's language (en, zh, ja, de …): ASR language, the voice's (if "
        "--voice is not given), the system prompt's (if --system-prompt is not given)",
    )
    models.add_argument(
        "--data-dir",
        default=os.environ.get("PIVOICE_DATA_DIR", ""),
        help="where models given by name are downloaded to, once ($PIVOICE_DATA_DIR; "
        "else $XDG_DATA_HOME/wyoming-pivoice; the add-on: /data)",
    )
    models.add_argument(
        "--model-fallback",
        choices=("none", "embedded"),
        default="none",
        help="embedded: a model that cannot be downloaded (offline …) is replaced by that "
        "stage's embedded model, with a warning, instead of failing the start",
    )

    asr = parser.add_argument_group("speech to text (faster-whisper)")
    asr.add_argument(
        "--asr-model",
        default=EMBEDDED,
        help="'embedded' (Whisper tiny.en), a CTranslate2 model folder, or a faster-whisper "
        f"name ({', '.join(names('asr'))} …), downloaded once",
    )
    asr.add_argument("--asr-compute-type", default="int8", help="int8, int8_float32, float32 …")
    asr.add_argument("--asr-beam-size", type=int, default=1)
    asr.add_argument(
        "--asr-language", default=None, help="language code, or 'auto' (default: --language, en)"
    )
    asr.add_argument("--asr-initial-prompt", default=None)
    asr.add_argument("--asr-threads", type=int, default=0, help="0: CTranslate2's default")
    asr.add_argument(
        "--asr-window",
        type=float,
        default=AsrSettings.window_s,
        help="shortest Whisper encoder window in seconds; it grows to fit longer speech. "
        "30: Whisper's fixed window (≈ 3× slower on short commands)",
    )

    tts = parser.add_argument_group("text to speech (piper)")
    tts.add_argument(
        "--voice",
        default=EMBEDDED,
        help="'embedded' (en_US-joe-medium), a path to an .onnx voice, or a Piper voice name "
        "(zh_CN-huayan-medium …, rhasspy/piper-voices), downloaded once",
    )
    tts.add_argument(
        "--voice-dir",
        action="append",
        default=[],
        help="folder to look for voices by name in (repeatable)",
    )
    tts.add_argument(
        "--tts-speaker", default=None, help="speaker name or id of a multi-speaker voice"
    )
    tts.add_argument("--tts-length-scale", type=float, default=None, help="< 1 speaks faster")
    tts.add_argument(
        "--tts-keep-arena",
        action="store_true",
        help="keep onnxruntime's memory arena between sentences: ≈ 13%% faster, "
        "but the server grows by hundreds of MiB over time",
    )

    llm = parser.add_argument_group("conversation (llama.cpp)")
    llm.add_argument(
        "--llm-model",
        default=EMBEDDED,
        help="'embedded' (SmolLM2-135M-Instruct Q4_1), a path to a .gguf file, a catalogue "
        f"name ({', '.join(names('llm'))}) or owner/repo:file.gguf on Hugging Face, "
        "downloaded once",
    )
    llm.add_argument("--llm-threads", type=int, default=0, help="0: all cores")
    llm.add_argument("--llm-context", type=int, default=2048)
    llm.add_argument(
        "--llm-language",
        action="append",
        default=None,
        help="language the model answers in (repeatable; default: --language, en)",
    )
    llm.add_argument("--max-tokens", type=int, default=256, help="cap on one reply")
    llm.add_argument(
        "--system-prompt", default=None, help="default: a short-answers prompt in --language"
    )
    llm.add_argument(
        "--llm-lazy",
        action="store_true",
        help="load the LLM on the first conversation turn instead of at start",
    )
    llm.add_argument(
        "--no-audio-first",
        action="store_true",
        help="let the LLM run on while Piper synthesizes (by default it waits: audio first)",
    )

    remote = parser.add_argument_group(
        "conversation on a bigger machine (an OpenAI-compatible engine: llama-server, Ollama, vLLM)"
    )
    remote.add_argument(
        "--llm-url",
        default=None,
        help="API base of the engine, e.g. http://192.168.1.20:8080/v1; the conversation runs "
        "there (ASR and TTS stay here)",
    )
    remote.add_argument(
        "--llm-api-key",
        default=None,
        help="its API key, if it wants one; else $PIVOICE_LLM_API_KEY (which keeps the key "
        "out of the process list)",
    )
    remote.add_argument(
        "--llm-remote-model", default=None, help="model to ask for; default: the first it lists"
    )
    remote.add_argument(
        "--llm-timeout",
        type=float,
        default=RemoteLlmSettings.timeout,
        help="seconds to connect, to the first piece of a reply, and between pieces with text",
    )
    remote.add_argument(
        "--llm-turn-timeout",
        type=float,
        default=RemoteLlmSettings.turn_timeout,
        help="seconds for a whole reply (a started one ends there, as at --max-tokens)",
    )
    remote.add_argument(
        "--llm-concurrency",
        type=int,
        default=RemoteLlmSettings.concurrency,
        help="turns sent to the engine at once; 0: from the engine (1 for llama-cpp-python's "
        "server, which ends a running reply when a new request comes; llama-server's slots)",
    )
    remote.add_argument(
        "--llm-fallback",
        choices=FALLBACKS,
        default="none",
        help="local: the local model (--llm-model) answers while the engine cannot",
    )

    knowledge = parser.add_argument_group("local knowledge (the household's notes)")
    knowledge.add_argument(
        "--knowledge",
        type=Path,
        default=None,
        metavar="DIR",
        help="a folder of .txt and .md notes; each turn's prompt gets the passages that match "
        "its words (docs/knowledge.md). Re-read when files change",
    )
    knowledge.add_argument(
        "--knowledge-index",
        type=Path,
        default=None,
        metavar="PATH",
        help="the notes' search index (SQLite); default: "
        "$XDG_DATA_HOME/wyoming-pivoice/knowledge-<hash of DIR>.sqlite3 (never inside DIR)",
    )
    knowledge.add_argument(
        "--knowledge-tokens",
        type=int,
        default=KnowledgeSettings.max_tokens,
        help="most prompt tokens the notes may take in one turn (the local model's count)",
    )

    limits = parser.add_argument_group("limits")
    limits.add_argument("--max-audio-seconds", type=float, default=Limits.max_audio_seconds)
    limits.add_argument("--max-text-chars", type=int, default=Limits.max_text_chars)
    limits.add_argument("--max-frame-bytes", type=int, default=Limits.max_frame_bytes)
    limits.add_argument(
        "--max-clients",
        type=int,
        default=Limits.max_clients,
        help="connections at once; when full, the longest-idle one without a request goes",
    )
    limits.add_argument("--max-clients-per-host", type=int, default=Limits.max_clients_per_host)
    limits.add_argument(
        "--idle-timeout",
        type=float,
        default=Limits.idle_timeout,
        help="close a connection this long after its last request (ping and describe do not count)",
    )
    limits.add_argument(
        "--frame-timeout",
        type=float,
        default=Limits.frame_timeout,
        help="a frame must be complete this long after its first byte",
    )
    limits.add_argument(
        "--request-timeout",
        type=float,
        default=Limits.request_timeout,
        help="a transcription's audio or a stream's text must be in within this time",
    )
    limits.add_argument(
        "--write-timeout",
        type=float,
        default=Limits.write_timeout,
        help="drop a client that takes none of its replies for this long",
    )

    parser.add_argument(
        "--compute-log",
        type=Path,
        default=None,
        metavar="PATH",
        help="append each model load and request's compute time here, as JSON lines "
        "(what `bench` reads)",
    )

    zeroconf = parser.add_argument_group("discovery")
    zeroconf.add_argument("--no-zeroconf", action="store_true", help="do not advertise over mDNS")
    zeroconf.add_argument("--zeroconf-name", default=None, help="default: pivoice-<hostname>")
    zeroconf.add_argument(
        "--zeroconf-host", default=None, help="address to advertise; default: detected"
    )
    parser.set_defaults(func=run)


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    pipeline = args.language or None
    asked = args.asr_language or pipeline or "en"
    language = None if asked in ("", "auto") else asked
    store = ModelStore(data_dir=args.data_dir, fallback_embedded=args.model_fallback == "embedded")
    base = (pipeline or "en").split("_")[0].split("-")[0]
    voice = args.voice
    if voice == EMBEDDED and base in DEFAULT_VOICES:
        voice = DEFAULT_VOICES[base]  # the embedded voice speaks English only
    system_prompt = args.system_prompt or SYSTEM_PROMPTS.get(base, SYSTEM_PROMPTS["en"])
    return ServerSettings(
        uri=args.uri,
        asr=AsrSettings(
            model=args.asr_model,
            compute_type=args.asr_compute_type,
            beam_size=args.asr_beam_size,
            language=language,
            initial_prompt=args.asr_initial_prompt,
            threads=args.asr_threads,
            window_s=args.asr_window,
            store=store,
        ),
        tts=TtsSettings(
            voice=voice,
            speaker=args.tts_speaker,
            length_scale=args.tts_length_scale,
            voice_dirs=tuple(args.voice_dir),
            keep_arena=args.tts_keep_arena,
            store=store,
        ),
        llm=LlmSettings(
            model=args.llm_model,
            threads=args.llm_threads,
            context=args.llm_context,
            max_tokens=args.max_tokens,
            system_prompt=system_prompt,
            store=store,
            languages=tuple(args.llm_language or [pipeline or "en"]),
        ),
        remote_llm=remote_llm_from_args(args),
        llm_lazy=args.llm_lazy,
        audio_first=not args.no_audio_first,
        language=pipeline,
        limits=Limits(
            max_audio_seconds=args.max_audio_seconds,
            max_text_chars=args.max_text_chars,
            max_frame_bytes=args.max_frame_bytes,
            max_clients=args.max_clients,
            max_clients_per_host=args.max_clients_per_host,
            idle_timeout=args.idle_timeout,
            frame_timeout=args.frame_timeout,
            request_timeout=args.request_timeout,
            write_timeout=args.write_timeout,
        ),
        zeroconf=ZeroconfSettings(
            enabled=not args.no_zeroconf, name=args.zeroconf_name, host=args.zeroconf_host
        ),
        knowledge=knowledge_from_args(args),
    )


def knowledge_from_args(args: argparse.Namespace) -> KnowledgeSettings | None:
    if args.knowledge is None:
        return None
    folder = args.knowledge.expanduser()
    return KnowledgeSettings(
        folder=folder,
        index=args.knowledge_index or default_index(folder),
        max_tokens=args.knowledge_tokens,
    )


def remote_llm_from_args(args: argparse.Namespace) -> RemoteLlmSettings | None:
    """The remote engine's settings from the server's (or doctor's) options, if --llm-url."""
    if not args.llm_url:
        return None
    return RemoteLlmSettings(
        url=args.llm_url,
        api_key=args.llm_api_key or os.environ.get("PIVOICE_LLM_API_KEY") or None,
        model=args.llm_remote_model or None,
        timeout=args.llm_timeout,
        fallback=getattr(args, "llm_fallback", "none"),
        turn_timeout=getattr(args, "llm_turn_timeout", RemoteLlmSettings.turn_timeout),
        concurrency=getattr(args, "llm_concurrency", RemoteLlmSettings.concurrency),
    )


def run(args: argparse.Namespace) -> int:
    from .. import compute_log, startup
    from .app import serve

    settings = settings_from_args(args)
    compute_log.open_log(args.compute_log)
    try:
        return startup.run(lambda: serve(settings))
    finally:
        compute_log.current().close()


def settings_from_argv(argv: list[str]) -> ServerSettings:
    """The settings `wyoming-pivoice server ARGV…` would run with (its parser, its checks);
    a host that starts a server (the lab's bench) reads them without knowing the parser."""
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    return settings_from_args(parser.parse_args(["server", *argv]))
