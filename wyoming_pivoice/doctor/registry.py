"""Every doctor check, once, in report order: the CLI's listing, the run order and the
tests' names all come from REGISTRY.

A check runs on a Subject: what this run looks at, with each probe asked once (one
PortAudio probe gives two checks, the model files feed the memory check too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from ..engines.remote_llm import RemoteLlmSettings
from ..server.knowledge import KnowledgeSettings
from . import audio, knowledge, models, remote, system
from .audio import AudioProbe, EchoChoice, probe_echo_canceller, probe_pyaudio
from .base import Check, Finding, Machine, Status
from .models import ModelChoice
from .system import LlamaBuild, PriorityLimits, probe_llama, probe_priority


@dataclass
class Subject:
    """What one doctor run looks at."""

    machine: Machine
    models: ModelChoice = field(default_factory=ModelChoice)
    echo: EchoChoice = field(default_factory=EchoChoice)
    audio_probe: AudioProbe | None = probe_pyaudio  # None: not asked (--no-audio)
    echo_probe: Callable[[], str | None] = probe_echo_canceller
    llama_probe: Callable[[], LlamaBuild | str] = probe_llama
    priority_probe: Callable[[], PriorityLimits] = probe_priority
    remote_llm: RemoteLlmSettings | None = None  # None: the server runs its LLM itself
    knowledge: KnowledgeSettings | None = None  # None: no --knowledge

    @cached_property
    def audio(self) -> dict[str, Finding]:
        if self.audio_probe is None:
            skipped = "not asked (--no-audio)"
            return {c.name: c.finding(Status.INFO, skipped) for c in (audio.DEVICES, audio.CAPTURE)}
        return {f.check: f for f in audio.check_audio(self.audio_probe())}

    @cached_property
    def model_files(self) -> dict[str, Finding]:
        return {f.check: f for f in models.check_models(self.models)}


@dataclass(frozen=True)
class Entry:
    check: Check
    run: Callable[[Subject], Finding | None]  # None: not asked this time


def _memory(subject: Subject) -> Finding:
    need, detail = models.memory_need(list(subject.model_files.values()))
    return system.check_memory(subject.machine, need, detail)


def _remote(subject: Subject) -> Finding | None:
    # Only when asked, and last: it talks to another machine.
    if subject.remote_llm is None:
        return None
    return remote.check_remote_llm(subject.remote_llm)


def _knowledge(subject: Subject) -> Finding | None:
    return None if subject.knowledge is None else knowledge.check_knowledge(subject.knowledge)


def _audio(check: Check) -> Entry:
    return Entry(check, lambda subject: subject.audio[check.name])


def _model(check: Check) -> Entry:
    return Entry(check, lambda subject: subject.model_files[check.name])


REGISTRY: tuple[Entry, ...] = (
    Entry(system.GOVERNOR, lambda s: system.check_governor(s.machine)),
    Entry(system.LLAMA_CPU, lambda s: system.check_llama_cpu(s.machine, s.llama_probe())),
    Entry(system.MEMORY, _memory),
    Entry(system.SWAP, lambda s: system.check_swap(s.machine)),
    Entry(system.ZSWAP, lambda s: system.check_zswap(s.machine)),
    Entry(system.DESKTOP, lambda s: system.check_desktop(s.machine)),
    Entry(system.TEMPERATURE, lambda s: system.check_temperature(s.machine)),
    Entry(system.THROTTLING, lambda s: system.check_throttling(s.machine)),
    Entry(system.AUDIO_PRIORITY, lambda s: system.check_audio_priority(s.priority_probe())),
    _audio(audio.DEVICES),
    _audio(audio.CAPTURE),
    Entry(audio.ECHO, lambda s: audio.check_echo(s.echo, s.echo_probe)),
    _model(models.ASR),
    _model(models.VOICE),
    _model(models.LLM),
    _model(models.VAD),
    Entry(models.CATALOGUE, lambda _subject: models.check_catalogue()),
    Entry(knowledge.KNOWLEDGE, _knowledge),
    Entry(remote.REMOTE, _remote),
)
CHECKS: tuple[Check, ...] = tuple(entry.check for entry in REGISTRY)


def run_checks(subject: Subject) -> list[Finding]:
    """The findings of every check asked, in REGISTRY order."""
    findings = []
    for entry in REGISTRY:
        finding = entry.run(subject)
        if finding is not None:
            assert finding.check == entry.check.name, (finding.check, entry.check.name)
            findings.append(finding)
    return findings
