"""cpu.oversubscribed, io.small_reads and gil.contention on real jobs (live), and on captures of
such jobs replayed through the real parsers and rules (tests/data/bcc)."""
import gzip
import json
import re

import pytest

from trainprobe.agent import evidence
from trainprobe.agent.rules import run_rules
from trainprobe.agent.ranking import rank
from trainprobe.probes.base import Capture
from tests.bcc_helpers import busy_process, make_tiny_files, needs_ebpf
from tests.helpers import DATA, run_cli

BCC_DATA = DATA / "bcc"


def diagnose(pid, *extra, duration="3", env=None):
    r = run_cli("diagnose", "--pid", str(pid), "--duration", duration, "--json", *extra, env=env, timeout=180)
    assert r.rc == 0, r.err
    return r.json()


def finding(rep, fid):
    return next((f for f in rep["findings"] if f["id"] == fid), None)


def thread_number(text, pattern):
    m = re.search(pattern, text)
    return int(m.group(1)) if m else None


# -- live ------------------------------------------------------------------------------------------

@pytest.mark.live
@needs_ebpf
def test_threads_far_above_the_cpus_plus_a_busy_neighbour_is_oversubscribed(workload):
    w = workload("--seconds", "120", "--sample-work", "0", "--threads", "16", warmup_lines=2)
    with busy_process():
        rep = diagnose(w.pid, "--deep", "--skip", "gil,syscalls")
    found = [(f["id"], f["expected_speedup"]) for f in rep["findings"]]
    top = next((f for f in rep["findings"] if f["id"] == "cpu.oversubscribed"), None)
    assert top is not None, found
    # In the low-switch regime (below) the thread cap and the busy neighbour's removal are both worth
    # about 1.06x, and which leads moves between runs (cpu.contended 1.07x against 1.06x, the unchanged
    # code of 7453b6e in 1 of 4 runs too): the cap must lead or stand within 5% of what does.
    first = rep["findings"][0]
    assert first is top or top["expected_speedup"] >= 0.95 * first["expected_speedup"], found
    assert first["id"] in ("cpu.oversubscribed", "cpu.contended"), found
    assert top["details"]["source"] == "sched"
    # The size of the gain is the waste the cap removes, priced per involuntary switch (the model's
    # switch_us): it follows the switch rate the host's scheduler delivers, which on this VM comes in
    # two regimes (about 5,400 per second per held core: 1.02-1.07x; 14,000-15,000: 1.25-1.38x, the
    # same code over several runs). Its accuracy is the ledger's (threads-oversubscribed), not this
    # test's: here the gain must be a gain and say what it was priced from.
    assert top["expected_speedup"] > 1.0
    assert "involuntary switches" in top["speedup_bound"] or "involuntary switches" in json.dumps(top["evidence"])
    cpus = rep["host"]["cpus"]
    fix = top["fixes"][0]
    n = thread_number(fix["change"], r"set_num_threads\((\d+)\)")
    assert n is not None and 1 <= n <= cpus
    assert f"OMP_NUM_THREADS={n}" in fix["command"]
    assert top["details"]["busy_threads"] > cpus
    facts = {e["fact"]: e["value"] for e in top["evidence"]}
    assert any("p50 / p99" in k for k in facts)
    assert w.alive()


@pytest.mark.live
def test_oversubscription_is_found_without_ebpf_from_schedstat(workload):
    w = workload("--seconds", "120", "--sample-work", "0", "--threads", "16", warmup_lines=2)
    with busy_process():
        rep = diagnose(w.pid, "--deep", "--skip", "gil", env={"TRAINPROBE_NO_EBPF": "1"})
    st = {p["name"]: p for p in rep["probes"]}
    assert st["sched"]["status"] == "skipped"
    top = rep["findings"][0]
    assert top["id"] == "cpu.oversubscribed"
    assert top["details"]["source"] == "process"
    assert "schedstat" in top["speedup_bound"]
    assert thread_number(top["fixes"][0]["change"], r"set_num_threads\((\d+)\)") <= rep["host"]["cpus"]


@pytest.mark.live
@needs_ebpf
def test_thousands_of_tiny_files_per_batch_is_small_reads(workload, tmp_path):
    d = make_tiny_files(tmp_path / "tiny", n=4000, size=256)
    per_sample, batch = 64, 32
    w = workload("--seconds", "120", "--sample-work", "0", "--num-workers", "1", "--small-files", str(d),
                 "--files-per-sample", str(per_sample), "--batch-size", str(batch), warmup_lines=2)
    rep = diagnose(w.pid, "--deep", "--skip", "gil")
    f = finding(rep, "io.small_reads")
    assert f is not None, [(x["id"], x["expected_speedup"]) for x in rep["findings"]]
    det = f["details"]
    # 64 files per sample x 32 samples: ~2048 opens per batch (the right magnitude per sample).
    assert det["opens_per_batch"] == pytest.approx(per_sample * batch, rel=0.3)
    assert det["opens_per_batch"] / batch == pytest.approx(per_sample, rel=0.3)
    assert det["mean_read_bytes"] == pytest.approx(256, rel=0.05)
    assert det["top_dir"] == str(d)
    assert f["expected_speedup"] > 1.05
    assert any("shard" in fx["title"].lower() for fx in f["fixes"])
    assert str(d) in f["fixes"][0]["command"]


@pytest.mark.live
def test_a_thread_spinning_with_the_gil_is_named(workload):
    w = workload("--seconds", "120", "--sample-work", "0", "--gil-spinner", warmup_lines=2)
    default = diagnose(w.pid)            # the default probes measure the GIL wait from CPU time
    f = finding(default, "gil.contention")
    assert f is not None and default["findings"][0]["id"] == "gil.contention", default["findings"]
    assert f["details"]["source"] == "gil_ownership" and f["details"]["holder"]["name"] == "metrics-spinner"
    lo, hi = f["expected_speedup_interval"]
    assert 1.1 < lo <= f["expected_speedup"] <= hi
    assert not finding(default, "compute.bound")
    rep = diagnose(w.pid, "--deep")
    f = finding(rep, "gil.contention")
    assert f is not None, [(x["id"], x["expected_speedup"]) for x in rep["findings"]]
    assert "metrics-spinner" in f["title"]
    assert f["details"]["holder"]["name"] == "metrics-spinner"
    assert "_spin" in f["details"]["holder"]["frame"]
    assert all("metrics-spinner" in fx["title"] for fx in f["fixes"])
    assert f["expected_speedup"] > 1.1
    assert rep["findings"][0]["id"] == "gil.contention"


@pytest.mark.live
@needs_ebpf
def test_a_healthy_job_gets_none_of_these(workload):
    w = workload("--seconds", "120", "--sample-work", "0", "--threads", "1", warmup_lines=2)
    rep = diagnose(w.pid, "--deep")
    ids = {f["id"] for f in rep["findings"]}
    assert not ids & {"io.small_reads", "gil.contention"}, rep["findings"]
    # Even on a host shared with other busy work (the loop may then really wait for a CPU), a job
    # whose own threads fit its CPUs is not called oversubscribed.
    assert "cpu.oversubscribed" not in ids, finding(rep, "cpu.oversubscribed")


# -- replayed captures -----------------------------------------------------------------------------

def load_captures(scenario):
    caps = []
    for p in sorted((BCC_DATA / scenario).glob("*.capture.json.gz")):
        with gzip.open(p, "rt") as fh:
            caps.append(Capture.from_dict(json.load(fh)))
    if not caps:
        pytest.skip(f"no captures in {BCC_DATA / scenario}")
    return caps


def replay(scenario, drop=()):
    caps = [c for c in load_captures(scenario) if c.probe not in drop]
    ctx = json.loads((BCC_DATA / scenario / "context.json").read_text())
    ev = evidence.build(caps, ctx)
    findings, runs = run_rules(ev)
    return rank(findings), ev


def test_replayed_oversubscribed_capture():
    findings, ev = replay("oversubscribed")
    assert findings[0].id == "cpu.oversubscribed"
    assert findings[0].details["source"] == "sched"
    assert findings[0].details["proposed_intra_op_threads"] <= 2
    assert ev.get("sched")["training_thread"]["runq_share"] > 0.2


def test_replayed_oversubscribed_capture_without_the_sched_probe_falls_back_to_schedstat():
    findings, _ev = replay("oversubscribed", drop=("sched",))
    f = next(f for f in findings if f.id == "cpu.oversubscribed")
    assert f.details["source"] == "process"


def test_replayed_small_files_capture():
    findings, ev = replay("small_files")
    f = next(f for f in findings if f.id == "io.small_reads")
    assert f.details["opens_per_batch"] == pytest.approx(64 * 32, rel=0.3)
    workers = [p for p in ev.get("syscalls")["children"] if p["opens"]]
    assert workers and all(p["mean_file_read_bytes"] == pytest.approx(256, rel=0.05) for p in workers)


def test_replayed_gil_capture_names_the_spinner():
    findings, ev = replay("gil_spinner")
    f = next(f for f in findings if f.id == "gil.contention")
    assert "metrics-spinner" in f.title
    assert ev.get("gil")["holder"]["name"] == "metrics-spinner"


def test_replayed_gil_capture_without_ownership_evidence_claims_no_gil_wait():
    # This capture predates py-spy's GIL sampler: CPU time alone is not read as a GIL wait.
    findings, ev = replay("gil_spinner", drop=("gil", "sched", "syscalls"))
    assert "gil.contention" not in {f.id for f in findings}
    assert any("GIL ownership was not measured" in n for n in ev.notes)


def test_replayed_healthy_capture_has_none_of_these():
    findings, _ev = replay("healthy")
    assert not {f.id for f in findings} & {"cpu.oversubscribed", "io.small_reads", "gil.contention"}


def test_small_reads_stays_quiet_when_the_loop_does_not_wait_on_data():
    findings, ev = replay("small_files")
    tt = ev.parsed["pyspy"]["training_thread"]
    tt["breakdown"] = {**tt["breakdown"], "data_wait": 0.0, "data_load": 0.0, "forward": 1.0}
    findings, _ = run_rules(ev)
    assert "io.small_reads" not in {f.id for f in findings}
