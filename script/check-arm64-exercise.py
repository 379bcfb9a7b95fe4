"""Run by script/check-arm64 inside the arm64 root (cwd /src, the root's .venv python): starts
the server (from BIN_DIR, the first argument, default .venv/bin) and asks it what Home
Assistant would, timing each step; by script/check-addon-image inside the image with
`--port PORT`: asks the server the add-on's run.sh started. Real speech: the next argument,
default kitchen.wav. Exits 1 on a wrong answer. Under emulation the times are qemu's."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
import wave

from wyoming.asr import Transcribe
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.info import Describe, Info

LOAD_TIMEOUT = 1800.0  # model loads under emulation take minutes
RUNNING = sys.argv[1:2] == ["--port"]  # a server that already runs, on that port
WAV = sys.argv[3 if RUNNING else 2] if len(sys.argv) > (3 if RUNNING else 2) else "kitchen.wav"


# Not pivoice_lab.ports: this runs where only the runtime is installed (the arm64 root, the image).
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listening on port {port} after {timeout:.0f} s")


async def ask(port: int, events: list[Event], until: str) -> list[Event]:
    async with AsyncTcpClient("127.0.0.1", port) as client:
        for event in events:
            await client.write_event(event)
        replies = []
        async with asyncio.timeout(LOAD_TIMEOUT):
            while (event := await client.read_event()) is not None:
                replies.append(event)
                if event.type == until:
                    break
        return replies


def report(step: str, start: float, result: str) -> None:
    print(f"exercise: {step}: {time.monotonic() - start:.1f} s: {result}", flush=True)


async def exercise(port: int) -> bool:
    ok = True
    start = time.monotonic()
    [event] = await ask(port, [Describe().event()], "info")
    info = Info.from_event(event)
    names = [info.asr[0].name, info.tts[0].name, info.handle[0].models[0].name]
    report("describe", start, ", ".join(names))

    with wave.open(WAV, "rb") as wav:
        rate, width, channels = wav.getframerate(), wav.getsampwidth(), wav.getnchannels()
        pcm = wav.readframes(wav.getnframes())
    events = [Transcribe(language="en").event(), AudioStart(rate, width, channels).event()]
    for i in range(0, len(pcm), 3200):
        events.append(AudioChunk(rate, width, channels, pcm[i : i + 3200]).event())
    events.append(AudioStop().event())
    start = time.monotonic()
    replies = await ask(port, events, "transcript-stop")
    text = next((e.data["text"] for e in replies if e.type == "transcript"), "")
    report("transcribe", start, repr(text))
    ok &= "kitchen" in text.lower() and "light" in text.lower()

    start = time.monotonic()
    replies = await ask(port, [Event("synthesize", {"text": "The lights are on."})], "audio-stop")
    audio_start = next(e.data for e in replies if e.type == "audio-start")
    audio = b"".join(e.payload or b"" for e in replies if e.type == "audio-chunk")
    frame = audio_start["width"] * audio_start["channels"]
    seconds = len(audio) / (audio_start["rate"] * frame)
    report("synthesize", start, f"{seconds:.2f} s of audio at {audio_start['rate']} Hz")
    ok &= seconds > 0.5

    start = time.monotonic()
    turn = Event("transcript", {"text": "What is the capital of France?"})
    replies = await ask(port, [turn], "handled-stop")
    reply = next((e.data["text"] for e in replies if e.type == "handled"), "")
    report("turn", start, repr(reply))
    ok &= bool(reply.strip())
    return ok


def main() -> int:
    if RUNNING:
        ok = asyncio.run(exercise(int(sys.argv[2])))
        print("exercise:", "PASSED" if ok else "FAILED", flush=True)
        return 0 if ok else 1
    bin_dir = sys.argv[1] if len(sys.argv) > 1 else ".venv/bin"
    port = free_port()
    start = time.monotonic()
    server = subprocess.Popen(
        [f"{bin_dir}/wyoming-pivoice", "server", "--uri", f"tcp://127.0.0.1:{port}",
         "--no-zeroconf"],
        stdout=open("server.log", "w"), stderr=subprocess.STDOUT,  # noqa: SIM115
    )  # fmt: skip
    try:
        wait_for_port(port, proc=server, timeout=LOAD_TIMEOUT)
        report("server listening", start, f"port {port}")
        ok = asyncio.run(exercise(port))
    finally:
        server.terminate()
        server.wait(timeout=60)
    print("exercise:", "PASSED" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
