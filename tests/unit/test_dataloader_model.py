"""The worker count the DataLoader model proposes: the smallest W within 2% of the best step time,
found without enumerating every CPU a bundle claims."""
import contextlib
import io
import itertools
import json
import resource
import time

from trainprobe.agent import bundle, cli, diagnosis
from trainprobe.agent.rules._dataloader_model import propose_workers, step_time
from tests.report_fixtures import h200_capture_and_context


def exhaustive(c, d, u, p, w_cap):
    times = {w: step_time(w, c, d, u, p) for w in range(1, max(w_cap, 1) + 1)}
    best = min(times.values())
    w = min(k for k, t in times.items() if t <= best * 1.02)
    return w, times[w]


def test_the_bounded_search_is_the_exhaustive_one():
    for c, d, u, p, w_cap in itertools.product((0.0, 0.01, 0.3), (0.0, 0.2, 3.0, 40.0), (0.0, 0.5, 1.9),
                                              (0.0, 1.0, 2.0, 15.5), (-1, 1, 2, 7, 63, 200)):
        assert propose_workers(c, d, u, p, w_cap) == exhaustive(c, d, u, p, w_cap), (c, d, u, p, w_cap)


def test_a_claimed_48_million_cpus_costs_nothing():
    t0 = time.monotonic()
    assert propose_workers(0.2, 5.0, 1.0, 48e6, 48_000_000) == exhaustive(0.2, 5.0, 1.0, 48e6, 26)
    assert propose_workers(0.0, 5.0, 0.0, 0.0, 48_000_000)[0] >= 47_000_000
    assert time.monotonic() - t0 < 0.5


def test_report_on_a_bundle_claiming_48_million_cpus(tmp_path):
    cap, ctx = h200_capture_and_context("starved")
    rep, _ev = diagnosis.report_from([cap], ctx, {}, [])
    d = tmp_path / "b"
    bundle.save(str(d), [cap], ctx, rep)
    meta = json.loads((d / "bundle.json").read_text())
    meta["context"]["host"]["cpus"] = 47943105
    (d / "bundle.json").write_text(json.dumps(meta))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out, err = io.StringIO(), io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli._run(["report", str(d), "--json"])
    assert rc == 0, err.getvalue()
    assert time.monotonic() - t0 < 10
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before < 150
    assert json.loads(out.getvalue())["findings"][0]["id"] == "dataloader.starved"
