"""GPU checks on passive reads: the PCI bus (sysfs) and NVML (probes/gpuhealth.py), live or replayed."""
from __future__ import annotations

from typing import Any

from trainprobe.agent.preflight import Result, gib
from trainprobe.agent.preflight.engine import Reads, check
from trainprobe.probes.gpuhealth import na, na_reason
from trainprobe.probes.parsers.hw import canonical_bdf, clock_event_labels, link_gen, parse_link_width
from trainprobe.probes.parsers.procfs import format_cpulist, parse_cpulist

NOT_SUPPORTED = "not supported"


def _v(x: Any) -> Any:
    return None if na(x) else x


def _gpus(r: Reads) -> list[dict[str, Any]]:
    d = r.data("nvml")
    return [] if d.get("error") else [g for g in d.get("gpus", []) if "handle" not in g]


def _target(g: dict[str, Any]) -> str:
    return f"gpu{g['index']}"


def _dur(r: Reads, group: str) -> float | None:
    d = r.data("nvml")
    t = (d.get("timing") or {}).get(group)
    return float(t) if t is not None else None


def _unsupported(x: Any) -> bool:
    reason = na_reason(x) or ""
    return NOT_SUPPORTED in reason or "lacks" in reason or "not in this pynvml" in reason


# -- the node's GPUs ------------------------------------------------------------------------------

@check("gpu.count", "gpu", ("pci", "nvml"))
def gpu_count(r: Reads, p: dict[str, Any]) -> Result:
    d = r.data("nvml")
    pci_err = r.error("pci")
    pci = None if pci_err else r.data("pci")
    n_pci = len(pci) if pci is not None else None
    want = int(p["gpu"]["count"])
    expected = f"{want}" if want > 0 else "as many as on the PCI bus"
    src = "/sys/bus/pci/devices (vendor 0x10de) and nvmlDeviceGetCount"
    pci_s = f"{n_pci} on the PCI bus" if n_pci is not None else "PCI bus unreadable"
    details = {"pci": [x["bdf"] for x in pci or []], "pci_drivers": {x["bdf"]: x.get("driver") for x in pci or []}}
    if d.get("error"):
        observed = f"{pci_s}; NVML: {d['error']}"
        if n_pci:
            drivers = {x.get("driver") for x in pci or []}
            return Result("critical", observed, expected,
                          f"{n_pci} NVIDIA GPU(s) on the PCI bus but NVML cannot start: {d['error']}",
                          remediation="load the driver (modprobe nvidia; drivers bound now: "
                                      f"{', '.join(sorted(str(x) for x in drivers))}) and read dmesg for NVRM errors",
                          value=0, unit="gpus", source=src, details=details)
        if want > 0:
            return Result("critical", observed, expected, f"the profile expects {want} GPU(s); none is on the PCI bus",
                          remediation="check the GPUs are seated and powered; read the BMC log",
                          value=0, unit="gpus", source=src, details=details)
        # No NVIDIA PCI device and no driver: a node without GPUs by design, most likely. It stays
        # unknown rather than ok, because the default profile cannot tell it from a GPU node whose
        # GPUs all left the bus; the shipped cpu-node profile says so ([gpu] count = 0).
        return Result("unknown", observed, expected,
                      "no GPU on this node (no NVIDIA PCI device, no NVIDIA driver): the GPU checks cannot run here",
                      remediation="on a node without GPUs by design, use --profile cpu-node (host checks only)",
                      source=src, details={**details, "no_gpu_by_design": n_pci == 0})
    n = _v(d.get("count"))
    observed = f"{pci_s}; NVML sees {n}" + (f"; driver {d.get('driver')}" if d.get("driver") else "")
    if n is None:
        return Result("critical", observed, expected, f"NVML cannot count the GPUs: {na_reason(d.get('count'))}",
                      remediation="read dmesg for NVRM errors; reload the driver or reboot", source=src, details=details)
    if n_pci and n < n_pci:
        seen = {canonical_bdf(g["bus_id"]) for g in d.get("gpus", []) if isinstance(g.get("bus_id"), str)}
        missing = [x["bdf"] for x in pci or [] if x["bdf"] not in seen] if len(seen) == n else []
        return Result("critical", observed, expected,
                      f"NVML sees {n} of the {n_pci} GPUs on the PCI bus"
                      + (f" (missing: {', '.join(missing)})" if missing else "")
                      + ": a GPU fell off the bus or the driver failed to bind it",
                      remediation="read dmesg for Xid 79 / 'fallen off the bus'; reset the GPU or reboot; "
                                  "if it persists, reseat or replace it",
                      value=n, unit="gpus", source=src, details={**details, "missing": missing})
    if want > 0 and n < want:
        return Result("critical", observed, expected, f"{n} GPU(s) where the profile expects {want}",
                      remediation="check the missing GPUs are seated and powered (lspci -d 10de:) and read the BMC log",
                      value=n, unit="gpus", source=src, details=details)
    if want > 0 and n > want:
        return Result("warn", observed, expected, f"{n} GPUs where the profile expects {want}: the wrong profile?",
                      remediation="run with the profile for this node type (--profile)", value=n, unit="gpus",
                      source=src, details=details)
    if n == 0:
        return Result("unknown", observed, expected, "NVML runs but sees no GPU", value=0, unit="gpus", source=src,
                      details=details)
    note = "" if n_pci is not None and n_pci == n else " (the PCI bus shows none: a container without /sys?)" \
        if n_pci == 0 else ""
    return Result("ok", observed, expected, f"{n} GPU(s) present{note}", value=n, unit="gpus", source=src,
                  details=details)


@check("gpu.driver", "gpu", ("nvml",))
def gpu_driver(r: Reads, p: dict[str, Any]) -> list[Result]:
    d = r.data("nvml")
    if d.get("error"):
        return []
    drv = _v(d.get("driver"))
    want = p["gpu"]["driver"]
    expected = f"{want}*" if want else "any"
    observed = f"{drv}" + (f" (CUDA driver API {_v(d.get('cuda_driver_version'))})"
                           if _v(d.get("cuda_driver_version")) else "")
    if drv is None:
        return [Result("unknown", "unreadable", expected, f"driver version: {na_reason(d.get('driver'))}",
                       source="nvmlSystemGetDriverVersion")]
    if want and not str(drv).startswith(want):
        return [Result("warn", observed, expected, f"driver {drv}, the profile expects {want}*",
                       remediation="install the driver version the node type is qualified with",
                       source="nvmlSystemGetDriverVersion")]
    return [Result("ok", observed, expected, f"driver {drv}", source="nvmlSystemGetDriverVersion")]


# -- per GPU ----------------------------------------------------------------------------------------

@check("gpu.persistence_mode", "gpu", ("nvml",))
def persistence(r: Reads, p: dict[str, Any]) -> list[Result]:
    out = []
    want = bool(p["gpu"]["persistence_mode"])
    for g in _gpus(r):
        pm = g.get("persistence_mode")
        src = "nvmlDeviceGetPersistenceMode"
        if na(pm):
            out.append(Result("ok" if _unsupported(pm) else "unknown", "unreadable", "on" if want else "any",
                              f"persistence mode: {na_reason(pm)}", target=_target(g), source=src))
        elif want and not pm:
            out.append(Result("warn", "off", "on", "persistence mode is off: each CUDA start reinitialises the "
                              "GPU (seconds), and settings such as clocks reset when no process holds it",
                              remediation="systemctl enable --now nvidia-persistenced (or nvidia-smi -pm 1)",
                              target=_target(g), value=0, source=src))
        else:
            out.append(Result("ok", "on" if pm else "off", "on" if want else "any", "persistence mode on" if pm
                              else "persistence mode off (allowed)", target=_target(g), value=int(bool(pm)), source=src))
    return out


@check("gpu.ecc", "gpu", ("nvml",))
def ecc(r: Reads, p: dict[str, Any]) -> list[Result]:
    out = []
    gp = p["gpu"]
    for g in _gpus(r):
        mode = g.get("ecc_mode")
        e = g.get("ecc") or {}
        vol, agg = e.get("volatile") or {}, e.get("aggregate") or {}
        vu, vc, au = _v(vol.get("uncorrected")), _v(vol.get("corrected")), _v(agg.get("uncorrected"))
        expected = (f"ECC on; 0 uncorrected; corrected <= {gp['ecc_corrected_warn']}" if gp["ecc"]
                    else f"0 uncorrected; corrected <= {gp['ecc_corrected_warn']}")
        src = "nvmlDeviceGetEccMode, nvmlDeviceGetTotalEccErrors, nvmlDeviceGetMemoryErrorCounter"
        details = {"mode": mode, "volatile": vol, "aggregate": agg}
        t, dur = _target(g), _dur(r, "ecc")
        if na(mode):
            st = "ok" if _unsupported(mode) else "unknown"
            out.append(Result(st, "no ECC", expected, f"ECC: {na_reason(mode)}", target=t, source=src,
                              details=details, duration_s=dur))
            continue
        cur, pending = (int(mode[0]), int(mode[1])) if isinstance(mode, list) else (int(mode), int(mode))
        observed = (f"ECC {'on' if cur else 'off'}" + (f" (pending {'on' if pending else 'off'})" if pending != cur else "")
                    + (f"; volatile {vu} uncorrected, {vc} corrected" if vu is not None else "")
                    + (f"; aggregate {au} uncorrected" if au else ""))
        where = [k.split("_")[0].upper() for k in ("dram_uncorrected", "sram_uncorrected")
                 if (_v(vol.get(k)) or 0) > 0]
        if vu:
            out.append(Result("critical", observed, expected,
                              f"{vu} uncorrectable ECC error(s) since the driver loaded"
                              + (f" ({', '.join(where)})" if where else "") + ": results computed on this GPU "
                              "may be wrong and the next access can crash the job",
                              remediation="drain the node; reset the GPU (nvidia-smi -r) to retire or remap the "
                                          "memory; replace it if errors return",
                              target=t, value=vu, unit="errors", source=src, details=details, duration_s=dur))
        elif vc is not None and vc > gp["ecc_corrected_critical"]:
            out.append(Result("critical", observed, expected, f"{vc} corrected ECC errors: memory is failing",
                              remediation="drain the node and have the GPU replaced", target=t, value=vc,
                              unit="errors", source=src, details=details, duration_s=dur))
        elif gp["ecc"] and not cur:
            out.append(Result("warn", observed, expected, "ECC is off: memory errors go undetected",
                              remediation="nvidia-smi -e 1, then reset the GPU or reboot", target=t, value=0,
                              unit="errors", source=src, details=details, duration_s=dur))
        elif gp["ecc"] and pending != cur:
            out.append(Result("warn", observed, expected, "an ECC mode change waits for a GPU reset",
                              remediation="nvidia-smi -r (no process may hold the GPU) or reboot", target=t,
                              value=vu or 0, unit="errors", source=src, details=details, duration_s=dur))
        elif vc is not None and vc > gp["ecc_corrected_warn"]:
            out.append(Result("warn", observed, expected, f"{vc} corrected ECC errors since the driver loaded",
                              remediation="watch the count; check row remapping; replace the GPU if it keeps rising",
                              target=t, value=vc, unit="errors", source=src, details=details, duration_s=dur))
        elif au:
            out.append(Result("warn", observed, expected,
                              f"{au} uncorrectable ECC error(s) in the GPU's lifetime (none since the driver loaded)",
                              remediation="check that row remapping or page retirement covered them (gpu.remapped_rows)",
                              target=t, value=0, unit="errors", source=src, details=details, duration_s=dur))
        else:
            out.append(Result("ok", observed, expected, "no uncorrectable ECC errors", target=t, value=vu or 0,
                              unit="errors", source=src, details=details, duration_s=dur))
    return out


@check("gpu.remapped_rows", "gpu", ("nvml",))
def remapped_rows(r: Reads, p: dict[str, Any]) -> list[Result]:
    out = []
    lim = int(p["gpu"]["remapped_uncorrectable_critical"])
    expected = f"no pending remap, no remap failure, <= {lim} uncorrectable remaps"
    for g in _gpus(r):
        rr = g.get("remapped_rows")
        t, src, dur = _target(g), "nvmlDeviceGetRemappedRows", _dur(r, "remap")
        if na(rr):
            out.append(Result("ok" if _unsupported(rr) else "unknown", "not reported", expected,
                              f"row remapping: {na_reason(rr)}" + (" (GPUs before Ampere retire pages instead)"
                                                                  if _unsupported(rr) else ""),
                              target=t, source=src, duration_s=dur))
            continue
        observed = (f"{rr['uncorrectable']} uncorrectable, {rr['correctable']} correctable"
                    + ("; PENDING" if rr["pending"] else "") + ("; FAILURE" if rr["failure"] else ""))
        if rr["failure"]:
            out.append(Result("critical", observed, expected, "a row remap failed: the GPU ran out of spare rows",
                              remediation="drain the node and have the GPU replaced", target=t,
                              value=rr["uncorrectable"], unit="rows", source=src, details=rr, duration_s=dur))
        elif rr["pending"]:
            out.append(Result("critical", observed, expected, "a row remap is pending: the bad row stays in use "
                              "until the GPU is reset", remediation="nvidia-smi -r (no process may hold the GPU) "
                              "or reboot", target=t, value=rr["uncorrectable"], unit="rows", source=src,
                              details=rr, duration_s=dur))
        elif rr["uncorrectable"] > lim:
            out.append(Result("critical", observed, expected, f"{rr['uncorrectable']} rows remapped for "
                              "uncorrectable errors", remediation="have the GPU replaced", target=t,
                              value=rr["uncorrectable"], unit="rows", source=src, details=rr, duration_s=dur))
        else:
            out.append(Result("ok", observed, expected, "row remapping healthy", target=t, value=rr["uncorrectable"],
                              unit="rows", source=src, details=rr, duration_s=dur))
    return out


@check("gpu.retired_pages", "gpu", ("nvml",))
def retired_pages(r: Reads, p: dict[str, Any]) -> list[Result]:
    out = []
    warn_n, crit_n = int(p["gpu"]["retired_pages_warn"]), int(p["gpu"]["retired_pages_critical"])
    expected = f"none pending; < {warn_n} retired"
    for g in _gpus(r):
        rp = g.get("retired_pages") or {}
        t, src, dur = _target(g), "nvmlDeviceGetRetiredPages, nvmlDeviceGetRetiredPagesPendingStatus", _dur(r, "remap")
        sbe, dbe, pend = _v(rp.get("single_bit")), _v(rp.get("double_bit")), rp.get("pending")
        if sbe is None and dbe is None:
            unsup = _unsupported(rp.get("single_bit"))
            out.append(Result("ok" if unsup else "unknown", "not reported", expected,
                              "page retirement: " + (na_reason(rp.get("single_bit")) or "?")
                              + (" (Ampere and later remap rows instead)" if unsup else ""),
                              target=t, source=src, duration_s=dur))
            continue
        n = (sbe or 0) + (dbe or 0)
        observed = f"{n} retired ({sbe or 0} single-bit, {dbe or 0} double-bit)" + ("; PENDING" if pend is True else "")
        if pend is True:
            out.append(Result("critical", observed, expected, "a page retirement is pending a GPU reset",
                              remediation="nvidia-smi -r or reboot", target=t, value=n, unit="pages", source=src,
                              details=rp, duration_s=dur))
        elif n >= crit_n:
            out.append(Result("critical", observed, expected, f"{n} pages retired: the table is nearly full",
                              remediation="have the GPU replaced", target=t, value=n, unit="pages", source=src,
                              details=rp, duration_s=dur))
        elif n >= warn_n:
            out.append(Result("warn", observed, expected, f"{n} pages retired", remediation="watch the count; "
                              "replace the GPU if it keeps rising", target=t, value=n, unit="pages", source=src,
                              details=rp, duration_s=dur))
        else:
            out.append(Result("ok", observed, expected, "page retirement healthy", target=t, value=n, unit="pages",
                              source=src, details=rp, duration_s=dur))
    return out


RECOVERY_ACTIONS = {0: "none", 1: "GPU reset", 2: "node reboot", 3: "drain P2P", 4: "drain and reset",
                    5: "recover the IMEX domain", 6: "bus reset", 7: "system reboot"}


@check("gpu.recovery_action", "gpu", ("nvml",))
def recovery_action(r: Reads, p: dict[str, Any]) -> list[Result]:
    out = []
    for g in _gpus(r):
        ra = g.get("recovery_action")
        t, src, dur = _target(g), "nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)", _dur(r, "remap")
        if na(ra):
            out.append(Result("ok" if _unsupported(ra) else "unknown", "not reported", "none",
                              f"recovery action: {na_reason(ra)}", target=t, source=src, duration_s=dur))
            continue
        name = RECOVERY_ACTIONS.get(int(ra), f"action {ra}")
        if int(ra) != 0:
            out.append(Result("critical", name, "none", f"the driver asks for a {name} before this GPU is used again",
                              remediation={1: "nvidia-smi -r -i <index> (no process may hold it)", 6: "a bus reset "
                                           "(nvidia-smi -r) or reboot"}.get(int(ra), "drain the node and " + name),
                              target=t, value=int(ra), source=src, duration_s=dur))
        else:
            out.append(Result("ok", "none", "none", "no recovery action pending", target=t, value=0, source=src,
                              duration_s=dur))
    return out


CRITICAL_EVENTS = 0x8 | 0x40 | 0x80
WARN_EVENTS = 0x20


@check("gpu.clock_events", "gpu", ("nvml",))
def clock_events(r: Reads, p: dict[str, Any]) -> list[Result]:
    out = []
    expected = "no HW slowdown, HW thermal, power brake or SW thermal slowdown"
    for g in _gpus(r):
        m = g.get("clocks_event_reasons")
        t, src, dur = _target(g), "nvmlDeviceGetCurrentClocksEventReasons", _dur(r, "clocks")
        if na(m):
            out.append(Result("unknown", "unreadable", expected, f"clock-event reasons: {na_reason(m)}", target=t,
                              source=src, duration_s=dur))
            continue
        m = int(m)
        names = clock_event_labels(m)
        observed = f"0x{m:x}" + (f" ({', '.join(names)})" if names else " (none)")
        if m & CRITICAL_EVENTS:
            bad = clock_event_labels(m & CRITICAL_EVENTS)
            out.append(Result("critical", observed, expected, f"clocks held down by {', '.join(bad)}: the GPU "
                              "runs far below its rated speed (cooling, power delivery or an external brake signal)",
                              remediation="check fans, airflow, inlet temperature and the PSUs; the BMC log says "
                                          "which", target=t, value=m, source=src, duration_s=dur))
        elif m & WARN_EVENTS:
            out.append(Result("warn", observed, expected, "the driver is slowing clocks for temperature",
                              remediation="check cooling and inlet temperature", target=t, value=m, source=src,
                              duration_s=dur))
        else:
            out.append(Result("ok", observed, expected, "no hardware clock slowdown", target=t, value=m, source=src,
                              duration_s=dur))
    return out


@check("gpu.temperature", "gpu", ("nvml",))
def temperature(r: Reads, p: dict[str, Any]) -> list[Result]:
    out = []
    warn_c, crit_c = float(p["gpu"]["temperature_warn_c"]), float(p["gpu"]["temperature_critical_c"])
    for g in _gpus(r):
        tc, slow = _v(g.get("temperature_c")), _v(g.get("temperature_slowdown_c"))
        t, src, dur = _target(g), "nvmlDeviceGetTemperature", _dur(r, "thermal_power")
        crit = min(crit_c, slow) if slow else crit_c
        warn = min(warn_c, crit - 5)
        expected = f"< {warn:g} C (slowdown at {slow} C)" if slow else f"< {warn:g} C"
        if tc is None:
            out.append(Result("unknown", "unreadable", expected, f"temperature: {na_reason(g.get('temperature_c'))}",
                              target=t, source=src, duration_s=dur))
        elif tc >= crit:
            out.append(Result("critical", f"{tc} C", expected, f"{tc} C before the job starts: the GPU will throttle",
                              remediation="check fans, airflow and inlet temperature", target=t, value=tc,
                              unit="celsius", source=src, duration_s=dur))
        elif tc >= warn:
            out.append(Result("warn", f"{tc} C", expected, f"{tc} C: close to where the GPU slows down",
                              remediation="check fans, airflow and inlet temperature", target=t, value=tc,
                              unit="celsius", source=src, duration_s=dur))
        else:
            out.append(Result("ok", f"{tc} C", expected, f"{tc} C", target=t, value=tc, unit="celsius", source=src,
                              duration_s=dur))
    return out


@check("gpu.power", "gpu", ("nvml",))
def power(r: Reads, p: dict[str, Any]) -> list[Result]:
    out = []
    for g in _gpus(r):
        draw, lim, dflt = _v(g.get("power_mw")), _v(g.get("power_limit_mw")), _v(g.get("power_default_limit_mw"))
        t, src, dur = _target(g), "nvmlDeviceGetPowerUsage, nvmlDeviceGetEnforcedPowerLimit", _dur(r, "thermal_power")
        expected = f"limit = default ({dflt / 1000:.0f} W)" if dflt else "limit = default"
        observed = (f"{draw / 1000:.0f} W drawn" if draw is not None else "draw unreadable") + \
                   (f", limit {lim / 1000:.0f} W" if lim is not None else "")
        if lim is not None and dflt is not None and lim < dflt * 0.98:
            out.append(Result("warn", observed, expected, f"the power limit is capped at {lim / 1000:.0f} W of the "
                              f"default {dflt / 1000:.0f} W: compute-bound steps run slower",
                              remediation=f"nvidia-smi -pl {dflt / 1000:.0f} (or find what set the cap: a "
                                          "datacenter power policy?)", target=t, value=lim / 1000, unit="watts",
                              source=src, duration_s=dur))
        elif draw is None and lim is None:
            out.append(Result("unknown", observed, expected, f"power: {na_reason(g.get('power_mw'))}", target=t,
                              source=src, duration_s=dur))
        else:
            out.append(Result("ok", observed, expected, observed, target=t,
                              value=(draw / 1000) if draw is not None else None, unit="watts", source=src,
                              duration_s=dur))
    return out


# -- PCIe link: NVML when it can read it, sysfs otherwise (needs no driver) ------------------------

def _link_from_nvml(g: dict[str, Any]) -> dict[str, Any] | None:
    pc = g.get("pcie") or {}
    vals = {k: _v(pc.get(k)) for k in ("gen", "width", "max_gen", "max_width", "gpu_max_gen", "replay_counter")}
    if None in (vals["gen"], vals["width"], vals["max_gen"], vals["max_width"]):
        return None
    return {**vals, "source": "nvmlDeviceGetCurrPcieLink*, nvmlDeviceGetMaxPcieLink*"}


def _link_from_sysfs(dev: dict[str, Any]) -> dict[str, Any] | None:
    vals = {"gen": link_gen(dev.get("current_link_speed")),
            "width": parse_link_width(dev.get("current_link_width"), zero_is_unknown=False),
            "max_gen": link_gen(dev.get("max_link_speed")),
            "max_width": parse_link_width(dev.get("max_link_width"), zero_is_unknown=False),
            "gpu_max_gen": None, "replay_counter": None}
    if None in (vals["gen"], vals["width"], vals["max_gen"], vals["max_width"]):
        return None
    return {**vals, "source": f"/sys/bus/pci/devices/{dev['bdf']}/{{current,max}}_link_{{speed,width}}"}


def judge_link(link: dict[str, Any], p: dict[str, Any], idle: bool | None, target: str) -> Result:
    want_gen = int(p["gpu"]["pcie_gen"]) or link["max_gen"]
    want_w = int(p["gpu"]["pcie_width"]) or link["max_width"]
    expected = f"Gen{want_gen} x{want_w}"
    observed = f"Gen{link['gen']} x{link['width']} (max Gen{link['max_gen']} x{link['max_width']})"
    replays = link.get("replay_counter")
    if replays is not None:
        observed += f"; {replays} replays"
    details = dict(link)
    src = link["source"]
    if link["max_gen"] < want_gen or link["max_width"] < want_w:
        return Result("critical", observed, expected,
                      f"the link can reach only Gen{link['max_gen']} x{link['max_width']}: the slot, riser or "
                      "BIOS setting limits it", remediation="check the slot and riser, and the BIOS PCIe speed "
                      "setting for that root port", target=target, value=link["width"], unit="lanes", source=src,
                      details=details)
    if link["width"] < want_w:
        return Result("critical", observed, expected,
                      f"the link trained at x{link['width']} of x{want_w}: host-device copies get "
                      f"{link['width'] / want_w:.0%} of the bandwidth",
                      remediation="reseat the GPU or riser; a retrain after reboot sometimes restores the width; "
                                  "replace the riser or cable if it persists", target=target, value=link["width"],
                      unit="lanes", source=src, details=details)
    if link["gen"] < want_gen:
        if idle:
            return Result("ok", observed, expected, f"idle at Gen{link['gen']}: GPUs lower the link speed when idle "
                          "(--active measures the copy rate under load)", target=target, value=link["width"],
                          unit="lanes", source=src, details=details)
        return Result("warn", observed, expected,
                      f"the link runs at Gen{link['gen']} where Gen{want_gen} is expected"
                      + (" (the GPU may be idle; --active measures it under load)" if idle is None else ""),
                      remediation="run with --active to measure copies under load; check the BIOS PCIe speed setting",
                      target=target, value=link["width"], unit="lanes", source=src, details=details)
    if replays is not None and replays > int(p["gpu"]["max_pcie_replays"]):
        return Result("warn", observed, expected, f"{replays} PCIe replays since the driver loaded: a marginal link",
                      remediation="reseat the GPU or riser; watch whether the count grows",
                      target=target, value=link["width"], unit="lanes", source=src, details=details)
    return Result("ok", observed, expected, f"Gen{link['gen']} x{link['width']}", target=target, value=link["width"],
                  unit="lanes", source=src, details=details)


@check("gpu.pcie_link", "gpu", ("nvml", "pci"))
def pcie_link(r: Reads, p: dict[str, Any]) -> list[Result]:
    out = []
    d = r.data("nvml")
    pci = [] if r.error("pci") else r.data("pci")
    by_bdf = {x["bdf"]: x for x in pci}
    seen: set[str] = set()
    for g in _gpus(r):
        bdf = canonical_bdf(g["bus_id"]) if isinstance(g.get("bus_id"), str) else None
        if bdf:
            seen.add(bdf)
        link = _link_from_nvml(g) or (_link_from_sysfs(by_bdf[bdf]) if bdf in by_bdf else None)
        reasons = _v(g.get("clocks_event_reasons"))
        idle = bool(int(reasons) & 0x1) if reasons is not None else None
        if link is None:
            out.append(Result("unknown", "unreadable", "-", "PCIe link: " + str(na_reason((g.get("pcie") or {})
                              .get("gen"))), target=_target(g), source="NVML and sysfs"))
            continue
        res = judge_link(link, p, idle, _target(g))
        res.duration_s = _dur(r, "pcie")
        out.append(res)
    # GPUs that NVML does not see (no driver, or fallen off the bus) still have a link on the bus.
    nvml_count = None if d.get("error") else _v(d.get("count"))
    if nvml_count is None or nvml_count < len(pci):
        for dev in pci:
            if dev["bdf"] in seen:
                continue
            link = _link_from_sysfs(dev)
            if link is None:
                out.append(Result("unknown", "unreadable", "-", f"{dev['bdf']}: no link attributes in sysfs",
                                  target=dev["bdf"], source=f"/sys/bus/pci/devices/{dev['bdf']}"))
                continue
            out.append(judge_link(link, p, None, dev["bdf"]))
    return out


@check("gpu.nvlink", "gpu", ("nvml",))
def nvlink(r: Reads, p: dict[str, Any]) -> list[Result]:
    out = []
    want = int(p["gpu"]["nvlinks"])
    for g in _gpus(r):
        nv = g.get("nvlink") or {}
        t, src, dur = _target(g), "nvmlDeviceGetNvLinkState, nvmlDeviceGetNvLinkErrorCounter", _dur(r, "nvlink")
        expected = f"{want} links up" if want > 0 else ("none" if want == 0 else "every link up")
        if not nv.get("supported"):
            if want > 0:
                out.append(Result("critical", "no NVLink", expected, f"the profile expects {want} NVLinks; the GPU "
                                  f"reports none ({nv.get('reason')})", remediation="check the NVLink bridge or "
                                  "baseboard; a reset or reboot may bring the links up", target=t, value=0,
                                  unit="links", source=src, duration_s=dur))
            else:
                out.append(Result("ok", "no NVLink", expected, "not applicable: this GPU has no NVLink", target=t,
                                  value=0, unit="links", source=src, duration_s=dur))
            continue
        links = nv.get("links") or []
        up = [x for x in links if x.get("active")]
        down = [x["link"] for x in links if not x.get("active")]
        errs: dict[str, int] = {}
        for x in up:
            for k, v in (x.get("errors") or {}).items():
                if isinstance(v, int):
                    errs[k] = errs.get(k, 0) + v
        observed = f"{len(up)} of {len(links)} up" + (f"; errors {errs}" if any(errs.values()) else "")
        need = want if want > 0 else len(links)
        if len(up) < need:
            out.append(Result("critical", observed, expected, f"NVLinks down: {', '.join(map(str, down)) or '-'}: "
                              "peer-to-peer traffic and NCCL fall back to PCIe or fail",
                              remediation="nvidia-smi nvlink -s; check the fabric manager (systemctl status "
                                          "nvidia-fabricmanager); reset the GPUs or reboot", target=t,
                              value=len(up), unit="links", source=src, details={"down": down, "errors": errs},
                              duration_s=dur))
        elif any(errs.values()):
            out.append(Result("warn", observed, expected, f"NVLink error counters are non-zero: {errs}",
                              remediation="watch whether they grow (nvidia-smi nvlink -e); reseat or replace if so",
                              target=t, value=len(up), unit="links", source=src, details={"errors": errs},
                              duration_s=dur))
        else:
            out.append(Result("ok", observed, expected, f"{len(up)} NVLinks up", target=t, value=len(up),
                              unit="links", source=src, duration_s=dur))
    return out


@check("gpu.busy", "gpu", ("nvml",))
def busy(r: Reads, p: dict[str, Any]) -> list[Result]:
    out = []
    max_mib = float(p["gpu"]["max_idle_memory_mib"])
    status = p["gpu"]["busy_status"]
    expected = f"no processes; <= {max_mib:g} MiB in use"
    for g in _gpus(r):
        procs = g.get("processes") or []
        mem = g.get("memory") or {}
        t, src, dur = _target(g), "nvmlDeviceGetComputeRunningProcesses, nvmlDeviceGetMemoryInfo", _dur(r, "processes")
        used = None if na(mem) else mem.get("used")
        observed = f"{len(procs)} process(es)" + (f", {gib(used)} in use" if used is not None else "") + \
                   (f" of {gib(mem.get('total'))}" if not na(mem) and mem.get("total") else "")
        pids = sorted({x["pid"] for x in procs})
        if procs or (used is not None and used > max_mib * (1 << 20)):
            out.append(Result(status, observed, expected,
                              (f"processes already on the GPU (PIDs {', '.join(map(str, pids[:8]))})" if procs else
                               f"{gib(used)} of GPU memory in use with no process listed (another container?)")
                              + ": the job would share the GPU or run out of memory",
                              remediation="stop the leftover processes (nvidia-smi --query-compute-apps=pid,"
                                          "process_name --format=csv), or reset the GPU", target=t,
                              value=used, unit="bytes", source=src, details={"processes": procs, "memory": mem},
                              duration_s=dur))
        elif na(mem) and g.get("processes_errors"):
            out.append(Result("unknown", "unreadable", expected, f"memory: {na_reason(mem)}", target=t, source=src,
                              duration_s=dur))
        else:
            out.append(Result("ok", observed, expected, "the GPU is free", target=t, value=used, unit="bytes",
                              source=src, details={"memory": mem}, duration_s=dur))
    return out


@check("gpu.numa_affinity", "gpu", ("nvml", "pci", "cpus", "numa"))
def numa_affinity(r: Reads, p: dict[str, Any]) -> list[Result]:
    out = []
    cpus = r.data("cpus")
    job = set(parse_cpulist(cpus.get("job_cpus")))
    online = set(parse_cpulist(cpus.get("online")))
    n_nodes = len(parse_cpulist(r.data("numa").get("online"))) or 1
    pci = [] if r.error("pci") else r.data("pci")
    by_bdf = {x["bdf"]: x for x in pci}
    for g in _gpus(r):
        t, dur = _target(g), _dur(r, "affinity")
        bdf = canonical_bdf(g["bus_id"]) if isinstance(g.get("bus_id"), str) else None
        aff = g.get("cpu_affinity")
        local_s = None if na(aff) or not aff else aff.get("cpulist")
        src = "nvmlDeviceGetCpuAffinity"
        if not local_s and bdf in by_bdf:
            local_s, src = by_bdf[bdf].get("local_cpulist"), f"/sys/bus/pci/devices/{bdf}/local_cpulist"
        local = set(parse_cpulist(local_s))
        sys_node = by_bdf.get(bdf, {}).get("numa_node") if bdf else None
        nvml_node = _v(g.get("numa_node"))
        node = nvml_node if nvml_node is not None else (int(sys_node) if sys_node not in (None, "") else None)
        expected = "the job's CPUs include CPUs local to the GPU"
        details = {"gpu_local_cpus": local_s, "job_cpus": format_cpulist(sorted(job)) if job else None,
                   "numa_node": node}
        if not local or not job:
            out.append(Result("unknown", "unreadable", expected, "the GPU's local CPUs or the job's CPUs are unknown",
                              target=t, source=src, details=details, duration_s=dur))
            continue
        if n_nodes > 1 and node is not None and int(node) < 0:
            out.append(Result("warn", f"NUMA node {node}", expected,
                              "the firmware reports no NUMA node for this GPU on a multi-socket host: "
                              "placement tools cannot pick its local CPUs",
                              remediation="update the BIOS, or enable ACPI SRAT/NUMA reporting for PCIe devices",
                              target=t, source=src, details=details, duration_s=dur))
            continue
        share = len(job & local) / len(job)
        observed = f"{share:.0%} of the job's {len(job)} CPUs are local (GPU local CPUs {local_s})"
        if local >= online:
            out.append(Result("ok", observed, expected, "every CPU is local to this GPU (one NUMA node, or the "
                              "platform reports no locality)", target=t, value=share, unit="ratio", source=src,
                              details=details, duration_s=dur))
        elif share == 0:
            out.append(Result("warn", observed, expected, f"none of the job's CPUs is local to {t}: its copies and "
                              "its pinned buffers cross the socket interconnect",
                              remediation=f"bind the rank for {t} to its node: numactl --cpunodebind={node} "
                                          f"--membind={node} (or taskset -c {local_s})", target=t, value=share,
                              unit="ratio", source=src, details=details, duration_s=dur))
        else:
            out.append(Result("ok", observed, expected, f"{share:.0%} of the job's CPUs are local", target=t,
                              value=share, unit="ratio", source=src, details=details, duration_s=dur))
    return out
