"""Shared test helpers: start real workloads, run the real CLI, load the real captures."""
from __future__ import annotations

import atexit
import gzip
import json
import os
import shutil
import signal
import tarfile
import tempfile
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
H200 = DATA / "h200"
H200_MODES = ("starved", "fixed", "healthy", "sync", "pageable", "pinned")
PY = sys.executable


@dataclass
class Workload:
    proc: subprocess.Popen
    lines: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rates(self) -> list[float]:
        return [float(ln.rsplit("steps_per_s=", 1)[1]) for ln in self.lines if ln.startswith("PROGRESS")]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_workload(*args: str, warmup_lines: int = 1, timeout: float = 60.0, env: dict | None = None,
                   module: str = "trainprobe.agent.workloads.train_cpu") -> Workload:
    """Start `python -m trainprobe.agent.workloads.train_cpu ARGS` and wait until it reports progress."""
    e = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
    e.update(env or {})
    proc = subprocess.Popen([PY, "-m", module, *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=e)
    w = Workload(proc)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            w.lines.append(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(1 for ln in w.lines if ln.startswith("PROGRESS")) >= warmup_lines:
            return w
        if proc.poll() is not None:
            raise RuntimeError("workload exited early:\n" + "\n".join(w.lines[-20:]))
        time.sleep(0.1)
    w.stop()
    raise RuntimeError("workload did not start in time:\n" + "\n".join(w.lines[-20:]))


@dataclass
class CliResult:
    rc: int
    out: str
    err: str

    def json(self) -> dict:
        return json.loads(self.out)


def run_cli(*args: str, timeout: float = 120.0, user: int | None = None, env: dict | None = None) -> CliResult:
    """Run the real `trainprobe` command line (optionally as another uid) and capture everything."""
    e = dict(os.environ, NO_COLOR="1")
    e.update(env or {})
    argv = [PY, "-m", "trainprobe.agent", *args]
    kw = {}
    if user is not None:
        kw["user"] = user
        kw["group"] = user
        kw["extra_groups"] = []
    p = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=e, **kw)
    return CliResult(p.returncode, p.stdout, p.stderr)


def h200_chrometrace(mode: str) -> str:
    with gzip.open(H200 / mode / "pyspy.chrometrace.json.gz", "rt") as fh:
        return fh.read()


def h200_pid(mode: str) -> int:
    return json.loads((H200 / mode / "nvml.json").read_text())["pid"]


def h200_pyspy_capture(mode: str):
    from trainprobe.probes.pyspy import capture_from_chrometrace
    return capture_from_chrometrace(h200_chrometrace(mode), h200_pid(mode),
                                    source_remap={"/srv/train/": str(H200 / "src") + "/"})


def h200_nvml(mode: str) -> dict:
    return json.loads((H200 / mode / "nvml.json").read_text())


def h200_gpu_capture(mode: str):
    from trainprobe.probes.gpu import capture_from_nvml_json
    return capture_from_nvml_json((H200 / mode / "nvml.json").read_text())


def h200_anchored_pyspy_capture(mode: str, shift_s: float = 0.0):
    """The py-spy capture on the NVML clock: the capture script launched py-spy (-r 50) and began
    NVML polling together at nvml.json's started_unix_us, so that is py-spy's time zero."""
    cap = h200_pyspy_capture(mode)
    cap.meta["launch_unix"] = h200_nvml(mode)["started_unix_us"] / 1e6 + shift_s
    cap.meta["rate_hz"] = 50
    return cap


def h200_evidence(mode: str, shift_s: float = 0.0, cpus: int = 16):
    from trainprobe.agent import evidence
    return evidence.build([h200_anchored_pyspy_capture(mode, shift_s), h200_gpu_capture(mode)],
                          {"cpus_available": cpus, "uses_cuda": True})


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and all its descendants, in MB, read from outside (psutil)."""
    import psutil

    root = psutil.Process(pid)
    total = 0
    for p in [root, *root.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / (1 << 20)


_TREES: dict[Path, Path] = {}


def extracted_tree(archive: Path) -> str:
    """The one top directory of a captured tree (a sysfs tarball), extracted once per test process
    for read-only use. Owners stay numeric: as root, tarfile would otherwise look up each member's
    group by name (11,000 lookups, 3 s, for one hwloc tree)."""
    archive = Path(archive)
    if archive not in _TREES:
        d = Path(tempfile.mkdtemp(prefix="trainprobe-tree-"))
        atexit.register(shutil.rmtree, d, True)
        with tarfile.open(archive) as tf:
            tf.extractall(d, numeric_owner=True, **({"filter": "tar"} if hasattr(tarfile, "data_filter") else {}))
        _TREES[archive] = d
    (top,) = [p for p in _TREES[archive].iterdir() if p.is_dir()]
    return str(top)


def interruptible() -> None:
    """preexec_fn for a child a test will Ctrl-C: SIGINT back to its default. A shell without job
    control starts background commands with SIGINT ignored, the ignore is inherited across exec, and
    Python then installs no KeyboardInterrupt handler: the child would never see the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_probe(probe, pid, window_s=3.0, **options):
    """One real window of `probe` over process `pid`, in this process: (capture, parsed evidence). The
    probe must be able to run there (its check is asserted)."""
    from trainprobe.probes.base import Capture, Recorder, WatchSpec   # noqa: PLC0415 - tests that need a probe
    spec = WatchSpec(pid=pid, window_s=window_s, options=options)
    assert probe.check(spec).ok
    cap = Capture(probe.name, started_unix=time.time())
    rec = Recorder(cap, threading.Event())
    probe.capture(spec, rec, time.monotonic() + window_s)
    return cap, type(probe).parse(cap)
