"""Topology and placement attached to real jobs on this (one-node) machine: a single training
process and a two-rank torchrun job with gloo on CPU."""
import json
import os
import subprocess
import time

import pytest

from trainprobe.agent import diagnosis
from trainprobe.agent.evidence import Evidence
from trainprobe.agent.rules import run_rules
from trainprobe.agent.rules._numa_fixes import torchrun_command, wrapper_script
from trainprobe.probes.parsers import procfs
from trainprobe.probes.base import Capture, Recorder, WatchSpec
from trainprobe.probes.placement import PlacementProbe
from trainprobe.probes.topology import read_topology
from tests.helpers import DATA, PY, REPO, run_cli, start_workload

pytestmark = pytest.mark.live

JOB = str(REPO / "tests" / "jobs" / "ddp_gloo.py")
SECRET = "tp-live-secret-5b2e81"
SECRET_ENV = {"MY_SERVICE_TOKEN": SECRET, "AWS_SECRET_ACCESS_KEY": SECRET + "-aws"}
PLACEMENT_PROBES = "process,topology,placement"


def quiet(_msg):
    pass


def test_cli_on_a_real_job_reads_the_host_and_reports_no_remote_placement(workload):
    w = workload("--seconds", "60", "--num-workers", "1", "--sample-work", "3000",
                 env=dict(SECRET_ENV, CUDA_VISIBLE_DEVICES="0"))
    r = run_cli("diagnose", "--pid", str(w.pid), "--duration", "3", "--json", "--probes", PLACEMENT_PROBES)
    assert r.rc == 0, r.err
    rep = r.json()
    status = {p["name"]: p["status"] for p in rep["probes"]}
    assert status["topology"] == "ok" and status["placement"] == "ok", rep["probes"]
    assert not [f for f in rep["findings"] if f["id"] in ("numa.remote", "pcie.degraded")]
    assert rep["host"]["numa_nodes"] == read_topology("/")["numa_node_count"] == 1
    assert SECRET not in r.out and SECRET not in r.err and "MY_SERVICE_TOKEN" not in r.out
    rules = {x["finding"]: x["status"] for x in rep["rules"]}
    assert rules["numa.remote"] == "quiet" and rules["pcie.degraded"] == "quiet"
    assert w.alive()


def test_evidence_of_a_real_job_unknown_locality_and_missing_links_tolerated(workload):
    w = workload("--seconds", "60", "--num-workers", "1", "--sample-work", "3000",
                 env=dict(SECRET_ENV, CUDA_VISIBLE_DEVICES="0"))
    d = diagnosis.run(w.pid, duration_s=2.5, only=tuple(PLACEMENT_PROBES.split(",")), progress=quiet)
    topo, pl = d.evidence.get("topology"), d.evidence.get("placement")
    for dev in topo["pci"]:
        raw = procfs.try_read_text("/", f"sys/bus/pci/devices/{dev['bdf']}/numa_node")
        if raw is not None and raw.strip() == "-1":
            assert dev["numa_node"] is None                      # reported unknown, never guessed
    main = next(p for p in pl["processes"] if p["pid"] == w.pid)
    assert main["cuda_visible_devices"] == "0"                   # the named variable is read ...
    assert set(main["cpu_seconds_by_node"]) <= {"0"} and main["cpu_seconds"] > 0.1
    blob = json.dumps(d.report) + json.dumps(d.evidence.parsed) + json.dumps([c.to_dict() for c in d.captures])
    assert SECRET not in blob and "AWS_SECRET_ACCESS_KEY" not in blob       # ... and nothing else is


# -- torchrun, two ranks, gloo --------------------------------------------------------------------

def start_torchrun(workload, *job_args, env=None):
    w = workload("--standalone", "--nproc-per-node=2", JOB, *job_args, module="torch.distributed.run",
                 env=dict(SECRET_ENV, **(env or {})), timeout=120)
    return _two_ranks(w)


@pytest.fixture(scope="module")
def torchrun_job():
    """One two-rank job for the module's placement reads (the last of them re-pins its ranks)."""
    w = start_workload("--standalone", "--nproc-per-node=2", JOB, "--seconds", "120", module="torch.distributed.run",
                       env=dict(SECRET_ENV), timeout=120)
    try:
        yield _two_ranks(w)
    finally:
        w.stop()


def _two_ranks(w):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ranks = [p for p, _ in procfs.descendants_of(w.pid) if "LOCAL_RANK" in
                 procfs.parse_environ_whitelist(procfs.read_bytes("/", f"proc/{p}/environ"))]
        if len(ranks) >= 2:
            return w
        time.sleep(0.2)
    raise AssertionError("the torchrun job did not start two ranks")


def capture(pid, window_s=2.5):
    import threading
    cap = Capture("placement")
    PlacementProbe().capture(WatchSpec(pid=pid, window_s=window_s), Recorder(cap, threading.Event()),
                             time.monotonic() + window_s)
    return PlacementProbe.parse(cap)


def pin(pid, cpu):
    """Pin every thread of a process and of its descendants to one CPU."""
    for p in [pid] + [d for d, _ in procfs.descendants_of(pid)]:
        for tid in os.listdir(f"/proc/{p}/task"):
            try:
                os.sched_setaffinity(int(tid), {cpu})
            except OSError:
                pass


def test_torchrun_ranks_placement_from_launcher_and_from_one_rank(torchrun_job):
    w = torchrun_job
    pl = capture(w.pid)
    ranks = {r["local_rank"]: r for r in pl["ranks"]}
    assert sorted(ranks) == [0, 1]
    procs = {p["pid"]: p for p in pl["processes"]}
    for lr, r in ranks.items():
        assert procs[r["pid"]]["role"] == "rank"
        workers = [procs[m] for m in r["members"] if m != r["pid"]]
        assert [x["role"] for x in workers] == ["dataloader_worker"]           # inherits LOCAL_RANK, still a worker
        assert procs[r["pid"]]["cpu_seconds"] > 0.05
    assert pl["launcher"]["is_target"] and pl["launcher"]["torchrun"]
    ev = Evidence(parsed={"topology": read_topology("/"), "placement": pl})
    assert not [f for f in run_rules(ev)[0] if f.id == "numa.remote"]           # one node: nothing remote
    one = capture(ranks[1]["pid"], window_s=1.0)
    assert one["target_is_rank"] and one["ranks"][0]["local_rank"] == 1
    assert one["launcher"]["pid"] == w.pid and one["launcher"]["torchrun"]
    assert SECRET not in json.dumps(pl) + json.dumps(one)
    assert w.alive()


def test_torchrun_ranks_pinned_to_the_wrong_node_get_a_line_each(torchrun_job):
    """The real job, its ranks pinned each to the other CPU, judged against the project's 2n2c
    tree (CPU 0 on node 0 with GPU 0, CPU 1 on node 1 with GPU 1): each rank gets its own line."""
    w = torchrun_job
    pl0 = capture(w.pid, window_s=0.5)
    ranks = {r["local_rank"]: r["pid"] for r in pl0["ranks"]}
    pin(ranks[0], 1)
    pin(ranks[1], 0)
    time.sleep(0.5)
    pl = capture(w.pid, window_s=3.0)
    ev = Evidence(parsed={"topology": read_topology(str(DATA / "topo" / "2n2c")), "placement": pl})
    f = next(f for f in run_rules(ev)[0] if f.id == "numa.remote")
    d = {j["local_rank"]: j for j in f.details["ranks"]}
    assert d[0]["remote"] and d[1]["remote"]
    assert d[0]["cpu_remote_share"] > 0.9 and d[1]["cpu_remote_share"] > 0.9
    argv = {lr: next(p["argv"] for p in pl["processes"] if p["pid"] == pid) for lr, pid in ranks.items()}
    cmds = [fx.command for fx in f.fixes if fx.command]
    for lr, node in ((0, 0), (1, 1)):
        line = f"numactl --cpunodebind={node} --membind={node} " + " ".join(argv[lr])
        assert line in cmds
        assert argv[lr][1:] == ["-u", JOB, "--seconds", "120"]
    wrapper = next(fx for fx in f.fixes if fx.change and fx.change.startswith("#!/bin/sh"))
    assert "  0) node=0 ;;\n  1) node=1 ;;\n" in wrapper.change
    launcher = pl["launcher"]["argv"]
    assert launcher[-3:] == [JOB, "--seconds", "120"]
    assert wrapper.command == " ".join(launcher[:-3] + ["--no-python", "./numa_bind.sh"] + argv[0])
    assert w.alive()


def test_generated_torchrun_command_really_binds_every_rank(workload, tmp_path):
    """Build the wrapper and the launcher line from a real job, then run that exact line: every
    rank's heap is then bound (numa_maps policy bind:0) where the original ran under default."""
    if subprocess.run(["sh", "-c", "command -v numactl"], capture_output=True).returncode:
        pytest.skip("numactl is not installed (apt-get install numactl)")
    w = start_torchrun(workload, "--seconds", "4", "--report-policy")
    pl = capture(w.pid, window_s=0.5)
    rank = next(p for p in pl["processes"] if p["role"] == "rank")
    (tmp_path / "numa_bind.sh").write_text(wrapper_script({0: 0, 1: 0}, "--membind"))
    (tmp_path / "numa_bind.sh").chmod(0o755)
    line = torchrun_command(pl["launcher"]["argv"], rank["argv"])
    assert "--no-python ./numa_bind.sh" in line
    w.proc.wait(timeout=60)
    before = [ln for ln in w.lines if ln.startswith("POLICY")]
    assert sorted(before) == ["POLICY local_rank=0 policy=default", "POLICY local_rank=1 policy=default"]
    out = subprocess.run(line, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert out.returncode == 0, out.stderr[-2000:]
    after = sorted(ln for ln in out.stdout.splitlines() if ln.startswith("POLICY"))
    assert after == ["POLICY local_rank=0 policy=bind:0", "POLICY local_rank=1 policy=bind:0"]
