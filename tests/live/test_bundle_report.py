"""Bundles (`diagnose --save`) and the offline `report BUNDLE`: the same findings come back."""
import io
import json
import os
import tarfile
import time

import pytest

from trainprobe.agent import bundle, diagnosis
from trainprobe.probes.base import Capture
from tests.helpers import run_cli
from tests.report_fixtures import h200_capture_and_context

OVERHEAD = {"agent_cpu_seconds": 0.5, "agent_max_rss_mb": 70.0, "target_slowdown_estimate": 0.01}


def live_like(mode):
    cap, ctx = h200_capture_and_context(mode)
    skipped = Capture("process", status="skipped", reason="captured on the H200 node without /proc access")
    ctx["session_notes"] = ["a note"]            # as diagnosis.run keeps them
    rep, _ev = diagnosis.report_from([skipped, cap], ctx, dict(OVERHEAD), ["a note"])
    return [skipped, cap], ctx, rep


def one_clean_line(r):
    assert "Traceback" not in r.err and "Traceback" not in r.out
    lines = [ln for ln in r.err.splitlines() if ln.strip()]
    assert len(lines) == 1, r.err
    return lines[0]


@pytest.mark.parametrize("name", ["bundle-dir", "bundle.tar.gz"])
@pytest.mark.parametrize("mode", ["starved", "fixed"])
def test_bundle_round_trips_and_rediagnoses_the_same(tmp_path, name, mode):
    caps, ctx, rep = live_like(mode)
    path = str(tmp_path / name)
    bundle.save(path, caps, ctx, rep)
    assert bundle.is_bundle(path)
    b = bundle.load(path)
    assert [c.to_dict() for c in b.captures] == [json.loads(json.dumps(c.to_dict())) for c in caps]
    assert b.context == json.loads(json.dumps(ctx)) and b.overhead == OVERHEAD and b.notes == ["a note"]
    assert b.report == json.loads(json.dumps(rep))
    again, _ev = diagnosis.report_from(b.captures, b.context, b.overhead, b.notes)
    assert again["findings"] == rep["findings"] and again["findings"]
    assert again["probes"] == rep["probes"] and again["target"] == rep["target"]
    assert again["window"] == rep["window"] and again["rules"] == rep["rules"]


def test_report_command_prints_text_json_and_html(tmp_path):
    caps, ctx, rep = live_like("starved")
    path = str(tmp_path / "b.tar.gz")
    bundle.save(path, caps, ctx, rep)
    r = run_cli("report", path, "--json", "--html", str(tmp_path / "r.html"))
    assert r.rc == 0, r.err
    out = r.json()
    assert out["findings"] == rep["findings"] and out["command"] == "report"
    assert out["source"]["bundle"] == path and out["source"]["live_findings"] == ["dataloader.starved"]
    assert out["schema"] == "trainprobe.report/1" and out["notes"] == ["a note"]
    page = (tmp_path / "r.html").read_text()
    assert rep["findings"][0]["title"].replace("(", "(") in page and "Re-diagnosed offline from the bundle" in page
    t = run_cli("report", path)
    assert t.rc == 0 and "#1  dataloader.starved" in t.out
    assert "trainprobe:" not in t.out


def test_archive_is_private_and_leaves_no_temporary_file(tmp_path):
    caps, ctx, rep = live_like("pinned")
    path = tmp_path / "b.tgz"
    bundle.save(str(path), caps, ctx, rep)
    assert (path.stat().st_mode & 0o777) == 0o600       # it holds the target's stacks and argv
    assert os.listdir(tmp_path) == ["b.tgz"]


def test_saving_over_an_unrelated_directory_is_refused(tmp_path):
    d = tmp_path / "photos"
    d.mkdir()
    (d / "cat.jpg").write_bytes(b"x")
    caps, ctx, rep = live_like("sync")
    with pytest.raises(bundle.BundleError, match="other files"):
        bundle.save(str(d), caps, ctx, rep)
    bundle.save(str(tmp_path / "again"), caps, ctx, rep)
    bundle.save(str(tmp_path / "again"), caps, ctx, rep)         # an existing bundle is replaced
    assert bundle.load(str(tmp_path / "again")).report["findings"] == rep["findings"]


def _tar(path, files):
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_report_refuses_what_is_not_a_bundle(tmp_path):
    r = run_cli("report", str(tmp_path / "nope"))
    assert r.rc == 2 and "no such bundle" in one_clean_line(r)
    r = run_cli("report", str(tmp_path))
    assert r.rc == 2 and "not a trainprobe bundle" in one_clean_line(r)
    (tmp_path / "junk.tar.gz").write_bytes(b"this is not gzip")
    r = run_cli("report", str(tmp_path / "junk.tar.gz"))
    assert r.rc == 2 and "cannot read the bundle" in one_clean_line(r)
    _tar(tmp_path / "empty.tar.gz", {"x/readme.txt": b"hello"})
    r = run_cli("report", str(tmp_path / "empty.tar.gz"))
    assert r.rc == 2 and "no bundle.json inside" in one_clean_line(r)
    _tar(tmp_path / "future.tar.gz", {"b/bundle.json": json.dumps({"schema": "trainprobe.bundle/9"}).encode()})
    r = run_cli("report", str(tmp_path / "future.tar.gz"))
    assert r.rc == 2 and "unknown bundle schema" in one_clean_line(r)
    _tar(tmp_path / "holes.tar.gz", {"b/bundle.json": json.dumps(
        {"schema": bundle.SCHEMA, "captures": ["captures/pyspy.json"], "context": {}}).encode()})
    r = run_cli("report", str(tmp_path / "holes.tar.gz"))
    assert r.rc == 2 and "listed but missing" in one_clean_line(r)


def test_archive_member_names_cannot_write_outside(tmp_path):
    caps, ctx, rep = live_like("healthy")
    good = tmp_path / "good"
    bundle.save(str(good), caps, ctx, rep)
    files = {f"../../escape/{name}": (good / name).read_bytes()
             for name in ["bundle.json", "report.json"] + [f"captures/{c.probe}.json" for c in caps]}
    _tar(tmp_path / "evil.tar.gz", files)
    before = set(os.listdir(tmp_path.parent.parent))
    with pytest.raises(bundle.BundleError, match="unsafe member name"):   # refused, not extracted
        bundle.load(str(tmp_path / "evil.tar.gz"))
    assert set(os.listdir(tmp_path.parent.parent)) == before
    r = run_cli("report", str(tmp_path / "evil.tar.gz"))
    assert r.rc == 2 and "unsafe member name" in one_clean_line(r)


def test_diagnose_refuses_unwritable_outputs_before_watching(tmp_path):
    t0 = time.monotonic()
    r = run_cli("diagnose", "--pid", str(os.getpid()), "--duration", "30", "--save", "/nonexistent/dir/b")
    assert r.rc == 2 and "is not a directory" in one_clean_line(r)
    r = run_cli("diagnose", "--pid", str(os.getpid()), "--duration", "30", "--html", str(tmp_path))
    assert r.rc == 2 and "it is a directory" in one_clean_line(r)
    f = tmp_path / "afile"
    f.write_text("x")
    r = run_cli("diagnose", "--pid", str(os.getpid()), "--duration", "30", "--save", str(f))
    assert r.rc == 2 and "a file is there" in one_clean_line(r)
    assert time.monotonic() - t0 < 25           # no 30 s window was spent


# -- live: a real workload, a real diagnosis, saved and re-diagnosed -------------------------------

@pytest.mark.live
def test_report_reproduces_the_live_findings_and_the_html_renders(workload, tmp_path):
    from scripts.browser import Chromium, chromium_binary
    w = workload("--seconds", "60", "--num-workers", "0")
    saved = str(tmp_path / "run.tar.gz")
    page = str(tmp_path / "live.html")
    r = run_cli("diagnose", "--pid", str(w.pid), "--duration", "3", "--json", "--save", saved, "--html", page)
    assert r.rc == 0, r.err
    live = r.json()
    assert live["findings"] and live["findings"][0]["id"] == "dataloader.starved"
    assert f"saved the raw evidence to {saved}" in r.err and f"wrote the HTML report to {page}" in r.err
    off = run_cli("report", saved, "--json")
    assert off.rc == 0, off.err
    rep = off.json()
    assert rep["findings"] == live["findings"]
    for key in ("probes", "target", "window", "host", "overhead", "rules"):
        assert rep[key] == live[key], key
    assert rep["source"]["live_findings"] == [f["id"] for f in live["findings"]]
    assert w.alive()
    if chromium_binary() is None:
        pytest.skip("chromium is not installed: the HTML was written but not opened")
    with Chromium() as b:
        b.open(page)
        assert b.eval("document.querySelector('#finding-1 .ftitle').textContent") == live["findings"][0]["title"]
        assert b.eval("document.querySelector('#no-gpu').textContent").startswith("no GPU evidence: gpu: ")
        assert b.eval("document.querySelectorAll('#flamegraphs .flame-wrap:not([hidden]) svg.tp-flame').length") == 1
        assert b.eval("document.querySelectorAll('.train-band rect.seg').length") >= 1
        img = b.screenshot(str(tmp_path / "live.png"), full_page=True)
        assert img.count_unlike((255, 255, 255), step=4) > 0.03 * (img.width // 4) * (img.height // 4)
        assert b.log.errors() == [] and b.log.requests == ["file://" + page]


@pytest.mark.live
def test_directory_bundle_of_a_job_with_workers(workload, tmp_path):
    w = workload("--seconds", "60", "--num-workers", "1", "--sample-work", "9000", warmup_lines=2)
    saved = str(tmp_path / "bundle")
    r = run_cli("diagnose", "--pid", str(w.pid), "--duration", "3", "--json", "--save", saved)
    assert r.rc == 0, r.err
    live = r.json()
    from trainprobe.probes.registry import probe_classes
    # Every probe of the run is kept, the skipped ones too (with their reasons): the default set here.
    assert sorted(os.listdir(os.path.join(saved, "captures"))) == sorted(
        f"{c.name}.json" for c in probe_classes() if c.default_enabled)
    off = run_cli("report", saved, "--json")
    assert off.rc == 0, off.err
    assert off.json()["findings"] == live["findings"]
    assert any(x["role"] == "dataloader_worker" for x in off.json()["target"]["workers"])
