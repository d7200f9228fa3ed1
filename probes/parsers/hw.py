"""Hardware facts, each defined once and read by diagnose and preflight alike.

Pure: tables and parsers of text the host prints (sysfs link attributes, NVML's bus ids and CPU
affinity words, NVML's clock-event bitmask). Nothing here touches the host; the probes in
probes/ (topology, gpu, host, gpuhealth) and the checks and rules that judge their output
import these instead of keeping their own copies.
"""
from __future__ import annotations

import re
from typing import Any

from trainprobe.probes.errors import parser
from trainprobe.probes.parsers.procfs import format_cpulist, parse_cpulist

__all__ = [
    "PCIE_GTS", "LANE_GBPS", "pcie_gen", "parse_link_speed", "parse_link_width", "link_gen", "link_gbps",
    "PCI_VENDOR_NVIDIA", "PCI_VENDOR_MELLANOX", "canonical_bdf", "nvml_affinity_words", "clean", "parse_cpus", "parse_cpumask", "cpus_from_nvml_words", "cpulist_from_nvml_words", "parse_cpulist", "format_cpulist",
    "CLOCK_EVENTS", "clock_event_keys", "clock_event_labels",
]

def clean(text: str | None) -> str | None:
    """sysfs text without its newline, and without the NUL some captured trees carry."""
    return None if text is None else text.replace("\x00", "").strip()


# -- PCIe -------------------------------------------------------------------------------------------

# Transfer rate per lane (GT/s) of each PCIe generation, and the share of it that carries payload
# after line coding: 8b/10b up to Gen2, 128b/130b for Gen3-5, FLIT mode (242/256) from Gen6.
PCIE_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0, 7: 128.0}
_LINE_CODE = {1: 8 / 10, 2: 8 / 10, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 242 / 256, 7: 242 / 256}
# GB/s one lane carries per direction (Gen4: 1.969, Gen5: 3.938; Gen5 x16: 63.0).
LANE_GBPS = {gen: PCIE_GTS[gen] * _LINE_CODE[gen] / 8 for gen in PCIE_GTS}


def pcie_gen(gts: float | None) -> int | None:
    """A link rate in GT/s -> its PCIe generation; None when unknown."""
    if gts is None:
        return None
    for gen, rate in PCIE_GTS.items():
        if abs(gts - rate) < 0.01:
            return gen
    return None


@parser("sysfs parse_link_speed")
def parse_link_speed(text: str | None) -> float | None:
    """sysfs `*_link_speed`: '8.0 GT/s PCIe', '8 GT/s', '2.5 GT/s' -> GT/s; 'Unknown speed' or absent -> None."""
    if not text:
        return None
    m = re.match(r"\s*([0-9.]+)\s*GT/s", text)
    if not m:
        return None
    v = float(m.group(1))
    return v if v > 0 else None


def parse_link_width(text: Any, zero_is_unknown: bool = True) -> int | None:
    """sysfs `*_link_width`: '16', 'x16' -> 16; absent or unreadable -> None. A link that is down
    reads 0: None by default (no width known), 0 with zero_is_unknown=False (preflight judges it)."""
    try:
        v = int((clean(None if text is None else str(text)) or "").lstrip("xX") or "")
    except ValueError:
        return None
    return v if v > 0 or (v == 0 and not zero_is_unknown) else None


def link_gen(speed_text: str | None) -> int | None:
    """sysfs `*_link_speed` text -> PCIe generation ('32.0 GT/s PCIe' -> 5)."""
    return pcie_gen(parse_link_speed(speed_text))


def link_gbps(gen: Any, width: Any) -> float | None:
    """Payload bandwidth of a link in GB/s per direction (Gen5 x16: 63.0), or None when unknown."""
    if not isinstance(gen, int) or not isinstance(width, int) or isinstance(gen, bool) or gen not in LANE_GBPS \
            or width <= 0:
        return None
    return LANE_GBPS[gen] * width


# -- PCI addresses and vendors ----------------------------------------------------------------------------------

PCI_VENDOR_NVIDIA = 0x10DE
PCI_VENDOR_MELLANOX = 0x15B3

_BDF = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


def canonical_bdf(text: str | None) -> str | None:
    """A PCI address in sysfs form: NVML's '00000000:00:06.0' and sysfs' '0000:00:06.0' both give
    '0000:00:06.0'. None when the text is not a PCI address."""
    if not text:
        return None
    m = _BDF.match(text.strip())
    if not m:
        return None
    dom, bus, dev, fn = m.groups()
    return f"{int(dom, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{fn}"


# -- CPU sets ---------------------------------------------------------------------------------------

def parse_cpus(text: str | None) -> list[int]:
    """A cpulist that tolerates NULs and stray text: unreadable -> []."""
    try:
        return parse_cpulist(clean(text))
    except ValueError:
        return []


@parser("sysfs parse_cpumask")
def parse_cpumask(text: str | None) -> list[int]:
    """'00000000,0000ff00' (32-bit words, most significant first) -> [8, ..., 15]."""
    text = clean(text)
    if not text:
        return []
    words = text.split(",")
    cpus: list[int] = []
    for i, word in enumerate(reversed(words)):
        # Only hex digits: int("-1f", 16) is negative and would never shift down to 0.
        if not word or len(word) > 8 or any(c not in "0123456789abcdefABCDEF" for c in word):
            return []
        v = int(word, 16)
        bit = 0
        while v:
            if v & 1:
                cpus.append(i * 32 + bit)
            v >>= 1
            bit += 1
    return sorted(cpus)


def nvml_affinity_words(ncpu: int) -> int:
    """How many 64-bit words nvmlDeviceGetCpuAffinity needs to cover `ncpu` CPUs."""
    return max(1, (ncpu + 63) // 64)


def cpus_from_nvml_words(words: list[int] | None) -> list[int]:
    """nvmlDeviceGetCpuAffinity's words (64-bit, CPU 0 in bit 0 of word 0) -> CPU numbers."""
    return [64 * k + b for k, w in enumerate(words or []) for b in range(64) if (int(w) >> b) & 1]


def cpulist_from_nvml_words(words: list[int] | None) -> str | None:
    """The same as a cpulist ('0-15,32-47'); None when no CPU is set or the words are unknown."""
    cpus = cpus_from_nvml_words(words)
    return format_cpulist(cpus) if cpus else None


# -- NVML clock-event (throttle) reasons ------------------------------------------------------------

# (bit, key in evidence, label in messages), from nvml.h's nvmlClocksEventReason*.
CLOCK_EVENTS = (
    (0x1, "gpu_idle", "GPU idle"),
    (0x2, "applications_clocks_setting", "applications clocks setting"),
    (0x4, "sw_power_cap", "SW power cap"),
    (0x8, "hw_slowdown", "HW slowdown"),
    (0x10, "sync_boost", "sync boost"),
    (0x20, "sw_thermal_slowdown", "SW thermal slowdown"),
    (0x40, "hw_thermal_slowdown", "HW thermal slowdown"),
    (0x80, "hw_power_brake_slowdown", "HW power brake slowdown"),
    (0x100, "display_clock_setting", "display clock setting"),
)


def clock_event_keys(mask: Any) -> list[str]:
    """A clock-event bitmask -> the evidence keys of its reasons ('sw_power_cap', ...)."""
    if not isinstance(mask, int) or isinstance(mask, bool):
        return []
    return [key for bit, key, _ in CLOCK_EVENTS if mask & bit]


def clock_event_labels(mask: int) -> list[str]:
    """A clock-event bitmask -> the words preflight's messages use ('SW power cap', ...)."""
    return [label for bit, _, label in CLOCK_EVENTS if mask & bit]
