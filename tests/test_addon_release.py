"""The release the add-on image installs: addon/release/ holds a wheel of one commit of this
repository (script/build-addon), because the Supervisor builds the image from the add-on
folder of its clone alone and the package is on no index.

Checked here: the wheel is config.yaml's version (the Dockerfile installs it by that name),
SHA256SUMS is its hash (the image build checks it), and every file of the package in the
wheel is byte for byte that file at the SOURCE commit.
"""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
import yaml

from .helpers import ADDON, REPO

RELEASE = ADDON / "release"


def version() -> str:
    return str(yaml.safe_load((ADDON / "config.yaml").read_text())["version"])


def wheel() -> Path:
    return RELEASE / f"wyoming_pivoice-{version()}-py3-none-any.whl"


def git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, check=False)


def test_the_release_is_this_version_and_its_hash_is_pinned() -> None:
    path = wheel()
    assert path.is_file(), f"no {path.name}: run script/build-addon and commit addon/release/"
    assert sorted(p.name for p in RELEASE.iterdir()) == sorted(["SHA256SUMS", "SOURCE", path.name])
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert (RELEASE / "SHA256SUMS").read_text() == f"{digest}  {path.name}\n"
    with zipfile.ZipFile(path) as archive:
        [metadata] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(archive.read(metadata).decode())
    assert meta["Name"] == "wyoming-pivoice" and meta["Version"] == version()
    dockerfile = (ADDON / "Dockerfile").read_text()
    assert "sha256sum --check --strict SHA256SUMS" in dockerfile
    assert (
        "file:///tmp/addon/release/wyoming_pivoice-${BUILD_VERSION}-py3-none-any.whl" in dockerfile
    )


def test_the_release_is_the_source_commit() -> None:
    commit = (RELEASE / "SOURCE").read_text().strip()
    assert len(commit) == 40
    if git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        shallow = git("rev-parse", "--is-shallow-repository").stdout.strip() == b"true"
        if shallow:
            pytest.skip(f"a shallow clone: {commit[:12]} is not in its history")
        pytest.fail(f"{commit[:12]} is not in this history: run script/build-addon again")
    with zipfile.ZipFile(wheel()) as archive:
        names = [n for n in archive.namelist() if n.startswith("wyoming_pivoice/")]
        assert "wyoming_pivoice/__main__.py" in names
        for name in names:
            source = git("show", f"{commit}:{name}")
            assert source.returncode == 0, f"{name} is not in {commit[:12]}"
            assert archive.read(name) == source.stdout, f"{name} differs from {commit[:12]}"
    listed = git("ls-tree", "-r", "--name-only", commit, "wyoming_pivoice/").stdout.decode()
    packaged = {n for n in listed.split() if n.endswith(".py")}
    assert packaged <= set(names), packaged - set(names)
    # The version the commit itself declares.
    init = git("show", f"{commit}:wyoming_pivoice/__init__.py").stdout.decode()
    assert f'__version__ = "{version()}"' in init
