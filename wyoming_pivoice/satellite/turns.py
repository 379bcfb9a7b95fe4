"""The turn core of both modes: one playback driver, one turn timer.

- `Playback` carries replies onto the speaker sink: a queue of steps (audio, a sound, a
  drain, a stop), each call to the device bounded; a stop drops the queued steps and
  cancels the one running. It reads the audio core's cut (a barge-in the audio thread
  carried out before the loop heard of it) and counts what it handed to the device, so what
  the user is said to have heard is what began to play, not what was written.
- `TurnTimer` numbers the turns and stamps each `timing.TurnClock` from the devices' own
  times (the sink's first sample, not when the loop ran); one JSON line per turn.

The standalone front (standalone/pipeline.py) and the Home Assistant one (ha/adapter.py)
play and time their turns through these alone: how a reply is played is changed here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from wyoming.audio import AudioFormat

from ..audio.pcm import bytes_per_second
from ..timing import TimingLog, TurnClock
from .protocols import AudioSink

if TYPE_CHECKING:
    from ..audio.echo import EchoCanceller

_LOGGER = logging.getLogger(__name__)

STEP_TIMEOUT = 2.0  # one speaker call (queue audio, stop); a drain is bounded by the sink
SHUTDOWN_WAIT = 0.5  # the driver's task, stopped
# An awaited drain gets the reply's length and this much more, then the speaker is stopped:
# a device 10 s behind its audio has stopped taking it (the sinks' own bounds are shorter;
# in HA mode the machine's drain deadline stops a `finish` instead).
DRAIN_EXTRA = 10.0

Sound = tuple[bytes, AudioFormat]  # a sound of our own: its audio and format


@dataclass
class _Step:
    call: Callable[[], Awaitable[None]]
    timeout: float | None
    done: asyncio.Future[None] | None = None  # resolved once the step has run (or failed)


class Playback:
    """The one playback driver: the sink's calls in order, on its own task (`run`).

    Nothing here waits for the device: `play`, `finish`, `sound` and `stop` queue a step and
    return, so a front's input never waits on a speaker; whoever must know when a step is
    over passes `done` or awaits `drained` (bounded by the reply's length; a `finish` is
    bounded by the HA machine's drain deadline, which stops it).
    """

    def __init__(self, sink: AudioSink, canceller: EchoCanceller | None = None) -> None:
        self.sink = sink
        self.canceller = canceller
        self.runs = 0  # the reply's audio runs (phrases) begun on the device
        self.seconds = 0.0  # the reply's audio handed to the device
        self._queued = 0.0  # the reply's audio queued here
        self._begun = False  # the reply's first audio has gone to the device
        self._steps: deque[_Step] = deque()
        self._ready = asyncio.Event()
        self._current: asyncio.Task[None] | None = None
        self._waiters: set[asyncio.Future[None]] = set()

    # ---- the queue -----------------------------------------------------------------------

    def begin(self) -> None:
        """A reply begins: its counts start at nothing."""
        self.runs, self.seconds, self._queued, self._begun = 0, 0.0, 0.0, False

    def play(self, pcm: bytes, fmt: AudioFormat, run: int = 0) -> None:
        """Queue audio of the current reply (`run`: which phrase of it)."""
        self._queued += len(pcm) / max(1, bytes_per_second(fmt))
        self._add(_Step(partial(self._play, pcm, fmt, run), STEP_TIMEOUT))

    def finish(self, done: Callable[[], None]) -> None:
        """Play what is queued out, then call `done` (also when the device failed; not after
        a stop, which ends the reply otherwise)."""
        self._add(_Step(partial(self._finish, done), None))

    async def drained(self) -> None:
        """`finish`, awaited: returns once the reply has played out or a stop ended it, or
        stops the speaker once the reply's length and DRAIN_EXTRA have passed."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        self.finish(partial(_resolve, waiter))
        bound = self._queued + DRAIN_EXTRA
        try:
            done, _ = await asyncio.wait({waiter}, timeout=bound)
        finally:
            self._waiters.discard(waiter)
        if not done:
            _LOGGER.warning("The speaker did not finish the reply within %.0f s: stopped", bound)
            await self.stop()

    def sound(
        self, name: str, load: Callable[[], Awaitable[Sound]], done: Callable[[], None]
    ) -> None:
        """Play the sound `name` of our own out (loaded by `load`), then call `done`."""
        self._add(_Step(partial(self._sound, name, load, done), None))

    def stop(self) -> asyncio.Future[None]:
        """Fall silent now: the queued steps go, the one running is cancelled, the sink
        stops. The future is resolved once it has (bounded by STEP_TIMEOUT)."""
        self._steps.clear()
        if self._current is not None:
            self._current.cancel()
        for waiter in self._waiters:
            _resolve(waiter)
        stopped = asyncio.get_running_loop().create_future()
        self._add(_Step(self.sink.stop, STEP_TIMEOUT, stopped))
        return stopped

    def _add(self, step: _Step) -> None:
        self._steps.append(step)
        self._ready.set()

    async def run(self) -> None:
        try:
            while True:
                if not self._steps:
                    self._ready.clear()
                    await self._ready.wait()
                    continue
                await self._run(self._steps.popleft())
        finally:  # stopped: the step running goes too, and nobody waits on the rest
            if self._current is not None:
                self._current.cancel()
            for step in self._steps:
                if step.done is not None:
                    _resolve(step.done)
            for waiter in self._waiters:
                _resolve(waiter)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """`run` on a task of its own for the time of the block."""
        task = asyncio.create_task(self.run(), name="speaker")
        try:
            yield
        finally:
            task.cancel()
            await asyncio.wait({task}, timeout=SHUTDOWN_WAIT)

    async def _run(self, step: _Step) -> None:
        task = self._current = asyncio.ensure_future(step.call())
        try:
            done, _ = await asyncio.wait({task}, timeout=step.timeout)
            if not done:
                _LOGGER.warning("The speaker did not answer within %.0f s", step.timeout)
                task.cancel()
            elif not task.cancelled() and task.exception() is not None:
                _LOGGER.error("Speaker step failed", exc_info=task.exception())
        finally:
            self._current = None
            if step.done is not None:
                _resolve(step.done)

    async def _play(self, pcm: bytes, fmt: AudioFormat, run: int) -> None:
        if not self._begun:
            self._begun = True
            if self.canceller is not None:
                self.canceller.take_stats()  # what was heard before this reply
        # Counted as it goes to the device: a stop drops what is still queued here.
        self.runs = max(self.runs, run + 1)
        self.seconds += len(pcm) / max(1, bytes_per_second(fmt))
        await self.sink.play(pcm, fmt)

    async def _finish(self, done: Callable[[], None]) -> None:
        try:
            await self.sink.drain()
        except Exception:
            _LOGGER.exception("The speaker failed while finishing")
        done()

    async def _sound(
        self, name: str, load: Callable[[], Awaitable[Sound]], done: Callable[[], None]
    ) -> None:
        try:
            pcm, fmt = await load()
            await self.sink.play(pcm, fmt)
            await self.sink.drain()
        except Exception:
            _LOGGER.exception("Cannot play the %s sound", name)
        done()

    # ---- the audio core's cut --------------------------------------------------------------

    @property
    def can_cut(self) -> bool:
        """The sink can be cut from the audio thread (audio/speaker.ContinuousSink)."""
        return getattr(self.sink, "cut", None) is not None

    def cut_now(self) -> bool:
        """On the audio thread: the turn policy said INTERRUPT on this frame. The rest of the
        reply is held back until the loop's own stop (or the reply's drain) catches up.
        Returns whether a reply was playing to cut (not one cut already)."""
        return bool(self.sink.cut(hold=True))  # type: ignore[attr-defined]

    def hold_now(self) -> bool:
        """On the audio thread: a voice over the reply, maybe (turn_policy.suspect): it pauses,
        keeping its audio. Returns whether a reply was playing to hold."""
        hold = getattr(self.sink, "hold", None)
        return bool(hold()) if hold is not None else False

    def release_now(self) -> None:
        """On the audio thread: the held reply plays on."""
        release = getattr(self.sink, "release", None)
        if release is not None:
            release()

    @property
    def cut_pending(self) -> bool:
        """The audio core cut a reply and the loop has not taken the cut yet."""
        return getattr(self.sink, "cut_at", None) is not None

    def take_cut(self) -> float | None:
        """When the audio core cut the reply (once); None if it did not."""
        take = getattr(self.sink, "take_cut", None)
        return take() if take is not None else None

    # ---- what was played -----------------------------------------------------------------

    @property
    def first_sample_at(self) -> float | None:
        """When the reply's first sample was heard (the device's own count)."""
        return self.sink.first_sample_at

    def echo(self) -> dict[str, float | None] | None:
        """The mic while the reply played, before and after the canceller (None: no AEC)."""
        return self.canceller.take_stats().as_dict() if self.canceller is not None else None


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class TurnTimer:
    """The one turn timer: numbers the turns, makes each one's clock, stamps what was played
    and writes the turn (one JSON line, timing.TimingLog)."""

    def __init__(self, log: TimingLog, mode: str, silence_ms: int, speculate_ms: int = 0) -> None:
        self.log = log
        self.mode = mode
        self.silence_ms = silence_ms
        self.speculate_ms = speculate_ms
        self.count = 0  # turns begun

    def next(self) -> int:
        """A turn begins (an utterance started, a run was asked for); returns its number."""
        self.count += 1
        return self.count

    def clock(self, speech_start: float | None = None) -> TurnClock:
        """A clock for the current turn (a speculative run and its whole turn share it)."""
        clock = TurnClock(self.count, self.mode, self.silence_ms, self.speculate_ms)
        if speech_start is not None:
            clock.mark("speech_start", speech_start)
        return clock

    def start(self) -> TurnClock:
        """`next` and its clock."""
        self.next()
        return self.clock()

    def played(self, clock: TurnClock, playback: Playback, at: float | None = None) -> None:
        """The reply has played out (or was stopped) at `at` (now)."""
        if playback.first_sample_at is not None:
            clock.mark_once("first_played", playback.first_sample_at)
        clock.mark("playback_done", at)
        echo = playback.echo()
        if echo is not None:
            clock.echo = echo

    def write(self, clock: TurnClock, unplayed: str | None = None) -> None:
        """The turn is over: its line. `unplayed`: its error if no reply played."""
        if unplayed is not None and clock.stamps["playback_done"] is None:
            clock.fail(unplayed)
        self.log.write(clock)

    def close(self) -> None:
        self.log.close()
