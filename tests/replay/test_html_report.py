"""The HTML report's document structure, without a browser: escaping, self-containment, and the
honest "missing: why" paths."""
import io
import re

from trainprobe.agent import evidence as evidence_mod
from trainprobe.agent import report as report_mod
from trainprobe.agent import visuals
from trainprobe.probes.base import Capture
from trainprobe.reports import html
from tests.report_fixtures import h200_report


def page(rep, vis):
    buf = io.StringIO()
    html.render(rep, buf, vis)
    return buf.getvalue()


def test_everything_from_the_job_is_escaped():
    rep, vis, _ev, _caps = h200_report("starved")
    rep["findings"][0]["title"] = 'loop waits <script>alert("x")</script> & more'
    rep["target"]["cmdline"] = "python train.py --tag '<b>'"
    rep["notes"] = ["</section><img src=x>"]
    text = page(rep, vis)
    assert "<script>alert" not in text and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; more" in text
    assert "<img src=x>" not in text and "--tag &#x27;&lt;b&gt;&#x27;" in text


def test_the_page_loads_nothing_from_outside():
    rep, vis, _ev, _caps = h200_report("fixed")
    text = page(rep, vis)
    assert text.count("<script>") == 1 and "<script src" not in text and "<link" not in text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert "@import" not in text and "url(" not in text
    for m in re.finditer(r"https?://[^\s\"'<>]+", text):
        assert m.group(0) == "http://www.w3.org/2000/svg", m.group(0)


def test_no_py_spy_and_no_gpu_say_why():
    skipped = Capture("pyspy", status="skipped", reason="py-spy not found: `pip install py-spy`")
    ctx = {"window": {"start_unix": 1.7e9, "seconds": 5.0}, "host": {"hostname": "h", "cpus": 2}, "target": {"pid": 42}}
    ev = evidence_mod.build([skipped], ctx)
    findings, runs = report_mod.diagnose(ev)
    rep = report_mod.build(ev, "diagnose", ctx["window"], {}, findings, runs, [])
    text = page(rep, visuals.build(ev, [skipped]))
    assert "no GPU evidence: gpu: not run" in text
    assert "no training-thread timeline: pyspy: skipped (py-spy not found: `pip install py-spy`)" in text
    assert "no py-spy stacks: pyspy: skipped (py-spy not found: `pip install py-spy`)" in text
    assert "No finding: the evidence gathered does not point at a host-side cause." in text
    assert '<td class="st-skipped">skipped</td><td>py-spy not found: `pip install py-spy`</td>' in text
    assert "<script>" not in text               # no graph, no script


def test_findings_are_in_rank_order_with_evidence_and_fixes():
    rep, vis, _ev, _caps = h200_report("starved")
    text = page(rep, vis)
    ids = re.findall(r'<article class="finding" id="finding-(\d+)" data-id="([^"]+)"', text)
    assert [fid for _n, fid in ids] == [f["id"] for f in rep["findings"]]
    top = rep["findings"][0]
    for e in top["evidence"]:
        assert html.esc(e["fact"]) in text
    for fx in top["fixes"]:
        assert html.esc(fx["change"]) in text
    assert html.esc(top["speedup_bound"]) in text
    assert f"{top['expected_speedup']:.2f}x expected speedup" in text
