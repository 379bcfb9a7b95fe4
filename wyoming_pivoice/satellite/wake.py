"""A local wake word with microWakeWord (pymicro-wakeword: TFLite models shipped in its wheel)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


class WakeWordError(ValueError):
    """A wake word we cannot load."""


def wake_key(name: str) -> str:
    """A wake word's name as models and Home Assistant spell it: "Okay Nabu" → okay_nabu."""
    return name.strip().lower().replace(" ", "_").replace("-", "_")


def builtin_names() -> list[str]:
    try:
        from pymicro_wakeword import Model
    except ImportError:
        return []
    return [model.value for model in Model]


class WakeWord:
    """Detects one wake word in 16 kHz mono s16le chunks.

    `name` is a built-in model (okay_nabu, hey_jarvis, hey_mycroft, alexa; spaces and
    dashes are accepted too) or the path of a microWakeWord JSON config. `detect` is
    blocking (a TFLite call per 10 ms); `async_detect` runs it on a worker thread.
    """

    def __init__(self, name: str) -> None:
        try:
            from pymicro_wakeword import MicroWakeWord, MicroWakeWordFeatures, Model
        except ImportError as err:
            raise WakeWordError(
                "--wake-word needs pymicro-wakeword (pip install pymicro-wakeword)"
            ) from err
        if name.endswith(".json") and Path(name).is_file():
            self._model = MicroWakeWord.from_config(name)
        else:
            try:
                model = Model(wake_key(name))
            except ValueError:
                raise WakeWordError(
                    f"unknown wake word {name!r}: use one of {', '.join(builtin_names())} "
                    "or the path of a microWakeWord .json config"
                ) from None
            self._model = MicroWakeWord.from_builtin(model)
        self.name = name
        self.phrase: str = self._model.wake_word
        self._features = MicroWakeWordFeatures()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="pivoice wake")

    def detect(self, chunk: bytes) -> bool:
        detected = False
        for features in self._features.process_streaming(chunk):
            if self._model.process_streaming(features):
                detected = True
        return detected

    async def async_detect(self, chunk: bytes) -> bool:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self.detect, chunk)

    def reset(self) -> None:
        """Forget the audio so far (after a detection, so one word fires once)."""
        self._model.reset()
        self._features.reset()

    async def async_reset(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self.reset)

    def close(self) -> None:
        self._executor.shutdown(wait=False)
