"""Builds `pivoice_aec3`: our binding (pivoice_aec3.cpp) compiled with the webrtc-audio-processing
1.3 source that rhasspy's webrtc-noise-gain 1.3.0 sdist bundles (AEC3, abseil), with that
sdist's own source lists and flags: its setup.py is run with setuptools.setup
captured, its binding swapped for ours. PIVOICE_WEBRTC_SRC names the unpacked sdist (build.sh
downloads, checks and unpacks it)."""

from __future__ import annotations

import os
import runpy
from pathlib import Path
from typing import Any

import setuptools
from pybind11 import get_include
from pybind11.setup_helpers import ParallelCompile, naive_recompile
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


def _their_setup(src: Path) -> dict[str, Any]:
    captured: dict[str, Any] = {}
    real = setuptools.setup
    setuptools.setup = lambda **kw: captured.update(kw)  # type: ignore[assignment]
    try:
        runpy.run_path(str(src / "setup.py"), run_name="webrtc_noise_gain_setup")
    finally:
        setuptools.setup = real
    return captured


def _extension() -> setuptools.Extension:
    src = os.environ.get("PIVOICE_WEBRTC_SRC")
    if not src or not (Path(src) / "setup.py").is_file():
        raise SystemExit(
            "PIVOICE_WEBRTC_SRC must name an unpacked webrtc_noise_gain-1.3.0 sdist: "
            "run native/aec3/build.sh"
        )
    theirs = _their_setup(Path(src))
    (ext,) = theirs["ext_modules"]
    sources = [s for s in ext.sources if not s.endswith("webrtc_noise_gain_cpp.cpp")]
    ours = setuptools.Extension(
        name="pivoice_aec3",
        language="c++",
        sources=[str(HERE / "pivoice_aec3.cpp"), *sources],
        # pybind11 does not build against the limited API their binding uses.
        define_macros=[m for m in ext.define_macros if m[0] != "Py_LIMITED_API"],
        # Python's CFLAGS ask for debug info (-g): nobody debugs this build, it only costs time.
        extra_compile_args=[*ext.extra_compile_args, "-g0"],
        include_dirs=[*ext.include_dirs, get_include()],
        libraries=ext.libraries,
    )
    return ours


class BuildExt(build_ext):
    """C++17 for the C++ sources only, as their setup.py does (its own compiler subclass no
    longer passes setuptools' checks: "run() must precede build_extension()")."""

    def build_extensions(self) -> None:
        compile_one = self.compiler._compile

        def _compile(obj, src, ext, cc_args, extra_postargs, pp_opts):  # type: ignore[no-untyped-def]
            if os.path.splitext(src)[1] in (".cc", ".cpp", ".cxx"):
                cc_args = [*cc_args, "-std=c++17"]
            compile_one(obj, src, ext, cc_args, extra_postargs, pp_opts)

        self.compiler._compile = _compile
        super().build_extensions()


# ~250 translation units: one compiler per core (PIVOICE_AEC3_JOBS to set another number);
# a rebuild in the same tree compiles only what is newer than its object (our binding).
ParallelCompile("PIVOICE_AEC3_JOBS", default=0, needs_recompile=naive_recompile).install()
extension = _extension()
setuptools.setup(
    ext_modules=[extension], cmdclass={"build_ext": BuildExt}, packages=[], py_modules=[]
)
