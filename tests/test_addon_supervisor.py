"""The add-on validated by the Home Assistant Supervisor's own code, not a port of it.

The Supervisor is no package on PyPI: its source comes from $PIVOICE_SUPERVISOR_SRC (a git
directory or a source tree, e.g. a clone of home-assistant/supervisor), else the copy the
search tool's `fetch` leaves in /work/.mirror; without one the test is skipped. It needs
Python 3.14, for one piece of syntax only (PEP 758: `except A, B:` unparenthesized), so the
copy under test gets the parentheses back and runs on this Python, in a venv of its own with
the Supervisor's pins for the modules its validators import (made once, then cached).

Checked: config.yaml passes SCHEMA_APP_CONFIG with no key dropped and no warning; the default
options pass the schema (AppOptions) and bad ones are refused; every option is translated;
repository.yaml passes SCHEMA_REPOSITORY_CONFIG.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import venv
from io import BytesIO
from pathlib import Path

import pytest
import yaml

from .helpers import ADDON, REPO

pytestmark = pytest.mark.slow  # a venv of its own, the first time

MIRROR = Path("/work/.mirror/home-assistant+supervisor/repo")
# The modules supervisor.apps.validate, .options and store.validate import, at the
# Supervisor's pins (requirements.txt) where it pins them.
NEEDS = [
    "voluptuous", "awesomeversion", "aiohttp", "aiodns", "ciso8601", "atomicwrites-homeassistant",
    "orjson", "PyYAML", "pyudev", "sentry-sdk", "gitpython",
]  # fmt: skip
VALIDATE = Path(__file__).parent / "fixtures" / "addon" / "supervisor_validate.py"


def supervisor_source(into: Path) -> str:
    """The Supervisor's `supervisor/` package and requirements.txt in `into`; its version."""
    source = Path(os.environ.get("PIVOICE_SUPERVISOR_SRC", MIRROR))
    if (source / "supervisor" / "apps").is_dir() or (source / "supervisor" / "addons").is_dir():
        shutil.copytree(source / "supervisor", into / "supervisor")
        shutil.copy(source / "requirements.txt", into / "requirements.txt")
        return "tree"
    if not (source / "HEAD").is_file():
        pytest.skip(f"no Supervisor source at {source} (set PIVOICE_SUPERVISOR_SRC)")
    git = ["git", f"--git-dir={source}"]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    archive = subprocess.run(
        [*git, "archive", "HEAD", "supervisor", "requirements.txt"], capture_output=True, check=True
    )
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return commit.stdout.strip()


def parenthesize_excepts(tree: Path) -> None:
    """PEP 758 (3.14) `except A, B:` → `except (A, B):`, which every Python 3 reads."""
    pattern = re.compile(r"^(\s*)except ([A-Za-z_][\w.]*(?:, [A-Za-z_][\w.]*)+)( as \w+)?:", re.M)
    for path in tree.rglob("*.py"):
        text = path.read_text()
        fixed = pattern.sub(lambda m: f"{m[1]}except ({m[2]}){m[3] or ''}:", text)
        if fixed != text:
            path.write_text(fixed)


def supervisor_venv(requirements: Path) -> Path:
    pins = {}
    for line in requirements.read_text().splitlines():
        if "==" in line:
            name, version = line.split("==", 1)
            pins[name.strip().lower()] = version.strip()
    wanted = [f"{n}=={pins[n.lower()]}" if n.lower() in pins else n for n in NEEDS]
    key = hashlib.sha256(" ".join(sorted(wanted)).encode()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    folder = cache / "wyoming-pivoice" / f"supervisor-venv-{key}"
    python = folder / "bin" / "python"
    if not (folder / ".done").exists():
        shutil.rmtree(folder, ignore_errors=True)
        venv.create(folder, with_pip=True)
        done = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *wanted],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            pytest.skip(f"the Supervisor's modules did not install: {done.stderr[-300:]}")
        (folder / ".done").write_text("\n".join(wanted))
    return python


def test_the_supervisor_accepts_the_add_on(tmp_path: Path) -> None:
    source = supervisor_source(tmp_path)
    parenthesize_excepts(tmp_path / "supervisor")
    python = supervisor_venv(tmp_path / "requirements.txt")
    done = subprocess.run(
        [str(python), str(VALIDATE), str(REPO)],
        capture_output=True, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"Supervisor {source}: {done.stderr[-2000:]}"
    said = json.loads(done.stdout)
    config = yaml.safe_load((ADDON / "config.yaml").read_text())
    assert said["dropped"] == [], said  # a key the Supervisor does not know is lost silently
    assert said["warnings"] == [], said  # e.g. a deprecated field or arch
    assert said["options"] == sorted(config["options"])
    assert {"arch", "slug", "ports", "asr_beam_size", "log_level", "llm_url"} <= set(
        said["rejected"]
    ), said["rejected"]
    assert said["translated"] == sorted(config["schema"])
    assert said["repository"]["name"] == "Pi Voice add-ons"
