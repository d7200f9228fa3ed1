"""Each HTML view, as a person sees it: the diagnosis report, the job report and the flame-graph
page opened in a real headless Chromium at a desktop width and at a phone's (390x844, mobile): the
body never scrolls sideways, the headline is on screen, the flame graph is drawn with its controls
(search, reset zoom, frames by function or by line), a finding below the worth-acting limit reads
muted, and the per-thread CPU split and the waiting frames are drawn apart from compute.
Screenshots go to $TRAINPROBE_SCREENSHOTS when set (to look at them), else to a temporary folder.
"""
import io
import json
import os

import pytest

from trainprobe.agent import bundle, visuals
from trainprobe.agent.fleet.merge import merge
from trainprobe.reports import output
from scripts.browser import Chromium, chromium_binary
from tests.helpers import REPO, run_cli

pytestmark = pytest.mark.skipif(chromium_binary() is None,
                                reason="chromium is not installed (apt-get install chromium; the Makefile's APT_PKGS)")

STARVED = REPO / "tests/data/h200/live/bundles/starved.tar.gz"
SIZES = {"desktop": (1240, 900, False), "phone": (390, 844, True)}


@pytest.fixture(scope="module")
def browser():
    with Chromium(width=1240, height=900) as b:
        yield b


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    d = os.environ.get("TRAINPROBE_SCREENSHOTS") or str(tmp_path_factory.mktemp("shots"))
    os.makedirs(d, exist_ok=True)
    return d


def _size(b, name):
    w, h, mobile = SIZES[name]
    b.call("Emulation.setDeviceMetricsOverride", {"width": w, "height": h, "deviceScaleFactor": 1, "mobile": mobile})


def _open(b, path, size):
    _size(b, size)
    b.log.console.clear(), b.log.exceptions.clear(), b.log.log_entries.clear(), b.log.requests.clear()
    b.open(str(path))
    assert b.log.errors() == []
    assert b.log.requests == ["file://" + os.path.abspath(str(path))], b.log.requests


def _no_sideways_scroll(b):
    sw, iw = b.eval("[document.documentElement.scrollWidth, window.innerWidth]")
    assert sw <= iw, f"the page is {sw} px wide in a {iw} px viewport"
    wide = b.eval("[].slice.call(document.querySelectorAll('body *')).filter(function(e){"
                  "var r=e.getBoundingClientRect(); return r.width > 0 && r.right > window.innerWidth + 1 &&"
                  " !e.closest('[hidden]') && !e.closest('.flame-wrap');}).slice(0,5).map(function(e){return e.tagName+'.'+e.className;})")
    assert wide == [], f"elements past the right edge: {wide}"


def _flame_wraps_scroll_inside(b):
    """On a narrow screen a flame graph keeps a readable size and scrolls inside its own box."""
    boxes = b.eval("[].slice.call(document.querySelectorAll('.flame-wrap:not([hidden])')).map(function(w){"
                   "var r=w.getBoundingClientRect(); return [r.right, getComputedStyle(w).overflowX,"
                   " w.scrollWidth, w.clientWidth];})")
    vw = b.eval("window.innerWidth")
    for right, overflow, sw, cw in boxes:
        assert right <= vw + 1 and (sw <= cw or overflow in ("auto", "scroll"))
    return boxes


def _on_screen(b, selector):
    r = b.eval(f"(function(){{var e=document.querySelector({json.dumps(selector)}); if(!e) return null;"
               "var r=e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom, r.width, r.height];})()")
    assert r is not None, f"no {selector}"
    left, top, right, bottom, w, h = r
    vw, vh = b.eval("[window.innerWidth, window.innerHeight]")
    assert w > 0 and h > 0 and left >= 0 and right <= vw + 1 and top >= 0 and top < vh, (selector, r, vw, vh)


@pytest.fixture(scope="module")
def report_html(tmp_path_factory):
    d = tmp_path_factory.mktemp("views")
    path = d / "starved.html"
    r = run_cli("report", str(STARVED), "--html", str(path))
    assert r.rc == 0, r.err
    return path


@pytest.mark.parametrize("size", SIZES)
def test_report_at_each_width(browser, report_html, shots, size):
    b = browser
    _open(b, report_html, size)
    _no_sideways_scroll(b)
    assert _flame_wraps_scroll_inside(b)
    _on_screen(b, ".headline")
    assert b.eval("document.querySelector('.headline').textContent").startswith(("Top fix", "Plan"))
    # The flame graphs: drawn, with frames, and the grouping control switches between two drawings.
    n = b.eval("document.querySelectorAll('.flame-wrap:not([hidden]) svg.tp-flame g.f').length")
    assert n > 5
    assert b.eval("document.querySelectorAll('#flamegraphs select.group').length") >= 1
    img = b.screenshot(os.path.join(shots, f"report-{size}.png"))
    assert img.width == SIZES[size][0]
    assert b.eval("document.querySelectorAll('.probe-cost').length") >= 1
    assert "{&quot;" not in b.dom() and '{"proc_reads' not in b.eval("document.body.innerText")
    b.screenshot(os.path.join(shots, f"report-{size}-full.png"), full_page=True)


def test_grouping_control_switches_between_function_and_line(browser, report_html):
    b = browser
    _open(b, report_html, "desktop")
    labels = ("[].slice.call(document.querySelectorAll('#flamegraphs .flame-block')[0]"
              ".querySelectorAll('.flame-wrap:not([hidden]) g.f title')).map(function(t){"
              "return t.textContent.split('\\n')[0];})")
    by_function = b.eval(labels)
    assert by_function and not any(l.endswith(":801)") for l in by_function)
    b.eval("(function(){var s=document.querySelector('#flamegraphs select.group'); s.value='line';"
           "s.dispatchEvent(new Event('change'));})()")
    by_line = b.eval(labels)
    assert any(l.endswith(":801)") for l in by_line), by_line[:5]
    assert len(set(by_line)) > len(set(by_function))


def test_flamegraph_page_shows_thread_split_and_waits(browser, tmp_path, shots):
    """A profile whose loop waits on its workers: the waiting frames are blue, and the bars split
    each thread's time as the kernel measured it (here given, as the flamegraph command passes it)."""
    prof = {"MainThread;train (t.py:9);__next__ (torch/utils/data/dataloader.py:3);Queue.get (queues.py:3);"
            "Condition.wait (threading.py:2)": 700_000,
            "MainThread;train (t.py:9);step (t.py:4)": 200_000, "MainThread;train (t.py:10);step (t.py:5)": 100_000}
    from trainprobe.agent.flame_split import waiting_part
    doc = {"profile": prof, "title": "loop waiting on workers", "subtitle": "", "unit": "us", "before": None,
           "exporter": "t", "group": "function", "waiting": waiting_part(prof),
           "threads": [{"name": "MainThread (PID 1, TID 1)", "wall_s": 1.0, "on_cpu_s": 0.2, "runqueue_s": 0.1,
                        "off_cpu_s": 0.7}]}
    for size in SIZES:
        path = tmp_path / f"flame-{size}.html"
        output.save("profile", "html", doc, str(path))
        _open(browser, path, size)
        _no_sideways_scroll(browser)
        _flame_wraps_scroll_inside(browser)
        assert browser.eval("document.querySelectorAll('.flame-wrap:not([hidden]) g.f[data-wait]').length") >= 2
        bars = browser.eval("[].slice.call(document.querySelectorAll('.flame-wrap:not([hidden]) .tp-thread rect'))"
                            ".map(function(r){return [r.getAttribute('class'), r.getBoundingClientRect().width];})")
        kinds = dict(bars)
        assert set(kinds) == {"tp-on-cpu", "tp-runqueue", "tp-off-cpu"}
        assert kinds["tp-off-cpu"] > kinds["tp-on-cpu"] > kinds["tp-runqueue"] > 0
        browser.screenshot(os.path.join(shots, f"flamegraph-{size}.png"))


def test_a_small_finding_reads_muted_in_the_browser(browser, tmp_path, shots):
    from trainprobe.agent.ranking import headline
    rep = json.loads((REPO / "tests/data/h200/live/starved.json").read_text())
    f = rep["findings"][0]
    f["expected_speedup"], f["expected_speedup_interval"] = 1.08, [1.02, 1.12]
    rep["findings"], rep["headline"] = [f], headline([f])
    path = tmp_path / "small.html"
    output.save("report", "html", dict(rep, visuals={}), str(path))
    _open(browser, path, "phone")
    _no_sideways_scroll(browser)
    colour, weight = browser.eval("(function(){var s=getComputedStyle(document.querySelector('.speedup'));"
                                  "return [s.color, s.fontWeight];})()")
    assert colour == "rgb(95, 99, 104)" and int(weight) < 700          # the muted grey, not bold red
    assert "not worth acting on" in browser.eval("document.querySelector('.speedup').textContent")
    browser.screenshot(os.path.join(shots, "small-finding-phone.png"))


def test_job_report_at_a_phone_width(browser, tmp_path, shots):
    row = {"node": "n1", "pid": 10, "rank": 0, "local_rank": 0, "procid": 0, "data_share": 0.7,
           "collective_share": 0.1, "host_sync_share": 0.0, "cpu_share": None, "gpu_busy": 0.3,
           "top_finding": "dataloader.starved", "top_title": "starved", "expected_speedup": 3.0}
    job = merge("42", [{"node": "n1", "status": "ok", "reason": None, "exit_code": 0,
                        "targets": [{"target": {"pid": 10, "ranks": []}, "status": "ok", "rows": [row],
                                     "report": {"findings": [], "probes": []}}]}], 10.0, nodes=["n1"])
    path = tmp_path / "job.html"
    output.save("job", "html", job, str(path))
    _open(browser, path, "phone")
    _no_sideways_scroll(browser)
    _on_screen(browser, "h1")
    browser.screenshot(os.path.join(shots, "job-phone.png"))
