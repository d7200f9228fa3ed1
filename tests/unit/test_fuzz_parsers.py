"""Property tests: every parser of text that a target or a host hands over answers with a value or
one of the project's typed errors (probes.errors, BundleError, ProfileError, FoldedError), never
with a bare exception that would surface as a traceback.

Inputs: arbitrary text and bytes, text shaped like the real thing (perf stat lines, /proc lines),
and real captures from tests/data mutated at a random place (a probe's whole parse path, as
`trainprobe report` runs it on a bundle from someone else).

Examples per parser are counted; set TRAINPROBE_FUZZ_COUNTS=FILE to have them written as JSON.
The whole file stays well under a minute (max_examples is modest, no deadline on a shared CI box).
"""
from __future__ import annotations

import copy
import gzip
import io
import json
import os
import tarfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainprobe.agent.bundle import BundleError
from trainprobe.agent.profiles import ProfileError
from trainprobe.probes.errors import ProbeError
from trainprobe.probes.parsers import redact
from trainprobe.reports.folded import FoldedError
from tests.helpers import DATA

TYPED = (ProbeError, BundleError, ProfileError, FoldedError)
COUNTS: Counter[str] = Counter()
FAST = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False)
SLOW = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module", autouse=True)
def _write_counts():
    yield
    path = os.environ.get("TRAINPROBE_FUZZ_COUNTS")
    if path:
        Path(path).write_text(json.dumps(dict(sorted(COUNTS.items())), indent=1) + "\n")


def call(name: str, fn, *args, **kw):
    """Run one parser on one input: a value or a typed error, nothing else."""
    COUNTS[name] += 1
    try:
        return fn(*args, **kw)
    except TYPED:
        return None
    except MemoryError:
        raise AssertionError(f"{name} exhausted memory on {args!r:.300}") from None


# -- strategies -----------------------------------------------------------------------------------

texty = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=300)
numbers = st.one_of(st.integers(-10**20, 10**20).map(str), st.floats(allow_nan=True).map(str),
                    st.sampled_from(["", "-", "0x1f", "1e309", "nan", "inf", "<not counted>", "<not supported>",
                                     "99999999999999999999", "-1", "0-4294967296", "3-1"]))
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                        st.text(max_size=20))
json_value = st.recursive(json_scalar, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                              st.dictionaries(st.text(max_size=8), kids, max_size=4)),
                          max_leaves=12)


def joined(parts, seps):
    return st.lists(parts, min_size=1, max_size=12).flatmap(lambda xs: seps.map(lambda s: s.join(xs)))


def mutate(doc, data):
    """Replace one node of a JSON document, chosen by hypothesis, by an arbitrary JSON value."""
    doc = copy.deepcopy(doc)
    if not isinstance(doc, (dict, list)) or not doc:
        return data.draw(json_value)
    node = doc
    for _ in range(data.draw(st.integers(0, 6))):
        keys = list(node.keys()) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            break
        k = data.draw(st.sampled_from(keys))
        child = node[k]
        if isinstance(child, (dict, list)) and child and data.draw(st.booleans()):
            node = child
            continue
        node[k] = data.draw(json_value)
        return doc
    keys = list(node.keys()) if isinstance(node, dict) else list(range(len(node)))
    if keys:
        node[data.draw(st.sampled_from(keys))] = data.draw(json_value)
    return doc


# -- /proc -----------------------------------------------------------------------------------------

@FAST
@given(st.one_of(texty, joined(numbers, st.sampled_from([",", "-", " ", ",-"]))))
def test_proc_cpulist_and_small_files(text):
    from trainprobe.probes.parsers import procfs
    call("procfs.parse_cpulist", procfs.parse_cpulist, text)
    call("procfs.parse_schedstat", procfs.parse_schedstat, text)
    call("procfs.parse_cpu_max", procfs.parse_cpu_max, text)
    call("procfs.parse_cgroup_v2_path", procfs.parse_cgroup_v2_path, text)
    call("procfs.parse_status", procfs.parse_status, text)
    call("procfs.parse_maps_libraries", procfs.parse_maps_libraries, text)


@FAST
@given(st.one_of(texty, st.builds(lambda pid, comm, rest: f"{pid} ({comm}) {rest}", numbers, texty,
                                  joined(numbers, st.just(" ")))))
def test_proc_stat(text):
    from trainprobe.probes.parsers import procfs
    call("procfs.parse_stat", procfs.parse_stat, text)


@FAST
@given(st.binary(max_size=400))
def test_proc_cmdline_and_environ(raw):
    from trainprobe.probes.parsers import procfs
    call("procfs.parse_argv", procfs.parse_argv, raw)
    call("procfs.parse_environ_whitelist", procfs.parse_environ_whitelist, raw)


@FAST
@given(st.one_of(texty, joined(st.one_of(st.sampled_from(["N0=3", "N1=x", "anon=2", "kernelpagesize_kB=2048",
                                                          "kernelpagesize_kB=x", "file=/a", "heap", "N-1=4"]),
                                         numbers), st.sampled_from([" ", "\n"]))))
def test_proc_numa_maps(text):
    from trainprobe.probes import placement
    call("placement.parse_numa_maps", placement.parse_numa_maps, text)


# -- perf stat -------------------------------------------------------------------------------------

perf_field = st.one_of(numbers, st.sampled_from(["cycles", "instructions:u", "cpu_core/cycles/", "msec",
                                                  "task-clock", "CPU0", "S0-D0-C1", "python-1234", "100.00",
                                                  "", "#", "summary", "12.5%"]), texty)


@FAST
@given(st.one_of(texty, joined(perf_field, st.sampled_from([",", ";", "\t"])),
                 st.lists(joined(perf_field, st.just(",")), max_size=6).map("\n".join)))
def test_perf_stat_output(text):
    from trainprobe.probes.parsers import perfparse
    call("perfparse.parse_text", perfparse.parse_text, text)
    for sep in (",", ";"):
        call("perfparse.parse_line", perfparse.parse_line, text.split("\n")[0], sep)


def _perf_fixtures():
    return [p.read_text() for p in sorted((DATA / "perf").glob("lkml-*.txt"))]


@FAST
@given(st.data())
def test_perf_stat_real_output_with_one_line_damaged(data):
    from trainprobe.probes.parsers import perfparse
    texts = _perf_fixtures()
    if not texts:
        return
    lines = data.draw(st.sampled_from(texts)).splitlines() or [""]
    i = data.draw(st.integers(0, len(lines) - 1))
    lines[i] = data.draw(st.one_of(texty, joined(perf_field, st.just(","))))
    call("perfparse.parse_text (damaged real)", perfparse.parse_text, "\n".join(lines))


# -- sysfs: topology and host facts --------------------------------------------------------------

@FAST
@given(st.one_of(texty, joined(st.one_of(numbers, st.text("0123456789abcdefABCDEF", max_size=12)),
                               st.sampled_from([",", " ", "x"]))))
def test_sysfs_values(text):
    from trainprobe.probes import topology
    from trainprobe.probes.parsers import hostfacts
    for fn in (topology.parse_cpus, topology.parse_hex, topology.parse_int, topology.parse_link_speed,
               topology.parse_link_width, topology.parse_cpumask):
        call(f"topology.{fn.__name__}", fn, text)
    call("hostfacts.parse_meminfo", hostfacts.parse_meminfo, text)
    call("hostfacts.parse_size_option", hostfacts.parse_size_option, text)
    call("hostfacts.parse_limits", hostfacts.parse_limits, "Limit Soft Hard Units\n" + text)
    call("hostfacts.parse_kmsg_line", hostfacts.parse_kmsg_line, text)


@FAST
@given(st.lists(st.sampled_from(["Max open files", "Max locked memory", "Max processes"]), min_size=1, max_size=3),
       st.lists(numbers, min_size=1, max_size=3))
def test_sysfs_limits_shaped(labels, vals):
    from trainprobe.probes.parsers import hostfacts
    text = "Limit Soft Hard Units\n" + "\n".join(f"{lb} {' '.join(vals)}" for lb in labels)
    call("hostfacts.parse_limits", hostfacts.parse_limits, text)


# -- every probe's parse, on real captures damaged at one place ------------------------------------

def _real_captures():
    from trainprobe.probes.base import Capture
    out = []
    for p in sorted((DATA / "bcc").glob("*/*.capture.json.gz")):
        with gzip.open(p, "rt") as fh:
            out.append(Capture.from_dict(json.load(fh)))
    for mode in ("starved",):
        from tests.helpers import h200_gpu_capture, h200_pyspy_capture
        out.append(h200_pyspy_capture(mode))
        out.append(h200_gpu_capture(mode))
    from trainprobe.agent import bundle
    out += bundle.load(str(DATA / "preflight" / "bundle-vm")).captures     # preflight's probes
    return out


_CAPS = None


def real_captures():
    global _CAPS
    if _CAPS is None:
        _CAPS = _real_captures()
    return _CAPS


@SLOW
@given(st.data())
def test_probe_parsers_on_damaged_captures(data):
    from trainprobe.probes.base import Capture
    from trainprobe.probes.registry import probe_classes
    classes = {c.name: c for c in probe_classes()}
    cap = data.draw(st.sampled_from(real_captures()))
    names = [k for k, v in cap.artifacts.items() if isinstance(v, str)]
    if not names:
        return
    name = data.draw(st.sampled_from(sorted(names)))
    text = cap.artifacts[name]
    try:
        doc = json.loads(text) if len(text) < 3_000_000 else None
    except ValueError:
        doc = None
    if doc is not None and data.draw(st.booleans()):
        new = json.dumps(mutate(doc, data))
    elif "\n" in text and doc is None:
        lines = text.splitlines()
        lines[data.draw(st.integers(0, len(lines) - 1))] = data.draw(texty)
        new = "\n".join(lines)
    else:
        new = data.draw(st.one_of(texty, json_value.map(json.dumps)))
    damaged = Capture.from_dict({**cap.to_dict(), "artifacts": {**cap.artifacts, name: new}})
    call(f"{cap.probe}.parse (damaged capture)", classes[cap.probe].parse, damaged)


# -- py-spy chrometrace, py-spy dump (GIL), NVML ---------------------------------------------------

frame_event = st.fixed_dictionaries(
    {"ph": st.sampled_from(["B", "E", "X", "M", 3, None]), "pid": st.one_of(st.integers(-2, 5), json_scalar),
     "tid": st.one_of(st.integers(0, 3), json_scalar), "ts": st.one_of(st.floats(0, 1e7), json_scalar),
     "name": st.one_of(st.sampled_from(["process 1:\"python t.py\"", "thread (1)", "f (a.py:1)"]), json_scalar),
     "args": st.one_of(st.fixed_dictionaries({"filename": json_scalar, "line": json_scalar}), json_value)})


@FAST
@given(st.one_of(st.lists(frame_event, max_size=30), json_value))
def test_pyspy_chrometrace_events(events):
    from trainprobe.probes.parsers import pystacks
    from trainprobe.probes.base import Capture
    from trainprobe.probes.pyspy import PySpyProbe
    cap = Capture("pyspy", artifacts={"chrometrace.json": json.dumps(events)}, meta={"pid": 1, "launch_unix": 0})
    call("pyspy.parse (chrometrace)", PySpyProbe.parse, cap)
    call("pystacks.read_chrometrace", pystacks.read_chrometrace, events)


gil_sample = st.fixed_dictionaries({
    "t": st.one_of(st.floats(0, 100), json_scalar),
    "dump": st.one_of(st.lists(st.fixed_dictionaries({
        "thread_id": json_scalar, "os_thread_id": json_scalar, "thread_name": json_scalar, "owns_gil": json_scalar,
        "active": json_scalar, "frames": st.one_of(st.lists(st.fixed_dictionaries({
            "name": json_scalar, "filename": json_scalar, "line": json_scalar}), max_size=4), json_value)}),
        max_size=4), json_value)})


@FAST
@given(st.lists(st.one_of(gil_sample, json_value), max_size=8))
def test_pyspy_dump_samples_for_the_gil_probe(samples):
    from trainprobe.probes.base import Capture
    from trainprobe.probes.gil import GilProbe
    cap = Capture("gil", artifacts={"gil_samples.jsonl": "\n".join(json.dumps(s) for s in samples)},
                  meta={"pid": 1})
    call("gil.parse (py-spy dump samples)", GilProbe.parse, cap)


@SLOW
@given(st.data())
def test_nvml_values(data):
    from trainprobe.probes import gpu
    from trainprobe.probes.support import nvml
    from tests.helpers import h200_nvml
    raw = mutate(h200_nvml("starved"), data)
    call("gpu.analyse (NVML values)", gpu.analyse, raw)
    v = data.draw(json_value)
    call("gpu.pcie_link_gbps", gpu.pcie_link_gbps, v, data.draw(json_value))
    call("gpu.decode_clock_reasons", gpu.decode_clock_reasons, v)
    call("gpu.cpulist_from_words", gpu.cpulist_from_words, v)
    call("nvml.is_na", nvml.is_na, v)


# -- bundles and saved profiles ----------------------------------------------------------------------

@SLOW
@given(st.data())
def test_bundle_directories(tmp_path_factory, data):
    from trainprobe.agent import bundle
    d = tmp_path_factory.mktemp("b")
    index = {"schema": "trainprobe.bundle/1", "context": {"window": {"seconds": 1.0}},
             "captures": ["captures/pyspy.json"]}
    (d / "captures").mkdir()
    (d / "bundle.json").write_text(json.dumps(mutate(index, data)))
    cap = {"probe": "pyspy", "artifacts": {"chrometrace.json": "[]"}, "meta": {"pid": 1}}
    (d / "captures" / "pyspy.json").write_text(json.dumps(mutate(cap, data)))
    call("bundle.load (directory)", bundle.load, str(d))


@SLOW
@given(st.lists(st.tuples(st.text(max_size=30), st.binary(max_size=200)), max_size=5), st.booleans())
def test_bundle_archives(tmp_path_factory, members, with_index):
    from trainprobe.agent import bundle
    p = tmp_path_factory.mktemp("t") / "b.tar.gz"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        if with_index:
            members = [("b/bundle.json", json.dumps({"schema": "trainprobe.bundle/1", "captures": [m[0] for m in members]}).encode())] + members
        for name, blob in members:
            info = tarfile.TarInfo(name or "x")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    p.write_bytes(buf.getvalue())
    call("bundle.load (archive)", bundle.load, str(p))
    p.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    call("bundle.load (truncated archive)", bundle.load, str(p))


@FAST
@given(st.one_of(texty, st.lists(st.builds(lambda s, n: f"{s} {n}", texty, numbers), max_size=6).map("\n".join)))
def test_folded_and_speedscope_profiles(tmp_path_factory, text):
    from trainprobe.agent import profiles
    from trainprobe.reports import folded
    call("folded.parse", folded.parse, text)
    call("folded.parse_diff", folded.parse_diff, text)
    p = tmp_path_factory.mktemp("p") / "x.folded"
    p.write_text(text)
    call("profiles.load_profile (folded)", profiles.load_profile, str(p))


@SLOW
@given(json_value)
def test_speedscope_documents(tmp_path_factory, doc):
    from trainprobe.agent import profiles
    from trainprobe.reports import speedscope
    if isinstance(doc, dict):
        doc["$schema"] = speedscope.SCHEMA
    p = tmp_path_factory.mktemp("s") / "x.json"
    p.write_text(json.dumps(doc))
    call("profiles.load_profile (speedscope/chrometrace JSON)", profiles.load_profile, str(p))


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("keyKEYtoknsecrpaswdhuiPWD:/_-= .") + ["ſ", "K", "İ", "ı", "é"]),
               max_size=40))
def test_the_redaction_prefilter_misses_nothing_the_case_blind_regex_finds(s):
    """The fast prefilter (lower() and `in` for ASCII text) answers as the case-blind regex it
    replaced, non-ASCII case folding included (the Kelvin sign, the long s)."""
    assert redact._maybe(s) == bool(redact._MAYBE.search(s))
    if not redact._maybe(s):
        assert redact.text(s) == s and redact.argv([s]) == [s]
