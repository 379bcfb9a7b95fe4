"""`wyoming-pivoice doctor` on fake /sys and /proc trees, and on this machine."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from wyoming_pivoice.doctor import knowledge, models, remote, system
from wyoming_pivoice.doctor.audio import AudioDevice, AudioReport, check_audio
from wyoming_pivoice.doctor.base import MIB, Machine, Status
from wyoming_pivoice.doctor.cli import exit_code, render_text
from wyoming_pivoice.doctor.models import (
    RUNTIME_BYTES,
    ModelChoice,
    check_asr,
    check_llm,
    check_models,
    check_voice,
    memory_need,
)
from wyoming_pivoice.doctor.registry import CHECKS, Subject, run_checks
from wyoming_pivoice.doctor.system import (
    LlamaBuild,
    check_desktop,
    check_governor,
    check_memory,
    check_swap,
    check_temperature,
    check_throttling,
    check_zswap,
)

from .helpers import REPO

GIB = 1024 * MIB
WYOMING_PIVOICE = REPO / ".venv" / "bin" / "wyoming-pivoice"
# What a run without --llm-url reports, in order.
# Checks asked for by an option only (--llm-url, --knowledge) are not in a plain run.
LOCAL = [check.name for check in CHECKS if check not in (remote.REMOTE, knowledge.KNOWLEDGE)]
LINE = re.compile(r"^(OK|INFO|WARN|FAIL)\s+(\S+)\s+(.+)$")


class FakeRoot:
    """A folder that stands in for `/`: write sys/ and proc/ files into it."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, relative: str, text: str) -> FakeRoot:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return self

    def governors(self, *names: str) -> FakeRoot:
        for cpu, name in enumerate(names):
            self.write(f"sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor", name + "\n")
        return self

    def meminfo(self, total: int, available: int, swap_free: int = 0) -> FakeRoot:
        return self.write(
            "proc/meminfo",
            f"MemTotal:       {total // 1024} kB\nMemFree:        {available // 2048} kB\n"
            f"MemAvailable:   {available // 1024} kB\nSwapTotal:      {swap_free // 1024} kB\n"
            f"SwapFree:       {swap_free // 1024} kB\n",
        )

    def swaps(self, *devices: tuple[str, str, int]) -> FakeRoot:
        lines = ["Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority"]
        lines += [f"{name}\t{kind}\t\t{size // 1024}\t\t0\t\t-2" for name, kind, size in devices]
        return self.write("proc/swaps", "\n".join(lines) + "\n")

    def zswap(self, enabled: str) -> FakeRoot:
        self.write("sys/module/zswap/parameters/enabled", enabled + "\n")
        self.write("sys/module/zswap/parameters/compressor", "lz4\n")
        return self.write("sys/module/zswap/parameters/max_pool_percent", "20\n")

    def process(self, pid: int, comm: str, cmdline: list[str], rss: int = 0) -> FakeRoot:
        self.write(f"proc/{pid}/comm", comm + "\n")
        self.write(f"proc/{pid}/cmdline", "\0".join(cmdline) + "\0")
        return self.write(f"proc/{pid}/status", f"Name:\t{comm}\nVmRSS:\t{rss // 1024} kB\n")

    def thermal(self, zone: int, kind: str, millidegrees: int) -> FakeRoot:
        self.write(f"sys/class/thermal/thermal_zone{zone}/type", kind + "\n")
        return self.write(f"sys/class/thermal/thermal_zone{zone}/temp", f"{millidegrees}\n")

    def machine(self, vcgencmd: str | None = None) -> Machine:
        return Machine(root=self.root, vcgencmd=vcgencmd)


@pytest.fixture
def fake(tmp_path: Path) -> FakeRoot:
    return FakeRoot(tmp_path / "root")


def fake_vcgencmd(folder: Path, throttled: str, temp: str = "temp=51.5'C") -> str:
    """An executable that answers like the Raspberry Pi firmware's vcgencmd."""
    script = folder / "vcgencmd"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$1" in get_throttled) echo "{throttled}";; measure_temp) echo "{temp}";;'
        " *) exit 1;; esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


# --- CPU governor ---------------------------------------------------------------------------


def test_governor_ondemand_warns_with_the_fix(fake: FakeRoot) -> None:
    finding = check_governor(fake.governors(*["ondemand"] * 4).machine())
    assert finding.status is Status.WARN
    assert "ondemand on 4 of 4 CPUs" in finding.message
    assert finding.fix.startswith(
        "echo performance | sudo tee /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor"
    )


def test_governor_performance_is_ok(fake: FakeRoot) -> None:
    finding = check_governor(fake.governors(*["performance"] * 4).machine())
    assert finding.status is Status.OK
    assert finding.message == "performance on all 4 CPUs"
    assert finding.fix == ""


def test_governor_mixed_names_the_slow_ones(fake: FakeRoot) -> None:
    finding = check_governor(fake.governors("performance", "schedutil").machine())
    assert finding.status is Status.WARN
    assert finding.message.startswith("schedutil on 1 of 2 CPUs")
    assert finding.data["governors"] == {"cpu0": "performance", "cpu1": "schedutil"}


def test_governor_absent_is_info(fake: FakeRoot) -> None:
    fake.write("sys/devices/system/cpu/online", "0-3\n")
    assert check_governor(fake.machine()).status is Status.INFO


# --- swap and zswap -------------------------------------------------------------------------


def test_swap_off_warns(fake: FakeRoot) -> None:
    finding = check_swap(fake.swaps().machine())
    assert finding.status is Status.WARN
    assert finding.message.startswith("no swap")
    assert "fallocate -l 2G /swapfile" in finding.fix  # no /etc/dphys-swapfile here


def test_swap_fix_uses_dphys_swapfile_on_raspberry_pi_os(fake: FakeRoot) -> None:
    fake.swaps(("/var/swap", "file", 100 * MIB)).write("etc/dphys-swapfile", "CONF_SWAPSIZE=100\n")
    finding = check_swap(fake.machine())
    assert finding.status is Status.WARN
    assert "only 100 MiB of swap (/var/swap)" in finding.message
    assert "CONF_SWAPSIZE=2048" in finding.fix


def test_swap_of_two_gib_is_ok(fake: FakeRoot) -> None:
    finding = check_swap(fake.swaps(("/var/swap", "file", 2 * GIB)).machine())
    assert finding.status is Status.OK
    assert finding.message == "2,048 MiB of swap (/var/swap)"


def test_zswap_on_is_ok(fake: FakeRoot) -> None:
    finding = check_zswap(fake.zswap("Y").machine())
    assert finding.status is Status.OK
    assert finding.message == "on (compressor lz4, pool up to 20% of memory)"


def test_zswap_off_warns_with_the_fix(fake: FakeRoot) -> None:
    finding = check_zswap(fake.zswap("N").swaps(("/var/swap", "file", 2 * GIB)).machine())
    assert finding.status is Status.WARN
    assert finding.fix.startswith("echo 1 | sudo tee /sys/module/zswap/parameters/enabled")


def test_zswap_off_is_fine_on_zram(fake: FakeRoot) -> None:
    machine = fake.zswap("N").swaps(("/dev/zram0", "partition", 2 * GIB)).machine()
    assert check_zswap(machine).status is Status.OK


def test_zswap_absent_is_info(fake: FakeRoot) -> None:
    assert check_zswap(fake.swaps().machine()).status is Status.INFO


# --- desktop --------------------------------------------------------------------------------


def test_desktop_process_warns_with_its_memory(fake: FakeRoot) -> None:
    fake.process(1, "systemd", ["/sbin/init"], rss=12 * MIB)
    fake.process(812, "labwc", ["/usr/bin/labwc", "-m"], rss=120 * MIB)
    fake.process(901, "Xwayland", ["/usr/bin/Xwayland", ":0"], rss=80 * MIB)
    finding = check_desktop(fake.machine())
    assert finding.status is Status.WARN
    assert "(Xwayland, labwc; 200 MiB resident)" in finding.message
    assert "multi-user.target" in finding.fix
    assert {p["pid"] for p in finding.data["processes"]} == {812, 901}


def test_no_desktop_is_ok(fake: FakeRoot) -> None:
    fake.process(1, "systemd", ["/sbin/init"]).process(2, "sshd", ["sshd: /usr/sbin/sshd"])
    assert check_desktop(fake.machine()).status is Status.OK


# --- temperature and throttling -------------------------------------------------------------


def test_hot_soc_warns(fake: FakeRoot) -> None:
    fake.thermal(0, "cpu-thermal", 82_400)
    finding = check_temperature(fake.machine())
    assert finding.status is Status.WARN
    assert finding.message.startswith("82.4 °C (cpu-thermal): past the 80 °C")
    assert "Active Cooler" in finding.fix


def test_cool_soc_is_ok_and_the_cpu_zone_wins(fake: FakeRoot) -> None:
    fake.thermal(0, "cpu-thermal", 48_000).thermal(1, "nvme-thermal", 90_000)
    finding = check_temperature(fake.machine())
    assert finding.status is Status.OK
    assert finding.message == "48.0 °C (cpu-thermal)"


def test_temperature_from_vcgencmd_without_thermal_zones(fake: FakeRoot, tmp_path: Path) -> None:
    vcgencmd = fake_vcgencmd(tmp_path, "throttled=0x0", temp="temp=74.1'C")
    finding = check_temperature(fake.machine(vcgencmd))
    assert finding.status is Status.WARN
    assert finding.message.startswith("74.1 °C (vcgencmd): near the 80 °C")


def test_no_temperature_is_info(fake: FakeRoot) -> None:
    assert check_temperature(fake.machine()).status is Status.INFO


def test_throttled_bits_are_named_with_both_fixes(fake: FakeRoot, tmp_path: Path) -> None:
    finding = check_throttling(fake.machine(fake_vcgencmd(tmp_path, "throttled=0x50005")))
    assert finding.status is Status.WARN
    assert finding.message == (
        "0x50005: under-voltage now, throttled now, under-voltage since boot, throttled since boot"
    )
    assert "27 W" in finding.fix and "Active Cooler" in finding.fix


def test_soft_temperature_limit_asks_only_for_cooling(fake: FakeRoot, tmp_path: Path) -> None:
    finding = check_throttling(fake.machine(fake_vcgencmd(tmp_path, "throttled=0x80000")))
    assert finding.message == "0x80000: soft temperature limit since boot"
    assert "27 W" not in finding.fix and "Active Cooler" in finding.fix


def test_never_throttled_is_ok(fake: FakeRoot, tmp_path: Path) -> None:
    finding = check_throttling(fake.machine(fake_vcgencmd(tmp_path, "throttled=0x0")))
    assert finding.status is Status.OK


def test_throttled_from_sysfs_without_vcgencmd(fake: FakeRoot) -> None:
    fake.write("sys/devices/platform/soc/soc:firmware/get_throttled", "50000\n")
    finding = check_throttling(fake.machine())
    assert finding.status is Status.WARN
    assert finding.data["source"] == "sysfs"
    assert finding.data["conditions"] == ["under-voltage since boot", "throttled since boot"]


def test_no_throttling_flags_is_info(fake: FakeRoot) -> None:
    assert check_throttling(fake.machine()).status is Status.INFO


# --- memory against the models --------------------------------------------------------------


def test_memory_fits(fake: FakeRoot) -> None:
    finding = check_memory(fake.meminfo(8 * GIB, 6 * GIB).machine(), 2 * GIB, "detail")
    assert finding.status is Status.OK
    assert finding.message.startswith("6,144 MiB available of 8,192 MiB")


def test_memory_fits_only_with_swap(fake: FakeRoot) -> None:
    machine = fake.meminfo(4 * GIB, 1 * GIB, swap_free=2 * GIB).machine()
    finding = check_memory(machine, 2 * GIB, "detail")
    assert finding.status is Status.WARN
    assert "only by swapping" in finding.message


def test_memory_does_not_fit(fake: FakeRoot) -> None:
    machine = fake.meminfo(2 * GIB, 1 * GIB).machine()
    finding = check_memory(machine, 3 * GIB, "detail")
    assert finding.status is Status.FAIL
    assert exit_code([finding]) == 1


def test_memory_with_a_server_running_counts_headroom(fake: FakeRoot) -> None:
    fake.meminfo(8 * GIB, 3 * GIB)
    fake.process(
        4242,
        "wyoming-pivoice",
        ["/opt/pv/.venv/bin/python3", "/opt/pv/.venv/bin/wyoming-pivoice", "server", "--uri", "x"],
        rss=900 * MIB,
    )
    fake.process(4243, "wyoming-pivoice", ["wyoming-pivoice", "satellite"], rss=100 * MIB)
    finding = check_memory(fake.machine(), 10 * GIB, "detail")
    assert finding.status is Status.OK
    assert finding.data["server_pids"] == [4242]
    assert "900 MiB resident" in finding.message


def test_memory_need_adds_cache_and_runtime_to_the_files() -> None:
    findings = check_models(ModelChoice())
    need, detail = memory_need(findings)
    files = sum(f.data["bytes"] for f in findings)
    llm = next(f.data["bytes"] for f in findings if f.check == models.LLM.name)
    assert need == files + int(llm * 0.25) + RUNTIME_BYTES
    assert detail.startswith("model files ")


# --- model files ----------------------------------------------------------------------------


def test_embedded_models_are_found() -> None:
    findings = check_models(ModelChoice())
    assert [f.check for f in findings] == [
        c.name for c in (models.ASR, models.VOICE, models.LLM, models.VAD)
    ]
    assert all(f.status is Status.OK for f in findings)
    assert all(f.data["bytes"] > MIB for f in findings)


def test_missing_llm_fails(tmp_path: Path) -> None:
    finding = check_llm(str(tmp_path / "nope.gguf"))
    assert finding.status is Status.FAIL
    assert "script/setup" in finding.fix


def test_a_file_that_is_not_gguf_fails(tmp_path: Path) -> None:
    fake_model = tmp_path / "model.gguf"
    fake_model.write_bytes(b"PK\x03\x04 not a gguf")
    finding = check_llm(str(fake_model))
    assert finding.status is Status.FAIL
    assert "not a GGUF" in finding.message


def test_voice_without_its_json_fails(tmp_path: Path) -> None:
    voice = tmp_path / "en_GB-test-low.onnx"
    voice.write_bytes(b"\0" * 16)
    finding = check_voice("en_GB-test-low", (str(tmp_path),))
    assert finding.status is Status.FAIL
    assert "en_GB-test-low.onnx.json" in finding.message


def test_whisper_name_is_downloaded_later() -> None:
    finding = check_asr("small.en")
    assert finding.status is Status.INFO
    assert finding.data == {"name": "small.en", "bytes": 485 * MIB}


# --- audio ----------------------------------------------------------------------------------


def test_no_audio_devices_says_so() -> None:
    devices, capture = check_audio(AudioReport())
    assert devices.status is Status.INFO and devices.message.startswith("no audio devices")
    assert capture.status is Status.INFO


def test_a_mic_that_opens_16k_is_ok() -> None:
    report = AudioReport(
        devices=[
            AudioDevice(0, "USB PnP Sound Device", 1, 0, 48000.0, capture_16k=True),
            AudioDevice(1, "bcm2835 Headphones", 0, 2, 44100.0),
        ],
        default_input=0,
        default_output=1,
    )
    devices, capture = check_audio(report)
    assert devices.status is Status.OK
    assert "default input 'USB PnP Sound Device', output 'bcm2835 Headphones'" in devices.message
    assert capture.status is Status.OK


def test_a_mic_without_16k_warns_with_the_fix() -> None:
    report = AudioReport(
        devices=[AudioDevice(2, "hw:2,0", 2, 2, 48000.0, capture_16k=False)], default_input=2
    )
    _devices, capture = check_audio(report)
    assert capture.status is Status.WARN
    assert "48000 Hz" in capture.message
    assert "plughw" in capture.fix


def test_speaker_only_warns_about_the_missing_mic() -> None:
    report = AudioReport(devices=[AudioDevice(0, "HDMI", 0, 8, 48000.0)], default_output=0)
    devices, capture = check_audio(report)
    assert devices.status is Status.WARN and "no microphone" in devices.message
    assert capture.status is Status.INFO


# --- everything together --------------------------------------------------------------------


def test_all_checks_on_a_tuned_pi(fake: FakeRoot, tmp_path: Path) -> None:
    fake.governors(*["performance"] * 4).meminfo(8 * GIB, 7 * GIB, swap_free=2 * GIB)
    fake.swaps(("/var/swap", "file", 2 * GIB)).zswap("Y").thermal(0, "cpu-thermal", 51_000)
    fake.process(1, "systemd", ["/sbin/init"])
    report = AudioReport(
        devices=[AudioDevice(0, "ReSpeaker", 2, 2, 16000.0, capture_16k=True)],
        default_input=0,
        default_output=0,
    )
    fake.write("proc/cpuinfo", (Path(__file__).parent / "fixtures" / "cpuinfo-pi5").read_text())
    pi5_build = "CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | DOTPROD = 1 | OPENMP = 1 | "
    machine = fake.machine(fake_vcgencmd(tmp_path, "throttled=0x0"))
    subject = Subject(
        machine,
        audio_probe=lambda: report,
        llama_probe=lambda: LlamaBuild("0.3.36", pi5_build),
    )
    findings = run_checks(subject)
    assert [f.check for f in findings] == LOCAL
    assert {f.check: f.status for f in findings} == dict.fromkeys(LOCAL, Status.OK)
    assert exit_code(findings) == 0
    text = render_text(findings)
    assert text.splitlines()[-1] == f"{len(LOCAL)} OK, 0 INFO, 0 WARN, 0 FAIL"


def test_cli_on_a_fake_tree_as_json(fake: FakeRoot) -> None:
    fake.governors("ondemand", "ondemand").meminfo(8 * GIB, 7 * GIB).swaps().zswap("Y")
    fake.process(1, "systemd", ["/sbin/init"]).process(77, "wayfire", ["wayfire"], rss=64 * MIB)
    done = subprocess.run(
        [str(WYOMING_PIVOICE), "doctor", "--json", "--no-audio", "--root", str(fake.root)],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": "/usr/bin:/bin"},  # no vcgencmd
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    statuses = {c["check"]: c["status"] for c in report["checks"]}
    assert list(statuses) == LOCAL
    assert statuses[system.GOVERNOR.name] == "WARN"
    assert statuses[system.SWAP.name] == "WARN"
    assert statuses[system.ZSWAP.name] == "OK"
    assert statuses[system.DESKTOP.name] == "WARN"
    assert statuses[system.TEMPERATURE.name] == statuses[system.THROTTLING.name] == "INFO"
    assert report["worst"] == "WARN"


def test_cli_exits_1_on_a_failure(fake: FakeRoot, tmp_path: Path) -> None:
    fake.meminfo(8 * GIB, 7 * GIB)
    done = subprocess.run(
        [
            str(WYOMING_PIVOICE),
            "doctor",
            "--no-audio",
            "--root",
            str(fake.root),
            "--llm-model",
            str(tmp_path / "missing.gguf"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert re.search(
        rf"^FAIL\s+{models.LLM.name}\s+GGUF model .*missing\.gguf.* not found", done.stdout, re.M
    )


def test_doctor_on_this_machine() -> None:
    """The real /sys and /proc and PortAudio: every check prints one line; no FAIL here."""
    done = subprocess.run(
        [str(WYOMING_PIVOICE), "doctor"], capture_output=True, text=True, check=False
    )
    lines = done.stdout.splitlines()
    parsed = [LINE.match(line) for line in lines[:-1]]
    assert all(parsed), done.stdout
    assert [m.group(2) for m in parsed if m] == LOCAL
    failed = [m.group(2) for m in parsed if m and m.group(1) == "FAIL"]
    assert done.returncode == (1 if failed else 0)
    assert failed == []  # the embedded models are installed and this machine has memory
    assert re.fullmatch(r"\d+ OK, \d+ INFO, \d+ WARN, 0 FAIL", lines[-1])
    for match in parsed:
        if match and match.group(1) in ("WARN", "FAIL"):
            assert " — fix: " in match.group(3)


# --- the audio threads' priority ------------------------------------------------------------


def test_audio_priority_says_how_to_let_the_audio_threads_run_above_the_models() -> None:
    from wyoming_pivoice.doctor.system import PriorityLimits, check_audio_priority

    assert check_audio_priority(PriorityLimits(True, 0, 0, 4)).status is Status.OK
    assert check_audio_priority(PriorityLimits(False, 95, 0, 4)).status is Status.OK
    user = check_audio_priority(PriorityLimits(False, 0, 0, 4))  # Raspberry Pi OS's default
    assert user.status is Status.WARN
    assert "LimitRTPRIO=10" in (user.fix or "") and "--llm-threads 3" in (user.fix or "")
