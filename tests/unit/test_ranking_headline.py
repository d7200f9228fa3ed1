"""Ranking by gain and confidence, the headline, and the interval in every view of the report."""
import json

from trainprobe.agent.findings import Finding
from trainprobe.agent.ranking import headline, rank
from tests.helpers import DATA, run_cli

BUNDLE = DATA / "ledger" / "bundles" / "gil-spinner.tar.gz"


def f(fid, speedup, conf, interval=None):
    return Finding(fid, f"{fid} title", speedup, "test", conf, interval=interval)


def test_a_sure_finding_outranks_a_slightly_larger_unsure_one():
    ranked = rank([f("io.small_reads", 1.6, "low"), f("dataloader.starved", 1.5, "high")])
    assert [x.id for x in ranked] == ["dataloader.starved", "io.small_reads"]


def test_a_much_larger_gain_still_wins_over_confidence():
    ranked = rank([f("dataloader.starved", 1.3, "high"), f("gil.contention", 3.0, "low")])
    assert ranked[0].id == "gil.contention"


def test_headline_says_plainly_when_no_fix_is_worth_ten_percent():
    line = headline([x.to_dict() for x in rank([f("host.sync", 1.06, "medium", (1.02, 1.09))])])
    assert line.startswith("No fix here is expected to speed the job up by even 1.1x")
    assert "host.sync" in line and "1.02-1.09x" in line


def test_headline_names_the_top_fix_with_its_interval():
    line = headline([x.to_dict() for x in rank([f("dataloader.starved", 2.4, "high", (1.9, 3.1))])])
    assert "dataloader.starved" in line and "2.40x" in line and "1.90-3.10x" in line


def test_interval_always_holds_the_estimate():
    x = f("gil.contention", 2.0, "medium", (2.5, 3.0))
    assert x.interval[0] <= x.expected_speedup <= x.interval[1]
    assert f("compute.bound", 1.0, "high").interval == (1.0, 1.0)


def test_interval_and_headline_in_json_text_and_html(tmp_path):
    r = run_cli("report", str(BUNDLE), "--json")
    assert r.rc == 0, r.err
    rep = r.json()
    top = rep["findings"][0]
    lo, hi = top["expected_speedup_interval"]
    assert rep["headline"].startswith("Top fix: " + top["id"])
    text = run_cli("report", str(BUNDLE))
    assert text.rc == 0, text.err
    assert f"({lo:.2f}-{hi:.2f}x)" in text.out and rep["headline"][:40] in text.out
    html = tmp_path / "r.html"
    h = run_cli("report", str(BUNDLE), "--html", str(html))
    assert h.rc == 0, h.err
    page = html.read_text()
    assert f"likely {lo:.2f}-{hi:.2f}x" in page and 'class="headline"' in page
    assert json.loads(json.dumps(rep))["findings"][0]["fixes"][0]["knobs"] == {"background_thread_holds_gil": False}


def test_a_fix_sure_to_slow_the_job_keeps_the_floor_and_says_by_how_much():
    # Lightning's ImageNet template on 2 CPUs: a thread cap priced 0.70x (0.62-0.79x), measured 0.62x.
    from trainprobe.reports.html import _findings
    from trainprobe.reports.text import Style, render_findings
    sure = f("cpu.oversubscribed", 0.70, "low", (0.62, 0.79))
    assert sure.expected_speedup == 1.0 and sure.interval == (0.62, 1.0)
    assert sure.expected_change == 0.7 and sure.expected_change_interval == (0.62, 0.79)
    d = sure.to_dict()
    assert d["expected_change"] == 0.7 and d["expected_change_interval"] == [0.62, 0.79]
    assert Finding.from_dict(d).expected_change == 0.7
    line = headline([d])
    assert line == "No fix here is expected to speed the job up: cpu.oversubscribed's fix would slow the job: about 0.70x (0.62-0.79x)."
    assert any("would slow the job: about 0.70x" in x for x in render_findings([d], Style(False)))
    assert any("would slow the job: about 0.70x" in x for x in _findings({"findings": [d]}))
    # an interval that reaches a gain: the floor alone, no figure below it
    unsure = f("dataloader.starved", 0.75, "low", (0.37, 1.22))
    assert unsure.expected_change is None and "expected_change" not in unsure.to_dict()
    assert "would slow" not in headline([unsure.to_dict()])
