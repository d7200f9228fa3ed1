"""Every probe's evidence has the shape its schema declares (probes/schema.py), on every capture the
repository holds: the bcc scenarios, every saved bundle (the ledger's, the H200 node's, the 2-rank
H200 job's), the H200 fixtures, the perf stat texts, the topology and placement trees, the PSI
files; and, when ../shared/fixtures is present, its H200 captures and hwloc's sysfs trees.

A renamed key, a new key the schema lacks, or a changed type fails here, not in a rule.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Dict, List, Optional, Tuple, TypedDict

import pytest

from trainprobe.agent import bundle
from trainprobe.agent.evidence import Evidence, build
from trainprobe.probes import schema
from trainprobe.probes.base import Capture
from trainprobe.probes.gpu import capture_from_nvml_json
from trainprobe.probes.placement import capture_from_roots
from trainprobe.probes.pyspy import capture_from_chrometrace
from trainprobe.probes.registry import probe_class, probe_classes
from trainprobe.probes.topology import snapshot
from tests.helpers import DATA, H200_MODES, REPO, extracted_tree, h200_gpu_capture, h200_pyspy_capture

SHARED = REPO.parent / "shared" / "fixtures"
BUNDLES = sorted([*(DATA / "ledger" / "bundles").glob("*.tar.gz"), *(DATA / "h200" / "live" / "bundles").glob("*.tar.gz"),
                  *(DATA / "h200x2").glob("*.tar.gz"), DATA / "preflight" / "bundle-vm"])
TOPO = DATA / "topo"
TREES = ("2n2c", "2s4g", "2s4g-t1", "2s4g-degraded", "h200-vm")
PLACEMENTS = ((4000, ("2s4g", "2s4g-t1")), (4103, ("2s4g", "2s4g-t1")), (7000, ("2s4g-degraded", "2s4g-degraded")),
              (4101, ("2n2c",)))
HWLOC = ("16amd64-8n2c", "32em64t-2n8c+dax+nvme+mic+dimms", "40intel64-2g2n4c+pcilocality",
         "64amd64-4s2n4ca2co", "nvidiagpunumanodes")


def parsed(cap: Capture) -> dict:
    cls = probe_class(cap.probe)
    assert cls is not None, f"no probe named {cap.probe}"
    return cls.parse(cap)


def assert_matches(cap: Capture, where: str) -> None:
    cls = probe_class(cap.probe)
    found = schema.problems(parsed(cap), cls.evidence_schema, f"{cap.probe}")
    assert not found, f"{where}: {cap.probe} evidence does not match {cls.evidence_schema.__name__}:\n" + \
        "\n".join(found[:20])


def replayable(caps: list[Capture]) -> list[Capture]:
    """The captures `evidence.build` parses: those that ran and kept artifacts."""
    return [c for c in caps if c.status in ("ok", "timeout") and c.artifacts]


# -- what the repository holds -------------------------------------------------------------------

@pytest.mark.parametrize("path", sorted((DATA / "bcc").glob("*/*.capture.json.gz")),
                         ids=lambda p: f"{p.parent.name}/{p.name.split('.')[0]}")
def test_bcc_scenario_captures(path):
    with gzip.open(path, "rt") as fh:
        assert_matches(Capture.from_dict(json.load(fh)), str(path.relative_to(DATA)))


@pytest.mark.parametrize("path", BUNDLES, ids=lambda p: p.name)
def test_every_capture_of_every_saved_bundle(path):
    caps = replayable(bundle.load(str(path)).captures)
    assert caps
    for cap in caps:
        assert_matches(cap, path.name)


@pytest.mark.parametrize("mode", H200_MODES)
def test_h200_fixtures(mode):
    assert_matches(h200_pyspy_capture(mode), f"h200/{mode}")
    assert_matches(h200_gpu_capture(mode), f"h200/{mode}")


def perf_capture(sessions: dict[str, str], targets: dict) -> Capture:
    arts = {f"{name}.perf.txt": (DATA / "perf" / f).read_text() for name, f in sessions.items()}
    return Capture("perfstat", artifacts={"targets.json": json.dumps(targets), **arts})


def test_perf_stat_texts():
    vm_pmu = {"sources": {"software": 1, "tracepoint": 2}, "hypervisor": True, "core_pmus": []}
    t = json.loads((DATA / "perf" / "vm-train-targets.json").read_text())
    train = {"main_pid": 15608, "sessions": {"main": [15608], "workers": [15646, 15647]},
             "tasks": {**t["main"], **t["workers"]}, "comm": t["comm"], "interval_ms": 500, "interval_count": 6,
             "pmu": vm_pmu}
    assert_matches(perf_capture({"main": "vm-train-main-interval-per-thread.txt",
                                 "workers": "vm-train-workers-interval-per-thread.txt"}, train), "perf/vm-train")
    failed = {"main_pid": 1, "sessions": {"main": [1]}, "tasks": {}, "pmu": vm_pmu}
    assert_matches(perf_capture({"main": "vm-interval-summary.txt"}, failed), "perf/vm-interval-summary")
    cap = perf_capture({}, failed)
    cap.artifacts["main.stderr.txt"] = (DATA / "perf" / "vm-error-no-such-pid.txt").read_text()
    assert_matches(cap, "perf/vm-error-no-such-pid")


@pytest.mark.parametrize("tree", TREES)
def test_topology_trees(tree):
    snap = json.dumps(snapshot(str(TOPO / tree)))
    assert_matches(Capture("topology", artifacts={"sysfs.json": snap}), f"topo/{tree}")


@pytest.mark.parametrize("pid,trees", PLACEMENTS, ids=lambda v: str(v))
def test_placement_trees(pid, trees):
    assert_matches(capture_from_roots(pid, [str(TOPO / t) for t in trees]), f"topo/{trees}")


def test_pressure_files():
    psi = DATA / "pressure"
    arts = {f"{scope}/{r}.{w}": (psi / f"{r}.{w}").read_text()
            for scope in ("host", "cgroup") for r in ("cpu", "io", "memory") for w in ("start", "end")}
    cap = Capture("pressure", artifacts=arts, meta={"interval_s": 5.0, "cgroup_path": "/sys/fs/cgroup/job"})
    assert_matches(cap, "pressure")


def test_throttle_files():
    thr = DATA / "throttle"
    arts = {"cpu.stat.start": (thr / "v1.start").read_text(), "cpu.stat.end": (thr / "v1.end").read_text(),
            "cpu.cfs_quota_us": (thr / "v1.cfs_quota_us").read_text(),
            "cpu.cfs_period_us": (thr / "v1.cfs_period_us").read_text()}
    assert_matches(Capture("throttle", artifacts=arts, meta={"interval_s": 2.0, "cgroup_version": 1,
                                                              "cgroup_dir": "/sys/fs/cgroup/cpu/job"}), "throttle")
    root = (thr / "v2-root.stat").read_text()
    assert_matches(Capture("throttle", artifacts={"cpu.stat.start": root, "cpu.stat.end": root},
                           meta={"interval_s": 2.0, "cgroup_version": 2, "cgroup_dir": "/sys/fs/cgroup"}), "throttle")


# -- what lives beside the repository ------------------------------------------------------------

def shared(sub: str) -> Path:
    path = SHARED / sub
    if not path.is_dir():
        pytest.skip(f"{path} is absent: the shared fixtures live beside the project, not in it")
    return path


@pytest.mark.parametrize("mode", H200_MODES)
def test_shared_h200_captures(mode):
    d = shared("h200") / mode
    with gzip.open(d / "pyspy.chrometrace.json.gz", "rt") as fh:
        trace = fh.read()
    nvml = (d / "nvml.json").read_text()
    assert_matches(capture_from_chrometrace(trace, json.loads(nvml)["pid"]), f"shared h200/{mode}")
    assert_matches(capture_from_nvml_json(nvml), f"shared h200/{mode}")


@pytest.mark.parametrize("name", HWLOC)
def test_shared_hwloc_sysfs_trees(name, tmp_path):
    snap = json.dumps(snapshot(extracted_tree(shared("sysfs") / f"{name}.tar.bz2")))
    assert_matches(Capture("topology", artifacts={"sysfs.json": snap}), f"shared sysfs/{name}")


# -- the declarations themselves -----------------------------------------------------------------

@pytest.mark.parametrize("cls", probe_classes(), ids=lambda c: c.name)
def test_every_registered_probe_declares_a_schema(cls):
    assert schema.is_typeddict(cls.evidence_schema), f"{cls.name} declares no evidence_schema"
    schema.fields(cls.evidence_schema)            # every annotation resolves


def test_every_registered_probe_has_captures_checked_here():
    """A new probe's captures (step 1 of docs/contributing.md) belong in this file's sources."""
    seen = {"gpu", "pyspy", "perfstat", "topology", "placement", "pressure", "throttle"}      # built above
    seen |= {c.probe for p in BUNDLES for c in replayable(bundle.load(str(p)).captures)}
    for path in (DATA / "bcc").glob("*/*.capture.json.gz"):
        with gzip.open(path, "rt") as fh:
            seen.add(json.load(fh)["probe"])
    assert {c.name for c in probe_classes()} <= seen


def test_gpu_evidence_survives_a_json_round_trip_with_int_indices():
    """JSON makes the GPU index keys strings; Evidence.put gives them back as ints, so rules read one type."""
    path = DATA / "h200x2" / "healthy.tar.gz"
    ev = build(bundle.load(str(path)).captures)
    gpu = ev.get("gpu")
    assert gpu["per_gpu"] and all(isinstance(k, int) for k in gpu["per_gpu"])
    back = json.loads(json.dumps(gpu))
    assert set(back["per_gpu"]) == {str(k) for k in gpu["per_gpu"]}
    assert any("expected a key of type int, got str" in p for p in schema.problems(back, schema.GpuEvidence))
    loaded = Evidence()
    loaded.put("gpu", back)
    assert loaded.get("gpu") == gpu
    assert not schema.problems(loaded.get("gpu"), schema.GpuEvidence)


# -- the checker on bad input --------------------------------------------------------------------

class Inner(TypedDict):
    n: int
    share: float


class _OuterSeen(TypedDict):
    name: str
    inner: Optional[Inner]


class Outer(_OuterSeen, total=False):
    rows: List[Inner]
    by_index: Dict[int, List[Tuple[float, str]]]


def test_checker_names_every_problem_with_its_path():
    assert schema.problems({"name": "a", "inner": {"n": 1, "share": 1}}, Outer) == []    # an int is a float
    bad = {"inner": {"n": True, "share": "x"}, "rows": [{"n": 1, "share": 0.5}, {"n": 2.5}], "extra": 1,
           "by_index": {"0": [[1.0, "a"]], 1: [[1.0]]}}
    assert sorted(schema.problems(bad, Outer)) == sorted([
        "$.name: expected a key of Outer, missing",
        "$.inner.n: expected int, got bool",
        "$.inner.share: expected float, got str",
        "$.rows[1].share: expected a key of Inner, missing",
        "$.rows[1].n: expected int, got float",
        "$.extra: expected no such key in Outer, got int",
        "$.by_index['0']: expected a key of type int, got str",
        "$.by_index[1][0]: expected tuple[float, str], got 1 items",
    ])
    assert schema.problems([], Outer) == ["$: expected Outer, got list"]
    assert schema.problems({"name": "a", "inner": 3}, Outer) == ["$.inner: expected Inner, got int"]


def test_from_json_gives_int_keys_back_and_leaves_the_rest():
    doc = {"name": "a", "inner": None, "by_index": {"0": [[1.0, "a"]], "x": []}, "rows": [{"n": 1, "share": 0.5}]}
    back = schema.from_json(doc, Outer)
    assert back["by_index"] == {0: [[1.0, "a"]], "x": []}
    assert back["rows"] is doc["rows"]                 # nothing below that can hold an int key
    assert schema.problems(back, Outer) == ["$.by_index['x']: expected a key of type int, got str"]
