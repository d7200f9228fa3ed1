"""Bundles saved by `diagnose --save` on a real H200 node (benchmarks/gpu_validate.py --keep), re-diagnosed
offline here: the same findings as the live run, and nothing invented on a machine without a GPU."""
import json

import pytest

from tests.helpers import H200, run_cli

BUNDLES = H200 / "live" / "bundles"
EXPECTED_TOP = {"starved": "dataloader.starved", "pageable": "h2d.pageable", "sync": "host.launch_bound"}
# Measured speedups of each mode's fix on the H200, runs 1 and 2 (README): starved -> fixed (12
# persistent pinned workers; trainprobe now prints 15), pageable -> pinned. sync -> graphed measured a hand-written CUDA graph
# of the whole step, not the torch.compile line trainprobe prints: the GPU ledger measures that one.
MEASURED = {"starved": (7.63, 5.86), "pageable": (6.30, 5.66)}


@pytest.mark.parametrize("mode", sorted(EXPECTED_TOP))
def test_report_of_a_gpu_bundle_reproduces_the_live_findings(mode):
    path = BUNDLES / f"{mode}.tar.gz"
    live = json.loads((H200 / "live" / f"{mode}.json").read_text())
    r = run_cli("report", str(path), "--json")
    assert r.rc == 0, r.err
    off = r.json()
    assert off["findings"][0]["id"] == EXPECTED_TOP[mode] == live["findings"][0]["id"]
    assert [f["id"] for f in off["findings"]][:1] == [f["id"] for f in live["findings"]][:1]
    # The fix measured on the H200 (benchmarks/gpu_validate.py, two runs): inside the finding's interval.
    if mode in MEASURED:
        lo, hi = off["findings"][0]["expected_speedup_interval"]
        for m in MEASURED[mode]:
            assert lo <= m <= hi, (mode, off["findings"][0]["expected_speedup"], [lo, hi], m)
    assert off["host"]["gpus"][0]["name"] == "NVIDIA H200"
    gpu = {p["name"]: p for p in off["probes"]}["gpu"]
    assert gpu["status"] == "ok"


def test_an_unnamed_thread_with_no_python_frames_is_not_busy():
    # py-spy labels a thread without a name "thread (TID)": it has no Python frames, so it is idle,
    # not a GIL suspect (the CUDA job on the H200 has such a thread beside the loop).
    from trainprobe.agent import bundle
    from trainprobe.probes.pyspy import PySpyProbe
    b = bundle.load(str(BUNDLES / "starved.tar.gz"))
    spy = PySpyProbe.parse(next(c for c in b.captures if c.probe == "pyspy"))
    others = spy["other_threads"]
    assert others and all(t["busy_fraction"] == 0.0 for t in others)
    assert all(t["tid"] is not None for t in others)
    r = run_cli("report", str(BUNDLES / "starved.tar.gz"), "--json")
    assert r.rc == 0, r.err
    assert not [n for n in r.json()["notes"] if "GIL" in n]
