"""How the canceller's two filters settle over a run of short replies (the bench's pattern):
AEC3's ERLE estimate and that of the linear filter beside it (EchoSettings.linear_barge_in),
reply by reply, with the room's clock drift and a per-reply move of the echo's delay (`--move
S`: each reply's reference placed up to S seconds early, as a speaker command reopened or a
room's tick moves it). SpeexDSP's linear filter needs the echo to stay put (docs/room.md,
session 14); AEC3's own (`--linear-filter aec3`, native/aec3) follows it (session 15).

    python -m pivoice_lab.room.converge --room=-6 --drift 0 --move 0.005 [--linear-filter aec3]
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np
from wyoming.audio import AudioFormat

from wyoming_pivoice.audio import (
    CHUNK_SAMPLES,
    CHUNK_SECONDS,
    EchoCanceller,
    float_to_pcm16,
    tune_linear,
)
from wyoming_pivoice.satellite import EchoSettings

from .acoustics import RATE, EchoPath, NoiseFloor, RoomAcoustics, SpeakerPath
from .offline import ROOMS, _reply, aec3_config

GAP_S = 3.0


def settle(
    room: RoomAcoustics,
    reply: tuple[bytes, int],
    replies: int,
    reply_s: float = 2.5,
    move_s: float = 0.0,
    seed: int = 1,
    linear_filter: str = "mdf",
    canceller_kind: str = "livekit",
) -> list[tuple[float, float]]:
    """(linear ERLE, AEC3 ERLE) estimates in dB after each of `replies` replies, each the
    first `reply_s` of `reply`, GAP_S apart."""
    pcm, rate = reply
    pcm = pcm[: int(reply_s * rate) * 2]
    fmt = AudioFormat(rate, 2, 1)
    played = SpeakerPath(fmt, room).convert(pcm)
    starts = [RATE // 2 + i * (len(played) + round(GAP_S * RATE)) for i in range(replies)]
    total = starts[-1] + len(played) + round(GAP_S * RATE)
    out = np.zeros(total, np.float32)
    for start in starts:
        out[start : start + len(played)] = played
    mic = EchoPath(room).process(out) + NoiseFloor(room.noise_dbfs, room.seed).block(total)
    canceller = EchoCanceller(
        EchoSettings(linear_barge_in=True, linear_filter=linear_filter, canceller=canceller_kind)
    )
    moves = np.random.default_rng(seed).uniform(-move_s, 0.0, replies)
    piece = round(rate * 0.02) * 2
    for start, move in zip(starts, moves, strict=True):
        for i, offset in enumerate(range(0, len(pcm), piece)):
            due = start / RATE + i * 0.02 + float(move)
            canceller.reference(pcm[offset : offset + piece], fmt, due)
    marks = [start + len(played) + round(GAP_S * RATE / 2) for start in starts]
    settled: list[tuple[float, float]] = []
    for n in range(total // CHUNK_SAMPLES):
        chunk = float_to_pcm16(mic[n * CHUNK_SAMPLES : (n + 1) * CHUNK_SAMPLES])
        canceller.process(chunk, (n + 1) * CHUNK_SECONDS)
        if len(settled) < len(marks) and (n + 1) * CHUNK_SAMPLES >= marks[len(settled)]:
            settled.append((canceller.linear_estimate.erle_db, canceller.estimate.erle_db))
    return settled


def main() -> None:  # pragma: no cover - a lab tool
    parser = argparse.ArgumentParser()
    parser.add_argument("--room", default="-6", help=f"of {', '.join(ROOMS)}")
    parser.add_argument("--drift", type=float, help="ppm (default: the room's)")
    parser.add_argument("--move", type=float, default=0.0, help="s, per reply")
    parser.add_argument("--replies", type=int, default=8)
    parser.add_argument("--linear-filter", default="mdf", help="mdf or aec3 (native/aec3)")
    parser.add_argument("--aec3-blocks", type=int, help="AEC3's filter length, 4 ms blocks")
    parser.add_argument("--corpus", type=Path, default=Path("/tmp/pivoice-offline-corpus"))
    parser.add_argument("--canceller", default="livekit", help="livekit or aec3 (ours)")
    parser.add_argument("--aec3-config", default="", help="field=value,... (our AEC3's config)")
    args = parser.parse_args()
    room = ROOMS[args.room]
    tune_linear(aec3_blocks=args.aec3_blocks, aec3_config=aec3_config(args.aec3_config))
    if args.drift is not None:
        room = replace(room, drift_ppm=args.drift)
    for n, (linear, aec3) in enumerate(settle(room, _reply(args.corpus / "reply.pcm"),
                                              args.replies, move_s=args.move,
                                              linear_filter=args.linear_filter,
                                              canceller_kind=args.canceller), 1):  # fmt: skip
        print(f"after reply {n}: linear filter {linear:.1f} dB, AEC3 {aec3:.1f} dB")


if __name__ == "__main__":  # pragma: no cover
    main()
