"""`wyoming-pivoice doctor`: checks what the Pi needs for snappy local voice, one line each.

Every check says OK, WARN (with the fix), FAIL (with the fix) or INFO (it cannot see
what it looks for here, e.g. no cpufreq inside a VM). The exit code is 1 when any
check FAILs, else 0, so scripts can gate on it without tripping on warnings.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from .doctor_audio import (
    AudioProbe,
    EchoChoice,
    check_audio,
    check_echo,
    probe_echo_canceller,
    probe_pyaudio,
)
from .doctor_base import Finding, Machine, Status
from .doctor_models import ModelChoice, check_models, memory_need
from .doctor_system import (
    LlamaBuild,
    check_desktop,
    check_governor,
    check_llama_cpu,
    check_memory,
    check_swap,
    check_temperature,
    check_throttling,
    check_zswap,
    probe_llama,
)
from .engines.remote_llm import RemoteLlmSettings
from .models import EMBEDDED

CHECKS = (
    "cpu-governor",
    "llm-cpu",
    "memory",
    "swap",
    "zswap",
    "desktop",
    "temperature",
    "throttling",
    "audio-devices",
    "capture-16k",
    "echo-cancellation",
    "model-asr",
    "model-voice",
    "model-llm",
    "model-vad",
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check this machine for local voice (governor, llama.cpp build, memory, swap, heat, "
        "audio, models)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument(
        "--root", type=Path, default=Path("/"), help="read sys/ and proc/ under this folder"
    )
    parser.add_argument("--no-audio", action="store_true", help="skip asking PortAudio")
    satellite = parser.add_argument_group("the satellite's options to check")
    satellite.add_argument("--no-aec", action="store_true")
    satellite.add_argument("--no-barge-in", action="store_true")
    models = parser.add_argument_group("the models to check (the server's options)")
    models.add_argument("--asr-model", default=EMBEDDED)
    models.add_argument("--voice", default=EMBEDDED)
    models.add_argument("--voice-dir", action="append", default=[])
    models.add_argument("--llm-model", default=EMBEDDED)
    remote = parser.add_argument_group("the remote LLM engine, if the server uses one")
    remote.add_argument("--llm-url", default=None)
    remote.add_argument("--llm-api-key", default=None, help="else $PIVOICE_LLM_API_KEY")
    remote.add_argument("--llm-remote-model", default=None)
    remote.add_argument("--llm-timeout", type=float, default=RemoteLlmSettings.timeout)
    parser.set_defaults(func=run)


def run_checks(
    machine: Machine,
    choice: ModelChoice,
    audio_probe: AudioProbe | None = probe_pyaudio,
    echo: EchoChoice | None = None,
    echo_probe: Callable[[], str | None] = probe_echo_canceller,
    llama_probe: Callable[[], LlamaBuild | str] = probe_llama,
) -> list[Finding]:
    """All findings, in CHECKS order; audio_probe None skips PortAudio."""
    model_findings = check_models(choice)
    need, detail = memory_need(model_findings)
    if audio_probe is None:
        skipped = "not asked (--no-audio)"
        audio = [
            Finding("audio-devices", Status.INFO, skipped),
            Finding("capture-16k", Status.INFO, skipped),
        ]
    else:
        audio = check_audio(audio_probe())
    findings = [
        check_governor(machine),
        check_llama_cpu(machine, llama_probe()),
        check_memory(machine, need, detail),
        check_swap(machine),
        check_zswap(machine),
        check_desktop(machine),
        check_temperature(machine),
        check_throttling(machine),
        *audio,
        check_echo(echo or EchoChoice(), echo_probe),
        *model_findings,
    ]
    return sorted(findings, key=lambda f: CHECKS.index(f.check))


def exit_code(findings: list[Finding]) -> int:
    return 1 if any(f.status is Status.FAIL for f in findings) else 0


def render_text(findings: list[Finding]) -> str:
    width = max(len(f.check) for f in findings)
    lines = []
    for finding in findings:
        line = f"{finding.status.value:<4}  {finding.check:<{width}}  {finding.message}"
        if finding.fix:
            line += f" — fix: {finding.fix}"
        lines.append(line)
    counts = {s: sum(f.status is s for f in findings) for s in Status}
    lines.append(", ".join(f"{n} {s.value}" for s, n in counts.items()))
    return "\n".join(lines)


def render_json(findings: list[Finding]) -> str:
    worst = max((f.status for f in findings), key=lambda s: s.rank)
    report = {"worst": worst.value, "checks": [f.as_dict() for f in findings]}
    return json.dumps(report, indent=2, ensure_ascii=False)


def run(args: argparse.Namespace) -> int:
    machine = Machine.local(args.root)
    choice = ModelChoice(
        asr=args.asr_model,
        voice=args.voice,
        voice_dirs=tuple(args.voice_dir),
        llm=args.llm_model,
    )
    echo = EchoChoice(aec=not args.no_aec, barge_in=not args.no_barge_in)
    findings = run_checks(machine, choice, None if args.no_audio else probe_pyaudio, echo)
    if args.llm_url:
        from .doctor_remote import check_remote_llm
        from .server.cli import remote_llm_from_args

        # Last, and only when asked: it talks to another machine (doctor_remote.py).
        findings.append(check_remote_llm(remote_llm_from_args(args)))  # type: ignore[arg-type]
    sys.stdout.write((render_json if args.json else render_text)(findings) + "\n")
    return exit_code(findings)
