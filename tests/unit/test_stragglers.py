"""The straggler model (agent/combiners/stragglers.py) on rows shaped like training_ranks.rank_facts's:
the lockstep asymmetry names the rank that waits least, whatever its cause, only outside the
sampling error; each cause is read from its own evidence, with its fix and its number. The live
cluster tests (tests/live/test_slurm_stragglers.py) check the same on real jobs."""
import pytest

from trainprobe.agent.combiners import stragglers


def _row(pid, coll, *, node="n1", rank=0, samples=250, data=0.0, sync=0.0, rd=0.05, cpu=None, cpus="0",
         hot=None, node_facts=None, gpu=None, findings=None):
    return {"node": node, "pid": pid, "rank": rank, "local_rank": 0, "collective_share": coll,
            "data_share": data, "host_sync_share": sync, "run_delay_share": rd,
            "cpu_share": cpu if cpu is not None else max(0.0, 1 - coll - rd - data),
            "samples": samples, "cpus_allowed": cpus, "cpus_allowed_count": len(cpus.split(",")),
            "hot_functions": hot or {"main (job.py)": 1.0, "train_step (job.py)": 0.9},
            "node_facts": node_facts or {}, "gpu": gpu, "findings": findings or []}


def test_the_rank_that_waits_least_is_the_straggler_and_the_speedup_is_lockstep():
    # The job: rank 0 waits 0.78 of its step, rank 1 0.63: rank 1 is 0.15 of the step slower.
    rows = [_row(10, 0.78, node="n1", rank=0),
            _row(20, 0.63, node="n2", rank=1, hot={"main (job.py)": 1.0, "extra_host_work (job.py)": 0.15})]
    v = stragglers.analyse(rows)
    (s,) = v["stragglers"]
    assert (s["node"], s["rank"], s["pid"]) == ("n2", 1, 20)
    assert s["excess_share"] == pytest.approx(0.15)
    assert v["job_expected_speedup"] == pytest.approx(1 / (1 - 0.15), abs=1e-3)
    assert s["cause"] == "own_compute" and "extra_host_work (job.py)" in s["causes"][0]["title"]
    assert v["per_rank"][0]["waits_for"] == ["n2 rank 1"]


def test_an_asymmetry_within_the_sampling_error_names_no_one():
    # 0.10 apart on 100 samples each: 1.8 x 2 sqrt(0.25 / 100 + 0.24 / 100) = 0.25 > 0.10.
    v = stragglers.analyse([_row(10, 0.50, samples=100), _row(20, 0.40, node="n2", rank=1, samples=100)])
    assert v["stragglers"] == [] and v["job_expected_speedup"] is None
    assert "within the measurement error" in v["no_straggler_reason"]
    # The same gap measured on 5000 samples each (error 1.8 x 0.0197 = 0.035) is a straggler.
    v = stragglers.analyse([_row(10, 0.50, samples=5000), _row(20, 0.40, node="n2", rank=1, samples=5000)])
    assert [s["pid"] for s in v["stragglers"]] == [20]
    assert v["stragglers"][0]["error_share"] == pytest.approx(1.8 * 2 * (0.49 / 5000) ** 0.5, abs=1e-3)


def test_an_asymmetry_the_job_would_not_gain_from_names_no_one():
    # Outside the error and within twice it, and worth under 5% to the job: 0.04 apart on 5000 samples
    # each (error 0.035), at most 1 / (1 - 0.04) = 1.04x.
    v = stragglers.analyse([_row(10, 0.50, samples=5000), _row(20, 0.46, node="n2", rank=1, samples=5000)])
    assert v["stragglers"] == [] and v["job_expected_speedup"] is None
    assert "under 1.05x" in v["no_straggler_reason"]


def test_ranks_whose_cpu_waits_take_turns_name_no_one():
    # A balanced 2-rank job on a 2-CPU host shared with other work (the shape of the cluster's balanced
    # windows: each rank on a CPU about a third of the window and waiting for one about as long). Rank 1
    # waits 0.23 of the step less in collectives than rank 0 (error 0.10) because it waited longer for
    # a CPU: made "as fast", the ranks would wait for each other's CPU waits in turn, and the step
    # after the fix is no shorter (removing nothing measured 0.99-1.10x in such windows).
    rows = [{**_row(10, 0.38, cpu=0.33, rd=0.29, samples=200), "helper_run_delay_share": 0.0},
            {**_row(20, 0.15, node="n2", rank=1, cpu=0.40, rd=0.45, samples=200), "helper_run_delay_share": 0.0}]
    v = stragglers.analyse(rows)
    assert v["stragglers"] == [], v["stragglers"]
    assert "take turns" in v["no_straggler_reason"] and "1.00x" in v["no_straggler_reason"]


def test_the_error_is_two_sigma_of_the_difference_widened_by_the_measured_spread():
    a, b = _row(1, 0.6, samples=400), _row(2, 0.2, samples=100)
    assert stragglers.diff_error(a, b) == pytest.approx(2 * (0.24 / 400 + 0.16 / 100) ** 0.5)
    assert stragglers.asymmetry_error(a, b) == pytest.approx(1.8 * stragglers.diff_error(a, b))


def test_many_ranks_one_slow_the_next_slowest_sets_the_pace():
    rows = [_row(i, w, node=f"n{i}", rank=i, rd=0.0) for i, w in enumerate([0.50, 0.52, 0.48, 0.10])]
    v = stragglers.analyse(rows)
    assert [s["pid"] for s in v["stragglers"]] == [3]
    # Fixed, rank 3 is as fast as the next slowest rank (wait 0.48): T' = T - (0.48 - 0.10), no CPU waits.
    assert v["job_expected_speedup"] == pytest.approx(1 / (1 - 0.38), abs=1e-3)


def _measured(pid, coll, cpu, rd, helper, **kw):
    return {**_row(pid, coll, cpu=cpu, rd=rd, **kw), "helper_run_delay_share": helper}


def test_once_it_keeps_pace_the_ranks_wait_for_each_others_cpu_waits():
    # benchmarks/bench_stragglers.py's data cause (2 ranks of a gloo job, each pinned to one CPU of a
    # 2-CPU VM): rank 1 loads its batches in its loop and waits 0.06 of the window in collectives,
    # rank 0 0.67. T - e says 2.52x; measured with the cause removed: 1.84x. Balanced, each rank waits
    # for the other's CPU waits (rank 1's 0.54 s a CPU-second, at rank 0's 0.245 CPU): T' = 0.245 +
    # 2 x 0.54 x 0.245 = 0.51 T, 1.96x.
    rows = [_measured(10, 0.6676, 0.2453, 0.0488, 0.0383, node="n1", rank=0, samples=141),
            _measured(20, 0.0644, 0.607, 0.1203, 0.2083, node="n2", rank=1, samples=148, data=0.4384, cpus="1")]
    v = stragglers.analyse(rows)
    (s,) = v["stragglers"]
    assert s["pid"] == 20 and s["cause"] == "data"
    assert s["job_speedup_upper"] == pytest.approx(1 / (1 - (0.6676 - 0.0644)), abs=1e-3)
    assert v["job_expected_speedup"] == pytest.approx(1.96, abs=0.02)
    assert s["after_fix"]["exchange"] == 0.0 and "CPU waits" in v["job_speedup_bound"]
    # The unexplained CPU wait its loading brings goes with the data cause, whose number is the job's.
    assert [c["cause"] for c in s["causes"]][:1] == ["data"] and "cpu_wait" not in [c["cause"] for c in s["causes"]]
    assert s["causes"][0]["job_speedup_if_removed"] == v["job_expected_speedup"]
    # The hog cause (another process on rank 1's CPU): the fix takes its waits away, so every rank waits
    # at rank 0's rate: T' = 0.175 + 2 x 0.16 = 0.495 T, 2.02x (measured 2.04x; T - e: 2.55x).
    con = lambda share: {"contention": {"job_cpu_count": 2, "competitors": [
        {"pid": 77, "command": "python spin.py", "cpus_allowed": "1", "share_of_job_cpus": share}]}}
    rows = [_measured(10, 0.665, 0.175, 0.0693, 0.0907, node="n1", rank=0, samples=162, node_facts=con(0.35)),
            _measured(20, 0.0564, 0.1673, 0.218, 0.5583, node="n2", rank=1, samples=161, cpus="1",
                      node_facts=con(0.35))]
    v = stragglers.analyse(rows)
    assert v["stragglers"][0]["cause"] == "cpu_contended"
    assert v["job_expected_speedup"] == pytest.approx(2.02, abs=0.02)


def test_data_and_syncs_are_named_with_the_nodes_own_fix():
    fix = [{"id": "dataloader.starved", "title": "t", "fixes": [{"title": "Use 4 workers",
                                                                  "change": "DataLoader(num_workers=4)", "command": None}]}]
    rows = [_row(10, 0.6), _row(20, 0.1, node="n2", rank=1, data=0.5, findings=fix)]
    s = stragglers.analyse(rows)["stragglers"][0]
    assert s["cause"] == "data" and "DataLoader(num_workers=4)" in s["fix"]
    assert s["causes"][0]["job_speedup_if_removed"] == pytest.approx(1 / (1 - 0.5), abs=1e-3)
    rows = [_row(10, 0.6), _row(20, 0.2, node="n2", rank=1, sync=0.4)]
    assert stragglers.analyse(rows)["stragglers"][0]["cause"] == "host_sync"


def test_cpu_wait_is_split_by_quota_other_processes_and_fewer_cpus():
    quota = {"throttle": {"share": 0.4, "quota_cpus": 0.35, "cgroup": "/sys/fs/cgroup/cpu/job 1",
                          "cgroup_version": 1}}
    rows = [_row(10, 0.6, node_facts={"throttle": {"share": 0.0}}),
            _row(20, 0.15, node="n2", rank=1, rd=0.5, node_facts=quota)]
    s = stragglers.analyse(rows)["stragglers"][0]
    assert s["cause"] == "cpu_quota" and "0.35 CPU" in s["causes"][0]["title"]
    assert s["causes"][0]["command"] == "echo -1 > '/sys/fs/cgroup/cpu/job 1/cpu.cfs_quota_us'"
    # PID 77 is bound to CPU 1 (rank 1's) and takes 0.3 of the job's 2 CPUs: 0.6 of CPU 1; PID 78 may run
    # anywhere and loads both ranks alike.
    con = lambda others: {"contention": {"job_cpu_count": 2, "competitors": [
        {"pid": 77, "command": "python spin.py", "cpus_allowed": "1", "share_of_job_cpus": 0.3},
        {"pid": 78, "command": "make -j", "cpus_allowed": "0-1", "share_of_job_cpus": others}]}}
    rows = [_row(10, 0.6, cpus="0", node_facts=con(0.6)), _row(20, 0.15, node="n2", rank=1, rd=0.5, cpus="1",
                                                           node_facts=con(0.6))]
    s = stragglers.analyse(rows)["stragglers"][0]
    assert s["cause"] == "cpu_contended" and "PID 77 (python spin.py)" in s["causes"][0]["title"]
    assert "PID 78" not in s["causes"][0]["title"] and "60%" in s["causes"][0]["title"]
    rows = [_row(10, 0.6, cpus="0,1"), _row(20, 0.15, node="n2", rank=1, rd=0.5, cpus="1")]
    assert stragglers.analyse(rows)["stragglers"][0]["cause"] == "fewer_cpus"
    # With none of these the wait is named as it is (the lockstep model then prices the job at 1.00x,
    # the ranks' CPU waits taking turns, and names no straggler: the cause is read directly).
    slow, other = _row(20, 0.15, node="n2", rank=1, rd=0.5, cpus="1"), _row(10, 0.6, cpus="0")
    assert stragglers.causes_of(slow, [other], 0.45)[0]["cause"] == "cpu_wait"


def test_an_unexplained_cpu_wait_does_not_take_the_data_cause_s_place():
    # Rank 1 loads its batches in its own loop (0.45 of its step in data frames) and waits for a CPU
    # 0.2 of its step beyond the other rank's rate, with no quota, no process bound to its CPU and as
    # many CPUs: the wait stays in its data frames, and the data cause ranks first.
    slow, other = _row(20, 0.15, node="n2", rank=1, rd=0.22, data=0.45, cpus="1"), _row(10, 0.6, cpus="0", rd=0.02)
    got = stragglers.causes_of(slow, [other], 0.45)
    causes = [c["cause"] for c in got]
    assert causes[0] == "data" and "cpu_wait" not in causes, got
    assert got[0]["evidence"]["cpu_wait_share"] > 0.1 and "wait for a CPU" in got[0]["title"]
    # With a quota that explains the wait, the wait is carved out of the data frames and named first.
    quota = {"throttle": {"share": 0.5, "quota_cpus": 0.5, "cgroup": "/sys/fs/cgroup/job", "cgroup_version": 2}}
    rows = [_row(10, 0.6, cpus="0", rd=0.02, node_facts={"throttle": {"share": 0.0}}),
            _row(20, 0.15, node="n2", rank=1, rd=0.5, data=0.3, cpus="1", node_facts=quota)]
    assert stragglers.analyse(rows)["stragglers"][0]["cause"] == "cpu_quota"


def test_a_slower_gpu_names_the_rank_even_when_the_hosts_waits_agree():
    g = lambda mhz, reasons: {"index": 0, "busy": 0.98, "sm_clock_mhz": mhz, "max_sm_clock_mhz": 1980,
                              "reasons": reasons}
    rows = [_row(10, 0.55, gpu=g(1980, {})), _row(20, 0.54, rank=1, gpu=g(1275, {"hw_thermal_slowdown": 1.0}))]
    v = stragglers.analyse(rows)
    (s,) = v["stragglers"]
    assert s["pid"] == 20 and s["cause"] == "gpu_slower" and s["named_by"] == "gpu"
    assert "HW thermal slowdown" in s["causes"][0]["title"] and "cooling" in s["fix"]
    assert v["job_expected_speedup"] == pytest.approx(1 / (1 - 0.98 * (1 - 1275 / 1980)), abs=1e-3)
    # Both GPUs at full clock: nothing to name.
    rows[1]["gpu"] = g(1980, {})
    assert stragglers.analyse(rows)["stragglers"] == []


def test_an_unexplained_straggler_says_so():
    rows = [_row(10, 0.6, rd=0.0, cpu=0.4), _row(20, 0.2, rank=1, rd=0.0, cpu=0.4)]  # more off-CPU, no frame
    rows[1]["hot_functions"] = dict(rows[0]["hot_functions"])
    s = stragglers.analyse(rows)["stragglers"][0]
    assert s["cause"] == "own_compute" and "same frames" in s["causes"][0]["title"]


def test_one_rank_or_none_measured_is_no_verdict():
    v = stragglers.analyse([_row(10, 0.5), {**_row(20, 0.5), "collective_share": None}])
    assert v["stragglers"] == [] and "needs two" in v["no_straggler_reason"]


def test_waits_behind_outside_processes_count_once_and_other_ranks_are_not_outsiders():
    # Rank 0 (CPU 0) waits 0.30 of the window, all of it behind a process outside the job that ran
    # 0.5 of CPU 0; rank 1, the straggler (CPU 1), waits 0.10 with nothing else on its CPU.
    def con(others_by_cpu, competitors=()):
        return {"contention": {"job_cpu_count": 2, "others_by_cpu": others_by_cpu, "competitors": list(competitors)}}
    rows = lambda facts: [_measured(10, 0.45, 0.25, 0.20, 0.10, rank=0, samples=400, node_facts=facts),
                          _measured(20, 0.05, 0.80, 0.05, 0.05, rank=1, samples=400, cpus="1", node_facts=facts)]
    after = stragglers.analyse(rows(con({0: 0.5, 1: 0.0})))["stragglers"][0]["after_fix"]
    assert after["outside_waits"] == pytest.approx(0.30) and after["cpu_waits"] == pytest.approx(2 * 0.125 * 0.25)
    # The job bundle's JSON makes the CPU keys strings: the same terms.
    assert stragglers.analyse(rows(con({"0": 0.5, "1": 0.0})))["stragglers"][0]["after_fix"] == after
    # Two Slurm nodes on one machine: what ran on rank 0's CPU was rank 1 itself, not an outsider.
    other_rank = [{"pid": 20, "command": "python train.py", "cpus_allowed": "0-1", "share_of_job_cpus": 0.5}]
    after = stragglers.analyse(rows(con({0: 0.5, 1: 0.0}, other_rank)))["stragglers"][0]["after_fix"]
    assert after["outside_waits"] == 0.0
