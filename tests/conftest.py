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
