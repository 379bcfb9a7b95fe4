"""Audio devices as PortAudio (pyaudio) sees them, and whether 16 kHz mono capture opens.

Whisper and Silero VAD want 16 kHz mono; a microphone that cannot open at 16 kHz
makes the satellite resample every chunk.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..audio.format import RATE
from .base import Check, Finding, Status

DEVICES = Check("audio-devices", "the microphones and speakers PortAudio sees")
CAPTURE = Check("capture-16k", "whether the microphone opens 16 kHz mono")
ECHO = Check("echo-cancellation", "whether WebRTC's echo canceller loads")

CAPTURE_RATE = RATE
CAPTURE_FIX = (
    "capture through ALSA's plug layer or the sound server, e.g. "
    "--mic-command 'arecord -D plughw:CARD=X,DEV=0 -r 16000 -c 1 -f S16_LE -t raw'"
)


@dataclass(frozen=True)
class AudioDevice:
    index: int
    name: str
    inputs: int
    outputs: int
    default_rate: float
    capture_16k: bool | None = None  # None: not an input, not tried


@dataclass(frozen=True)
class AudioReport:
    devices: list[AudioDevice] = field(default_factory=list)
    default_input: int | None = None
    default_output: int | None = None
    error: str | None = None  # PortAudio could not be asked at all


AudioProbe = Callable[[], AudioReport]


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """ALSA and JACK print pages of probing noise on fd 2 while PortAudio starts."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def probe_pyaudio() -> AudioReport:
    try:
        import pyaudio
    except ImportError as err:
        return AudioReport(error=f"pyaudio is not installed ({err})")
    with _quiet_stderr():
        audio = pyaudio.PyAudio()
    try:
        devices = []
        for index in range(audio.get_device_count()):
            info = audio.get_device_info_by_index(index)
            inputs = int(info.get("maxInputChannels", 0))
            capture = None
            if inputs > 0:
                try:
                    with _quiet_stderr():
                        capture = bool(
                            audio.is_format_supported(
                                CAPTURE_RATE,
                                input_device=index,
                                input_channels=1,
                                input_format=pyaudio.paInt16,
                            )
                        )
                except ValueError:
                    capture = False  # PortAudio raises for an unsupported format
            devices.append(
                AudioDevice(
                    index=index,
                    name=str(info.get("name", index)),
                    inputs=inputs,
                    outputs=int(info.get("maxOutputChannels", 0)),
                    default_rate=float(info.get("defaultSampleRate", 0)),
                    capture_16k=capture,
                )
            )
        return AudioReport(
            devices=devices,
            default_input=_default_index(audio.get_default_input_device_info),
            default_output=_default_index(audio.get_default_output_device_info),
        )
    finally:
        audio.terminate()


def _default_index(getter: Callable[[], dict]) -> int | None:
    try:
        return int(getter()["index"])
    except (OSError, KeyError):
        return None  # "No Default Input Device Available"


def check_audio(report: AudioReport) -> list[Finding]:
    if report.error:
        cannot = f"cannot ask PortAudio: {report.error}"
        return [
            DEVICES.finding(Status.INFO, cannot),
            CAPTURE.finding(Status.INFO, cannot),
        ]
    inputs = [d for d in report.devices if d.inputs > 0]
    outputs = [d for d in report.devices if d.outputs > 0]
    data = {
        "devices": [d.__dict__ for d in report.devices],
        "default_input": report.default_input,
        "default_output": report.default_output,
    }
    if not report.devices:
        devices = DEVICES.finding(
            Status.INFO,
            "no audio devices: fine for the server alone; the satellite needs a microphone and "
            "a speaker (or --mic-command/--snd-command)",
            data=data,
        )
    elif not inputs or not outputs:
        missing = "microphone" if not inputs else "speaker"
        devices = DEVICES.finding(
            Status.WARN,
            f"{len(inputs)} capture and {len(outputs)} playback devices: no {missing} for the "
            "satellite",
            fix=f"plug in a {missing} (USB or HAT) and check it with "
            + ("arecord -l" if not inputs else "aplay -l"),
            data=data,
        )
    else:
        devices = DEVICES.finding(
            Status.OK,
            f"{len(inputs)} capture and {len(outputs)} playback devices; default input "
            f"{_name(report, report.default_input)}, output {_name(report, report.default_output)}",
            data=data,
        )
    return [devices, _check_capture(report, inputs)]


def _name(report: AudioReport, index: int | None) -> str:
    device = next((d for d in report.devices if d.index == index), None)
    return repr(device.name) if device else "none"


def _check_capture(report: AudioReport, inputs: list[AudioDevice]) -> Finding:
    if not inputs:
        return CAPTURE.finding(Status.INFO, "no capture device to try 16 kHz mono on")
    device = next((d for d in inputs if d.index == report.default_input), inputs[0])
    data = {"device": device.name, "index": device.index, "default_rate": device.default_rate}
    if device.capture_16k:
        return CAPTURE.finding(
            Status.OK,
            f"{device.name!r} opens 16 kHz mono 16-bit directly",
            data=data,
        )
    return CAPTURE.finding(
        Status.WARN,
        f"{device.name!r} does not open 16 kHz mono 16-bit (it runs at "
        f"{device.default_rate:.0f} Hz): every chunk must be resampled",
        fix=CAPTURE_FIX,
        data=data,
    )


# ---- echo cancellation ----------------------------------------------------------------------

AEC_FIX = (
    "reinstall the satellite's dependencies (script/setup: the `livekit` wheel carries WebRTC's "
    "echo canceller), or run the satellite with --no-barge-in"
)


@dataclass(frozen=True)
class EchoChoice:
    """The satellite's options that decide whether it can hear itself."""

    aec: bool = True
    barge_in: bool = True


def probe_echo_canceller() -> str | None:
    """None when WebRTC's AEC3 loads here and cancels a frame; else why not."""
    try:
        from ..audio.echo import EchoCanceller
        from ..satellite.settings import EchoSettings

        canceller = EchoCanceller(EchoSettings())
        canceller.process(bytes(1024), 0.0)
    except Exception as err:  # ImportError, OSError from the native library, …
        return f"{type(err).__name__}: {err}"
    return None


def check_echo(choice: EchoChoice, probe: Callable[[], str | None]) -> Finding:
    data: dict[str, Any] = {"aec": choice.aec, "barge_in": choice.barge_in}
    if not choice.aec:
        if choice.barge_in:
            return ECHO.finding(
                Status.WARN,
                "off (--no-aec) while barge-in is on: where the microphone hears the speaker, "
                "the satellite stops its own replies and answers its own voice",
                fix="drop --no-aec, or add --no-barge-in where the mic cannot hear the speaker",
                data=data,
            )
        return ECHO.finding(
            Status.INFO,
            "off (--no-aec): fine only where the microphone cannot hear the speaker",
            data=data,
        )
    error = probe()
    if error is not None:
        data["error"] = error
        return ECHO.finding(
            Status.WARN if choice.barge_in else Status.INFO,
            f"WebRTC's echo canceller cannot load here ({error}): the satellite runs without it"
            + (" and barge-in will hear the satellite's own replies" if choice.barge_in else ""),
            fix=AEC_FIX,
            data=data,
        )
    return ECHO.finding(
        Status.OK,
        "active: WebRTC AEC3 takes the satellite's own playback (whatever speaker or command "
        "plays it) out of the microphone",
        data=data,
    )
