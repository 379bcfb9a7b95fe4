"""Checks of the Pi itself, read from /sys and /proc (and vcgencmd where present).

These are the knobs the source write-ups tuned by hand: the CPU governor, swap and
zswap, a desktop session eating memory, heat and throttling, and free memory for
the models; and whether the loaded llama.cpp was built for this CPU's features.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from .base import MIB, Check, Finding, Machine, Status, mib, read_text

GOVERNOR = Check("cpu-governor", "the CPU frequency governor")
LLAMA_CPU = Check("llm-cpu", "whether llama.cpp was built for this CPU's features")
MEMORY = Check("memory", "memory for the models")
SWAP = Check("swap", "swap space")
ZSWAP = Check("zswap", "compressed swap in memory")
DESKTOP = Check("desktop", "a desktop session taking memory")
TEMPERATURE = Check("temperature", "the SoC temperature")
THROTTLING = Check("throttling", "the firmware's throttling and under-voltage flags")

GOVERNOR_FIX = "echo performance | sudo tee /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor"
GOVERNOR_KEEP = (
    "to keep it after a reboot add cpufreq.default_governor=performance to the kernel command line"
)
# Raspberry Pi OS sizes its swap file with dphys-swapfile; elsewhere (Ubuntu) a plain file.
DPHYS_SWAP_FIX = (
    "sudo dphys-swapfile swapoff && sudo sed -i 's/^#*CONF_SWAPSIZE=.*/CONF_SWAPSIZE=2048/' "
    "/etc/dphys-swapfile && sudo dphys-swapfile setup && sudo dphys-swapfile swapon"
)
FILE_SWAP_FIX = (
    "sudo fallocate -l 2G /swapfile && sudo chmod 600 /swapfile && sudo mkswap /swapfile && "
    "sudo swapon /swapfile && echo '/swapfile none swap sw 0 0' | sudo tee -a /etc/fstab"
)
ZSWAP_FIX = (
    "echo 1 | sudo tee /sys/module/zswap/parameters/enabled "
    "(to keep it: add zswap.enabled=1 to /boot/firmware/cmdline.txt)"
)
DESKTOP_FIX = (
    "boot to the console: sudo systemctl set-default multi-user.target && sudo reboot "
    "(or raspi-config → System Options → Boot / Auto Login → Console)"
)
COOLING_FIX = "fit the Active Cooler (or a fan and heatsink) and keep the case ventilated"
POWER_FIX = "use the official 27 W USB-C supply (5.1 V, 5 A) and a short, thick cable"

MIN_SWAP_BYTES = 1024 * MIB  # below this a model that outgrows RAM still gets killed
THROTTLE_CELSIUS = 80.0  # the Pi 5 firmware slows the clock from here (soft limit), hard at 85 °C
WARM_CELSIUS = 70.0

# Processes of a graphical session, as /proc/PID/comm shows them (15 characters at most).
DESKTOP_PROCESSES = frozenset(
    {
        "Xorg",
        "Xwayland",
        "lxsession",
        "lxpanel",
        "wayfire",
        "labwc",
        "wf-panel-pi",
        "pcmanfm",
        "gnome-shell",
        "kwin_wayland",
        "kwin_x11",
        "plasmashell",
        "xfce4-session",
        "lightdm",
        "gdm3",
        "sddm",
    }
)

# Bits of `vcgencmd get_throttled` (Raspberry Pi firmware).
THROTTLE_BITS = {
    0: "under-voltage now",
    1: "ARM frequency capped now",
    2: "throttled now",
    3: "soft temperature limit now",
    16: "under-voltage since boot",
    17: "ARM frequency capped since boot",
    18: "throttled since boot",
    19: "soft temperature limit since boot",
}
UNDER_VOLTAGE_BITS = {0, 16}


def check_governor(machine: Machine) -> Finding:
    governors: dict[str, str] = {}
    for path in machine.glob("sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor"):
        value = read_text(path)
        if value:
            governors[path.parent.parent.name] = value
    if not governors:
        return GOVERNOR.finding(
            Status.INFO,
            "cannot see a CPU frequency governor (no cpufreq in /sys: a VM, a container, "
            "or a fixed clock)",
        )
    slow = {cpu: gov for cpu, gov in governors.items() if gov != "performance"}
    data = {"governors": governors}
    if not slow:
        return GOVERNOR.finding(Status.OK, f"performance on all {len(governors)} CPUs", data=data)
    kinds = ", ".join(sorted(set(slow.values())))
    return GOVERNOR.finding(
        Status.WARN,
        f"{kinds} on {len(slow)} of {len(governors)} CPUs: the clock rises only after work "
        "starts, which delays the first words of a reply",
        fix=f"{GOVERNOR_FIX} ({GOVERNOR_KEEP})",
        data=data,
    )


def meminfo(machine: Machine) -> dict[str, int]:
    """/proc/meminfo in bytes."""
    values: dict[str, int] = {}
    for line in (machine.read("proc/meminfo") or "").splitlines():
        match = re.match(r"(\w+):\s+(\d+)(?:\s+kB)?", line)
        if match:
            values[match.group(1)] = int(match.group(2)) * 1024
    return values


def processes(machine: Machine) -> list[tuple[int, str, str]]:
    """(pid, comm, cmdline) of every process visible in /proc."""
    found = []
    for entry in machine.glob("proc/[0-9]*"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        comm = read_text(entry / "comm")
        if comm is None:
            continue  # gone meanwhile, or not a process
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            raw = b""
        found.append((pid, comm, raw.replace(b"\0", b" ").decode(errors="replace").strip()))
    return found


def rss_bytes(machine: Machine, pid: int) -> int:
    match = re.search(r"VmRSS:\s+(\d+)", machine.read(f"proc/{pid}/status") or "")
    return int(match.group(1)) * 1024 if match else 0


def running_servers(machine: Machine) -> list[int]:
    """PIDs of `wyoming-pivoice server` processes other than this one."""
    me = os.getpid()
    return [
        pid
        for pid, _comm, cmdline in processes(machine)
        if pid != me and re.search(r"wyoming[-_]pivoice\S*\s+(?:--\S+\s+\S+\s+)*server\b", cmdline)
    ]


def check_memory(machine: Machine, need_bytes: int, need_detail: str) -> Finding:
    info = meminfo(machine)
    if "MemTotal" not in info:
        return MEMORY.finding(Status.INFO, "cannot read /proc/meminfo")
    total = info["MemTotal"]
    available = info.get("MemAvailable", info.get("MemFree", 0))
    swap_free = info.get("SwapFree", 0)
    data: dict[str, Any] = {
        "total_bytes": total,
        "available_bytes": available,
        "swap_free_bytes": swap_free,
        "need_bytes": need_bytes,
    }
    servers = running_servers(machine)
    if servers:
        # Its models are loaded already, so what is available is headroom, not room for them.
        rss = sum(rss_bytes(machine, pid) for pid in servers)
        data.update(server_pids=servers, server_rss_bytes=rss)
        status = Status.OK if available >= 256 * MIB else Status.WARN
        return MEMORY.finding(
            status,
            f"a server is running (pid {', '.join(map(str, servers))}, {mib(rss)} resident); "
            f"{mib(available)} still available of {mib(total)}",
            fix="" if status is Status.OK else DESKTOP_FIX,
            data=data,
        )
    summary = f"{mib(available)} available of {mib(total)}; the models need about {mib(need_bytes)}"
    summary += f" ({need_detail})"
    if available >= need_bytes:
        return MEMORY.finding(Status.OK, summary, data=data)
    if available + swap_free >= need_bytes:
        return MEMORY.finding(
            Status.WARN,
            summary + ": they fit only by swapping, which stalls replies",
            fix="free memory (close the desktop and other services) or choose smaller models",
            data=data,
        )
    return MEMORY.finding(
        Status.FAIL,
        summary + ": they do not fit, even with swap",
        fix="choose smaller models (a smaller --llm-model first) or add swap: " + swap_fix(machine),
        data=data,
    )


def swap_fix(machine: Machine) -> str:
    return DPHYS_SWAP_FIX if machine.path("etc/dphys-swapfile").exists() else FILE_SWAP_FIX


def swap_devices(machine: Machine) -> list[dict[str, str | int]] | None:
    text = machine.read("proc/swaps")
    if text is None:
        return None
    devices: list[dict[str, str | int]] = []
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 3 and parts[2].isdigit():
            devices.append({"name": parts[0], "type": parts[1], "bytes": int(parts[2]) * 1024})
    return devices


def check_swap(machine: Machine) -> Finding:
    devices = swap_devices(machine)
    if devices is None:
        return SWAP.finding(Status.INFO, "cannot read /proc/swaps")
    total = sum(int(d["bytes"]) for d in devices)
    data = {"devices": devices, "total_bytes": total}
    if not devices:
        return SWAP.finding(
            Status.WARN,
            "no swap: if the models outgrow memory the kernel kills the server",
            fix=swap_fix(machine),
            data=data,
        )
    names = ", ".join(str(d["name"]) for d in devices)
    if total < MIN_SWAP_BYTES:
        return SWAP.finding(
            Status.WARN,
            f"only {mib(total)} of swap ({names}): too little to absorb a model",
            fix=swap_fix(machine),
            data=data,
        )
    return SWAP.finding(Status.OK, f"{mib(total)} of swap ({names})", data=data)


def check_zswap(machine: Machine) -> Finding:
    enabled = machine.read("sys/module/zswap/parameters/enabled")
    if enabled is None:
        return ZSWAP.finding(Status.INFO, "cannot see zswap (not in this kernel, or no /sys)")
    compressor = machine.read("sys/module/zswap/parameters/compressor") or "?"
    pool = machine.read("sys/module/zswap/parameters/max_pool_percent") or "?"
    data = {"enabled": enabled, "compressor": compressor, "max_pool_percent": pool}
    if enabled.upper() in ("Y", "1"):
        return ZSWAP.finding(
            Status.OK,
            f"on (compressor {compressor}, pool up to {pool}% of memory)",
            data=data,
        )
    devices = swap_devices(machine) or []
    if any("zram" in str(d["name"]) for d in devices):
        return ZSWAP.finding(Status.OK, "off; swap is on zram, which compresses already", data=data)
    return ZSWAP.finding(
        Status.WARN,
        "off: swapped-out pages go to the SD card uncompressed, slowly"
        + ("" if devices else " (turn it on together with swap)"),
        fix=ZSWAP_FIX,
        data=data,
    )


def check_desktop(machine: Machine) -> Finding:
    procs = processes(machine)
    if not procs:
        return DESKTOP.finding(Status.INFO, "cannot see any processes in /proc")
    desktop = [(pid, comm) for pid, comm, _ in procs if comm in DESKTOP_PROCESSES]
    if not desktop:
        return DESKTOP.finding(Status.OK, "no desktop session running")
    rss = sum(rss_bytes(machine, pid) for pid, _ in desktop)
    names = ", ".join(sorted({comm for _, comm in desktop}))
    return DESKTOP.finding(
        Status.WARN,
        f"a desktop session is running ({names}; {mib(rss)} resident): memory the models could use",
        fix=DESKTOP_FIX,
        data={"processes": [{"pid": pid, "name": comm} for pid, comm in desktop], "rss_bytes": rss},
    )


def soc_temperature(machine: Machine) -> tuple[float, str] | None:
    """(°C, source): the CPU/SoC thermal zone, else the hottest zone, else vcgencmd."""
    zones: list[tuple[str, float]] = []
    for zone in machine.glob("sys/class/thermal/thermal_zone*"):
        raw = read_text(zone / "temp")
        if raw is None or not raw.lstrip("-").isdigit():
            continue
        kind = read_text(zone / "type") or zone.name
        zones.append((kind, int(raw) / 1000.0))
    soc = [z for z in zones if re.search(r"cpu|soc|pkg", z[0], re.IGNORECASE)]
    if soc or zones:
        kind, celsius = max(soc or zones, key=lambda z: z[1])
        return celsius, kind
    reply = machine.firmware("measure_temp")  # temp=48.3'C
    match = re.search(r"temp=([\d.]+)", reply or "")
    return (float(match.group(1)), "vcgencmd") if match else None


def check_temperature(machine: Machine) -> Finding:
    reading = soc_temperature(machine)
    if reading is None:
        return TEMPERATURE.finding(
            Status.INFO,
            "cannot see a SoC temperature (no thermal zone in /sys, no vcgencmd)",
        )
    celsius, source = reading
    data = {"celsius": celsius, "source": source}
    if celsius >= WARM_CELSIUS:
        return TEMPERATURE.finding(
            Status.WARN,
            f"{celsius:.1f} °C ({source}): "
            + ("past" if celsius >= THROTTLE_CELSIUS else "near")
            + f" the {THROTTLE_CELSIUS:.0f} °C where the Pi 5 slows its clock",
            fix=COOLING_FIX,
            data=data,
        )
    return TEMPERATURE.finding(Status.OK, f"{celsius:.1f} °C ({source})", data=data)


def throttled_flags(machine: Machine) -> tuple[int, str] | None:
    reply = machine.firmware("get_throttled")  # throttled=0x50005
    match = re.search(r"throttled=(0x[0-9a-fA-F]+)", reply or "")
    if match:
        return int(match.group(1), 16), "vcgencmd"
    # The firmware driver also shows it in sysfs (hex without 0x) on Raspberry Pi kernels.
    for pattern in (
        "sys/devices/platform/soc/soc:firmware/get_throttled",
        "sys/devices/platform/*firmware*/get_throttled",
        "sys/devices/platform/*/*firmware*/get_throttled",
    ):
        for path in machine.glob(pattern):
            raw = read_text(path)
            if raw and re.fullmatch(r"(0x)?[0-9a-fA-F]+", raw):
                return int(raw, 16), "sysfs"
    return None


def check_throttling(machine: Machine) -> Finding:
    reading = throttled_flags(machine)
    if reading is None:
        return THROTTLING.finding(
            Status.INFO,
            "cannot see the firmware's throttling flags (not a Raspberry Pi, or no vcgencmd)",
        )
    flags, source = reading
    names = [name for bit, name in THROTTLE_BITS.items() if flags & (1 << bit)]
    data = {"flags": f"0x{flags:x}", "source": source, "conditions": names}
    if not names:
        return THROTTLING.finding(Status.OK, f"never throttled since boot (0x{flags:x})", data=data)
    fixes = []
    if any(flags & (1 << bit) for bit in UNDER_VOLTAGE_BITS):
        fixes.append(POWER_FIX)
    if flags & ~sum(1 << bit for bit in UNDER_VOLTAGE_BITS):
        fixes.append(COOLING_FIX)
    return THROTTLING.finding(
        Status.WARN,
        f"0x{flags:x}: {', '.join(names)}",
        fix="; ".join(fixes),
        data=data,
    )


# --- the CPU features llama.cpp was built with ------------------------------------------------

# /proc/cpuinfo flag → the name llama.cpp's CPU backend reports for the kernels that use it.
# Only features with llama.cpp kernels of their own: missing one means a slower generic path.
ARM_FEATURES = {
    "asimddp": "DOTPROD",  # the Pi 5's Cortex-A76 has it; quantised dot products
    "asimdhp": "FP16_VA",  # half-precision vector arithmetic
    "i8mm": "MATMUL_INT8",
    "sve": "SVE",
    "sme": "SME",
}
X86_FEATURES = {
    "avx": "AVX",
    "avx2": "AVX2",
    "fma": "FMA",
    "f16c": "F16C",
    "avx_vnni": "AVX_VNNI",
    "avx512f": "AVX512",
    "avx512vbmi": "AVX512_VBMI",
    "avx512_vnni": "AVX512_VNNI",
    "avx512_bf16": "AVX512_BF16",
    "amx_int8": "AMX_INT8",
}
ARM_REBUILD_FIX = (
    "rebuild llama.cpp for this CPU: rm -rf ~/.cache/wyoming-pivoice/llama-* && script/setup "
    "(or, for a wheel other Pi 5s can use, PIVOICE_ARM_ARCH=armv8.2-a+dotprod+fp16 script/setup)"
)
X86_REBUILD_FIX = (
    "rebuild llama.cpp for this CPU: CMAKE_ARGS=-DGGML_NATIVE=ON .venv/bin/pip install "
    "--force-reinstall --no-deps --no-cache-dir llama-cpp-python=={version}"
)


@dataclass(frozen=True)
class LlamaBuild:
    """What the llama.cpp library this process loads says about itself."""

    version: str
    system_info: str  # llama_print_system_info(): "CPU : NEON = 1 | DOTPROD = 1 | …"

    @property
    def features(self) -> set[str]:
        return set(re.findall(r"(\w+) = 1\b", self.system_info))


def probe_llama() -> LlamaBuild | str:
    """Loads llama.cpp the way the server does; the error text where it cannot."""
    try:
        import llama_cpp
    except Exception as err:  # a missing or broken shared library raises OSError and others
        return f"{type(err).__name__}: {err}"
    return LlamaBuild(llama_cpp.__version__, llama_cpp.llama_print_system_info().decode())


def cpu_flags(machine: Machine) -> tuple[str, set[str]] | None:
    """('arm' or 'x86', the CPU's feature flags) from /proc/cpuinfo's first processor."""
    text = machine.read("proc/cpuinfo")
    for line in (text or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Features":
            return "arm", set(value.split())
        if key.strip() == "flags":
            return "x86", set(value.split())
    return None


def check_llama_cpu(machine: Machine, build: LlamaBuild | str) -> Finding:
    if isinstance(build, str):
        return LLAMA_CPU.finding(
            Status.FAIL,
            f"llama.cpp does not load ({build}): the conversation engine cannot run",
            fix="script/setup (it builds llama-cpp-python for this machine)",
        )
    used = sorted(build.features)
    data: dict[str, object] = {
        "llama_cpp_python": build.version,
        "system_info": build.system_info.strip(),
        "used": used,
    }
    flags = cpu_flags(machine)
    if flags is None:
        return LLAMA_CPU.finding(
            Status.INFO,
            f"llama.cpp {build.version} uses {', '.join(used) or 'no SIMD'}; "
            "cannot read the CPU's own features (/proc/cpuinfo)",
            data=data,
        )
    family, have = flags
    table = ARM_FEATURES if family == "arm" else X86_FEATURES
    unused = sorted({name for flag, name in table.items() if flag in have} - build.features)
    data["unused"] = unused
    summary = f"llama.cpp {build.version} uses {', '.join(used) or 'no SIMD'}"
    if not unused:
        return LLAMA_CPU.finding(Status.OK, summary + ": all this CPU offers", data=data)
    fix = ARM_REBUILD_FIX if family == "arm" else X86_REBUILD_FIX.format(version=build.version)
    return LLAMA_CPU.finding(
        Status.WARN,
        f"{summary}; this CPU also has {', '.join(unused)}, which this build leaves out: "
        "the language model runs slower kernels",
        fix=fix,
        data=data,
    )


# ---- the audio threads' priority beside the models -----------------------------------------

AUDIO_PRIORITY = Check(
    "audio-priority", "whether the satellite's audio threads can run above the models' threads"
)


@dataclass(frozen=True)
class PriorityLimits:
    """What this user may ask of the scheduler (resource limits, from the process)."""

    root: bool
    rtprio: int  # RLIMIT_RTPRIO soft limit: the highest real-time priority allowed
    nice: int  # RLIMIT_NICE soft limit: 20 − the lowest nice value allowed
    cores: int


def probe_priority() -> PriorityLimits:
    import resource

    def soft(limit: int) -> int:
        value = resource.getrlimit(limit)[0]
        return 1_000_000 if value == resource.RLIM_INFINITY else int(value)

    return PriorityLimits(
        root=os.geteuid() == 0,
        rtprio=soft(resource.RLIMIT_RTPRIO),
        nice=soft(resource.RLIMIT_NICE),
        cores=os.cpu_count() or 1,
    )


def check_audio_priority(limits: PriorityLimits) -> Finding:
    from ..audio.pacing import AUDIO_NICE, AUDIO_RT_PRIORITY

    # Server and satellite on one Pi: llama.cpp, CTranslate2 and Piper each take every core
    # by default; the audio threads (mic, echo canceller, VAD, speaker) must not wait behind
    # them, or the canceller's reference and capture drift apart (issue #20: 1-16 dB of
    # ERLE live under load where the same audio gives 27-63 dB offline).
    threads = f"--llm-threads {max(1, limits.cores - 1)}" if limits.cores > 2 else ""
    data = {"rtprio_limit": limits.rtprio, "nice_limit": limits.nice, "root": limits.root}
    if limits.root or limits.rtprio >= AUDIO_RT_PRIORITY:
        return AUDIO_PRIORITY.finding(
            Status.OK,
            f"real-time round-robin (priority {AUDIO_RT_PRIORITY}) allowed: the audio threads "
            f"run above the models on {limits.cores} cores",
            data=data,
        )
    fix = (
        f"as a systemd service add LimitRTPRIO={AUDIO_RT_PRIORITY} under [Service]; or "
        f"'@audio - rtprio {AUDIO_RT_PRIORITY}' in /etc/security/limits.d/audio.conf and log in "
        "again as a member of the audio group"
    )
    if threads:
        fix += f"; with the server on this Pi too, leave the audio a core: {threads}"
    if 20 - limits.nice <= AUDIO_NICE:
        return AUDIO_PRIORITY.finding(
            Status.OK,
            f"no real-time priority, but nice {AUDIO_NICE} allowed: the audio threads run "
            "above the models",
            fix=fix,
            data=data,
        )
    return AUDIO_PRIORITY.finding(
        Status.WARN,
        "the satellite's audio threads would run at the models' priority (no real-time or "
        "raised nice allowed for this user): while the server decodes a reply, echo "
        "cancellation and barge-in suffer",
        fix=fix,
        data=data,
    )
