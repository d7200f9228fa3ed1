"""Active GPU checks (--active): judge the measurements of probes/gpubench.py against the GPU's
data-sheet peak, its peers on the node, and what its PCIe link carries."""
from __future__ import annotations

import statistics
from typing import Any

from trainprobe.agent.preflight import Result
from trainprobe.agent.preflight.engine import Reads, check
from trainprobe.probes.gpuhealth import na
from trainprobe.probes.parsers.hw import link_gbps


def _nvml_gpus(r: Reads) -> list[dict[str, Any]]:
    rec = r.get("nvml")
    if not rec or rec.get("error") or not rec.get("data") or rec["data"].get("error"):
        return []
    return [g for g in rec["data"].get("gpus", []) if "handle" not in g]


def _pairs(r: Reads) -> tuple[list[tuple[dict[str, Any], dict[str, Any] | None, str]], Result | None]:
    """(measurement, its NVML record or None, target) per device, or one Result saying why there are none."""
    d = r.data("gpubench")
    if d.get("error"):
        return [], Result("unknown", "did not run", "a CUDA device", f"the active tier did not run: {d['error']}",
                          remediation="run on a GPU node with a CUDA build of torch", source="torch")
    devs = [x for x in d.get("devices", []) if str(x.get("device", "")).startswith("cuda")]
    if not devs:
        return [], Result("unknown", "no device", "a CUDA device", "the active tier found no CUDA device",
                          source="torch")
    gpus = _nvml_gpus(r)
    by_bus = {str(g.get("bus_id", "")).upper(): g for g in gpus if isinstance(g.get("bus_id"), str)}
    by_index = {g["index"]: g for g in gpus}
    out = []
    for dev in devs:
        idx = int(str(dev["device"]).split(":")[1])
        g = by_bus.get(str(dev.get("bus_id") or "").upper()) or by_index.get(idx)
        out.append((dev, g, f"gpu{g['index']}" if g else f"cuda{idx}"))
    return out, None


def _failed(m: Any) -> str | None:
    if not isinstance(m, dict):
        return "no measurement"
    if "error" in m:
        return m["error"]
    if na(m) or "na" in m:
        return m.get("na")
    return None


@check("active.matmul", "active", ("gpubench", "nvml"))
def matmul(r: Reads, p: dict[str, Any]) -> list[Result]:
    pairs, none = _pairs(r)
    if none:
        return [none]
    tol = float(p["active"]["matmul_max_rel_error"])
    expected = f"finite; max relative error <= {tol:g} vs float64 on the CPU"
    out = []
    for dev, _g, t in pairs:
        m = dev.get("matmul")
        err = _failed(m)
        src = "torch fp32 matmul (TF32 off) vs float64 CPU reference"
        if err:
            out.append(Result("critical", "failed", expected, f"a 1024x1024 matmul failed on the GPU: {err}",
                              remediation="read dmesg for Xid errors; reset the GPU; drain the node if it repeats",
                              target=t, source=src, duration_s=m.get("seconds_total") if isinstance(m, dict) else None))
            continue
        if not m["finite"]:
            out.append(Result("critical", "NaN or Inf", expected, "the GPU returned NaN or Inf for finite inputs: "
                              "silent data corruption", remediation="drain the node; have the GPU tested and replaced",
                              target=t, source=src, duration_s=m.get("seconds_total")))
        elif m["max_rel_error"] > tol:
            out.append(Result("critical", f"{m['max_rel_error']:.2e}", expected,
                              f"the GPU's matmul differs from the CPU's by {m['max_rel_error']:.2e}: silent data "
                              "corruption", remediation="drain the node; have the GPU tested and replaced", target=t,
                              value=m["max_rel_error"], source=src, details=m, duration_s=m.get("seconds_total")))
        else:
            out.append(Result("ok", f"{m['max_rel_error']:.2e}", expected, "the GPU computes what the CPU computes",
                              target=t, value=m["max_rel_error"], source=src, details=m,
                              duration_s=m.get("seconds_total")))
    return out


@check("active.gemm", "active", ("gpubench", "nvml"))
def gemm(r: Reads, p: dict[str, Any]) -> list[Result]:
    pairs, none = _pairs(r)
    if none:
        return [none]
    a = p["active"]
    peaks = a["peak_bf16_tflops"]
    rates = [dev["gemm"]["tflops"] for dev, _g, _t in pairs if not _failed(dev.get("gemm"))]
    median = statistics.median(rates) if len(rates) >= 2 else None
    out = []
    for dev, g, t in pairs:
        m = dev.get("gemm")
        err = _failed(m)
        name = (g or {}).get("name") or dev.get("name")
        peak = peaks.get(name) if isinstance(name, str) else None
        src = "torch.matmul bf16, timed with CUDA events"
        parts = []
        if peak:
            parts.append(f">= {a['gemm_warn_fraction_of_peak']:.0%} of the {peak:g} TFLOPS peak")
        if a["gemm_min_tflops"]:
            parts.append(f">= {a['gemm_min_tflops']:g} TFLOPS")
        if median:
            parts.append(f"within {a['gemm_peer_tolerance']:.0%} of the node median")
        expected = "; ".join(parts) or "measured (no peak known for this GPU)"
        if err:
            out.append(Result("critical", "failed", expected, f"the bf16 GEMM failed: {err}",
                              remediation="read dmesg for Xid errors; reset the GPU", target=t, source=src,
                              duration_s=m.get("seconds_total") if isinstance(m, dict) else None))
            continue
        tf = float(m["tflops"])
        observed = f"{tf:.0f} TFLOPS" + (f" ({tf / peak:.0%} of peak)" if peak else "")
        details = {**m, "peak_tflops": peak, "node_median_tflops": median, "name": name}
        res = Result("ok", observed, expected, f"bf16 GEMM {tf:.0f} TFLOPS (n={m['n']})", target=t, value=tf,
                     unit="tflops", source=src, details=details, duration_s=m.get("seconds_total"))
        fix = ("look at gpu.clock_events and gpu.power for this GPU (a power cap or a slowdown); "
               "check cooling; reset the GPU")
        if peak and tf < a["gemm_critical_fraction_of_peak"] * peak:
            res.status, res.message, res.remediation = "critical", f"{tf:.0f} TFLOPS is {tf / peak:.0%} of the peak", fix
        elif peak and tf < a["gemm_warn_fraction_of_peak"] * peak:
            res.status, res.message, res.remediation = "warn", f"{tf:.0f} TFLOPS is {tf / peak:.0%} of the peak", fix
        elif a["gemm_min_tflops"] and tf < a["gemm_min_tflops"]:
            res.status, res.message, res.remediation = "warn", f"{tf:.0f} TFLOPS is under the profile's floor", fix
        elif median and tf < (1 - a["gemm_peer_tolerance"]) * median:
            res.status, res.message, res.remediation = ("warn", f"{tf:.0f} TFLOPS is {1 - tf / median:.0%} below "
                                                        f"the node median {median:.0f}", fix)
        out.append(res)
    return out


def _copy(r: Reads, p: dict[str, Any], key: str, label: str) -> list[Result]:
    pairs, none = _pairs(r)
    if none:
        return [none]
    a = p["active"]
    out = []
    for dev, g, t in pairs:
        m = dev.get("copy")
        err = _failed(m)
        src = f"torch pinned {label} copy_, timed with CUDA events"
        pc = (g or {}).get("pcie") or {}
        max_gen = pc.get("max_gen") if isinstance(pc.get("max_gen"), int) else None
        max_w = pc.get("max_width") if isinstance(pc.get("max_width"), int) else None
        gen = int(p["gpu"]["pcie_gen"]) or max_gen
        width = int(p["gpu"]["pcie_width"]) or max_w
        link = link_gbps(gen, width)
        expected = (f">= {a['copy_warn_fraction_of_link']:.0%} of {link:.1f} GB/s (Gen{gen} x{width})" if link
                    else "measured (link unknown)")
        if err:
            out.append(Result("critical", "failed", expected, f"the pinned {label} copy failed: {err}",
                              remediation="read dmesg for Xid and IOMMU errors", target=t, source=src,
                              duration_s=m.get("seconds_total") if isinstance(m, dict) else None))
            continue
        gbps = float(m[key])
        observed = f"{gbps:.1f} GB/s" + (f" ({gbps / link:.0%} of the link)" if link else "")
        details = {**m, "link_gbps": link, "link": f"Gen{gen} x{width}" if link else None}
        res = Result("ok", observed, expected, f"pinned {label} {gbps:.1f} GB/s", target=t, value=gbps, unit="GB/s",
                     source=src, details=details, duration_s=m.get("seconds_total"))
        fix = ("check gpu.pcie_link (width and speed under load), the IOMMU mode (iommu=pt), and that "
               "nothing else copies on this link")
        if link and gbps < a["copy_critical_fraction_of_link"] * link:
            res.status, res.message, res.remediation = ("critical", f"pinned {label} copies reach {gbps:.1f} GB/s, "
                                                        f"{gbps / link:.0%} of what Gen{gen} x{width} carries", fix)
        elif link and gbps < a["copy_warn_fraction_of_link"] * link:
            res.status, res.message, res.remediation = ("warn", f"pinned {label} copies reach {gbps:.1f} GB/s, "
                                                        f"{gbps / link:.0%} of what Gen{gen} x{width} carries", fix)
        out.append(res)
    return out


@check("active.h2d_bandwidth", "active", ("gpubench", "nvml"))
def h2d(r: Reads, p: dict[str, Any]) -> list[Result]:
    return _copy(r, p, "h2d_gbps", "host-to-device")


@check("active.d2h_bandwidth", "active", ("gpubench", "nvml"))
def d2h(r: Reads, p: dict[str, Any]) -> list[Result]:
    return _copy(r, p, "d2h_gbps", "device-to-host")
