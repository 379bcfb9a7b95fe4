"""The room's two device commands, standard library only (they start once per reply):

    python -m pivoice_lab.room.client speaker SOCKET RATE WIDTH CHANNELS   # stdin → room
    python -m pivoice_lab.room.client mic SOCKET                           # room → stdout

Give them to the satellite as `--snd-command '… speaker SOCKET {rate} {width} {channels}'`
and `--mic-command '… mic SOCKET'`.
"""

from __future__ import annotations

import io
import os
import socket
import struct
import sys
import time
from typing import cast

# A speaker's buffer is the room's to model: keep the socket's own small, so audio handed
# to a speaker that is then killed does not sit in the kernel and play anyway.
SEND_BUFFER = 4096
# The speaker hands the room this much at a time (23 ms at 22050 Hz): the room's device buffer
# then holds what it models (60 ms) plus one block, not plus 93 ms.
BLOCK_BYTES = 1024
# Each block goes with the monotonic time the command read it (the system's one clock): the
# room plays no sample before its device was handed it, however late the room reads it.
HEADER = ">dI"  # time handed over, bytes that follow (0: the end, play out what you have)
HEADER_BYTES = struct.calcsize(HEADER)


def _connect(path: str, kind: bytes) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
    sock.connect(path)
    sock.sendall(kind)
    return sock


def speaker(path: str, rate: int, width: int, channels: int) -> None:
    """Audio goes in blocks, each after its time and length; an empty block says "that was
    all, play it out". A speaker that dies without it is cut off at once, like a device that
    closes."""
    sock = _connect(path, f"speaker {rate} {width} {channels}\n".encode())
    stdin = cast(io.BufferedReader, sys.stdin.buffer)  # a buffered binary stream
    while data := stdin.read1(BLOCK_BYTES):
        sock.sendall(struct.pack(HEADER, time.monotonic(), len(data)) + data)
    sock.sendall(struct.pack(HEADER, time.monotonic(), 0))
    sock.recv(1)  # the room closes once it has played everything


def mic(path: str) -> None:
    sock = _connect(path, b"mic\n")
    out = sys.stdout.buffer.fileno()
    while data := sock.recv(8192):
        os.write(out, data)


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["speaker"] and len(argv) == 5:
            speaker(argv[1], int(argv[2]), int(argv[3]), int(argv[4]))
        elif argv[:1] == ["mic"] and len(argv) == 2:
            mic(argv[1])
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except (BrokenPipeError, ConnectionError, KeyboardInterrupt):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
