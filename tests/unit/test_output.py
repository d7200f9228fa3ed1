"""reports/output.py: every output form has one renderer with one signature, the commands' options
name forms that exist, every view writes a value the same way, and files are written whole."""
import inspect
import io
import json
import stat

import pytest

from trainprobe.agent.fleet.merge import merge
from trainprobe.reports import output
from trainprobe.reports.output import FORMS, fmt_value
from tests.helpers import DATA, H200

STARVED = json.loads((H200 / "live" / "starved.json").read_text())
HEALTHY = json.loads((H200 / "live" / "healthy.json").read_text())
PREFLIGHT = json.loads((DATA / "preflight" / "gpu" / "h200-report.json").read_text())
PROFILE = {"MainThread;train (t.py:9);next (loader.py:3)": 700, "MainThread;train (t.py:9);step (t.py:4)": 300}


def _job() -> dict:
    row = {"node": "n1", "pid": 10, "rank": None, "local_rank": 0, "procid": 0, "data_share": 0.7,
           "collective_share": 0.0, "host_sync_share": 0.0, "cpu_share": None, "gpu_busy": None,
           "top_finding": "dataloader.starved", "top_title": "starved", "expected_speedup": 3.0}
    return merge("42", [{"node": "n1", "status": "ok", "reason": None, "exit_code": 0,
                         "targets": [{"target": {"pid": 10, "ranks": []}, "status": "ok", "rows": [row],
                                      "report": {"findings": [], "probes": []}}]}], 10.0, nodes=["n1"])


def _profile(before=None) -> output.ProfileDoc:
    return {"profile": PROFILE, "title": "t", "subtitle": "s", "unit": "us", "before": before,
            "exporter": "trainprobe@test"}


WATCH = {"jobs": [{"root": 10, "job": "", "trainers": [{"pid": 10, "loop_wait_share": 0.5}], "gpus": {0: 0.2},
                   "condition": True, "condition_held_s": 3.0, "diagnoses": 0, "last_diagnosis_unix": None,
                   "last_finding": None, "last_expected_speedup": None}],
         "gpus": {0: 0.2}, "samples": 4, "agent_cpu_seconds": 0.1, "trigger": "gpu-busy<0.5"}
DOCS = {"report": dict(STARVED, visuals={}), "job": _job(), "preflight": PREFLIGHT, "profile": _profile(),
        "watch": WATCH, "demo": {"report": STARVED, "predicted_speedup": 6.95, "measured_speedup": 6.1}}
# What each command's options select (agent/commands/*): these forms must exist.
USED = {("report", f) for f in ("text", "json", "html")} | {("job", f) for f in ("text", "json", "html")} \
    | {("preflight", f) for f in ("text", "text-verbose", "json", "prometheus")} \
    | {("profile", f) for f in ("svg", "html", "speedscope", "folded")} | {("watch", "prometheus"), ("demo", "json")}


def test_every_form_the_commands_use_is_declared_and_nothing_else():
    assert set(FORMS) == USED


@pytest.mark.parametrize("key", sorted(FORMS), ids=lambda k: "-".join(k))
def test_each_renderer_has_the_one_signature_and_draws_a_real_document(key):
    form = FORMS[key]
    params = list(inspect.signature(form.render).parameters.values())
    assert len(params) == 2 and all(p.default is p.empty for p in params), f"{key}: render(doc, stream)"
    buf = io.StringIO()
    output.emit(*key, DOCS[key[0]], buf)
    assert buf.getvalue().strip()


def test_flamegraph_formats_and_extensions_come_from_the_forms():
    from trainprobe.agent.commands.flamegraph import FORMATS
    assert FORMATS == ("svg", "html", "speedscope", "folded")
    cases = {"a.svg": "svg", "a.HTML": "html", "a.htm": "html", "a.json": "speedscope", "a.folded": "folded",
             "a.collapsed": "folded", "a.txt": "folded", "a.png": "svg", None: "svg"}
    for path, want in cases.items():
        assert output.format_for("profile", None, path, default="svg") == want, path
    assert output.format_for("profile", "folded", "a.svg", default="svg") == "folded"


def test_an_unknown_form_names_the_ones_there_are():
    with pytest.raises(ValueError, match="there is: svg, html, speedscope, folded"):
        output.form("profile", "png")


def test_save_writes_the_form_whole_with_its_mode(tmp_path):
    for key, mode in ((("report", "html"), 0o600), (("preflight", "prometheus"), 0o644)):
        path = tmp_path / f"out.{key[1]}"
        output.save(*key, DOCS[key[0]], str(path))
        buf = io.StringIO()
        output.emit(*key, DOCS[key[0]], buf)
        assert path.read_text() == buf.getvalue()
        assert stat.S_IMODE(path.stat().st_mode) == mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.html", "out.prometheus"]


def test_folded_form_draws_the_difference_when_given_a_before():
    buf = io.StringIO()
    output.emit("profile", "folded", _profile(before={"MainThread;train (t.py:9);step (t.py:4)": 900}), buf)
    assert "MainThread;train (t.py:9);step (t.py:4) 900 300\n" in buf.getvalue()


def test_fmt_value():
    assert (fmt_value(True), fmt_value(False), fmt_value(None)) == ("yes", "no", "-")
    assert (fmt_value(0.4567), fmt_value(12.345), fmt_value(4321.0), fmt_value(0.0)) == ("0.46", "12.3", "4,321", "0")
    assert (fmt_value(7), fmt_value("x"), fmt_value([1, "a"])) == ("7", "x", "1, a")
    assert fmt_value({"proc_reads": 28, "samples": 8, "mean": 1.41147}) == "proc_reads 28, samples 8, mean 1.41"
    assert (fmt_value(0.42, "%"), fmt_value(2.0, "x"), fmt_value(0.0125, "s"), fmt_value(3.2, "s")) == \
        ("42%", "2.00x", "12.5 ms", "3.20 s")
    assert (fmt_value(None, "%"), fmt_value(None, "x"), fmt_value(True, "%")) == ("-", "-", "yes")


def test_text_and_html_write_a_flag_the_same_way():
    """healthy.json's evidence holds a flag (the GPU's clocks held back by its power cap)."""
    text, page = io.StringIO(), io.StringIO()
    output.emit("report", "text", HEALTHY, text)
    output.emit("report", "html", HEALTHY, page)
    assert "sw_power_cap: yes" in text.getvalue() and "sw_power_cap: True" not in text.getvalue()
    assert '<td class="num">yes</td>' in page.getvalue()


def test_job_views_write_a_missing_rank_the_same_way():
    text = io.StringIO()
    output.emit("job", "text", DOCS["job"], text)
    page = io.StringIO()
    output.emit("job", "html", DOCS["job"], page)
    assert "n1" in text.getvalue() and "   -       10" in text.getvalue()
    assert "<td class=l>n1</td><td>-</td><td>10</td>" in page.getvalue()
