"""benchmarks/gpu_validate.py without a GPU: its bookkeeping as pure functions, and a whole run
against CPU stand-ins for the GPU workloads (the real diagnose CLI attaches to each)."""
import json
import sys
import textwrap

import pytest

from benchmarks import gpu_validate as gv
from tests.helpers import REPO


def test_progress_lines_of_both_workload_formats():
    p = gv.parse_progress("PROGRESS mode=sync steps=150 elapsed=0.6012 steps_per_s=249.50 t=1795963449.1", 5.0)
    assert (p.steps, p.clock, p.arrived) == (150, 0.6012, 5.0)
    p = gv.parse_progress("PROGRESS t=1700000000.500 steps=40 steps_per_s=20.00", 7.0)
    assert (p.steps, p.clock) == (40, 1700000000.5)
    assert gv.parse_progress("RESULT mode=x steps=9 elapsed=1.0 steps_per_s=9.00", 1.0).steps == 9
    assert gv.parse_progress("Traceback (most recent call last):", 1.0) is None
    assert gv.parse_progress("PROGRESS steps=oops", 1.0) is None


def test_rate_uses_the_workloads_own_clock_not_the_arrival_times():
    # 100 steps/s by the workload's clock; lines arrive with jitter.
    pts = [gv.Point(arrived=10.0 + k + (0.3 if k % 2 else 0.0), steps=100 * k, clock=float(k)) for k in range(10)]
    rate, span = gv.rate_between(pts, 12.0, 17.5)
    assert rate == pytest.approx(100.0) and span >= 4.0
    # Fewer than two lines inside: widen to the nearest lines outside.
    rate, span = gv.rate_between(pts, 12.05, 12.2)       # lines at 12.0 and 13.3 around it
    assert rate == pytest.approx(100.0) and span == pytest.approx(1.0)
    assert gv.rate_between(pts[:1], 0, 100) == (None, 0.0)


def test_expectations_and_pairs():
    assert gv.expected_ok("starved", ["dataloader.starved", "compute.bound"])
    assert not gv.expected_ok("starved", ["compute.bound"])
    assert gv.expected_ok("sync", ["host.sync"])
    assert gv.expected_ok("fixed", ["host.launch_bound"]) and not gv.expected_ok("fixed", ["x", "dataloader.starved"])
    rows = {"starved": {"steps_per_s": 34.8, "findings": [["dataloader.starved", 8.68, "high"]]},
            "fixed": {"steps_per_s": 217.0, "findings": []}}
    (p,) = gv.pairs(rows)
    assert p["measured_speedup"] == pytest.approx(6.24, abs=0.01)
    assert p["predicted_speedup"] == 8.68 and p["predicted_over_measured"] == pytest.approx(1.39, abs=0.01)
    md = gv.markdown([{"mode": "starved", "expected": "dataloader.starved", "status": "ok",
                       "top_finding": "dataloader.starved", "top_speedup": 8.68, "top_confidence": "high",
                       "expected_met": True, "gpu_busy": 0.049, "steps_per_s": 34.8}], [p], {"driver": "580"})
    assert "| starved | dataloader.starved | dataloader.starved (8.68x, high) | yes | 5% | 34.80 |" in md
    assert "| starved -> fixed | dataloader.starved | 8.68x | 6.24x | 1.39 |" in md


STAND_IN = textwrap.dedent("""
    # CPU stand-ins for the GPU workloads: same command line (MODE SECONDS), train_cpu's progress lines.
    import runpy, sys
    sys.path.insert(0, {repo!r})
    mode, seconds = sys.argv[1], sys.argv[2]
    knobs = {{"starved": ["--num-workers", "0"], "fixed": ["--sample-work", "0"]}}
    if mode not in knobs:
        sys.exit("no GPU here for mode " + mode)
    sys.argv = ["train_cpu", "--seconds", seconds, "--report-every", "0.5", *knobs[mode]]
    runpy.run_module("agent.workloads.train_cpu", run_name="__main__")
""")


@pytest.mark.live
def test_a_whole_run_against_cpu_stand_ins(tmp_path, capsys):
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN.format(repo=str(REPO)))
    out = tmp_path / "out"
    rc = gv.main(["--out", str(out), "--modes", "starved,healthy,fixed", "--duration", "2.5", "--warmup", "1",
                  "--clean", "2.5", "--no-preflight", "--workload-cmd", f"{sys.executable} {script}"])
    summary = json.loads((out / "summary.json").read_text())
    rows = {r["mode"]: r for r in summary["modes"]}
    # The mode whose workload cannot start fails with its own words; the others still run.
    assert rows["healthy"]["status"] == "failed" and "no GPU here for mode healthy" in rows["healthy"]["error"]
    assert rc == 1
    for mode in ("starved", "fixed"):
        r = rows[mode]
        assert r["status"] == "ok", r
        assert (out / "reports" / f"{mode}.json").exists()
        assert r["steps_per_s"] and r["steps_per_s_while_diagnosed"]
        assert r["probes"]["pyspy"] == "ok" and r["probes"]["gpu"].startswith("skipped (no NVIDIA driver")
    assert rows["starved"]["top_finding"] == "dataloader.starved" and rows["starved"]["expected_met"]
    assert rows["fixed"]["expected_met"]
    (pair,) = summary["pairs"]
    assert pair["from"] == "starved" and pair["predicted_speedup"] > 1.0
    assert pair["measured_speedup"] > 1.5       # in-memory batches beat in-loop loading by far
    md = (out / "summary.md").read_text()
    assert md in capsys.readouterr().out and "| starved -> fixed |" in md
    assert "diagnose --pid" in (out / "logs" / "starved.diagnose.txt").read_text()


def test_a_node_without_nvml_is_not_ready_and_says_why(tmp_path):
    from tests.test_gpu_probe import _driver_present
    if _driver_present():
        pytest.skip("an NVIDIA driver is present")
    rc = gv.main(["--out", str(tmp_path)])
    assert rc == 2
    assert "not ready: NVML is not usable here: no NVIDIA driver" in (tmp_path / "summary.md").read_text()
