"""Golden structure of the flame graphs, drawn from real py-spy stacks (tests/data/h200)."""
import collections
import json
import random
import re
import xml.etree.ElementTree as ET

import pytest

from trainprobe.agent import profiles
from trainprobe.probes.parsers import pystacks
from trainprobe.reports import flamegraph, folded
from tests.helpers import H200_MODES, h200_pyspy_capture

SVG = "{http://www.w3.org/2000/svg}"


def real_profile(mode, **kw):
    return profiles.process_profile(profiles.stacks_of(h200_pyspy_capture(mode)), **kw)


def frames_of(svg_text):
    """[(depth, x, n, label, rect x, rect width, fill, delta or None)] from the SVG itself."""
    root = ET.fromstring(svg_text.split("?>", 1)[1] if svg_text.startswith("<?xml") else svg_text)
    out = []
    rects = []
    for g in root.iter(f"{SVG}g"):
        if g.get("class") != "f":
            continue
        r = g.find(f"{SVG}rect")
        title = g.find(f"{SVG}title").text
        rects.append((float(r.get("y")), g, r, title))
    ys = sorted({y for y, *_ in rects}, reverse=True)       # root at the bottom: largest y is depth 0
    depth_of = {y: i for i, y in enumerate(ys)}
    for y, g, r, title in rects:
        d = g.get("data-delta")
        out.append((depth_of[y], int(g.get("data-x")), int(g.get("data-n")), title.rsplit("\n", 1)[0],
                    float(r.get("x")), float(r.get("width")), r.get("fill"), float(d) if d is not None else None))
    return root, out


def paths(frames):
    """Each frame's path (root first), found from geometry alone: a frame's parent is the frame one
    level down whose span contains it."""
    by_depth = collections.defaultdict(list)
    for f in frames:
        by_depth[f[0]].append(f)
    out = {}
    for d in sorted(by_depth):
        for f in by_depth[d]:
            if d == 0:
                out[id(f)] = (f, ())
                continue
            parent = next(p for p in by_depth[d - 1] if p[1] <= f[1] and f[1] + f[2] <= p[1] + p[2])
            out[id(f)] = (f, out[id(parent)][1] + (f[3],))
    return [v for v in out.values()]


def inclusive(profile, path):
    key = ";".join(path)
    if not path:
        return sum(profile.values())
    return sum(v for k, v in profile.items() if k == key or k.startswith(key + ";"))


@pytest.mark.parametrize("mode", H200_MODES)
def test_widths_sum_to_the_total_on_real_stacks(mode):
    prof = real_profile(mode, threads=True, subprocesses=True)
    total = folded.total(prof)
    r = flamegraph.render(prof, title=mode, minwidth_px=0)
    _root, frames = frames_of(r.svg)
    assert r.total == total and r.pruned == 0
    roots = [f for f in frames if f[0] == 0]
    assert len(roots) == 1 and roots[0][3] == "all" and roots[0][2] == total
    inner = flamegraph.WIDTH - 2 * flamegraph.PAD
    assert roots[0][5] == pytest.approx(inner, abs=0.01)
    # Every frame: its width is its inclusive count, and its children share at most its width;
    # what is left is exactly the time spent in the frame itself.
    for f, path in paths(frames):
        assert f[2] == inclusive(prof, path), path
        kids = [c for c in frames if c[0] == f[0] + 1 and f[1] <= c[1] < f[1] + f[2]]
        self_count = prof.get(";".join(path), 0) if path else prof.get("", 0)
        assert sum(c[2] for c in kids) + self_count == f[2], path
        assert sum(c[5] for c in kids) <= f[5] + 0.01 * (len(kids) + 1)
        assert f[5] == pytest.approx(f[2] * inner / total, abs=0.006)
    # Frames at one depth never overlap.
    for d in {f[0] for f in frames}:
        row = sorted((f[1], f[1] + f[2]) for f in frames if f[0] == d)
        assert all(a[1] <= b[0] for a, b in zip(row, row[1:]))


def test_python_frames_read_function_file_and_line():
    prof = real_profile("starved")
    _root, frames = frames_of(flamegraph.render(prof).svg)
    labels = {f[3] for f in frames}
    assert "Heavy.__getitem__ (workloads.py:10)" in labels
    assert any(re.fullmatch(r"_MapDatasetFetcher\.fetch \(torch/utils/data/_utils/fetch\.py:\d+\)", x) for x in labels)
    # user code is red-orange, installed packages yellow
    fills = {f[3]: f[6] for f in frames}
    r, g, b = map(int, re.findall(r"\d+", fills["Heavy.__getitem__ (workloads.py:10)"]))
    assert r >= 220 and g <= 170
    lib = next(v for k, v in fills.items() if k.startswith("_MapDatasetFetcher.fetch"))
    r2, g2, _b2 = map(int, re.findall(r"\d+", lib))
    assert g2 >= 175


def test_threads_and_subprocesses_give_one_root_each():
    prof = real_profile("fixed", threads=True, subprocesses=True)
    tops = {k.split(";")[0] for k in prof}
    assert len({t for t in tops if t.startswith("process ")}) == 13     # the main process and 12 workers
    merged = real_profile("fixed")
    assert not any(k.startswith(("process ", "thread (")) for k in merged)
    assert folded.total(merged) < folded.total(prof)                    # the workers are left out


def test_workers_stacks_are_not_stacked_on_each_other():
    # py-spy gives forked workers the training thread's thread id; a stack rebuilt per process
    # would grow without bound (tens of nested <module> frames). One <module> per stack here.
    st = profiles.stacks_of(h200_pyspy_capture("fixed"))
    prof = profiles.workers_profile(st)
    assert max(k.count("<module>") for k in prof) == 1
    assert max(k.count(";") + 1 for k in prof) < 40


def test_minimum_width_prunes_and_keeps_the_root_total():
    prof = real_profile("fixed", threads=True, subprocesses=True)
    full = flamegraph.render(prof, minwidth_px=0)
    pruned = flamegraph.render(prof, minwidth_px=2.0)
    assert pruned.frames < full.frames and pruned.pruned > 0
    _root, frames = frames_of(pruned.svg)
    assert all(f[5] >= 2.0 - 0.01 for f in frames)
    assert next(f for f in frames if f[0] == 0)[2] == folded.total(prof)


def test_layout_equals_a_naive_tree():
    rng = random.Random(3)
    names = [f"f{i} (m{i % 7}.py:{i})" for i in range(30)]
    prof = {}
    for _ in range(400):
        depth = rng.randint(1, 12)
        prof[";".join(rng.choice(names[:6 + d]) for d in range(depth))] = rng.randint(1, 60)
    for min_count in (0, 5, 80):
        lay = flamegraph.layout(prof, min_count)
        incl = collections.Counter()
        for k, v in prof.items():
            fr = k.split(";")
            for d in range(1, len(fr) + 1):
                incl[tuple(fr[:d])] += v
        want = collections.Counter((len(p), p[-1], w) for p, w in incl.items() if w >= min_count)
        got = collections.Counter((d, name, w) for d, _x, w, name, _id in lay.nodes if d > 0)
        assert got == want


def test_diff_colours_follow_the_sign_on_a_small_case():
    before = {"main;load": 50, "main;step": 50}
    after = {"main;load": 20, "main;step": 80}
    _root, frames = frames_of(flamegraph.render(after, before=before, minwidth_px=0).svg)
    by = {f[3]: f for f in frames}
    assert by["step"][7] == pytest.approx(0.3) and by["step"][6].startswith("rgb(255,")
    assert by["load"][7] == pytest.approx(-0.3) and by["load"][6].endswith(",255)")
    assert by["main"][7] == 0 and by["main"][6] == "rgb(235,235,235)"


def test_diff_colours_follow_the_sign_on_real_profiles():
    # Before the fix (num_workers=0) and after (12 workers): the training thread of each.
    before = profiles.training_profile(profiles.stacks_of(h200_pyspy_capture("starved")))
    after = profiles.training_profile(profiles.stacks_of(h200_pyspy_capture("fixed")))
    r = flamegraph.render(after, before=before, minwidth_px=0)
    _root, frames = frames_of(r.svg)
    A, B = folded.total(after), folded.total(before)
    signs = collections.Counter()
    max_abs = max(abs(f[7]) for f in frames)
    for f, path in paths(frames):
        want = inclusive(after, path) / A - inclusive(before, path) / B
        assert f[7] == pytest.approx(want, abs=1e-5), path
        rgb = tuple(map(int, re.findall(r"\d+", f[6])))
        if f[7] > 1e-9:
            assert rgb[0] == 255 and rgb[1] == rgb[2] < 255, (path, f[6])
            signs["+"] += 1
        elif f[7] < -1e-9:
            assert rgb[2] == 255 and rgb[0] == rgb[1] < 255, (path, f[6])
            signs["-"] += 1
        # saturation grows with the size of the change
        assert rgb[1] == pytest.approx(round(225 * (1 - min(1, abs(f[7]) / max_abs))), abs=1) or f[7] == 0
    assert signs["+"] and signs["-"]
    # The in-loop loading path of `before` is gone `after`: the subtitle says how much of before.
    assert "absent now" in r.svg


def test_svg_is_one_valid_document_with_its_script():
    r = flamegraph.render(real_profile("sync"), title="a <title> & more")
    root, _frames = frames_of(r.svg)
    assert root.get("class").startswith("tp-flame") and int(root.get("data-total")) == r.total
    script = root.find(f"{SVG}script").text
    assert "trainprobeFlame.init(document.documentElement" in script
    assert "a &lt;title&gt; &amp; more" in r.svg
    assert "http://" not in r.svg.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in r.svg


def test_empty_profile_draws_only_the_root():
    r = flamegraph.render({})
    _root, frames = frames_of(r.svg)
    assert [f[3] for f in frames] == ["all"] and r.total == 0


def test_frame_labels_cannot_break_the_folded_format():
    f = pystacks.Frame("odd;name\nx", "/srv/a;b/c.py", 3)
    lab = pystacks.frame_label(f)
    assert ";" not in lab and "\n" not in lab
    tr = pystacks.ThreadTrace(1, 2, 5, "Main;Thread", [pystacks.Span(0.0, 0.5, (f,))])
    prof = pystacks.fold_traces([tr], threads=True, processes=True)
    assert list(prof.values()) == [500000]
    assert folded.parse(folded.dumps(prof)) == prof


@pytest.mark.parametrize("path,short", [
    ("/usr/lib/python3.12/site-packages/torch/nn/modules/module.py", "torch/nn/modules/module.py"),
    ("/opt/venv/lib/python3.11/site-packages/numpy/core/fromnumeric.py", "numpy/core/fromnumeric.py"),
    ("/usr/lib/python3.11/multiprocessing/queues.py", "multiprocessing/queues.py"),
    ("/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", "threading.py"),
    ("/srv/train/workloads.py", "workloads.py"),
    ("<frozen runpy>", "<frozen runpy>"),
    ("", ""),
])
def test_short_paths(path, short):
    assert pystacks.short_path(path) == short


def test_profile_of_real_capture_counts_microseconds_of_each_thread():
    st = profiles.stacks_of(h200_pyspy_capture("starved"))
    prof = profiles.training_profile(st)
    assert folded.total(prof) == pytest.approx(st.training.seconds * 1e6, rel=1e-4)
    assert json.dumps(prof)


def test_short_path_is_idempotent():
    for p in ("/usr/lib/python3.11/site-packages/torch/utils/data/dataloader.py", "/srv/x/train.py",
              "/usr/lib/python3.11/threading.py"):
        once = pystacks.short_path(p)
        assert pystacks.short_path(once) == once
