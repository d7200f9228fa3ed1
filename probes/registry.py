"""The list of probes. A new probe is one module in probes/ and one line here."""
from __future__ import annotations

import importlib
from typing import Type

from probes.base import Probe

# (module, class) in the order the manifest shows them.
PROBES: tuple[tuple[str, str], ...] = (
    ("probes.process", "ProcessProbe"),
    ("probes.pyspy", "PySpyProbe"),
    ("probes.gpu", "GpuProbe"),
    ("probes.perfstat", "PerfStatProbe"),
    ("probes.topology", "TopologyProbe"),
    ("probes.placement", "PlacementProbe"),
    ("probes.pressure", "PressureProbe"),
    ("probes.sched", "SchedProbe"),
    ("probes.syscalls", "SyscallsProbe"),
    ("probes.gil", "GilProbe"),
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
