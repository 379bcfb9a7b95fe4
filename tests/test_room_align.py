"""lab room.align: where the satellite placed its reference and microphone, from its AEC dump
and the room's recordings."""

from __future__ import annotations

import numpy as np

from pivoice_lab.room.align import RATE, placements


def test_the_placement_errors_are_found_in_milliseconds() -> None:
    rng = np.random.default_rng(5)
    seconds = 4
    source = np.zeros(seconds * RATE)
    source[RATE : 3 * RATE] = rng.standard_normal(2 * RATE) * 0.1  # a reply, 1-3 s
    mic = rng.standard_normal(seconds * RATE) * 0.05
    room_start, dump_start = 100.0, 100.5
    # The satellite placed the reference 40 ms later than it played, the microphone 2 ms earlier
    # than it was captured.
    late, early = round(0.040 * RATE), round(0.002 * RATE)
    n = (seconds - 1) * RATE
    first = round((dump_start - room_start) * RATE)
    dump = np.zeros((n, 2), dtype=np.int16)
    dump[:, 1] = np.round(source[first - late : first - late + n] * 32767)
    dump[:, 0] = np.round(mic[first + early : first + early + n] * 32767)
    found = placements(dump, dump_start, mic, source, room_start, [101.5, 102.0, 103.1])
    assert [p.reference_ms for p in found[:2]] == [40.0, 40.0]
    assert [p.microphone_ms for p in found[:2]] == [-2.0, -2.0]
    assert found[2].reference_ms is None  # the reply is over: nothing to place
    assert found[2].microphone_ms == -2.0
