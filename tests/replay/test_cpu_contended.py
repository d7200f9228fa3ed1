"""cpu.contended on bundles saved by `diagnose --save` on the 2-CPU development VM
(tests/live/test_cpu_contended.py with TRAINPROBE_CONTENTION_SAVE), re-diagnosed through the real
parsers and rules:

    contended.tar.gz       the bundled job (data in memory, one thread) pinned to CPU 0 beside
                           `python -c "while True: pass"` (root) and `sh -c "while :; do :; done"`
                           (nobody) pinned there too, on a host loaded by other work as well;
    oversubscribed.tar.gz  the same job with 4 intra-op threads on CPU 0, nothing of the test's beside it;
    busy_host.tar.gz       the same one-thread job on CPU 0 with nothing of the test's beside it,
                           while other work on the host took 77% of that CPU: the field's case, where
                           the competitors are nobody's job.
"""
from __future__ import annotations

import json

import pytest

from trainprobe.agent import bundle, diagnosis
from trainprobe.agent.evidence import build
from trainprobe.agent.findings import FINDING_IDS
from trainprobe.agent.rules import run_rules
from trainprobe.agent.rules.cpu_contended import gain_if_leave
from trainprobe.probes import schema
from trainprobe.probes.base import Capture
from trainprobe.probes.contention import ContentionProbe, _place
from trainprobe.probes.parsers.procfs import per_cpu_times
from tests.helpers import DATA, run_cli

CONTENTION = DATA / "contention"


def load(name: str):
    return bundle.load(str(CONTENTION / f"{name}.tar.gz"))


def rediagnose(name: str, drop: tuple[str, ...] = ()):
    b = load(name)
    caps = [c for c in b.captures if c.probe not in drop]
    rep, ev = diagnosis.report_from(caps, b.context, b.overhead, [])
    return rep, ev


def finding(rep, fid):
    return next((f for f in rep["findings"] if f["id"] == fid), None)


def ids(rep):
    return [f["id"] for f in rep["findings"]]


@pytest.mark.parametrize("name", ["contended", "oversubscribed", "busy_host"])
def test_the_evidence_has_its_declared_shape(name):
    cap = next(c for c in load(name).captures if c.probe == "contention")
    ev = ContentionProbe.parse(cap)
    assert not schema.problems(ev, schema.ContentionEvidence, "contention")
    # What a step model reads, plainly: each thread's run-queue share, others' CPU-s on the job's
    # CPUs, the job's CPU budget.
    assert ev["job_threads"] and all(0.0 <= t["runq_share"] <= 1.0 for t in ev["job_threads"])
    assert ev["others_cpu_seconds_on_job_cpus"] is not None and ev["job_cpu_budget"] == 1.0
    assert ev["job_cpus"] == "0"
    # A process of the job, or of the agent's own tree, is never a competitor.
    assert not {c["pid"] for c in ev["competitors"]} & set(ev["job_pids"])
    assert not any(c["comm"] == "py-spy" and str(ev["pid"]) in c["cmdline"] for c in ev["competitors"])


def test_the_job_beside_two_busy_processes_is_contended_and_they_are_named():
    rep, ev = rediagnose("contended")
    assert ids(rep)[0] == "cpu.contended", [(f["id"], f["title"]) for f in rep["findings"]]
    assert "compute.bound" not in ids(rep)
    f = rep["findings"][0]
    comps = f["details"]["competitors"]
    py = next(c for c in comps if c["cmdline"].endswith("-c while True: pass") and c["attribution"] == "inside")
    sh = next(c for c in comps if c["cmdline"] == "/bin/sh -c while :; do :; done")
    assert py["user"] == "root" and sh["user"] == "nobody" and sh["uid"] == 65534
    assert py["cpu_seconds_on_job_cpus"] > 0.1 and sh["cpu_seconds_on_job_cpus"] > 0.1
    d = f["details"]
    assert d["runq_share_training"] > 0.5 and d["runq_share_own"] == 0.0
    # 1/(1-r), capped by the job's CPU work on its one CPU.
    assert f["expected_speedup"] == pytest.approx(min(1 / (1 - d["runq_share_training"]),
                                                      1.0 / max(1e-9, ev.get("contention")["job_cpu_seconds"]
                                                                / ev.get("contention")["window_s"])), rel=0.02)
    lo, hi = f["expected_speedup_interval"]
    assert 1.0 < lo < f["expected_speedup"] < hi
    commands = " ".join(fx["command"] or "" for fx in f["fixes"])
    assert f"renice -n 19 -p" in commands and "taskset -a -cp 1 " in commands
    changes = " ".join(fx["change"] or "" for fx in f["fixes"])
    assert "--exclusive" in changes and "cpu-manager-policy=static" in changes and "Guaranteed" in changes
    assert "PSI" in " ".join(e["fact"] for e in f["evidence"])


def test_without_the_contention_probe_the_wait_still_is_not_called_compute():
    # The default probes of an older agent (py-spy and /proc): py-spy puts the training thread in
    # forward/backward; its schedstat says it waited for a CPU, so it is not compute-bound.
    rep, ev = rediagnose("contended", drop=("contention",))
    assert "compute.bound" not in ids(rep)
    assert ev.get("pyspy")["training_thread"]["breakdown"]["backward"] > 0.3
    assert any("Not compute-bound" in n for n in rep["notes"]), rep["notes"]


def test_a_job_oversubscribed_by_its_own_threads_is_not_contended():
    rep, ev = rediagnose("oversubscribed")
    assert "cpu.oversubscribed" in ids(rep) and "cpu.contended" not in ids(rep)
    con = ev.get("contention")
    assert con["job_runnable_mean"] > 1.5 * con["job_cpu_budget"]       # its own threads exceed its CPU
    assert con["others_cpu_seconds_on_job_cpus"] / con["window_s"] < 0.10
    over = finding(rep, "cpu.oversubscribed")
    assert over["details"]["other_cores"] is not None and over["details"]["other_cores"] < 0.10


def test_a_job_on_a_cpu_others_crowd_gets_their_names_and_not_compute_bound():
    rep, ev = rediagnose("busy_host")
    assert ids(rep)[0] == "cpu.contended" and "compute.bound" not in ids(rep)
    f = rep["findings"][0]
    assert f["details"]["others_share_of_job_cpus"] > 0.5
    assert all(c["pid"] not in ev.get("contention")["job_pids"] for c in f["details"]["competitors"])
    assert f["title"].count("PID ") >= 1


def test_report_command_rediagnoses_the_saved_bundle():
    r = run_cli("report", "--json", str(CONTENTION / "contended.tar.gz"))
    assert r.rc == 0, r.err
    assert r.json()["findings"][0]["id"] == "cpu.contended"


def test_the_job_owning_more_runnable_threads_than_cpus_leaves_a_share_to_oversubscription():
    # Own against others on one capture: the same wait, the job's demand raised above its CPU.
    b = load("contended")
    ev = build([c for c in b.captures], {})
    con = ev.parsed["contention"]
    base = next(f for f in run_rules(ev)[0] if f.id == "cpu.contended")
    con["job_runnable_mean"] = 2.0 * con["job_cpu_budget"]
    raised = next(f for f in run_rules(ev)[0] if f.id == "cpu.contended")
    assert raised.details["runq_share_own"] == pytest.approx(0.5)
    assert raised.expected_speedup < base.expected_speedup
    assert raised.confidence != "high"


def test_a_malformed_capture_fails_its_probe_only():
    ev = build([Capture("contention", artifacts={"contention.json": json.dumps({"pid": 1})})], {})
    assert ev.records["contention"].status == "failed" and "contention capture" in ev.records["contention"].reason
    assert "cpu.contended" in FINDING_IDS


# -- the pure pieces, on real text ---------------------------------------------------------------

def test_per_cpu_times_reads_proc_stat_lines():
    cap = next(c for c in load("contended").captures if c.probe == "contention")
    t = per_cpu_times(cap.artifacts["proc_stat.end"])
    assert set(t) == {0, 1} and all(v["run"] > 0 for v in t.values())


def test_placement_of_a_process_on_the_jobs_cpus():
    assert _place(2.0, {0}, {0}, []) == (2.0, "inside", 1.0)
    assert _place(2.0, {1}, {0}, [0]) == (0.0, "outside", 0.0)
    assert _place(2.0, {0, 1}, {0}, [0, 0, 1, 1]) == (1.0, "sampled", 0.5)
    assert _place(2.0, {0, 1, 2, 3}, {0}, []) == (0.5, "overlap", 0.25)


def test_what_named_competitors_alone_are_worth_lies_below_every_other_process_leaving():
    lo, hi = gain_if_leave(cpu=0.2, r=0.8, others_share=0.8, leaving_share=0.4)
    assert 1.0 < lo <= hi <= 1 / (1 - 0.8)
    assert gain_if_leave(0.2, 0.8, 0.8, 0.8) == (5.0, 5.0)


@pytest.mark.parametrize("source", ["bcc/healthy", "ledger/bundles/healthy-in-memory.tar.gz"])
def test_the_healthy_job_captured_alone_stays_compute_bound(source):
    # The same in-memory job on a quiet CPU (captures taken before the contention probe existed):
    # its training thread barely waits for a CPU, so subtracting that wait keeps it compute-bound.
    import gzip
    from trainprobe.agent.combiners.cpu_wait import training_wait
    if source.endswith(".tar.gz"):
        b = bundle.load(str(DATA / source))
        ev = build([c for c in b.captures if c.status in ("ok", "timeout") and c.artifacts], b.context)
    else:
        caps = []
        for p in sorted((DATA / source).glob("*.capture.json.gz")):
            with gzip.open(p, "rt") as fh:
                caps.append(Capture.from_dict(json.load(fh)))
        ev = build(caps, json.loads((DATA / source / "context.json").read_text()))
    findings, _ = run_rules(ev)
    wait = training_wait(ev)
    assert wait is not None and wait["r"] < 0.10
    assert [f.id for f in findings][:1] == ["compute.bound"], [(f.id, f.expected_speedup) for f in findings]
    assert "cpu.contended" not in {f.id for f in findings}
