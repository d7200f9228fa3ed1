"""The throttle probe: cpu.stat parsed from captured text, and a live cgroup with a CPU quota."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import DATA, run_cli, run_probe
from trainprobe.probes.throttle import ThrottleProbe, find_cgroup, parse_cpu_stat, quota_cpus, throttling

THR = DATA / "throttle"


def test_parser_reads_captured_cpu_stat():
    end = parse_cpu_stat((THR / "v1.end").read_text())
    assert end == {"nr_periods": 20, "nr_throttled": 19, "throttled_time": 1464329116, "nr_bursts": 0,
                   "burst_time": 0}
    root = parse_cpu_stat((THR / "v2-root.stat").read_text())
    assert "nr_periods" not in root and root["usage_usec"] > 0


def test_throttling_over_a_window_from_captured_v1_text():
    t = throttling((THR / "v1.start").read_text(), (THR / "v1.end").read_text(), 2.0)
    assert t["periods"] == 20 and t["throttled_periods"] == 19 and t["throttled_period_share"] == 0.95
    assert t["throttled_seconds"] == pytest.approx(1.464329, abs=1e-6)
    assert t["throttled_share_of_window"] == pytest.approx(0.7322, abs=1e-4)
    files = {"cpu.cfs_quota_us": (THR / "v1.cfs_quota_us").read_text(),
             "cpu.cfs_period_us": (THR / "v1.cfs_period_us").read_text()}
    assert quota_cpus(1, files) == 0.2
    assert quota_cpus(1, {"cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"}) is None
    assert quota_cpus(2, {"cpu.max": "max 100000\n"}) is None and quota_cpus(2, {"cpu.max": "50000 100000\n"}) == 0.5
    # A cgroup without a quota counts no periods: nothing throttled, no share.
    none = throttling((THR / "v2-root.stat").read_text(), (THR / "v2-root.stat").read_text(), 2.0)
    assert none["periods"] == 0 and none["throttled_period_share"] is None and none["throttled_seconds"] is None


def _quota_group(spinner_pid: int) -> Path | None:
    """A v1 cpu cgroup (or a v2 one with the cpu controller) at 0.2 CPU holding the spinner."""
    for mount, quota_file, quota in (("/sys/fs/cgroup/cpu", "cpu.cfs_quota_us", "20000"),
                                     ("/sys/fs/cgroup", "cpu.max", "20000 100000")):
        if not os.path.exists(os.path.join(mount, quota_file if mount.endswith("cpu") else "cgroup.controllers")):
            continue
        g = Path(mount) / f"trainprobe-test-{os.getpid()}"
        try:
            g.mkdir()
            (g / quota_file).write_text(quota)
            (g / "cgroup.procs").write_text(str(spinner_pid))
            return g
        except OSError:
            if g.exists():
                g.rmdir()
    return None


@pytest.mark.live
def test_probe_sees_a_quota_throttle_a_spinner():
    if os.geteuid() != 0:
        pytest.skip("root is needed to create a cgroup with a CPU quota")
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    g = _quota_group(spin.pid)
    try:
        if g is None:
            pytest.skip("no cgroup cpu controller to put a quota on")
        _, ev = run_probe(ThrottleProbe(), spin.pid, 1.5)      # its check is asserted
    finally:
        spin.kill()
        spin.wait()
        if g is not None:
            time.sleep(0.1)
            g.rmdir()
    assert ev["cgroup_dir"] == str(g) and ev["quota_cpus"] == 0.2
    # 0.2 CPU for a process that wants a whole one: most periods hit the quota, and the spinner was
    # held back for most of the window.
    assert ev["periods"] >= 10 and ev["throttled_period_share"] > 0.8
    assert ev["throttled_share_of_window"] > 0.5


@pytest.mark.live
def test_diagnose_runs_it_when_named_and_reports_the_evidence(workload):
    w = workload("--seconds", "60", "--num-workers", "0")
    r = run_cli("diagnose", "--pid", str(w.pid), "--duration", "2", "--json", "--probes", "process,throttle")
    assert r.rc == 0, r.err
    probes = {p["name"]: p for p in r.json()["probes"]}
    assert probes["throttle"]["status"] == "ok", probes["throttle"]
    found = find_cgroup("/", Path(f"/proc/{w.pid}/cgroup").read_text())
    assert found is not None
