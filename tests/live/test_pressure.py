"""The pressure (PSI) probe: its parser on real /proc/pressure text, and the probe on a starved host."""
import os
import subprocess
import sys
import threading
import time

import pytest

from trainprobe.probes.base import Capture, Recorder, WatchSpec
from trainprobe.probes.pressure import PressureProbe, cgroup_v2_path, parse_pressure, stalls
from tests.helpers import DATA

PSI = DATA / "pressure"   # captured on a 2-CPU VM (Linux 6.18), 5 s apart; see tests/data/pressure/README.md


def test_parser_reads_captured_psi_files():
    cpu = parse_pressure((PSI / "cpu.start").read_text())
    assert cpu["some"] == {"avg10": 7.50, "avg60": 3.49, "avg300": 1.36, "total_us": 8332151}
    assert cpu["full"]["total_us"] == 0
    io = parse_pressure((PSI / "io.end").read_text())
    assert io["full"]["avg300"] == 0.13 and io["full"]["total_us"] == 2523809


def test_a_kernel_without_the_cpu_full_line_is_read():
    # Before Linux 5.13 the host's cpu file holds only the `some` line.
    only_some = (PSI / "cpu.start").read_text().splitlines()[0] + "\n"
    assert set(parse_pressure(only_some)) == {"some"}


def test_stall_share_comes_from_the_total_counters():
    s = stalls((PSI / "cpu.start").read_text(), (PSI / "cpu.end").read_text(), window_s=5.0)
    assert s["some"]["stall_fraction"] == pytest.approx((8613808 - 8332151) / 1e6 / 5.0, abs=1e-4)
    assert s["full"]["stall_fraction"] == 0.0
    assert s["some"]["avg10"] == 6.16            # the averages are the end reading's
    assert stalls("", (PSI / "cpu.end").read_text(), 5.0)["some"]["stall_fraction"] is None


def test_cgroup_v2_path_and_v1_none():
    assert cgroup_v2_path("0::/user.slice/job.scope\n") == "/user.slice/job.scope"
    assert cgroup_v2_path("12:cpu,cpuacct:/slurm/job_1\n") is None
    assert cgroup_v2_path("4:memory:/x\n0::/\n") is None      # the root cgroup: the host's pressure


@pytest.mark.live
def test_probe_sees_cpu_stalls_of_more_spinners_than_cpus():
    if PressureProbe().check(WatchSpec(pid=os.getpid(), window_s=1)).ok is False:
        pytest.skip("no PSI on this kernel")
    n = (os.cpu_count() or 1) + 2
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(0.3)
        cap = Capture("pressure")
        PressureProbe().capture(WatchSpec(pid=spin[0].pid, window_s=1.5), Recorder(cap, threading.Event()),
                                time.monotonic() + 1.5)
    finally:
        for p in spin:
            p.kill()
            p.wait()
    ev = PressureProbe.parse(cap)
    assert 1.4 < ev["window_s"] < 3.0
    # More runnable spinners than CPUs: some task waited for a CPU most of the window.
    assert ev["host"]["cpu"]["some"]["stall_fraction"] > 0.5
    if ev["cgroup_path"]:
        assert "cpu" in ev["cgroup"]
