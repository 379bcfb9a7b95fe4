"""doctor's `llm-cpu` check: the CPU features the loaded llama.cpp uses, against the CPU's."""

from __future__ import annotations

from pathlib import Path

import pytest

from wyoming_pivoice.doctor.base import Machine, Status
from wyoming_pivoice.doctor.system import LlamaBuild, check_llama_cpu, cpu_flags, probe_llama

PI5_CPUINFO = Path(__file__).parent / "fixtures" / "cpuinfo-pi5"
# What llama.cpp 0.3.36 reports when GCC 12 built it for plain armv8-a (GGML_NATIVE=OFF, no
# GGML_CPU_ARM_ARCH), and when built with -march=armv8.2-a+dotprod+fp16.
GENERIC_ARM = "CPU : NEON = 1 | ARM_FMA = 1 | OPENMP = 1 | REPACK = 1 | "
PI5_ARM = "CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | DOTPROD = 1 | OPENMP = 1 | REPACK = 1 | "
X86_PORTABLE = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "


def machine_with_cpuinfo(tmp_path: Path, text: str | None) -> Machine:
    if text is not None:
        (tmp_path / "proc").mkdir(parents=True, exist_ok=True)
        (tmp_path / "proc" / "cpuinfo").write_text(text)
    return Machine(root=tmp_path)


def test_generic_arm_build_on_a_pi5_warns_with_the_rebuild(tmp_path: Path) -> None:
    machine = machine_with_cpuinfo(tmp_path, PI5_CPUINFO.read_text())
    finding = check_llama_cpu(machine, LlamaBuild("0.3.36", GENERIC_ARM))
    assert finding.status is Status.WARN
    assert finding.data["unused"] == ["DOTPROD", "FP16_VA"]
    assert finding.data["used"] == ["ARM_FMA", "NEON", "OPENMP", "REPACK"]
    assert "this CPU also has DOTPROD, FP16_VA" in finding.message
    assert "script/setup" in finding.fix and "armv8.2-a+dotprod+fp16" in finding.fix


def test_pi5_build_on_a_pi5_is_ok(tmp_path: Path) -> None:
    machine = machine_with_cpuinfo(tmp_path, PI5_CPUINFO.read_text())
    finding = check_llama_cpu(machine, LlamaBuild("0.3.36", PI5_ARM))
    assert finding.status is Status.OK, finding.message
    assert "DOTPROD" in finding.message and "FP16_VA" in finding.message


def test_x86_portable_build_warns_only_where_the_cpu_has_more(tmp_path: Path) -> None:
    avx2 = "processor\t: 0\nflags\t\t: fpu sse sse2 pni ssse3 fma avx f16c bmi2 avx2\n"
    assert cpu_flags(machine_with_cpuinfo(tmp_path / "a", avx2)) is not None
    ok = check_llama_cpu(
        machine_with_cpuinfo(tmp_path / "a", avx2), LlamaBuild("0.3.36", X86_PORTABLE)
    )
    assert ok.status is Status.OK
    avx512 = avx2.rstrip("\n") + " avx512f avx512_vnni\n"
    warn = check_llama_cpu(
        machine_with_cpuinfo(tmp_path / "b", avx512), LlamaBuild("0.3.36", X86_PORTABLE)
    )
    assert warn.status is Status.WARN
    assert warn.data["unused"] == ["AVX512", "AVX512_VNNI"]
    assert "GGML_NATIVE=ON" in warn.fix and "llama-cpp-python==0.3.36" in warn.fix


def test_unreadable_cpuinfo_is_info(tmp_path: Path) -> None:
    finding = check_llama_cpu(machine_with_cpuinfo(tmp_path, None), LlamaBuild("0.3.36", PI5_ARM))
    assert finding.status is Status.INFO
    assert "DOTPROD" in finding.message


def test_a_library_that_does_not_load_fails(tmp_path: Path) -> None:
    finding = check_llama_cpu(machine_with_cpuinfo(tmp_path, None), "OSError: libgomp.so.1")
    assert finding.status is Status.FAIL
    assert "libgomp.so.1" in finding.message and finding.fix


def test_the_loaded_llama_on_this_machine() -> None:
    """The real library and /proc/cpuinfo: x86-64 keeps its portable AVX2 build."""
    build = probe_llama()
    assert isinstance(build, LlamaBuild), build
    finding = check_llama_cpu(Machine(), build)
    assert finding.status in (Status.OK, Status.WARN), finding.message
    flags = cpu_flags(Machine())
    if flags is None:
        pytest.skip("no /proc/cpuinfo")
    family, have = flags
    if family == "x86" and "avx2" in have:
        assert {"AVX", "AVX2", "FMA", "F16C"} <= build.features
