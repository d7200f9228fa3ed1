"""A preflight bundle saved on the development VM (`preflight --active --save`, tests/data/preflight/
bundle-vm): its captures go back through the preflight probes' parsers and the checks give the
verdicts the live run gave; another profile judges the same reads again; a damaged or foreign
bundle is one line of bad input."""
from __future__ import annotations

import json
import shutil

import pytest

from trainprobe.agent import bundle
from trainprobe.agent.preflight import profile as profiles
from trainprobe.agent.preflight.engine import Context
from trainprobe.agent.preflight.runner import PROBES, load_replay, parse_reads, run
from trainprobe.probes.base import Capture, ReadRecord
from trainprobe.probes.errors import BadInput
from trainprobe.probes.parsers import hostfacts
from tests.helpers import run_cli
from tests.preflight_fixtures import PREFLIGHT

SAVED = PREFLIGHT / "bundle-vm"


def verdicts(checks):
    return [(c["check"], c["target"], c["status"], c["observed"]) for c in checks]


def replay(path, profile=None, tiers=("host", "gpu", "active")):
    raw = load_replay(str(path))
    return run(Context(profile=profile or profiles.load(None)), tiers, replay=raw)


def test_replay_gives_the_live_verdicts():
    live = json.loads((SAVED / "report.json").read_text())
    again = replay(SAVED)
    assert verdicts([r.to_dict() for r in again.records]) == verdicts(live["checks"])
    assert again.raw["host"]["hostname"] == live["host"]["hostname"]
    # Nothing about the run is read from this machine: a hung or absent read would say so.
    assert not [r for r in again.records if r.result.observed == "not read"]


def test_every_capture_is_a_preflight_probe_and_parses():
    b = bundle.load(str(SAVED))
    assert sorted(c.probe for c in b.captures) == ["gpubench", "gpuhealth", "host"]
    reads = parse_reads(b.captures)
    assert set(reads) == {r for p in PROBES.values() for r in p.reads}
    for cap in b.captures:                                 # the declared shape of each probe's evidence
        parsed = PROBES[cap.probe].parse(cap)
        assert set(parsed) <= set(PROBES[cap.probe].evidence_schema.__annotations__)
        assert all(set(r) == set(ReadRecord.__annotations__) for r in parsed.values())
    assert all(r["error"] is None and not r["timed_out"] for r in reads.values())
    mem = hostfacts.parse_meminfo(reads["meminfo"]["data"])
    assert mem["MemTotal"] > 1 << 30
    host = next(c for c in b.captures if c.probe == "host")
    assert {"kind": "file", "what": "/proc/meminfo", "rc": 0} in [
        {k: p[k] for k in ("kind", "what", "rc")} for p in host.provenance]
    assert reads["gpubench"]["data"]["error"].startswith("torch")     # a CPU-only torch, said by the child


def test_another_profile_judges_the_same_reads():
    live = {(c["check"], c["target"]): c for c in json.loads((SAVED / "report.json").read_text())["checks"]}
    strict = profiles.load(None)
    strict["host"]["min_shm_gib"] = 1 << 20
    out = {(r.check, r.result.target): r.result for r in replay(SAVED, strict).records}
    assert live[("host.shm", None)]["status"] == "ok"
    assert out[("host.shm", None)].status == "critical"
    assert out[("host.shm", None)].value == live[("host.shm", None)]["value"]


def test_the_cli_replays_the_bundle_with_its_exit_code():
    live = json.loads((SAVED / "report.json").read_text())
    r = run_cli("preflight", "--json", "--active", "--replay", str(SAVED))
    rep = r.json()
    assert r.rc == live["exit_code"] == rep["exit_code"]
    assert verdicts(rep["checks"]) == verdicts(live["checks"]) and rep["replayed_from"] == str(SAVED)
    # `report` reads diagnosis bundles: for this one it says which command does.
    other = run_cli("report", str(SAVED))
    assert other.rc == 2 and "trainprobe preflight --replay" in other.err


def test_a_damaged_capture_is_bad_input(tmp_path):
    broken = tmp_path / "b"
    shutil.copytree(SAVED, broken)
    cap = json.loads((broken / "captures/host.json").read_text())
    del cap["artifacts"]["meminfo"]                       # the read says it answered; its text is gone
    (broken / "captures/host.json").write_text(json.dumps(cap))
    with pytest.raises(BadInput, match="host capture: malformed input"):
        load_replay(str(broken))


def test_a_diagnosis_bundle_is_not_a_preflight_bundle(tmp_path):
    path = tmp_path / "diag.tar.gz"
    bundle.save(str(path), [Capture("process")], {"window": {"seconds": 1.0}})
    with pytest.raises(BadInput, match="not a preflight bundle"):
        load_replay(str(path))
