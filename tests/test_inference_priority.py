"""The server's models run below the audio (engines/runtime.py INFERENCE_NICE): on one Pi a
satellite's audio threads must get a core while a reply decodes, whatever the user may ask of
the scheduler. Checked on a real server process: the threads that did the model work run at
nice 5, the event loop's thread (which answers `describe`) at the nice it started with."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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


# ---- llama.cpp's threads under load (engines/llm.py) ----------------------------------------


@pytest.mark.slow  # a real model
def test_a_reply_uses_the_cores_other_work_leaves(monkeypatch) -> None:
    """A busy machine gets a one-thread reply (spinning barriers stall on a preempted thread:
    48 tokens took 30-250 s on 2 threads at load 13-18 here, 0.9-2.7 s on 1); an idle one all
    the cores it may use; load that comes mid-reply takes threads away, never adds them."""
    import llama_cpp

    from wyoming_pivoice.engines import llm
    from wyoming_pivoice.engines.llm import LlamaChat, LlmSettings, free_threads

    cores = os.cpu_count() or 1
    assert free_threads(4, None, 1) == 4  # nothing known: the limit
    assert free_threads(4, 1, 1) == min(4, cores)  # only the asking thread runs
    assert free_threads(4, 40, 1) == 1
    assert free_threads(2, cores + 1, 2) == max(1, min(2, cores - (cores - 1)))
    # A quiet instant on a busy machine: the load average still says busy.
    assert free_threads(4, 1, 1, average=20.0, own=4) == 1
    # Our own decoding is most of the average: still all the cores.
    assert free_threads(4, 1, 1, average=1.8, own=4) == min(4, cores)

    chat = LlamaChat(LlmSettings(max_tokens=24, temperature=0.0))
    messages = [{"role": "user", "content": "Count from one to twenty, please."}]
    counts = iter([(1, 0.0)] + [(40, 40.0)] * 100)  # idle at the start, then busy
    monkeypatch.setattr(llm, "running_tasks", lambda: next(counts))
    seen = []
    for piece in chat.stream(messages):
        seen.append((piece, llama_cpp.llama_n_threads(chat.llama._ctx.ctx)))
    assert seen[0][1] == cores and seen[-1][1] == 1 and chat.threads == 1
    assert "".join(p for p, _ in seen).strip()  # it still answered

    monkeypatch.setattr(llm, "running_tasks", lambda: (40, 40.0))
    reply = chat.complete(messages)
    assert reply.strip() and llama_cpp.llama_n_threads(chat.llama._ctx.ctx) == 1

    # A ceiling of 1 holds for the prompt's evaluation too (llama-cpp-python's own default
    # for it is every core).
    one = LlamaChat(LlmSettings(max_tokens=4, threads=1))
    assert llama_cpp.llama_n_threads_batch(one.llama._ctx.ctx) == 1
