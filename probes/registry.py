"""The list of probes. A new probe is one module in probes/ and one line here."""
from __future__ import annotations

import importlib
from typing import Type

from trainprobe.probes.base import Probe

# (module, class) in the order the manifest shows them.
PROBES: tuple[tuple[str, str], ...] = (
    ("trainprobe.probes.process", "ProcessProbe"),
    ("trainprobe.probes.pyspy", "PySpyProbe"),
    ("trainprobe.probes.gpu", "GpuProbe"),
    ("trainprobe.probes.perfstat", "PerfStatProbe"),
    ("trainprobe.probes.topology", "TopologyProbe"),
    ("trainprobe.probes.placement", "PlacementProbe"),
    ("trainprobe.probes.pressure", "PressureProbe"),
    ("trainprobe.probes.sched", "SchedProbe"),
    ("trainprobe.probes.syscalls", "SyscallsProbe"),
    ("trainprobe.probes.gil", "GilProbe"),
)


def probe_classes() -> list[Type[Probe]]:
    out = []
    for mod, cls in PROBES:
        out.append(getattr(importlib.import_module(mod), cls))
    return out


def probe_class(name: str) -> Type[Probe] | None:
    for cls in probe_classes():
        if cls.name == name:
            return cls
    return None
