"""lab room.dumpreplay: an AEC dump replayed through one AEC3, beside the live frame lines."""

from __future__ import annotations

import numpy as np

from pivoice_lab.room.align import read_dump
from pivoice_lab.room.dumpreplay import compare, replay


def test_a_dump_replays_through_aec3_and_lines_up_with_the_frame_lines(tmp_path) -> None:
    rng = np.random.default_rng(1)
    ref = (rng.standard_normal(16000 * 4) * 3000).astype(np.int16)  # 4 s of reference
    mic = np.zeros_like(ref)
    mic[800:] = (ref[:-800] * 0.5).astype(np.int16)  # its echo, 50 ms late, −6 dB
    pairs = np.column_stack([mic, ref])
    out = replay(pairs)
    assert out.shape == mic.shape

    def db(x: np.ndarray) -> float:
        return 10 * float(np.log10(np.mean((x.astype(np.float64) / 32768) ** 2) + 1e-12))

    last = slice(16000 * 3, 16000 * 4)
    assert db(out[last]) < db(mic[last]) - 15  # converged: the echo taken off
    log = (
        "x INFO AEC dump to /tmp/aec.raw from monotonic 100.000000\n"
        "x DEBUG Over the reply at 103.500: VAD 0.01, mic -20.0 dB, residual -50.0 dB, "
        "expected -45.0 dB; linear VAD None\n"
        "x DEBUG Over the reply at 109.000: VAD 0.01, mic -20.0 dB, residual -50.0 dB, "
        "expected -45.0 dB; linear VAD None\n"
    )
    (tmp_path / "aec.raw").write_bytes(pairs.astype("<i2").tobytes())
    read = read_dump(tmp_path / "aec.raw", log)
    assert read is not None and read[1] == 100.0 and np.array_equal(read[0], pairs)
    assert read_dump(tmp_path / "missing.raw", log) is None
    (row,) = compare(log, read[1], out)  # the second lies past the dump's end
    assert row.at == 103.5 and row.live_residual_db == -50.0 and row.expected_db == -45.0
    end = round(3.5 * 16000)
    assert abs(row.replayed_residual_db - db(out[end - 512 : end])) < 1e-9
