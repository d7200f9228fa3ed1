"""`trainprobe flamegraph` on real training processes started by the tests, and offline."""
import json
import os
import subprocess
import xml.etree.ElementTree as ET

import pytest

from trainprobe.agent import bundle, profiles
from trainprobe.reports import folded
from tests.helpers import h200_pyspy_capture, run_cli
from tests.report_fixtures import h200_capture_and_context
from tests.replay.test_folded_speedscope import validate_speedscope

SVG = "{http://www.w3.org/2000/svg}"


def one_clean_line(r):
    assert "Traceback" not in r.err and "Traceback" not in r.out
    lines = [ln for ln in r.err.splitlines() if ln.strip()]
    assert lines, "expected a message on stderr"
    return lines[-1]


def svg_frames(path):
    root = ET.parse(path).getroot()
    out = []
    for g in root.iter(f"{SVG}g"):
        if g.get("class") == "f":
            out.append((g.find(f"{SVG}title").text.split("\n")[0], int(g.get("data-n")), g.get("data-delta")))
    return root, out


@pytest.mark.live
def test_svg_of_a_live_job_shows_its_python_frames(workload, tmp_path):
    w = workload("--seconds", "60", "--num-workers", "0")
    out = tmp_path / "f.svg"
    r = run_cli("flamegraph", "--pid", str(w.pid), "--duration", "2", "-o", str(out))
    assert r.rc == 0, r.err
    assert r.out == ""                                     # the graph went to the file
    root, frames = svg_frames(out)
    labels = [f[0] for f in frames]
    total = int(root.get("data-total"))
    assert frames[-1][0] == "all" or "all" in labels
    # one box per function by default (--group function): no line numbers
    assert "SyntheticDataset.__getitem__ (train_cpu.py)" in labels
    assert "_MapDatasetFetcher.fetch (torch/utils/data/_utils/fetch.py)" in labels
    # wall-clock microseconds of the process's threads over a ~2 s window (at least the main thread)
    assert 1.0e6 < total < 2.5e6 * 8
    assert "non-blocking --idle" in root.find(f".//{SVG}text[@class='tp-sub']").text
    assert w.alive()
    assert "wrote svg to" in r.err


@pytest.mark.live
def test_folded_and_speedscope_with_workers_then_a_live_diff(workload, tmp_path):
    w = workload("--seconds", "60", "--num-workers", "1", "--sample-work", "6000", warmup_lines=2)
    r = run_cli("flamegraph", "--pid", str(w.pid), "--duration", "2", "--format", "folded", "--subprocesses", "--threads",
                "--group", "line")
    assert r.rc == 0, r.err
    prof = folded.parse(r.out)
    roots = {k.split(";")[0] for k in prof}
    assert len({x for x in roots if x.startswith("process ")}) >= 2          # the main process and its worker
    assert all(k.split(";")[1].startswith("thread (") for k in prof)
    assert any("_worker_loop (torch/utils/data/_utils/worker.py:" in k for k in prof)
    assert folded.dumps(prof) == r.out                                         # canonical, integer counts
    before = tmp_path / "before.folded"
    before.write_text(r.out)

    ss = tmp_path / "p.json"
    r = run_cli("flamegraph", "--pid", str(w.pid), "--duration", "2", "-o", str(ss), "--subprocesses", "--threads")
    assert r.rc == 0, r.err
    doc = json.loads(ss.read_text())
    validate_speedscope(doc)
    assert len(doc["profiles"]) >= 3 and doc["exporter"].startswith("trainprobe@")
    assert any(p["name"].startswith("process ") and " / thread (" in p["name"] for p in doc["profiles"])

    d = tmp_path / "diff.html"
    r = run_cli("flamegraph", "--pid", str(w.pid), "--duration", "2", "-o", str(d), "--subprocesses", "--threads",
                "--diff", str(before))
    assert r.rc == 0, r.err
    page = d.read_text()
    assert 'data-diff="1"' in page and "data-delta=" in page and f"before: folded stacks {before}" in page
    assert w.alive()


def test_offline_diff_of_before_and_after_a_fix(tmp_path):
    # the training thread before (num_workers=0) and after the fix (12 workers)
    before = profiles.training_profile(profiles.stacks_of(h200_pyspy_capture("starved")))
    after = profiles.training_profile(profiles.stacks_of(h200_pyspy_capture("fixed")))
    (tmp_path / "before.folded").write_text(folded.dumps(before))
    (tmp_path / "after.folded").write_text(folded.dumps(after))
    out = tmp_path / "d.svg"
    r = run_cli("flamegraph", "--input", str(tmp_path / "after.folded"), "--diff", str(tmp_path / "before.folded"),
                "-o", str(out), "--group", "line")
    assert r.rc == 0, r.err
    _root, frames = svg_frames(out)
    deltas = {lab: float(d) for lab, _n, d in frames}
    assert deltas["Tensor.backward (torch/_tensor.py:631)"] > 0.3        # the loop now computes most of the time
    assert deltas["main (workloads.py:40)"] < -0.8                        # and hardly loads batches any more
    assert all(not lab.startswith("_SingleProcessDataLoaderIter") for lab in deltas)    # gone: not drawn
    # the two-count folded form
    r = run_cli("flamegraph", "--input", str(tmp_path / "after.folded"), "--diff", str(tmp_path / "before.folded"),
                "--format", "folded")
    assert r.rc == 0, r.err
    b2, a2 = folded.parse_diff(r.out)
    assert b2 == folded.group(before) and a2 == folded.group(after)       # both grouped by function


def test_input_reads_bundles_speedscope_and_chrometraces(tmp_path):
    cap, ctx = h200_capture_and_context("fixed")
    want = profiles.process_profile(profiles.stacks_of(cap), subprocesses=True)
    bundle.save(str(tmp_path / "b.tar.gz"), [cap], ctx, None)
    r = run_cli("flamegraph", "--input", str(tmp_path / "b.tar.gz"), "--subprocesses", "--format", "folded",
                "--group", "line")
    assert r.rc == 0, r.err
    assert folded.parse(r.out) == want
    r = run_cli("flamegraph", "--input", str(tmp_path / "b.tar.gz"), "--subprocesses", "-o", str(tmp_path / "s.json"),
                "--group", "line")
    assert r.rc == 0, r.err
    r = run_cli("flamegraph", "--input", str(tmp_path / "s.json"), "--format", "folded", "--group", "line")
    assert r.rc == 0, r.err
    back = folded.parse(r.out)
    # speedscope keeps one profile per process; read back they merge without the process roots
    stripped = {}
    for k, v in want.items():
        rest = k.split(";", 1)[1] if ";" in k else ""
        stripped[rest] = stripped.get(rest, 0) + v
    assert back == {k: v for k, v in stripped.items() if k}
    (tmp_path / "trace.json").write_text(cap.artifacts["chrometrace.json"])
    r = run_cli("flamegraph", "--input", str(tmp_path / "trace.json"), "--format", "folded")
    assert r.rc == 0, r.err
    assert folded.parse(r.out) == folded.group(profiles.process_profile(profiles.stacks_of(cap)), "function")


def test_bad_input_gets_one_line_and_exit_2(tmp_path):
    f = tmp_path / "x.folded"
    f.write_text("a;b 3\n")
    r = run_cli("flamegraph", "--pid", "1", "--input", str(f))
    assert r.rc == 2 and "not both" in one_clean_line(r)
    r = run_cli("flamegraph", "--input", str(f), "--diff", str(f), "--format", "speedscope")
    assert r.rc == 2 and "--diff draws a differential flame graph" in one_clean_line(r)
    r = run_cli("flamegraph", "--input", str(f), "--diff", str(tmp_path / "missing"))
    assert r.rc == 2 and "--diff: no such file" in one_clean_line(r)
    (tmp_path / "bad.txt").write_text("hello world\n")
    r = run_cli("flamegraph", "--input", str(tmp_path / "bad.txt"))
    assert r.rc == 2 and "line 1 is not" in one_clean_line(r)
    r = run_cli("flamegraph", "--input", str(f), "-o", "/nonexistent/dir/f.svg")
    assert r.rc == 2 and "is not a directory" in one_clean_line(r)
    r = run_cli("flamegraph", "--input", str(f), "--format", "png")
    assert r.rc == 2 and "Traceback" not in r.err
    p = subprocess.Popen(["sleep", "30"])
    try:
        r = run_cli("flamegraph", "--pid", str(p.pid), "--duration", "1")
        assert r.rc == 2 and "not a Python process" in one_clean_line(r)
    finally:
        p.kill()
        p.wait()
    assert not os.path.exists("/nonexistent/dir/f.svg")
