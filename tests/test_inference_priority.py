"""The server's models run below the audio (engines/runtime.py INFERENCE_NICE): on one Pi a
satellite's audio threads must get a core while a reply decodes, whatever the user may ask of
the scheduler. Checked on a real server process: the threads that did the model work run at
nice 5, the event loop's thread (which answers `describe`) at the nice it started with."""

from __future__ import annotations

import os
from pathlib import Path

from wyoming_pivoice.engines.runtime import INFERENCE_NICE

from .helpers import make_speech, read_wav, server_process_of, stt, tts


def _nice(pid: int, tid: int) -> int:
    # /proc/<pid>/task/<tid>/stat: field 19 is the nice value; the name (field 2) may hold spaces.
    stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])


async def test_model_threads_run_below_the_loop(server_port: int, speech_dir: Path) -> None:
    pcm, _rate = await tts(server_port, "Run the models below the audio, please.")
    assert len(pcm) > 22050  # a real voice said it: more than half a second at 22050 Hz
    wav = make_speech("turn on the kitchen light", speech_dir / "priority.wav")
    assert "kitchen" in (await stt(server_port, read_wav(wav)[0])).lower()

    proc = server_process_of(server_port)
    start = os.getpriority(os.PRIO_PROCESS, proc.pid)
    threads = sorted(proc.threads(), key=lambda t: t.user_time + t.system_time, reverse=True)
    workers = [t for t in threads if t.id != proc.pid and t.user_time + t.system_time > 0.2]
    assert workers, "no thread of the server did model work"
    assert _nice(proc.pid, proc.pid) == start  # the loop
    assert [_nice(proc.pid, t.id) for t in workers] == [max(start, INFERENCE_NICE)] * len(workers)
