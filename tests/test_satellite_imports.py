"""The satellite loads no model runtime it does not use, and nothing of the server.

Read from `sys.modules` as the process exits (`-X importtime` misses what
`importlib.import_module` loads, which is how the CLI finds its subcommand).
"""

from __future__ import annotations

import subprocess
import sys

# Runtimes only the server uses (Silero's onnxruntime is the satellite's own, loaded with
# the VAD when it starts listening), and the server itself.
SERVER_ONLY = (
    "faster_whisper",
    "ctranslate2",
    "llama_cpp",
    "piper",
    "wyoming_pivoice.server",
    "wyoming_pivoice.engines.asr",
    "wyoming_pivoice.engines.llm",
    "wyoming_pivoice.engines.tts",
    "pivoice_lab",
)


_DUMP = """
import atexit, runpy, sys
atexit.register(lambda: print("MODULES", *sorted(sys.modules), file=sys.stderr))
{code}
"""


def imported(code: str) -> set[str]:
    """The modules a fresh interpreter has imported once `code` has run (or exited)."""
    proc = subprocess.run(
        [sys.executable, "-c", _DUMP.format(code=code)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    dump = [line for line in proc.stderr.splitlines() if line.startswith("MODULES ")]
    assert dump, proc.stderr
    return set(dump[-1].split()[1:])


def loaded(modules: set[str], *names: str) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def test_satellite_help_imports_no_engine() -> None:
    modules = imported(
        'sys.argv = ["wyoming-pivoice", "satellite", "--help"]\n'
        'runpy.run_module("wyoming_pivoice", run_name="__main__")'
    )
    assert "wyoming_pivoice.satellite.cli" in modules
    assert loaded(modules, *SERVER_ONLY, "onnxruntime", "wyoming_pivoice.engines") == []


def test_satellite_modules_import_no_server_runtime() -> None:
    """Both modes' code, standalone and Home Assistant: Silero's runtime at most."""
    modules = imported(
        "import wyoming_pivoice.satellite.standalone.pipeline, "
        "wyoming_pivoice.satellite.ha.adapter, wyoming_pivoice.satellite.cli, "
        "wyoming_pivoice.startup",
    )
    assert "wyoming_pivoice.satellite.listener" in modules
    assert loaded(modules, *SERVER_ONLY) == []
