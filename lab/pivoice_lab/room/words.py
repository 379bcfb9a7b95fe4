"""What the satellite's utterance holds of words said over a reply, and what Whisper makes of it.

offline.py scores the barge-in decision; this follows the same scene further: the satellite's
own canceller, Silero VAD, fast barge-in and endpointer (EndpointLogic with the canceller's
evidence, as the audio core and the listener run them), the reply cut `CUT_S` after the
fast barge-in decides (the speaker stops playing, the canceller is told, as live), and the
utterance the endpointer hands over — its pre-roll from before the start decision and what
follows to the endpoint — transcribed by the server's Whisper (tiny.en, embedded) and scored
as the room bench scores it: every key word of the command in the transcript, and WER.

`today` is the utterance the satellite hands over (the endpointer's, with the audio core's
UtteranceAudio: the microphone as captured while the reply may be heard). The same span is
also cut from other signals, so where the words go can be told apart: `cleaned` (the
canceller's output throughout: the satellite before session 12), `raw` (the microphone as
captured throughout), `raw_echo` (the microphone while the reply may be heard, the
canceller's output elsewhere), `voice` (the user alone: what Whisper could do at best), and
`<signal>+N` (from N ms before the span: a longer pre-roll).

    python -m pivoice_lab.room.words --json /tmp/words.json

An offline score is a hypothesis; the live bench under load decides (docs/room.md).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from wyoming_pivoice.audio import (
    CHUNK_SAMPLES,
    Act,
    EchoCanceller,
    FastBargeIn,
    UtteranceAudio,
    float_to_pcm16,
)
from wyoming_pivoice.engines import RecentSileroVad, SileroVad, silero_vad
from wyoming_pivoice.satellite import (
    EchoSettings,
    Endpointer,
    EndpointKind,
    VadSettings,
    policy_from,
)

from .acoustics import RATE, RoomAcoustics
from .scene import two_replies

CUT_S = 0.04  # the live cut follows the decision by 30-60 ms (docs/room.md)


@dataclass(frozen=True)
class Take:
    """One command said over the second reply of a scene (offline.py's scene)."""

    room: RoomAcoustics
    onset_s: float | None = 1.0  # after the second reply starts; None: nobody speaks
    gain_db: float = 0.0  # against the echo's active level (a headset: HEADSET_DBFS)
    user: str = ""
    text: str = ""
    words: tuple[str, ...] = ()


@dataclass
class Utterance:
    """What the endpointer handed over, and the same span in the other signals."""

    take: dict
    started_after_s: float | None = None  # SPEECH_STARTED after the voice's onset
    decided_after_s: float | None = None  # the fast barge-in, after the onset (the reply is
    # cut CUT_S after it, or after SPEECH_STARTED when that comes first)
    reach_s: float | None = None  # the utterance's first sample after the onset (<0: before)
    self_made: int = 0  # utterances started with nobody speaking
    released: int = 0  # holds not followed by a barge-in (live the reply would play on)
    audio: dict[str, np.ndarray] = field(default_factory=dict)


def run_take(
    take: Take,
    reply: tuple[bytes, int],
    user: np.ndarray | None,
    vad: SileroVad | RecentSileroVad,
    vad_settings: VadSettings | None = None,
    echo_settings: EchoSettings | None = None,
    prerolls_ms: Iterable[int] = (300, 600),
    use_kept: bool = True,
) -> Utterance:
    """Two replies through `take.room`, `user` (16 kHz float) over the second at its onset;
    the satellite's chain chunk by chunk; the first utterance that starts over the second
    reply, cut from each signal."""
    two = two_replies(take.room, reply, user, take.onset_s, take.gain_db, after_s=3.0)
    second, out, mic, voice, onset = two.second, two.out, two.mic, two.voice, two.onset
    played, total = two.played, len(mic)
    response = take.room.impulse_response()
    canceller = EchoCanceller(echo_settings or EchoSettings())
    two.feed_reference(canceller)
    vad.reset()
    settings = vad_settings or VadSettings()
    logic = Endpointer(settings, vad).logic  # the endpointer's state machine alone
    fast = FastBargeIn(policy_from(settings))
    result = Utterance(asdict(take))
    cleaned: list[bytes] = []
    linear: list[bytes] = []  # the linear filter's output (no suppressor), where it runs
    echo_chunks: list[bool] = []
    span: tuple[int, int] | None = None
    sent = b""  # the utterance the satellite hands over
    kept = UtteranceAudio()
    cut = None
    for n in range(total // CHUNK_SAMPLES):
        lo, hi = n * CHUNK_SAMPLES, (n + 1) * CHUNK_SAMPLES
        now = hi / RATE
        if cut is not None and 0 < cut < hi:  # the speaker stopped here: so does its echo
            unplayed = out[cut : second + len(played)].copy()
            out[cut:] = 0.0
            echo = np.convolve(unplayed, response)[: total - cut].astype(np.float32)
            mic[cut : cut + len(echo)] -= echo
            canceller.cut(cut / RATE)
            cut = -1
        captured = float_to_pcm16(mic[lo:hi])
        chunk = canceller.process(captured, now)
        cleaned.append(chunk)
        linear.append(canceller.linear_chunk or chunk)
        samples = np.frombuffer(chunk, dtype="<i2").astype(np.float32) / 32768
        probability = vad.probability(samples)
        evidence = canceller.evidence(probability)
        echo_chunks.append(evidence.playing)
        act = fast.step(evidence, logic.in_speech)
        # A hold stops the sound as a barge-in does (what follows a false one, the reply
        # playing on, is not modelled: the take's reply stays cut).
        if cut is None and act in (Act.HOLD, Act.INTERRUPT) and lo > second:
            cut = hi + round(CUT_S * RATE)
            if onset is not None:
                result.decided_after_s = round((hi - onset) / RATE, 3)
        if act is Act.RELEASE:
            result.released += 1
        logic.evidence, logic.hearing = evidence, canceller.hearing  # as Endpointer._process
        delay = canceller.delay_samples
        heard = kept.chunk(captured, chunk, evidence.playing, delay) if use_kept else chunk
        for event in logic.process(probability, heard, now):
            if event.kind is EndpointKind.SPEECH_STARTED and hi > second:
                if cut is None:  # the endpointer's start stops a reply too (the pipeline)
                    cut = hi + round(CUT_S * RATE)
                if onset is None or hi < onset:
                    result.self_made += 1
                elif span is None:
                    result.started_after_s = round((hi - onset) / RATE, 3)
                    # The audio starts this far back from the start decision's chunk end;
                    # the canceller's output lags the microphone by one frame.
                    span = (hi - len(event.audio) // 2, 0)
            if event.kind is EndpointKind.ENDPOINT and span is not None and span[1] == 0:
                span = (span[0], span[0] + len(event.audio) // 2)
                sent = event.audio
        if span is not None and span[1] and n * CHUNK_SAMPLES > span[1] + RATE:
            break
    if span is None or span[1] == 0 or onset is None:
        return result
    lo, hi = span
    lag = canceller.delay_samples
    result.reach_s = round((lo - lag - onset) / RATE, 3)
    today = np.frombuffer(b"".join(cleaned), dtype="<i2").astype(np.float32) / 32768
    # The microphone and the voice on the canceller's output timeline (`lag` later).
    raw = np.concatenate([np.zeros(lag, np.float32), mic])[: len(today)]
    alone = np.concatenate([np.zeros(lag, np.float32), voice])[: len(today)]
    playing = np.repeat(np.array(echo_chunks, dtype=bool), CHUNK_SAMPLES)[: len(today)]
    mixed = np.where(playing, raw, today)
    lin = np.frombuffer(b"".join(linear), dtype="<i2").astype(np.float32) / 32768
    signals = {
        "cleaned": today, "raw": raw, "raw_echo": mixed, "voice": alone,
        "linear_echo": np.where(playing, lin, today),
    }  # fmt: skip
    for ms in (0, *prerolls_ms):
        start = max(0, lo - ms * RATE // 1000)
        for name, signal in signals.items():
            result.audio[f"{name}+{ms}" if ms else name] = signal[start:hi]
    result.audio["today"] = np.frombuffer(sent, dtype="<i2").astype(np.float32) / 32768
    return result


@dataclass
class Scored:
    take: dict
    candidate: str
    transcript: str
    heard: bool
    errors: int
    words: int


def score(utterances: Iterable[Utterance], transcribe: Callable[[np.ndarray], str]) -> list[Scored]:
    """Every candidate of every utterance through `transcribe` (the server's Whisper), scored
    as the room bench scores: all key words in the transcript; and the WER."""
    from ..bench.wer import score_one

    scored = []
    for utt in utterances:
        take = utt.take
        for name, audio in utt.audio.items():
            text = transcribe(audio).strip()
            lowered = text.lower()
            heard = all(word in lowered for word in take["words"])
            wer = score_one(take["user"], take["text"], text)
            scored.append(Scored(take, name, text, heard, wer.errors, wer.words))
    return scored


def summarise(scored: Iterable[Scored]) -> dict[str, dict]:
    """Per candidate: key words heard, WER (errors over words, all utterances together)."""
    by: dict[str, list[Scored]] = {}
    for s in scored:
        by.setdefault(s.candidate, []).append(s)
    return {
        name: {
            "utterances": len(items),
            "heard": sum(s.heard for s in items),
            "wer": round(sum(s.errors for s in items) / max(1, sum(s.words for s in items)), 3),
        }
        for name, items in by.items()
    }


def main() -> None:  # pragma: no cover - a lab tool
    """The issue's two rooms and a headset, the bench's commands (and the recorded human
    voice) over a Piper reply at the onsets the bench uses; a JSON summary per candidate."""
    import argparse

    from wyoming_pivoice.audio import tune_linear
    from wyoming_pivoice.engines import AsrSettings, WhisperAsr

    from ..bench.corpus import ARCTIC_TEXT, ARCTIC_WAV, build, human_recording, read_wav_float
    from .offline import _reply, _trim, aec3_config

    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", type=Path, default=Path("/tmp/pivoice-offline-corpus"))
    parser.add_argument("--gains", default="0")
    parser.add_argument("--onsets", default="0.7,1.1")
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--rooms", default="-6,-3,headset")
    parser.add_argument("--vad", action="append", default=[], help="a VadSettings field=int")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--cleaned", action="store_true", help="utterances of the output only")
    parser.add_argument(
        "--canceller", default="livekit", help="livekit or aec3 (ours, EchoSettings.canceller)"
    )
    parser.add_argument("--aec3-config", default="", help="field=value,... (our AEC3's config)")
    args = parser.parse_args()
    tune_linear(aec3_config=aec3_config(args.aec3_config))
    echo_settings = EchoSettings(canceller=args.canceller)
    reply = _reply(args.corpus / "reply.pcm")
    corpus = build(args.corpus)
    users = [u for u in corpus if u.kind == "command"][: args.users]
    voices = [(u.id, u.text, u.words, _trim(u.samples())) for u in users]
    arctic = _trim(read_wav_float(human_recording(ARCTIC_WAV)))
    voices.append(("arctic", ARCTIC_TEXT, ("always", "superlative"), arctic))
    rooms = {
        "-6": RoomAcoustics(-6, 150, RoomAcoustics.tail_for_rt60(0.7), seed=1, highpass_hz=200,
                            clip_db=6, drift_ppm=100),
        "-3": RoomAcoustics(-3, 250, RoomAcoustics.tail_for_rt60(0.7), seed=2, highpass_hz=200,
                            clip_db=6, drift_ppm=-100),
        "headset": RoomAcoustics(-90, 20, 0, seed=3),
    }  # fmt: skip
    vad_settings = VadSettings()
    for setting in args.vad:
        key, value = setting.split("=")
        # Integer settings only (a bool field beside them now: --hold-reply).
        vad_settings = replace(vad_settings, **{key: int(value)})  # type: ignore[arg-type]
    vad = silero_vad(vad_settings.state_span)  # the satellite endpointer's
    asr = WhisperAsr(AsrSettings())
    utterances = []
    self_made = released = 0
    for key in args.rooms.split(","):
        room = rooms[key]
        alone = run_take(Take(room, None), reply, None, vad, vad_settings, echo_settings)
        self_made += alone.self_made
        released += alone.released
        for name, text, words, samples in voices:
            for gain in (float(g) for g in args.gains.split(",")):
                for onset in (float(o) for o in args.onsets.split(",")):
                    take = Take(room, onset, gain, name, text, words)
                    utterances.append(
                        run_take(
                            take,
                            reply,
                            samples,
                            vad,
                            vad_settings,
                            echo_settings,
                            use_kept=not args.cleaned,
                        )
                    )
    scored = score(utterances, asr.transcribe)
    report = {
        "all": summarise(scored),
        "by_room": {
            key: summarise(s for s in scored if s.take["room"] == asdict(rooms[key]))
            for key in args.rooms.split(",")
        },
        "missed_utterances": sum(not u.audio for u in utterances),
        "self_made_in_silence": self_made,
        "self_made_over_user": sum(u.self_made for u in utterances),
        "holds_released": released + sum(u.released for u in utterances),
        "median_reach_s": statistics.median(
            [u.reach_s for u in utterances if u.reach_s is not None] or [0.0]
        ),
    }
    print(json.dumps(report, indent=1))
    if args.json:
        rows = [asdict(s) for s in scored]
        extra = [
            {"take": u.take, "started": u.started_after_s, "decided": u.decided_after_s,
             "reach": u.reach_s} for u in utterances
        ]  # fmt: skip
        args.json.write_text(json.dumps({"report": report, "scored": rows, "takes": extra}))


if __name__ == "__main__":  # pragma: no cover
    main()
