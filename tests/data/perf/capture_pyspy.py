"""Capture py-spy evidence of a local train_cpu workload into tests/data/perf/ (chrometrace + pid)."""
import gzip, json, subprocess, sys, time, os
sys.path.insert(0, os.getcwd())
from tests.helpers import start_workload
from probes.pyspy import PySpyProbe
from agent.session import run_session
from probes.base import WatchSpec
name, args = sys.argv[1], sys.argv[2:]
w = start_workload(*args, warmup_lines=3)
try:
    res = run_session(WatchSpec(pid=w.pid, window_s=4.0, rate_hz=50), [PySpyProbe()], progress=lambda m: None)
    cap = res.captures[0]
    assert cap.status == "ok", cap.reason
    with gzip.open(f"tests/data/perf/{name}.chrometrace.json.gz", "wt") as fh:
        fh.write(cap.artifacts["chrometrace.json"])
    json.dump({"pid": w.pid, "argv": ["python", "-m", "agent.workloads.train_cpu", *args],
               "launch_unix": cap.meta["launch_unix"], "rate_hz": 50}, open(f"tests/data/perf/{name}.json", "w"))
    bd = PySpyProbe.parse(cap)["training_thread"]["breakdown"]
    print(name, bd)
finally:
    w.stop()
