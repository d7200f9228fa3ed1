"""Folded stacks and speedscope JSON: round trips, and the speedscope schema's required fields."""
import json

import pytest

from trainprobe.agent import profiles
from trainprobe.reports import folded, speedscope
from tests.helpers import H200_MODES, h200_pyspy_capture

UNITS = {"none", "nanoseconds", "microseconds", "milliseconds", "seconds", "bytes"}


def real(mode, **kw):
    return profiles.process_profile(profiles.stacks_of(h200_pyspy_capture(mode)), **kw)


@pytest.mark.parametrize("mode", H200_MODES)
def test_folded_round_trips_real_profiles(mode):
    prof = real(mode, threads=True, subprocesses=True)
    text = folded.dumps(prof)
    assert folded.parse(text) == prof
    assert folded.dumps(folded.parse(text)) == text
    for line in text.splitlines():
        stack, count = line.rsplit(" ", 1)
        assert count.isdigit() and int(count) > 0          # integer counts (speedscope needs them)
        assert stack and "\n" not in stack


def test_folded_parse_follows_flamegraph_pl():
    text = "a;b;c 10\na;b 5\n\na;b;c 2\nx;y 1.6\n"
    assert folded.parse(text) == {"a;b;c": 12, "a;b": 5, "x;y": 2}
    # the differential form: a second count is the profile the graph is sized by
    assert folded.parse("a;b 3 7\n") == {"a;b": 7}
    assert folded.parse_diff("a;b 3 7\na;c 4 0\n") == ({"a;b": 3, "a;c": 4}, {"a;b": 7})
    with pytest.raises(folded.FoldedError, match="line 2"):
        folded.parse("a;b 1\nnot a count\n")


def test_folded_diff_dump_lists_both_sides():
    out = folded.dumps_diff({"a;b": 3, "a;c": 4}, {"a;b": 7, "a;d": 1})
    assert out == "a;b 3 7\na;c 4 0\na;d 0 1\n"
    assert folded.parse_diff(out) == ({"a;b": 3, "a;c": 4}, {"a;b": 7, "a;d": 1})


def validate_speedscope(doc):
    """The required fields of https://www.speedscope.app/file-format-schema.json (File, Frame,
    SampledProfile), and the constraints its spec states (one weight per sample, indices into
    shared.frames, endValue >= startValue)."""
    for key in ("$schema", "shared", "profiles"):
        assert key in doc, key
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    frames = doc["shared"]["frames"]
    assert isinstance(frames, list)
    for fr in frames:
        assert isinstance(fr["name"], str)
        assert set(fr) <= {"name", "file", "line", "col"}
        if "file" in fr:
            assert isinstance(fr["file"], str)
        if "line" in fr:
            assert isinstance(fr["line"], int)
    assert isinstance(doc["profiles"], list) and doc["profiles"]
    for p in doc["profiles"]:
        for key in ("type", "name", "unit", "startValue", "endValue", "samples", "weights"):
            assert key in p, key
        assert p["type"] == "sampled" and p["unit"] in UNITS and isinstance(p["name"], str)
        assert p["endValue"] >= p["startValue"]
        assert len(p["samples"]) == len(p["weights"])
        for stack in p["samples"]:
            assert all(isinstance(i, int) and 0 <= i < len(frames) for i in stack)
        assert all(isinstance(w, (int, float)) and w >= 0 for w in p["weights"])
    if "activeProfileIndex" in doc:
        assert 0 <= doc["activeProfileIndex"] < len(doc["profiles"])


@pytest.mark.parametrize("mode", ["starved", "fixed"])
def test_speedscope_validates_and_round_trips(mode):
    prof = real(mode, subprocesses=True)
    doc = json.loads(json.dumps(speedscope.document([("all", prof)], name=mode, exporter="trainprobe@test")))
    validate_speedscope(doc)
    p = doc["profiles"][0]
    assert p["endValue"] - p["startValue"] == folded.total(prof) == sum(p["weights"])
    (name, back, unit), = speedscope.read(doc)
    assert back == prof and unit == "microseconds" and name == "all"


def test_speedscope_frames_carry_file_and_line():
    doc = speedscope.document([("t", real("starved"))])
    fr = {(f["name"], f.get("file"), f.get("line")) for f in doc["shared"]["frames"]}
    assert ("Heavy.__getitem__", "workloads.py", 10) in fr
    assert all(not f["name"].endswith(")") or "file" not in f for f in doc["shared"]["frames"])


def test_speedscope_one_profile_per_root_and_shared_frames():
    prof = real("fixed", threads=True, subprocesses=True)
    groups = speedscope.split_by_root(prof)
    doc = speedscope.document(groups)
    validate_speedscope(doc)
    assert len(doc["profiles"]) == len(groups) > 13
    labels = [f["name"] for f in doc["shared"]["frames"]]
    assert len(labels) == len(set((f["name"], f.get("file"), f.get("line")) for f in doc["shared"]["frames"]))
    # every sample with a Python frame is kept; a root alone (no Python frame) has nothing to show
    with_frames = sum(v for k, v in prof.items() if not all(f.startswith(("process (", "thread (")) for f in k.split(";")))
    assert sum(sum(p["weights"]) for p in doc["profiles"]) == with_frames
    assert with_frames < folded.total(prof)          # the capture has such samples: the test means something
    assert not any(n.startswith(("process ", "thread (")) for n in labels)


def test_speedscope_reads_evented_profiles():
    doc = {"$schema": speedscope.SCHEMA, "shared": {"frames": [{"name": "a"}, {"name": "b", "file": "x.py", "line": 3}]},
           "profiles": [{"type": "evented", "name": "e", "unit": "microseconds", "startValue": 0, "endValue": 10,
                         "events": [{"type": "O", "at": 0, "frame": 0}, {"type": "O", "at": 2, "frame": 1},
                                    {"type": "C", "at": 7, "frame": 1}, {"type": "C", "at": 10, "frame": 0}]}]}
    (_n, prof, _u), = speedscope.read(doc)
    assert prof == {"a": 5, "a;b (x.py:3)": 5}
