"""The job merge (pure) and the node-side choice of the job's processes (pure), on synthetic input
shaped like the node agent's output; the live two-slurmd test checks the same on a real job."""
import io

from trainprobe.agent.fleet.merge import merge
from trainprobe.probes.support.slurmjob import JobProcess, training_targets
from trainprobe.reports import job_html, job_text


def _row(node, rank, pid, data, coll, top=None, speedup=None, sync=0.0):
    return {"node": node, "pid": pid, "rank": rank, "local_rank": 0, "procid": rank, "data_share": data,
            "collective_share": coll, "host_sync_share": sync, "cpu_share": None, "gpu_busy": None,
            "top_finding": top, "top_title": top and f"{top} on {node}", "expected_speedup": speedup}


def _payload(node, rows, findings=()):
    return {"node": node, "status": "ok", "reason": None, "exit_code": 0,
            "targets": [{"target": {"pid": rows[0]["pid"], "ranks": []}, "status": "ok", "rows": rows,
                         "report": {"findings": list(findings), "probes": [
                             {"name": "pyspy", "status": "ok"},
                             {"name": "gpu", "status": "skipped", "reason": "no NVIDIA driver"}]}}]}


def test_lockstep_speedup_is_the_others_wait_minus_the_stragglers():
    rows = [_row("n1", 0, 10, 0.0, 0.6), _row("n2", 1, 20, 0.8, 0.0, "dataloader.starved", 4.0)]
    # Rank 0 waits 0.6 of the step for rank 1, which waits none: made as fast as rank 0, the step
    # loses 0.6 of itself: 1 / (1 - 0.6) = 2.5x.
    rep = merge("7", [_payload("n1", rows[:1]), _payload("n2", rows[1:])], 10.0, nodes=["n1", "n2"])
    assert rep["job_expected_speedup"] == 2.5 and "0.60" in rep["job_speedup_bound"]
    assert rep["stragglers"][0]["cause"] == "data"


def test_merge_names_stragglers_keeps_failed_nodes_and_renders():
    numa = {"id": "numa.remote", "expected_speedup": 1.2, "title": "t",
            "fixes": [{"title": "bind", "change": None, "command": "numactl --cpunodebind=1 --membind=1 python t.py"}]}
    ps = [_payload("n1", [_row("n1", 0, 10, 0.01, 0.55)]),
          _payload("n2", [_row("n2", 1, 20, 0.7, 0.02, "dataloader.starved", 3.0)], findings=[numa]),
          {"node": "n3", "status": "timeout", "reason": "timed out: no report within the window", "exit_code": 3,
           "targets": []}]
    rep = merge("42", ps, 10.0, nodes=["n1", "n2", "n3", "n4"])
    assert rep["job"]["nodes_ok"] == ["n1", "n2"]
    assert [(s["node"], s["rank"], s["cause"]) for s in rep["stragglers"]] == [("n2", 1, "data")]
    assert rep["job_expected_speedup"] == round(1 / (1 - (0.55 - 0.02)), 3)
    st = {n["node"]: n for n in rep["nodes"]}
    assert st["n3"]["status"] == "timeout" and st["n4"]["status"] == "no_report"
    assert st["n2"]["numactl"] == ["numactl --cpunodebind=1 --membind=1 python t.py"]
    assert st["n1"]["probes_not_ok"] == ["gpu: skipped (no NVIDIA driver)"]
    assert rep["exit_code"] == 0
    out = io.StringIO()
    job_text.render(rep, out, color=False)
    text = out.getvalue()
    assert "Straggler: node n2, rank 1" in text and "2.13x" in text and "n3" in text and "timeout" in text
    assert "numactl --cpunodebind=1" in text
    assert "waits for n2 rank 1" in text                  # rank 0's wait is named by the job view
    html = job_html.render(rep)
    assert "class=straggler" in html and "timeout" in html


def test_merge_without_any_report_exits_like_diagnose():
    rep = merge("42", [{"node": "n1", "status": "failed", "reason": "not permitted", "exit_code": 4, "targets": []}],
                nodes=["n1"])
    assert rep["exit_code"] == 4 and rep["job_expected_speedup"] is None


def test_node_strings_are_escaped_in_html():
    ps = [_payload("n1<script>", [_row("n1<script>", 0, 10, 0.5, 0.0, "dataloader.starved", 2.0)])]
    assert "<script>" not in job_html.render(merge("1", ps))


def _p(pid, ppid, torch=True, **env):
    return JobProcess(pid, ppid, "python", "python train.py", {k: str(v) for k, v in env.items()}, True, torch)


def test_training_targets_torchrun_and_direct_ranks():
    # torchrun launcher 100 with ranks 101, 102 (each with a DataLoader worker that inherits its env).
    procs = [_p(100, 1, SLURM_PROCID=0), _p(101, 100, RANK=0, LOCAL_RANK=0), _p(102, 100, RANK=1, LOCAL_RANK=1),
             _p(103, 101, RANK=0, LOCAL_RANK=0), _p(104, 102, RANK=1, LOCAL_RANK=1),
             JobProcess(50, 1, "bash", "bash job.sh", {}, False, False)]
    t = training_targets(procs)
    assert [x.pid for x in t] == [100]
    assert [(r["pid"], r["rank"]) for r in t[0].ranks] == [(101, 0), (102, 1)]
    # A rank started by srun directly, no launcher: the rank is its own target.
    t = training_targets([_p(200, 1, SLURM_PROCID=3, SLURM_LOCALID=0), _p(201, 200, SLURM_PROCID=3)])
    assert [(x.pid, x.ranks[0]["rank"]) for x in t] == [(200, 3)]
