import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.helpers import start_workload  # noqa: E402


@pytest.fixture
def workload():
    """Factory: start a real training workload; every one is stopped at teardown."""
    started = []

    def make(*args, **kw):
        w = start_workload(*args, **kw)
        started.append(w)
        return w

    yield make
    for w in started:
        w.stop()


# -- CI cannot pass by skipping --------------------------------------------------------------------
# On a user's machine a live test skips with a reason when the host lacks a capability (bcc, perf,
# chromium, numactl, py-spy, root). Under CI (.ci/run exports TRAINPROBE_REQUIRE_LIVE=1) the
# capability is installed by `make`, so such a skip means a broken install: it fails instead.
# Skips that are not about a capability stay skips: data that lives beside the project
# (../shared fixtures, captures not taken yet) and paths that exist only on other hardware
# (an NVIDIA driver present).
REQUIRE_LIVE_ENV = "TRAINPROBE_REQUIRE_LIVE"
NOT_A_CAPABILITY = ("nvidia driver is present", "the no-driver path", "the no-PMU path", "fixture", "captures",
                    "not captured", "third-party sysfs", "../shared", "beside the project",
                    "this test reads the behaviour of")   # a host sysctl other than the one the test reads


def require_live() -> bool:
    return os.environ.get(REQUIRE_LIVE_ENV, "").strip() not in ("", "0")


def skip_is_a_capability(reason: str) -> bool:
    r = reason.lower()
    return not any(s in r for s in NOT_A_CAPABILITY)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if not (rep.skipped and require_live()) or hasattr(rep, "wasxfail"):
        return
    longrepr = rep.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    if skip_is_a_capability(reason):
        rep.outcome = "failed"
        rep.longrepr = (f"{REQUIRE_LIVE_ENV}=1: this test would have skipped for a missing capability, "
                        f"which CI installs: {reason}")


# -- Two phases: in parallel, then alone ----------------------------------------------------------
# `make test` runs the suite in two pytest runs: every test not marked `serial` on two xdist workers,
# then the `serial` ones one at a time. A test is serial when what it asserts (a finding's rank, a
# measured share of the step, the agent's cost, a straggler) would move if another test's job ran
# beside it on the same CPUs, or when it waits on a deadline that another test's load would overrun
# (an eBPF program compiled and attached); tests that assert structure (what was read, what was refused, what a
# page shows, that nothing was left attached) run in parallel. Marked here by module, or by test.
SERIAL_MODULES = {
    "test_bcc_probes", "test_cost", "test_cpu_contended", "test_gil_evidence", "test_live_multirank", "test_live_straggler_ranks", "test_rules_cpu_io_gil", "test_slurm_job", "test_slurm_stragglers",
    "test_priority_auto", "test_throttle", "test_watch", "test_windows",
}
SERIAL_TESTS = {
    "test_live_diagnose.py::test_starved_inloop_job_gets_dataloader_starved_with_workers",
    "test_live_diagnose.py::test_too_few_workers_still_starved_and_no_more_workers_than_fit",
    "test_live_diagnose.py::test_compute_bound_job_is_not_called_starved",
    "test_live_diagnose.py::test_text_report_shows_top_finding_speedup_evidence_and_fix",
    "test_bundle_report.py::test_report_reproduces_the_live_findings_and_the_html_renders",
    "test_bundle_report.py::test_directory_bundle_of_a_job_with_workers",
    "test_perf_live.py::test_diagnose_report_is_complete_with_the_perf_probe",
    # perf's interval count over a 3 s window: a loaded CPU delays its start past two intervals
    "test_perf_live.py::test_probe_on_a_training_job_and_its_workers",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        name = f"{module}.py::{item.originalname or item.name}"
        if module in SERIAL_MODULES or name in SERIAL_TESTS:
            item.add_marker(pytest.mark.serial)
