"""`wyoming-pivoice doctor`: checks what the Pi needs for snappy local voice, one line each.

Every check says OK, WARN (with the fix), FAIL (with the fix) or INFO (it cannot see
what it looks for here, e.g. no cpufreq inside a VM). The exit code is 1 when any
check FAILs, else 0, so scripts can gate on it without tripping on warnings.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .. import options
from ..engines.remote_llm import RemoteLlmSettings
from ..satellite.settings import SatelliteSettings
from ..server.knowledge import KnowledgeSettings, default_index
from ..settings import ServerSettings
from .audio import EchoChoice, probe_pyaudio
from .base import Finding, Machine, Status
from .models import ModelChoice
from .registry import CHECKS, Subject, run_checks


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check this machine for local voice (governor, llama.cpp build, memory, swap, heat, "
        "audio, models)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="checks, in report order: "
        + "; ".join(f"{check.name} ({check.about})" for check in CHECKS),
    )
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument(
        "--root", type=Path, default=Path("/"), help="read sys/ and proc/ under this folder"
    )
    parser.add_argument("--no-audio", action="store_true", help="skip asking PortAudio")
    # The same flags as the server's and the satellite's, made from the same fields.
    checked = (
        ("the satellite's options to check", SatelliteSettings, ("--no-aec", "--no-barge-in")),
        (
            "the models to check (the server's options)",
            ServerSettings,
            ("--asr-model", "--voice", "--voice-dir", "--llm-model", "--data-dir"),
        ),
        (
            "the remote LLM engine, if the server uses one",
            RemoteLlmSettings,
            ("--llm-url", "--llm-api-key", "--llm-remote-model", "--llm-timeout"),
        ),
        (
            "local knowledge, if the server uses it",
            KnowledgeSettings,
            ("--knowledge", "--knowledge-index"),
        ),
    )
    for title, settings, flags in checked:
        options.add_arguments(parser, settings, only=flags, group=title)
    parser.set_defaults(func=run)


def _knowledge(args: argparse.Namespace) -> KnowledgeSettings | None:
    if args.knowledge is None:
        return None
    index = args.knowledge_index or default_index(args.knowledge)
    return KnowledgeSettings(folder=args.knowledge, index=index)


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
    remote_llm = None
    if args.llm_url:
        from ..server.cli import remote_llm_from_args

        remote_llm = remote_llm_from_args(args)
    subject = Subject(
        machine=Machine.local(args.root),
        models=ModelChoice(
            asr=args.asr_model,
            voice=args.voice,
            voice_dirs=tuple(args.voice_dir),
            llm=args.llm_model,
            data_dir=args.data_dir,
        ),
        echo=EchoChoice(aec=not args.no_aec, barge_in=not args.no_barge_in),
        audio_probe=None if args.no_audio else probe_pyaudio,
        remote_llm=remote_llm,
        knowledge=_knowledge(args),
    )
    findings = run_checks(subject)
    sys.stdout.write((render_json if args.json else render_text)(findings) + "\n")
    return exit_code(findings)
