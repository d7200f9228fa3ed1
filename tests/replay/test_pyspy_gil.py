"""GIL ownership and the training thread's waits, on real py-spy output captured here
(tests/data/pyspy/gil, written by scripts/capture_pyspy_gil.py from tests/jobs/gil_threads.py) and
on the H200 node's dumps of GPU jobs; replayed through the real parser and rules."""
import gzip
import json

import pytest

from trainprobe.agent import evidence
from trainprobe.agent.combiners.gil_wait import gil_wait, suspects
from trainprobe.agent.rules import run_rules
from trainprobe.probes import schema
from trainprobe.probes.base import Capture
from trainprobe.probes.gil import analyse as gil_analyse
from trainprobe.probes.parsers import pystacks
from trainprobe.probes.pyspy import PySpyProbe, allocate_waits, python_build
from tests.helpers import DATA, H200_MODES

GIL = DATA / "pyspy" / "gil"
SCENARIOS = ("blocked", "ccalls", "spinner", "native")


def capture(name):
    with gzip.open(GIL / name / "pyspy.capture.json.gz", "rt") as fh:
        return Capture.from_dict(json.load(fh))


def diagnose(cap):
    ev = evidence.build([cap], {})
    findings, _ = run_rules(ev)
    return {f.id: f for f in findings}, ev


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_evidence_matches_its_schema_and_has_the_ownership_measure(name):
    spy = PySpyProbe.parse(capture(name))
    assert not schema.problems(spy, schema.PySpyEvidence, "pyspy")
    assert spy["gil"]["measured"] and spy["gil"]["samples"] >= 40
    tt = spy["training_thread"]
    assert tt["cpu_fraction"] is not None and set(tt["waits"]) == set(pystacks.WAIT_KEYS)
    assert sum(tt["waits"].values()) <= max(0.0, 1.0 - tt["cpu_fraction"] - (tt["run_delay_fraction"] or 0)) + 1e-3


@pytest.mark.parametrize("name", ("blocked", "ccalls", "native"))
def test_threads_that_wait_or_release_the_gil_give_no_gil_finding(name):
    found, ev = diagnose(capture(name))
    assert "gil.contention" not in found, found["gil.contention"].title if "gil.contention" in found else ""
    spy = ev.get("pyspy")
    assert spy["training_thread"]["waits"]["gil"] == 0.0 or spy["gil"]["others_share"] < 0.05
    assert not suspects(ev)
    by_name = {o["name"]: o for o in spy["other_threads"]}
    for kind in ("pipe", "queue", "event", "sleep"):
        o = by_name.get(f"bg-{kind}")
        if o is not None:
            # Blocked by the OS's account, whatever its frames: py-spy's frames call a read "busy".
            assert o["gil_share"] == 0.0 and o["active_fraction"] < 0.2, o
    if name == "blocked":
        assert by_name["bg-pipe"]["busy_fraction"] == 1.0          # what the frames alone had said


def test_a_pure_python_spinner_is_found_and_its_finding_cites_the_ownership_measure():
    found, ev = diagnose(capture("spinner"))
    f = found["gil.contention"]
    assert f.details["source"] == "gil_ownership" and f.details["holder"]["name"] == "bg-spinner"
    assert f.details["holder"]["gil_share"] >= 0.3
    assert any("py-spy --gil" in x.fact and "bg-spinner" in x.fact for x in f.evidence)
    assert [s["name"] for s in suspects(ev)] == ["bg-spinner"]        # not the blocked reader beside it
    m = gil_wait(ev)
    assert 0.10 <= m["g"] <= m["h"] + 1e-9


def test_the_native_loop_is_classified_and_not_a_gil_wait():
    spy = PySpyProbe.parse(capture("native"))
    w, kinds = spy["training_thread"]["waits"], spy["training_thread"]["frame_kinds"]
    assert kinds["io"] > 0.03 and kinds["idle_wait"] > 0.03 and kinds["native"] > 0.1, kinds
    assert w["io"] > 0.03 and w["idle_wait"] > 0.03 and w["gil"] == 0.0, w


def test_a_capture_without_ownership_claims_no_gil_wait():
    """Captures older than the GIL sampler: the ownership is 'not measured', and CPU time alone
    (the training thread off-CPU in code while a thread looked busy) is not read as a GIL wait."""
    cap = capture("spinner")
    del cap.artifacts["gil_speedscope.json"]
    cap.meta.pop("gil", None)
    found, ev = diagnose(cap)
    assert "gil.contention" not in found
    assert ev.get("pyspy")["gil"]["measured"] is False and gil_wait(ev) is None
    assert any("GIL ownership was not measured" in n for n in ev.notes)


def test_a_free_threaded_build_has_no_gil_finding():
    cap = capture("spinner")
    cap.meta["python_build"] = {"free_threaded": True, "basis": "python3.13t"}
    found, ev = diagnose(cap)
    assert "gil.contention" not in found
    assert gil_wait(ev)["g"] == 0.0 and not gil_wait(ev)["suspects"]


def test_the_free_threaded_build_is_told_from_the_binary_libpython_or_abi_tag(tmp_path):
    def proc(pid, exe, maps):
        d = tmp_path / "proc" / str(pid)
        d.mkdir(parents=True)
        (d / "exe").symlink_to(exe)
        (d / "maps").write_text("".join(f"7f00-7f01 r-xp 0 0:0 1 {m}\n" for m in maps))
    proc(1, "/usr/bin/python3.13t", [])
    proc(2, "/opt/bin/python", ["/opt/lib/libpython3.13t.so.1.0"])
    proc(3, "/opt/bin/python", ["/opt/lib/python3.13t/lib-dynload/_json.cpython-313t-x86_64-linux-gnu.so"])
    proc(4, "/usr/bin/python3.11", ["/usr/lib/python3.11/lib-dynload/_json.cpython-311-x86_64-linux-gnu.so"])
    proc(5, "/opt/bin/python", [])
    got = {pid: python_build(str(tmp_path), pid)["free_threaded"] for pid in range(1, 6)}
    assert got == {1: True, 2: True, 3: True, 4: False, 5: None}


def test_off_cpu_time_goes_to_blocking_frames_first_and_to_the_gil_only_up_to_what_others_held():
    shares = {"io": 0.2, "idle_wait": 0.1, "native": 0.3, "code": 0.4}
    w = allocate_waits(shares, cpu=0.2, run_delay=0.0, others_gil=None)
    assert w["io"] == 0.2 and w["idle_wait"] == 0.1 and w["gil"] == 0.0
    assert w["native_other"] == 0.3 and w["unexplained"] == pytest.approx(0.2)
    w = allocate_waits(shares, cpu=0.2, run_delay=0.0, others_gil=0.25)
    assert w["gil"] == 0.25 and w["native_other"] == pytest.approx(0.25)
    # More blocking frames than off-CPU time (a sync that spins): scaled down, nothing for the GIL.
    w = allocate_waits({"host_sync": 0.8, "code": 0.2}, cpu=0.5, run_delay=0.0, others_gil=0.9)
    assert w["host_sync"] == pytest.approx(0.5) and w["gil"] == 0.0


@pytest.mark.parametrize("mode", H200_MODES)
def test_h200_dumps_of_gpu_jobs_show_no_gil_wait(mode):
    """Real dumps of GPU jobs: the training thread waits off-CPU in native code (autograd's engine,
    a sync) holding no GIL, and no other thread holds it: no sample is a GIL wait."""
    dump = json.loads((DATA / "h200" / mode / "pyspy-dump.json").read_text())
    main = next(t for t in dump if t.get("thread_name") == "MainThread")
    ev = gil_analyse([{"threads": dump, "syscall": {}}], {"pid": main["os_thread_id"], "arch": "x86_64"})
    holders = [t for t in dump if t.get("owns_gil") and t is not main]
    assert not holders and ev["gil_wait_samples"] == 0
    frames = tuple(pystacks.Frame(f["name"], f["filename"], f["line"]) for f in reversed(main["frames"]))
    if any(f.name == "_engine_run_backward" for f in frames):
        assert not main["active"] and pystacks.classify_wait(frames, {}) == "native"


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_captured_dumps_agree_with_the_ownership_sampler(name):
    """`py-spy dump --json` of the same job: a blocked neighbour is inactive and holds no GIL."""
    dump = json.loads((GIL / name / "pyspy-dump.json").read_text())
    for t in dump:
        if t.get("thread_name") in ("bg-pipe", "bg-queue", "bg-event"):
            assert not t["owns_gil"] and not t["active"], t["thread_name"]


def test_gil_speedscope_parser_reads_threads_and_leaves():
    doc = json.loads(capture("spinner").artifacts["gil_speedscope.json"])
    rows = {h.name: h for h in pystacks.read_gil_speedscope(doc)}
    assert rows["bg-spinner"].samples > rows["MainThread"].samples
    assert any(k.startswith("_spinner") for k in rows["bg-spinner"].leaves)
    assert pystacks.read_gil_speedscope({"profiles": [{"name": 3, "samples": [[99], "x"]}]})[0].tid is None
