"""The list of probes, diagnose's and preflight's. A new probe is one module in probes/ and one line here."""
from __future__ import annotations

import importlib
from typing import Iterable, Type

from trainprobe.probes.base import Probe

# (name, module, class, runs by default) in the order the manifest shows them, by the command that
# runs them (a probe's `commands`; the conformance test keeps the table and the classes in step). A
# command imports only its own probes, and a diagnosis without --deep or --probes only its default
# ones: a module costs its import (about 1 ms each on a 2-CPU node) whether or not it runs.
PROBES: tuple[tuple[str, str, str, bool], ...] = (
    ("process", "trainprobe.probes.process", "ProcessProbe", True),
    ("pyspy", "trainprobe.probes.pyspy", "PySpyProbe", True),
    ("gpu", "trainprobe.probes.gpu", "GpuProbe", True),
    ("perfstat", "trainprobe.probes.perfstat", "PerfStatProbe", True),
    ("topology", "trainprobe.probes.topology", "TopologyProbe", True),
    ("placement", "trainprobe.probes.placement", "PlacementProbe", True),
    ("pressure", "trainprobe.probes.pressure", "PressureProbe", True),
    ("contention", "trainprobe.probes.contention", "ContentionProbe", True),
    ("throttle", "trainprobe.probes.throttle", "ThrottleProbe", False),
    ("sched", "trainprobe.probes.sched", "SchedProbe", False),
    ("syscalls", "trainprobe.probes.syscalls", "SyscallsProbe", False),
    ("gil", "trainprobe.probes.gil", "GilProbe", False),
)
# preflight's probes: the node's health before a job starts
PREFLIGHT_PROBES: tuple[tuple[str, str, str, bool], ...] = (
    ("host", "trainprobe.probes.host", "HostProbe", False),
    ("gpuhealth", "trainprobe.probes.gpuhealth", "GpuHealthProbe", False),
    ("gpubench", "trainprobe.probes.gpubench", "GpuBenchProbe", False),
)
_TABLES = {"diagnose": PROBES, "preflight": PREFLIGHT_PROBES}


def probe_names(command: str | None = None, default_only: bool = False) -> list[str]:
    """The probes' names, from the table alone (nothing imported)."""
    table = _TABLES.get(command or "", PROBES + PREFLIGHT_PROBES)
    return [name for name, _, _, default in table if default or not default_only]


def probe_classes(command: str | None = None, names: Iterable[str] | None = None) -> list[Type[Probe]]:
    """Every probe, or those of one command ("diagnose", "preflight": a probe's `commands`), in
    table order; with `names`, only those (the others are not imported)."""
    table = _TABLES.get(command or "", PROBES + PREFLIGHT_PROBES)
    wanted = None if names is None else set(names)
    out = []
    for name, mod, cls, _ in table:
        if wanted is not None and name not in wanted:
            continue
        c = getattr(importlib.import_module(mod), cls)
        if command is None or command in c.commands:
            out.append(c)
    return out


def probe_class(name: str) -> Type[Probe] | None:
    """The probe called `name`, importing its module only."""
    for n, mod, cls, _ in PROBES + PREFLIGHT_PROBES:
        if n == name:
            return getattr(importlib.import_module(mod), cls)
    return None
