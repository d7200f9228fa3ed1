"""The perf stat probe's decisions that do not need a target: permissions, PMU detection, the plan."""
import os

import pytest

from trainprobe.probes.perfstat import (CAP_PERFMON, CAP_SYS_ADMIN, PerfStatProbe, core_pmus, interval_plan,
                             permission_problem, read_pmu)
from trainprobe.probes.base import WatchSpec
from trainprobe.probes.registry import probe_class


def test_registered_with_its_metadata():
    cls = probe_class("perfstat")
    assert cls is PerfStatProbe
    assert cls.description and cls.needs and cls.cost and cls.timeout_s > 0


@pytest.mark.parametrize("window,ms,count", [(10.0, 1000, 10), (3.0, 300, 10), (0.5, 100, 5), (600.0, 1000, 600)])
def test_interval_plan_stays_inside_the_window(window, ms, count):
    assert interval_plan(window) == (ms, count)
    m, n = interval_plan(window)
    assert m * n <= window * 1000 + 1e-6 and m >= 100


def test_root_and_capabilities_bypass_paranoid():
    assert permission_problem(0, 0, 4, 1000) is None
    assert permission_problem(1000, 1 << CAP_PERFMON, 4, 0) is None
    assert permission_problem(1000, 1 << CAP_SYS_ADMIN, 3, 0) is None


def test_debian_paranoid_three_forbids_unprivileged_perf_and_says_how_to_fix():
    why = permission_problem(1000, 0, 3, 1000)
    assert "perf_event_paranoid is 3" in why and "sysctl kernel.perf_event_paranoid=2" in why
    assert "CAP_PERFMON" in why


def test_another_users_process_needs_privilege():
    why = permission_problem(1000, 0, 2, 0)
    assert "belongs to uid 0" in why and "root or CAP_PERFMON" in why
    assert permission_problem(1000, 0, 2, 1000) is None      # own process at 2: user-space counts


def test_core_pmu_detection():
    assert core_pmus({"software": 1, "tracepoint": 2, "msr": 9, "power": 13, "uprobe": 8}) == []
    assert core_pmus({"cpu": 4, "software": 1, "power": 13}) == ["cpu"]
    assert core_pmus({"cpu_core": 4, "cpu_atom": 10, "software": 1}) == ["cpu_atom", "cpu_core"]
    assert core_pmus({"armv8_pmuv3_0": 8, "software": 1}) == ["armv8_pmuv3_0"]


def test_this_hosts_pmu_is_read_from_sysfs():
    pmu = read_pmu("/")
    assert "software" in pmu["sources"] and pmu["sources"]["software"] == 1
    if os.path.exists("/sys/bus/event_source/devices/cpu"):
        assert "cpu" in pmu["core_pmus"]
    else:
        assert "cpu" not in pmu["core_pmus"]


def test_check_names_a_missing_target(tmp_path):
    av = PerfStatProbe().check(WatchSpec(pid=2 ** 22 + 7, window_s=1.0))
    if av.ok is False and av.reason.startswith("perf not found"):
        pytest.skip("perf is not installed on this host")
    assert av.ok is False and "does not exist" in av.reason


def test_ubuntu_wrapper_without_a_build_for_this_kernel_says_what_to_install():
    # The wording of Ubuntu's /usr/bin/perf wrapper (linux-tools-common) when the running kernel
    # has no matching linux-tools package, as users quote it.
    from trainprobe.probes.errors import Unavailable
    from trainprobe.probes.perfstat import classify_failure
    err = classify_failure("WARNING: perf not found for kernel 6.8.0-138\n\n  You may need to install the "
                           "following packages for this specific kernel:\n    linux-tools-6.8.0-138-generic\n", 2)
    assert isinstance(err, Unavailable) and "linux-tools-$(uname -r)" in str(err)
