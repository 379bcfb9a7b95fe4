"""The server's limits, all in one place (wire/framing.py's reader enforces the frame sizes).

Every refusal sends `error` (for clients that read it) and then ends the client's wait in a
way Home Assistant understands, since HA ignores `error` (README, *Limits*):
- a request that is refused but leaves the connection readable gets the answer its client
  waits for: an empty `transcript` (ASR), an empty audio run `audio-start`/`audio-stop`
  (`synthesize`), `synthesize-stopped` (a stream), `not-handled` with a short text (a turn).
  The connection stays: later requests on it are still served, in order.
- a connection we cannot or will not read on (a bad frame, a slot refused, idle, too slow,
  evicted) gets `error` and is closed: EOF releases every client.

- header line of a frame: 64 KiB (asyncio's stream limit) → `malformed`, closed. So is any
  frame that is not a JSON event.
- payload block of one frame: `max_frame_bytes` (4 MiB); data block: `max_data_bytes`
  (256 KiB: parsed JSON takes many times its size) → `frame-too-large`, closed.
- a frame, once its first byte is in: complete within `frame_timeout` (30 s) → `timeout`, closed.
- a request (transcription, streaming synthesis), from its first event to its last:
  `request_timeout` (120 s) → `timeout`, closed.
- audio of one transcription: `max_audio_seconds` (60 s) → `audio-too-long`; queued audio
  on one connection: 2 × that → `overloaded`.
- text of one synthesis, turn or stream (all its chunks), a turn's `context` as JSON:
  `max_text_chars` (4000) → `text-too-long`.
- requests queued on one connection: `max_pending` (64) → `overloaded`; twice that many
  unanswered refusals → closed.
- connections: `max_clients` (16), `max_clients_per_host` (12) from one address, each taken
  with a connection's first request, once read (slots.py). At a limit the connection idle
  longest after a finished request, with nothing unread, is evicted (`evicted`, closed);
  only if every one has a request is the newcomer refused: `busy` and the end its client
  waits for, then closed. Connections not yet past their first request wait in a lobby of
  4 per slot (the oldest silent one closed for room after 1 s).
- silence: `idle_timeout` (300 s) since the client's last request and last reply → `idle`,
  closed. `ping` and `describe` are answered but do not count as requests: they keep no slot.
- a client that reads none of its replies: `write_timeout` (30 s) → dropped.
- synthesis: one inference speaks at most `MAX_PIECE_PHONEMES` (engines/tts.py); the model
  is given back between pieces so other clients' requests interleave.
- conversation: prompt + reply fit the model's context in its own tokens (oldest history
  dropped first, then the user text cut); memory per (client address, conversation id).
  A reply ends `reply_timeout` (120 s) after its turn arrived, however slowly the model
  writes (a starved llama.cpp once took minutes): what was written by then is the answer
  (`handled`), or converse.SLOW_REPLY if nothing was; the model is told to stop.
"""

from __future__ import annotations

from dataclasses import dataclass

# The frame sizes live beside the reader, which the satellite shares without importing the server.
from ..options import opt
from ..wire.framing import MAX_DATA_BYTES, MAX_FRAME_BYTES


@dataclass(frozen=True)
class Limits:
    max_audio_seconds: float = opt(60.0, "--max-audio-seconds")
    max_text_chars: int = opt(4000, "--max-text-chars")
    max_frame_bytes: int = opt(MAX_FRAME_BYTES, "--max-frame-bytes")
    max_data_bytes: int = MAX_DATA_BYTES
    max_pending: int = 64
    max_clients: int = opt(
        16,
        "--max-clients",
        help="connections at once; when full, the longest-idle one without a request goes",
    )
    max_clients_per_host: int = opt(12, "--max-clients-per-host")
    idle_timeout: float = opt(
        300.0,
        "--idle-timeout",
        help="close a connection this long after its last request (ping and describe do not count)",
    )
    write_timeout: float = opt(
        30.0, "--write-timeout", help="drop a client that takes none of its replies for this long"
    )
    frame_timeout: float = opt(
        30.0, "--frame-timeout", help="a frame must be complete this long after its first byte"
    )
    request_timeout: float = opt(
        120.0,
        "--request-timeout",
        help="a transcription's audio or a stream's text must be in within this time",
    )
    reply_timeout: float = opt(
        120.0,
        "--reply-timeout",
        help="a conversation turn's reply ends this long after it was asked: what the model "
        "wrote by then is the answer",
    )
