"""Every SVG and HTML output stays well-formed whatever characters the target put in its names.

A job chooses its function names, file names, thread names and command line; a bundle or profile
handed to `report` or `flamegraph --input` holds any JSON string, lone surrogates included. One
character that XML 1.0 forbids, written raw, makes a standalone SVG unreadable (the browser shows
an error instead of the graph): a job could hide its own profile. Built from the real H200 capture
with every forbidden class planted in every name, rendered in every form, parsed back.
"""
from __future__ import annotations

import copy
import json
import re
import xml.etree.ElementTree as ET

import pytest

from trainprobe.agent import evidence as evidence_mod
from trainprobe.agent import profiles
from trainprobe.agent import report as report_mod
from trainprobe.agent import visuals
from trainprobe.agent.fleet.merge import merge
from trainprobe.probes.parsers import pystacks
from trainprobe.probes.pyspy import capture_from_chrometrace
from trainprobe.reports import output, xmlsafe
from tests.helpers import H200, h200_chrometrace, h200_pid
from tests.report_fixtures import gpu_evidence, nvml

# One of each class XML 1.0 forbids: C0 controls other than tab, newline, carriage return;
# lone surrogates (low before high, so they never pair); the two non-characters U+FFFE, U+FFFF.
FORBIDDEN = {"NUL": "\x00", "SOH": "\x01", "BS": "\x08", "VT": "\x0b", "FF": "\x0c", "SO": "\x0e",
             "ESC": "\x1b", "US": "\x1f", "low surrogate": "\udfff", "high surrogate": "\ud800",
             "U+FFFE": "\ufffe", "U+FFFF": "\uffff"}
ODD = "".join(FORBIDDEN.values()) + "\x7f\x85\u202e"      # and the controls shown escaped in the terminal too
ANY_FORBIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
FN, FILE, THREAD, CMD = f"Heavy.get{ODD}item", f"/srv/train/work{ODD}loads.py", f"loader{ODD}", f"--tag {ODD}"


def _odd_trace(mode: str = "starved") -> str:
    """The real py-spy trace with the odd function, file, thread and process names planted."""
    events = json.loads(h200_chrometrace(mode))
    out = []
    for ev in events:
        ev = copy.deepcopy(ev)
        if ev.get("name") == "Heavy.__getitem__":
            ev["name"] = FN
        if ev.get("args", {}).get("filename") == "/srv/train/workloads.py" and ev.get("name") == "main":
            ev["args"]["filename"] = FILE
        is_process = str(ev.get("name", "")).startswith("process ")
        if is_process:
            ev["name"] = ev["name"].replace("starved 16", CMD)
        thread = dict(ev, name=f"thread ({ev['tid'] % 100000}): {THREAD}", args={"filename": "", "line": 0})
        if is_process and ev["ph"] == "E":
            out.append(thread)
        out.append(ev)
        if is_process and ev["ph"] == "B":
            out.append(thread)
    return json.dumps(out)        # ASCII: the odd characters travel as \u escapes, as in any JSON file


@pytest.fixture(scope="module")
def odd():
    """(report with its visuals, profile) from the planted trace, through the real parsers and rules."""
    mode = "starved"
    cap = capture_from_chrometrace(_odd_trace(mode), h200_pid(mode),
                                   source_remap={"/srv/train/": str(H200 / "src") + "/"})
    start = nvml(mode)["started_unix_us"] / 1e6
    cap.meta["launch_unix"] = start
    window = {"start_unix": start - 4.0, "seconds": 8.3}
    ctx = {"host": {"hostname": f"node{ODD}", "cpus": 16, "numa_nodes": 1, "kernel": "6.8.0"},
           "target": {"pid": h200_pid(mode), "cmdline": f"python3 workloads.py {CMD}"}, "window": window,
           "uses_cuda": True}
    ev = evidence_mod.build([cap], ctx)
    ev.context["cpus_available"] = 16
    ev.parsed["gpu"] = gpu_evidence(mode, window["start_unix"], window["start_unix"] + window["seconds"])
    findings, runs = report_mod.diagnose(ev)
    rep = report_mod.build(ev, "diagnose", window, {"agent_cpu_seconds": 0.4}, findings, runs, [])
    rep["notes"] = [f"note {ODD}"]
    rep["visuals"] = visuals.build(ev, [cap])
    prof = profiles.process_profile(profiles.stacks_of(cap), threads=True, subprocesses=True)
    return rep, prof


def _assert_visible(text: str) -> None:
    """Each odd character is shown, as a visible escape, where the name is drawn."""
    for name, c in FORBIDDEN.items():
        shown = f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"
        assert shown in text, f"{name} is not shown"


def _svgs(text: str) -> list[ET.Element]:
    parts = re.findall(r"<svg\b.*?</svg>", text, flags=re.S)
    return [ET.fromstring(p) for p in parts]


def test_the_planted_names_reach_the_profile(odd):
    """The test can fail: the odd names are in the data handed to every renderer."""
    rep, prof = odd
    stacks = "\n".join(prof)
    assert FN in stacks and THREAD in stacks and ODD in stacks
    assert ODD in rep["target"]["cmdline"]
    titles = [g.get("title", "") for g in rep["visuals"]["flamegraphs"]]
    assert any(THREAD in t for t in titles), titles


@pytest.mark.parametrize("diff", [False, True])
def test_the_standalone_flame_graph_is_well_formed_xml(odd, tmp_path, diff):
    _rep, prof = odd
    doc = {"profile": prof, "title": f"Flame graph of {ODD}", "subtitle": f"from {ODD}", "unit": profiles.UNIT,
           "before": ({k: v * (i % 3) for i, (k, v) in enumerate(prof.items())} if diff else None),
           "exporter": "test"}
    path = tmp_path / "fg.svg"
    output.save("profile", "svg", doc, str(path))
    text = path.read_text(encoding="utf-8")
    assert not ANY_FORBIDDEN.search(text)
    root = ET.parse(path).getroot()                        # the file as a browser's XML parser reads it
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    titles = "\n".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}title"))
    labels = "\n".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
    _assert_visible(titles)
    assert "Heavy.get\\x00\\x01" in titles and "\\x1b" in labels
    assert "loader\\x00" in titles and "\\u202e" in titles   # thread root; a bidi override shown, not obeyed


def test_the_html_report_and_its_svgs(odd, tmp_path):
    rep, _prof = odd
    path = tmp_path / "report.html"
    output.save("report", "html", rep, str(path))
    text = path.read_text(encoding="utf-8")
    assert not ANY_FORBIDDEN.search(text), "a forbidden character is in the HTML report"
    svgs = _svgs(text)
    assert len(svgs) >= 2                                  # the timeline and the flame graphs
    _assert_visible(text)
    assert "python3 workloads.py --tag \\x00\\x01" in text and "node\\x00" in text and "note \\x00" in text
    flame = "\n".join(t.text or "" for s in svgs for t in s.iter("{http://www.w3.org/2000/svg}title"))
    assert "Heavy.get\\x00" in flame


def test_the_flame_graph_page_and_the_other_profile_forms(odd, tmp_path):
    _rep, prof = odd
    doc = {"profile": prof, "title": f"t{ODD}", "subtitle": "", "unit": profiles.UNIT, "before": None,
           "exporter": "test"}
    output.save("profile", "html", doc, str(tmp_path / "fg.html"))
    text = (tmp_path / "fg.html").read_text(encoding="utf-8")
    assert not ANY_FORBIDDEN.search(text)
    svgs = _svgs(text)                  # the graph by function and by line (a control shows one)
    assert len(svgs) == 2
    for svg in svgs:
        _assert_visible("\n".join(t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}title")))
    # speedscope is JSON: every character escaped by the JSON writer, the names intact when read back.
    output.save("profile", "speedscope", doc, str(tmp_path / "fg.json"))
    raw = (tmp_path / "fg.json").read_bytes()
    assert raw.isascii()
    names = [f["name"] for f in json.loads(raw)["shared"]["frames"]]
    assert any(FN in n for n in names)


def test_the_job_html(tmp_path):
    row = {"node": f"n{ODD}", "pid": 10, "rank": 0, "local_rank": 0, "procid": 0, "data_share": 0.7,
           "collective_share": 0.0, "host_sync_share": 0.0, "cpu_share": None, "gpu_busy": None,
           "top_finding": f"dataloader.starved{ODD}", "top_title": f"waits {ODD}", "expected_speedup": 3.0}
    finding = {"id": f"dataloader.starved{ODD}", "expected_speedup": 3.0, "title": f"title {ODD}",
               "fixes": [{"title": f"fix {ODD}", "change": f"num_workers=8 {ODD}", "command": f"python t.py {CMD}"}]}
    payload = {"node": f"n{ODD}", "status": "ok", "reason": None, "exit_code": 0,
               "targets": [{"target": {"pid": 10, "ranks": []}, "status": "ok", "rows": [row],
                            "report": {"findings": [finding], "probes": [
                                {"name": "pyspy", "status": "skipped", "reason": f"why {ODD}"}]}}]}
    failed = {"node": f"m{ODD}", "status": "failed", "reason": f"broken {ODD}", "exit_code": 1, "targets": []}
    rep = merge(f"42{ODD}", [payload, failed], 10.0)
    output.save("job", "html", rep, str(tmp_path / "job.html"))
    text = (tmp_path / "job.html").read_text(encoding="utf-8")
    assert not ANY_FORBIDDEN.search(text)
    _assert_visible(text)
    assert "Slurm job 42\\x00" in text and "broken \\x00" in text


def test_xmlsafe_keeps_what_xml_allows():
    allowed = "tab\tnl\ncr\r \ud7ff \ue000 \ufffd \U00010000 \U0010ffff \U0001fffe é 中 <&>\"'"
    assert xmlsafe.text(allowed) == allowed
    assert xmlsafe.is_well_formed_text(xmlsafe.escape(ODD))
    assert xmlsafe.escape("a\x1bb<c>") == "a\\x1bb&lt;c&gt;"
    assert xmlsafe.escape(None) == "" and xmlsafe.escape(3) == "3"
    every = xmlsafe.escape("".join(map(chr, range(0x110000))))      # every code point, in one document
    root = ET.fromstring(f"<a b=\"{every}\">{every}</a>".encode("utf-8"))
    assert root.text.count("\ufffd") == 1 and "\\ud800" in root.text and "\\x1b" in root.get("b")


def test_a_forbidden_character_is_rejected_by_the_parser_used_here():
    """The check above is meaningful: the same parser refuses the raw characters."""
    for name, c in FORBIDDEN.items():
        if "surrogate" in name:
            with pytest.raises(UnicodeEncodeError):
                f"<a>{c}</a>".encode("utf-8")
            continue
        with pytest.raises(ET.ParseError):
            ET.fromstring(f"<a>{c}</a>")


def test_thread_frames_of_the_trace_are_lifted():
    traces = pystacks.read_chrometrace(json.loads(_odd_trace()))
    assert any(t.name == THREAD for t in traces)
