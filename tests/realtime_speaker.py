"""A stand-in for a speaker command such as `aplay`: takes raw s16le mono at RATE on stdin
at real time, as a device does, keeping 40 ms buffered, and appends each 10 ms block it
plays to LOG as '<start> <end>' on the monotonic clock (the clock of the satellite's
turn stamps). Killed, it falls silent at the end of its last block.

    python realtime_speaker.py RATE LOG
"""

import sys
import time

BUFFER = 0.04

rate, log = int(sys.argv[1]), open(sys.argv[2], "a", buffering=1)  # noqa: SIM115
bytes_per_second = rate * 2
clock = 0.0
while data := sys.stdin.buffer.read(bytes_per_second // 100):
    clock = max(clock, time.monotonic())  # an underrun: the device starts again
    start, clock = clock, clock + len(data) / bytes_per_second
    log.write(f"{start:.4f} {clock:.4f}\n")
    ahead = clock - time.monotonic() - BUFFER
    if ahead > 0:
        time.sleep(ahead)  # a device plays at real time: its pace, not synchronisation
