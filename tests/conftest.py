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
