"""The gpubench probe (preflight --active): GPU measurements with torch, run in a child process
(`python -m trainprobe.probes.gpubench`).

Per GPU: a 1024x1024 fp32 matmul (TF32 off) compared with a float64 CPU reference (relative
error, NaN/Inf), the achieved bf16 GEMM rate on 8192x8192 matrices, and pinned host-to-device and
device-to-host copy bandwidth (256 MiB buffers). It prints one JSON object with the raw numbers;
whether they are good is decided in agent/preflight. It runs in its own process so a hung CUDA call
can be killed from outside. Cost: a CUDA context per GPU and a few seconds per GPU, at full load.

`--device cpu` runs the matmul and GEMM parts on the CPU (no copies): the same code path, for
machines without a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from trainprobe.probes.base import Availability, ReadingProbe, Recorder, WatchSpec, reads_schema
from trainprobe.probes.errors import ProbeError, TimedOut

SCHEMA = "trainprobe.gpubench/1"


def _timer(torch: Any, device: str):
    """(start, stop) -> seconds: CUDA events on a GPU, perf_counter on the CPU."""
    if device.startswith("cuda"):
        def run(fn, reps: int) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        return run

    def run_cpu(fn, reps: int) -> float:
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return time.perf_counter() - t0
    return run_cpu


def matmul_check(torch: Any, device: str, n: int = 1024) -> dict[str, Any]:
    g = torch.Generator().manual_seed(1234)
    a = torch.randn(n, n, generator=g, dtype=torch.float32)
    b = torch.randn(n, n, generator=g, dtype=torch.float32)
    ref = a.double() @ b.double()
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        got = (a.to(device) @ b.to(device)).double().cpu()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    finite = bool(torch.isfinite(got).all())
    err = float((got - ref).abs().max() / ref.abs().max()) if finite else None
    return {"n": n, "dtype": "float32", "tf32": False, "finite": finite, "max_rel_error": err}


def gemm_rate(torch: Any, device: str, n: int, dtype_name: str, min_seconds: float) -> dict[str, Any]:
    dtype = getattr(torch, dtype_name)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    run = _timer(torch, device)

    def step() -> None:
        torch.matmul(a, b, out=c)

    run(step, 2)  # warm-up: cuBLAS heuristics, clocks up
    reps, secs = 1, run(step, 1)
    while secs < min_seconds and reps < 10_000:
        reps = max(reps * 2, int(reps * min_seconds / max(secs, 1e-6) * 1.2))
        secs = run(step, reps)
    flops = 2.0 * n ** 3 * reps
    return {"n": n, "dtype": dtype_name, "reps": reps, "seconds": round(secs, 6),
            "tflops": float(f"{flops / secs / 1e12:.4g}")}  # 4 significant digits: a CPU reads ~0.01


def copy_bandwidth(torch: Any, device: str, nbytes: int, reps: int) -> dict[str, Any]:
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    run = _timer(torch, device)
    run(lambda: dev.copy_(host, non_blocking=True), 1)
    h2d = run(lambda: dev.copy_(host, non_blocking=True), reps)
    run(lambda: host.copy_(dev, non_blocking=True), 1)
    d2h = run(lambda: host.copy_(dev, non_blocking=True), reps)
    return {"bytes": nbytes, "reps": reps, "pinned": True,
            "h2d_gbps": round(nbytes * reps / h2d / 1e9, 3), "d2h_gbps": round(nbytes * reps / d2h / 1e9, 3)}


def bench_device(torch: Any, device: str, gemm_n: int, gemm_seconds: float, copy_bytes: int,
                 copy_reps: int) -> dict[str, Any]:
    rec: dict[str, Any] = {"device": device}
    t0 = time.monotonic()
    if device.startswith("cuda"):
        idx = int(device.split(":")[1])
        props = torch.cuda.get_device_properties(idx)
        rec["name"] = props.name
        dom, bus, dev = (getattr(props, k, None) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
        rec["bus_id"] = f"{dom:08x}:{bus:02x}:{dev:02x}.0".upper() if None not in (dom, bus, dev) else None
        torch.cuda.set_device(idx)
        torch.zeros(1, device=device)  # context creation, outside the timed parts
    rec["context_seconds"] = round(time.monotonic() - t0, 3)
    for key, fn in (("matmul", lambda: matmul_check(torch, device)),
                    ("gemm", lambda: gemm_rate(torch, device, gemm_n, "bfloat16", gemm_seconds)),
                    ("copy", (lambda: copy_bandwidth(torch, device, copy_bytes, copy_reps))
                     if device.startswith("cuda") else None)):
        if fn is None:
            rec[key] = {"na": "no CUDA device: copies need one"}
            continue
        t1 = time.monotonic()
        try:
            rec[key] = fn()
        except Exception as exc:  # noqa: BLE001 - a failing device is a measurement, not a crash
            rec[key] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
        rec[key]["seconds_total"] = round(time.monotonic() - t1, 3)
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return rec


def run(gpus: list[int] | None, device_kind: str, gemm_n: int, gemm_seconds: float, copy_mib: int,
        copy_reps: int) -> dict[str, Any]:
    out: dict[str, Any] = {"schema": SCHEMA, "error": None, "devices": []}
    try:
        import torch  # noqa: PLC0415 - heavy: only in this child process
    except ImportError:
        out["error"] = "torch is not installed: `pip install torch` (a CUDA build) to run --active"
        return out
    out["torch"] = torch.__version__
    out["cuda"] = getattr(torch.version, "cuda", None)
    if device_kind == "cpu":
        devices = ["cpu"]
    else:
        if not torch.cuda.is_available():
            out["error"] = (f"torch {torch.__version__} sees no CUDA device"
                            + (" (a CPU-only build)" if not getattr(torch.version, "cuda", None) else ""))
            return out
        n = torch.cuda.device_count()
        devices = [f"cuda:{i}" for i in range(n) if gpus is None or i in gpus]
    for dev in devices:
        out["devices"].append(bench_device(torch, dev, gemm_n, gemm_seconds, copy_mib << 20, copy_reps))
    return out


def run_child(rec: Recorder, gpus: list[int] | None, timeout_s: float, gemm_n: int = 8192,
              gemm_seconds: float = 0.5, copy_mib: int = 256, copy_reps: int = 10,
              device: str = "cuda") -> dict[str, Any]:
    """Run the measurements in a child process (tracked by `rec`) and kill it if it overruns `timeout_s`."""
    argv = [sys.executable, "-m", "trainprobe.probes.gpubench", "--device", device, "--gemm-n", str(gemm_n),
            "--gemm-seconds", str(gemm_seconds), "--copy-mib", str(copy_mib), "--copy-reps", str(copy_reps)]
    if gpus is not None:
        argv += ["--gpus", ",".join(map(str, gpus))]
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p))
    proc = rec.spawn(argv, stop_signal=signal.SIGKILL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     text=True, env=env)
    try:
        out, err = proc.communicate(timeout=max(1.0, timeout_s))
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.communicate(timeout=2.0)
        except subprocess.TimeoutExpired:
            pass  # stuck in the driver (D state): leave it, do not hang with it
        raise TimedOut(f"the active GPU tier did not finish within {timeout_s:g} s and was killed "
                       "(a hung CUDA call?)") from None
    rec.finish(proc, 0.0)
    lines = [ln for ln in out.splitlines() if ln.strip().startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (err.strip().splitlines() or ["no output"])[-1]
        raise ProbeError(f"the active GPU tier exited with code {proc.returncode}: {tail}")
    return json.loads(lines[-1])


class GpuBenchProbe(ReadingProbe):
    """The active GPU tier: matmul correctness, GEMM rate and pinned copy bandwidth, per GPU."""

    name = "gpubench"
    description = "Active GPU tests: matmul vs CPU, bf16 GEMM rate, pinned copy bandwidth"
    needs = ("torch with CUDA", "idle GPUs")
    cost = "a CUDA context and a few seconds per GPU, at full load (opt in: preflight --active)"
    timeout_s = 120.0
    reads = {"gpubench": "the active GPU tier (torch)"}
    evidence_schema = reads_schema("GpuBenchReads", reads)

    def check(self, spec: WatchSpec) -> Availability:
        # torch missing or CPU-only is said by the child, in the read: the checks report it.
        return Availability.yes()

    def read(self, name: str, spec: WatchSpec, rec: Recorder) -> Any:
        if spec.root != "/":
            from trainprobe.probes.gpuhealth import TREE_NO_DEVICES
            return {"schema": SCHEMA, "error": TREE_NO_DEVICES, "devices": []}
        a = spec.options.get("active") or {}
        timeout_s = float(spec.options.get("active_timeout_s", self.timeout_s))
        return run_child(rec, spec.options.get("gpus"), timeout_s, gemm_n=int(a.get("gemm_n", 8192)),
                         gemm_seconds=float(a.get("gemm_seconds", 0.5)), copy_mib=int(a.get("copy_mib", 256)),
                         copy_reps=int(a.get("copy_reps", 10)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainprobe.probes.gpubench")
    ap.add_argument("--gpus", default=None, help="CUDA device indices (PCI bus order), comma-separated")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--gemm-n", type=int, default=8192)
    ap.add_argument("--gemm-seconds", type=float, default=0.5)
    ap.add_argument("--copy-mib", type=int, default=256)
    ap.add_argument("--copy-reps", type=int, default=10)
    a = ap.parse_args(argv)
    # Number CUDA devices the way NVML and nvidia-smi do, so results match the passive reads.
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    gpus = [int(x) for x in a.gpus.split(",") if x.strip()] if a.gpus else None
    res = run(gpus, a.device, a.gemm_n, a.gemm_seconds, a.copy_mib, a.copy_reps)
    json.dump(res, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
