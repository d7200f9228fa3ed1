"""The list of probes, diagnose's and preflight's. A new probe is one module in probes/ and one line here."""
from __future__ import annotations

import importlib
from typing import Type

from trainprobe.probes.base import Probe

# (module, class) in the order the manifest shows them, by the command that runs them (a probe's
# `commands`; the conformance test keeps the two in step). A command imports only its own probes.
PROBES: tuple[tuple[str, str], ...] = (
    ("trainprobe.probes.process", "ProcessProbe"),
    ("trainprobe.probes.pyspy", "PySpyProbe"),
    ("trainprobe.probes.gpu", "GpuProbe"),
    ("trainprobe.probes.perfstat", "PerfStatProbe"),
    ("trainprobe.probes.topology", "TopologyProbe"),
    ("trainprobe.probes.placement", "PlacementProbe"),
    ("trainprobe.probes.pressure", "PressureProbe"),
    ("trainprobe.probes.throttle", "ThrottleProbe"),
    ("trainprobe.probes.sched", "SchedProbe"),
    ("trainprobe.probes.syscalls", "SyscallsProbe"),
    ("trainprobe.probes.gil", "GilProbe"),
)
# preflight's probes: the node's health before a job starts
PREFLIGHT_PROBES: tuple[tuple[str, str], ...] = (
    ("trainprobe.probes.host", "HostProbe"),
    ("trainprobe.probes.gpuhealth", "GpuHealthProbe"),
    ("trainprobe.probes.gpubench", "GpuBenchProbe"),
)


def probe_classes(command: str | None = None) -> list[Type[Probe]]:
    """Every probe, or those of one command ("diagnose", "preflight": a probe's `commands`)."""
    table = {"diagnose": PROBES, "preflight": PREFLIGHT_PROBES}.get(command or "", PROBES + PREFLIGHT_PROBES)
    out = []
    for mod, cls in table:
        c = getattr(importlib.import_module(mod), cls)
        if command is None or command in c.commands:
            out.append(c)
    return out


def probe_class(name: str) -> Type[Probe] | None:
    """The probe called `name`, importing no more of the table than it takes to find it."""
    for mod, cls in PROBES + PREFLIGHT_PROBES:
        c = getattr(importlib.import_module(mod), cls)
        if c.name == name:
            return c
    return None
