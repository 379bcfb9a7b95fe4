"""The events of our own follow protocol, spoken by both ends: a Home Assistant satellite of
ours (satellite/ha/follow.py) and the server it follows (server/follow.py). One spelling here,
so the two ends cannot drift apart."""

from __future__ import annotations

FOLLOW = "pivoice-follow"  # satellite → server: follow the turns HA sends for this satellite id
HEARD = "pivoice-heard"  # satellite → server: the transcript HA sent us (joins older HA)
SPOKEN = "pivoice-spoken"  # satellite → server: the followed reply has played
OWN_TTS = "pivoice-own-tts"  # satellite → server, first on a TTS connection: a followed reply
# satellite → server: the utterance so far (payload: s16le 16 kHz mono), at the satellite's
# speculative endpoint; the server may answer it before HA asks (server/follow.py: Speculation);
# data {fresh: true}: no turn of ours has come since HA (re)connected (a new conversation)
SPECULATE = "pivoice-speculate"
VOID = "pivoice-void"  # satellite → server: that utterance goes on, or HA answered it itself
REPLY_START = "pivoice-reply-start"  # server → satellite: a reply to this satellite begins
# server → satellite: the reply that began `pivoice-reply-start{held}` (a speculation) is the
# turn's: play it (release), or is no turn's: forget it unplayed (drop)
REPLY_RELEASE = "pivoice-reply-release"
REPLY_DROP = "pivoice-reply-drop"
REPLY_FAILED = "pivoice-reply-failed"  # server → satellite: that reply ended without an answer
SATELLITE_EVENTS = frozenset(
    {FOLLOW, HEARD, SPOKEN, OWN_TTS, SPECULATE, VOID}
)  # what the server accepts
