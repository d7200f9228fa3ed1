"""The SVG flame graph and the HTML report, opened in a real headless Chromium.

Each page must render (non-blank pixels in a screenshot), carry what it should in its DOM (the top
finding's title, the GPU chart or the reason it is missing), answer to a real mouse (hover, click
to zoom) and to search, log no console error, and fetch nothing but itself (offline, no CDN).
Screenshots go to $TRAINPROBE_SCREENSHOTS when set (to look at them), else to a temporary folder.
"""
import os
import re

import pytest

from trainprobe.agent import profiles
from trainprobe.reports import flamegraph, folded, html
from scripts.browser import Chromium, chromium_binary
from tests.helpers import h200_pyspy_capture
from tests.report_fixtures import h200_report

pytestmark = pytest.mark.skipif(chromium_binary() is None,
                                reason="chromium is not installed (apt-get install chromium; the Makefile's APT_PKGS)")

BG = (247, 247, 242)        # the flame graph's background
WHITE = (255, 255, 255)


@pytest.fixture(scope="module")
def browser():
    with Chromium(width=1240, height=900) as b:
        yield b


@pytest.fixture
def shots(tmp_path):
    d = os.environ.get("TRAINPROBE_SCREENSHOTS") or str(tmp_path)
    os.makedirs(d, exist_ok=True)
    return d


def open_clean(b, path):
    b.log.console.clear(), b.log.exceptions.clear(), b.log.log_entries.clear(), b.log.requests.clear()
    b.open(str(path))


def assert_quiet_and_offline(b, path):
    assert b.log.errors() == []
    assert b.log.requests == ["file://" + os.path.abspath(str(path))], b.log.requests


def centre(b, selector_js):
    r = b.eval(f"(function(){{var e={selector_js}; var r=e.getBoundingClientRect();"
               "return [r.left + r.width / 2, r.top + r.height / 2, r.width];})()")
    assert r[2] > 4, "element too small to point at"
    return r[0], r[1]


def test_svg_renders_hovers_zooms_and_searches(browser, tmp_path, shots):
    prof = profiles.process_profile(profiles.stacks_of(h200_pyspy_capture("starved")), threads=True)
    path = tmp_path / "starved.svg"
    path.write_text(flamegraph.render(prof, title="starved: main process").svg)
    b = browser
    open_clean(b, path)
    img = b.screenshot(os.path.join(shots, "flamegraph.png"))
    assert img.count_unlike(BG, step=3) > 0.05 * (img.width // 3) * (img.height // 3)   # frames were painted
    assert len(img.colours()) > 20
    assert b.eval("document.querySelector('.tp-title').textContent") == "starved: main process"
    total = folded.total(prof)
    assert b.eval("+document.documentElement.getAttribute('data-total')") == total
    assert_quiet_and_offline(b, path)

    heavy = "Array.from(document.querySelectorAll('g.f')).find(g => g.querySelector('title').textContent.startsWith('Heavy.__getitem__ (workloads.py:10)')).querySelector('rect')"
    # hover: the details line names the frame and its share
    x, y = centre(b, heavy)
    b.mouse("mouseMoved", x, y)
    details = b.eval("document.querySelector('.tp-details').textContent")
    assert details.startswith("Heavy.__getitem__ (workloads.py:10)") and re.search(r"\d+\.\d% of the total", details)
    # click: the frame fills the width, frames outside it are hidden, its ancestors stay
    b.click(x, y)
    inner = flamegraph.WIDTH - 2 * flamegraph.PAD
    assert float(b.eval(f"{heavy}.getAttribute('width')")) == pytest.approx(inner, abs=0.05)
    hidden = b.eval("Array.from(document.querySelectorAll('g.f')).filter(g => g.style.display === 'none').length")
    assert hidden > 0
    assert b.eval("document.querySelectorAll('g.f.tp-parent').length") >= 3
    b.screenshot(os.path.join(shots, "flamegraph-zoomed.png"))
    x2, y2 = centre(b, "document.querySelector('.tp-unzoom')")
    b.click(x2, y2)
    assert b.eval("Array.from(document.querySelectorAll('g.f')).filter(g => g.style.display === 'none').length") == 0
    heavy_count = sum(v for k, v in prof.items() if k.endswith("Heavy.__getitem__ (workloads.py:10)"))
    assert 0 < heavy_count < total
    assert float(b.eval(f"{heavy}.getAttribute('width')")) == pytest.approx(heavy_count * inner / total, abs=0.05)
    # search: the share matched is the share of time in stacks through a matching frame
    res = b.eval("trainprobeFlame.init(document.documentElement).search('Heavy')")
    expect = sum(v for k, v in prof.items() if "Heavy." in k) / total
    assert res["share"] == pytest.approx(expect, abs=1e-9)
    assert b.eval("document.querySelector('.tp-matched').textContent") == f"Matched: {100 * expect:.1f}% ({res['frames']} frames)"
    assert b.eval("document.querySelectorAll('g.f.tp-hit').length") == res["frames"] >= 2
    assert b.eval(f"{heavy}.getAttribute('fill')") == "rgb(230,0,230)"
    b.screenshot(os.path.join(shots, "flamegraph-search.png"))
    b.eval("trainprobeFlame.init(document.documentElement).search(null)")
    assert b.eval("document.querySelectorAll('g.f.tp-hit').length") == 0
    assert b.log.errors() == []


def test_html_report_with_gpu_timeline_renders(browser, tmp_path, shots):
    rep, vis, _ev, _caps = h200_report("starved")
    path = tmp_path / "report.html"
    with open(path, "w") as fh:
        html.render(rep, fh, vis)
    b = browser
    open_clean(b, path)
    img = b.screenshot(os.path.join(shots, "report-starved.png"), full_page=True)
    assert img.count_unlike(WHITE, step=4) > 0.04 * (img.width // 4) * (img.height // 4)
    top = rep["findings"][0]
    assert top["id"] == "dataloader.starved"
    dom = b.dom()
    assert html.esc(top["title"]) in dom
    assert b.eval("document.querySelector('#finding-1 .ftitle').textContent") == top["title"]
    assert b.eval("document.querySelector('#finding-1 .fid').textContent") == "dataloader.starved"
    # the GPU chart: one utilization line, the idle windows shaded, the training thread's band under it
    assert b.eval("document.querySelectorAll('.gpu-chart polyline.gpu-util').length") == 1
    idle = vis["gpu"]["idle_intervals"]
    assert idle and b.eval("document.querySelectorAll('.gpu-chart rect.idle').length") == len(idle)
    segs = b.eval("Array.from(document.querySelectorAll('.train-band rect.seg')).map(r => r.getAttribute('data-cat'))")
    assert len(segs) == len(vis["timeline"]["training"]) and segs.count("data_load") > len(segs) / 3
    band_top = b.eval("document.querySelector('.train-band rect.seg').getBoundingClientRect().top")
    chart_bottom = b.eval("document.querySelector('.gpu-chart rect').getBoundingClientRect().bottom")
    assert band_top >= chart_bottom                       # the band sits under the GPU chart
    assert "no GPU evidence" not in dom
    # the training thread's flame graph, and why there is no workers' graph
    assert b.eval("document.querySelectorAll('#flamegraphs .flame-wrap:not([hidden]) svg.tp-flame').length") == 1
    assert "no DataLoader worker was seen" in dom
    # the manifest
    assert b.eval("document.querySelector('#probes td code').textContent") == "pyspy"
    # the search box drives the graph
    b.eval("(function(){var i=document.querySelector('.tools input'); i.value='getitem';"
           "i.dispatchEvent(new Event('input'));})()")
    assert b.eval("document.querySelector('.tools .found').textContent").startswith("matched ")
    assert b.eval("document.querySelectorAll('#flamegraphs g.f.tp-hit').length") > 0
    assert_quiet_and_offline(b, path)


def test_html_report_without_gpu_says_why_and_draws_the_workers(browser, tmp_path, shots):
    rep, vis, _ev, _caps = h200_report("fixed", with_gpu=False)
    path = tmp_path / "report-fixed.html"
    with open(path, "w") as fh:
        html.render(rep, fh, vis)
    b = browser
    open_clean(b, path)
    img = b.screenshot(os.path.join(shots, "report-fixed-nogpu.png"), full_page=True)
    assert img.count_unlike(WHITE, step=4) > 0.04 * (img.width // 4) * (img.height // 4)
    assert b.eval("document.querySelector('#no-gpu').textContent") == "no GPU evidence: gpu: not run"
    assert b.eval("document.querySelectorAll('.gpu-chart').length") == 0
    assert b.eval("document.querySelectorAll('.train-band rect.seg').length") > 10
    assert b.eval("document.querySelectorAll('#flamegraphs .flame-wrap:not([hidden]) svg.tp-flame').length") == 2
    titles = b.eval("Array.from(document.querySelectorAll('#flamegraphs h3')).map(h => h.textContent)")
    assert titles[0].startswith("Training thread") and titles[1] == "DataLoader workers (12 processes)"
    assert b.eval("document.querySelector('#finding-1 .ftitle').textContent") == rep["findings"][0]["title"]
    # zoom in the second graph with a real click; the first graph is untouched
    sel = ("Array.from(document.querySelectorAll('#flamegraphs .flame-wrap:not([hidden]) svg.tp-flame')[1].querySelectorAll('g.f'))"
           ".find(g => g.querySelector('title').textContent.startsWith('_worker_loop')).querySelector('rect')")
    b.eval(f"{sel}.scrollIntoView({{block: 'center'}})")
    x, y = centre(b, sel)
    b.click(x, y)
    assert float(b.eval(f"{sel}.getAttribute('width')")) == pytest.approx(flamegraph.WIDTH - 2 * flamegraph.PAD, abs=0.05)
    assert b.eval("document.querySelectorAll('#flamegraphs .flame-wrap:not([hidden]) svg.tp-flame')[0].querySelectorAll('g.tp-parent').length") == 0
    assert_quiet_and_offline(b, path)


def test_flamegraph_html_page_renders(browser, tmp_path, shots):
    before = profiles.training_profile(profiles.stacks_of(h200_pyspy_capture("starved")))
    after = profiles.training_profile(profiles.stacks_of(h200_pyspy_capture("fixed")))
    path = tmp_path / "diff.html"
    with open(path, "w") as fh:
        html.render_flamegraph_page(after, fh, "Training thread after the fix", "before: num_workers=0", before=before)
    b = browser
    open_clean(b, path)
    img = b.screenshot(os.path.join(shots, "flamegraph-diff.png"))
    assert img.count_unlike(WHITE, step=4) > 0.03 * (img.width // 4) * (img.height // 4)
    fills = b.eval("Array.from(document.querySelectorAll('g.f')).map(g => [+g.getAttribute('data-delta'), "
                   "g.querySelector('rect').getAttribute('fill')])")
    reds = [f for d, f in fills if d > 0]
    blues = [f for d, f in fills if d < 0]
    assert reds and blues
    assert all(f.startswith("rgb(255,") for f in reds) and all(f.endswith(",255)") for f in blues)
    assert_quiet_and_offline(b, path)
