"""Predictions against measurements: the validation ledger's bundles, re-diagnosed offline.

tests/data/ledger/KIND.json is a ledger written by `benchmarks/ledger.py --kind KIND` (trimmed to
what these tests read); bundles/CASE.tar.gz are the bundles it saved while it diagnosed each job.
Each ledger row measured the job before and after applying the fix trainprobe printed. Here the
current rules re-diagnose the same evidence, and the test asserts the numbers against what was
measured: the measured speedup inside the finding's interval, the estimate within 0.8-1.25x of
it (a rule that now stays silent estimates 1.0x and claims under 1.1x), the right finding first
(or, where the expected cause's own fix measured under 1.1x, that cause not claimed), nothing above 1.1x on a healthy job, and no fix that restates the
job's current setting. Rows the models do not meet yet are listed in the ledger JSON's `misses`
with the reason, and are expected failures (strict: a row that starts passing must be taken off
the list).
"""
import functools
import json

import pytest

from tests.helpers import DATA, run_cli

LEDGER = DATA / "ledger"
HEALTHY_MAX = 1.1
QUIET = 1.1        # a rule that stays silent claims its fix gains under this (the headline's threshold)


def rows():
    out = []
    for path in sorted(LEDGER.glob("*.json")):
        led = json.loads(path.read_text())
        for r in led["rows"]:
            if (LEDGER / "bundles" / f"{r['case']}.tar.gz").exists() and not r.get("error"):
                out.append(pytest.param(r, led.get("misses", {}), id=f"{path.stem}-{r['case']}"))
    return out


@functools.lru_cache(maxsize=None)
def _report(case):
    r = run_cli("report", str(LEDGER / "bundles" / f"{case}.tar.gz"), "--json")
    assert r.rc == 0, r.err
    return r.out


def rediagnose(case):
    """The real `trainprobe report BUNDLE --json`, run once per bundle in a test process."""
    return json.loads(_report(case))


def check(ok, detail, misses, case, what):
    """Assert ok, unless the ledger lists this row as a known miss: then it must still miss (xfail
    with the recorded reason), and a row that starts passing fails until it is taken off the list."""
    why = (misses.get(case) or {}).get(what)
    if why and ok:
        pytest.fail(f"{case} now meets '{what}': take it off the ledger's misses ({why})")
    if why:
        pytest.xfail(why)
    assert ok, detail


ROWS = rows()


@pytest.mark.parametrize("row,misses", ROWS)
def test_top_finding_is_the_one_the_job_was_built_for(row, misses):
    rep = rediagnose(row["case"])
    fs = rep["findings"]
    got = [(f["id"], f["expected_speedup"]) for f in fs]
    if row["healthy"]:
        ok = (not fs or fs[0]["id"] == "compute.bound") and all(f["expected_speedup"] <= HEALTHY_MAX for f in fs)
    elif row.get("measured", QUIET) < QUIET:
        # The expected cause's own fix measured under 1.1x: the right report does not claim it.
        ok = all(f["id"] != row["expect"] for f in fs)
    else:
        ok = bool(fs) and fs[0]["id"] == row["expect"]
    check(ok, got, misses, row["case"], "top")


def estimate_of(row):
    """(estimate, interval) of the measured row's finding as the current rules give it; a rule that
    stays silent estimates 1.0x and claims under QUIET."""
    f = next((x for x in rediagnose(row["case"])["findings"] if x["id"] == row["finding"]), None)
    if f is None:
        return 1.0, (0.0, QUIET)
    lo, hi = f["expected_speedup_interval"]
    assert lo <= f["expected_speedup"] <= hi
    return f["expected_speedup"], (lo, hi)


@pytest.mark.parametrize("row,misses", [p for p in ROWS if "measured" in p.values[0]])
def test_measured_speedup_falls_inside_the_findings_interval(row, misses):
    est, (lo, hi) = estimate_of(row)
    check(lo <= row["measured"] <= hi, (est, [lo, hi], row["measured"], row["ratios"]),
          misses, row["case"], "interval")


@pytest.mark.parametrize("row,misses", [p for p in ROWS if "measured" in p.values[0]])
def test_estimate_is_within_a_quarter_of_the_measured_speedup(row, misses):
    est, _ = estimate_of(row)
    check(0.8 <= est / row["measured"] <= 1.25, (est, row["measured"]), misses, row["case"], "estimate")


CURRENT = {"num_workers": "num_workers", "pin_memory": "pin_memory", "persistent_workers": "persistent_workers",
           "intra_op_threads": "threads", "prefetch_factor": "prefetch_factor"}


@pytest.mark.parametrize("row,misses", ROWS)
def test_no_fix_restates_the_current_setting(row, misses):
    before = row["knobs_before"]
    for f in rediagnose(row["case"])["findings"]:
        for fx in f["fixes"]:
            for k, v in (fx.get("knobs") or {}).items():
                if k in CURRENT and CURRENT[k] in before:
                    assert before[CURRENT[k]] != v, (f["id"], fx["change"], before)


def test_the_ledger_covers_every_cpu_side_rule():
    led = json.loads((LEDGER / "cpu.json").read_text())
    covered = {r["expect"] for r in led["rows"]}
    assert {"dataloader.starved", "gil.contention", "cpu.oversubscribed", "io.small_reads",
            "compute.bound"} <= covered
    assert len(led["rows"]) >= 10


def test_heldout_fit_predicts_the_left_out_jobs():
    """Leave-one-job-out on the rows the pinning constant moves: each row is predicted with a value
    fitted on the others, never on itself, and the measured speedup falls inside its interval."""
    from pathlib import Path

    from scripts.ledger import heldout, measured_rows
    rows = [r for r in measured_rows([Path(LEDGER / "gpu.json")])
            if r["case"] in ("timm-starved", "lightning-starved", "gan-recreated")]
    res = heldout(rows, {"a_pin": (0.77, 1.0)})
    assert res["summary"]["rows"] == 3
    for r in res["rows"]:
        assert r["case"] not in r.get("fitted_on", [])
        assert r["interval"][0] <= r["measured"] <= r["interval"][1], r


def test_the_fit_weighs_a_job_once_however_many_runs_it_has():
    """Re-runs (`-rN`) are one job: left out together, and in the fit's objective a job's runs count
    as their geometric mean, so a job measured three times does not outvote two jobs measured once."""
    from scripts.ledger import _job_error, job_of
    assert job_of("vae-gpu-r3") == job_of("vae-gpu") == "vae-gpu" and job_of("mnist-r2x") == "mnist-r2x"
    rows = [{"case": c, "key": c, "source": "x.json", "measured": 1.0} for c in ("a", "a-r2", "a-r3", "b", "c")]
    # at v = 1 job a fits exactly (three runs) and b and c are 2x off; at v = 2 it is the other way
    table = {"a": {"k": {1: 1.0, 2: 2.0}}, "a-r2": {"k": {1: 1.0, 2: 2.0}}, "a-r3": {"k": {1: 1.0, 2: 2.0}},
             "b": {"k": {1: 2.0, 2: 1.0}}, "c": {"k": {1: 2.0, 2: 1.0}}}
    assert _job_error(rows, table, "k", 2) < _job_error(rows, table, "k", 1)
    # per run, the three runs of a would have won: the median of 0, 0, 0, log 2, log 2 is 0


def test_a_fitted_value_replaces_the_prior_only_where_it_lowers_the_error_clearly():
    """A median over a few jobs moves by a few hundredths between neighbouring values: the fold keeps
    the prior unless another value lowers the objective by FIT_GAIN."""
    import math

    from scripts.ledger import FIT_GAIN, _fit
    rows = [{"case": c, "key": c, "source": "x.json", "measured": 1.0} for c in ("a", "b", "c")]
    near = math.exp(FIT_GAIN / 2)         # a value that lowers each job's |log| by half of FIT_GAIN
    table = {c: {"k": {1: math.exp(0.2), 2: math.exp(0.2) / near, 3: 1.0}} for c in ("a", "b", "c")}
    assert _fit(rows, table, "k", (1, 2), prior=1) == 1       # 0.005 better: the prior stays
    assert _fit(rows, table, "k", (1, 2, 3), prior=1) == 3    # 0.2 better: fitted


def test_constants_that_shorten_the_same_term_are_fitted_together():
    """compile_e and compile_fusion both shorten a compiled eager model's loop: fitted apart, each with
    the other at its prior, each takes the whole gap and the two together count it twice. The folds
    fit them over the product of their grids, nearest the prior among equals."""
    import math

    from scripts.ledger import _fit, fit_units
    units = fit_units({"a_pin": (0.77, 1.0), "compile_e": (0.4, 0.57), "compile_fusion": (0.8, 1.0)})
    assert units == [(("a_pin",), [(0.77,), (1.0,)]),
                     (("compile_e", "compile_fusion"), [(0.4, 0.8), (0.4, 1.0), (0.57, 0.8), (0.57, 1.0)])]
    assert fit_units({"compile_fusion": (0.8, 1.0)}) == [(("compile_fusion",), [(0.8,), (1.0,)])]
    # Each job measured 1.5x; either constant alone at its better value predicts it, both together 2x.
    rows = [{"case": c, "key": c, "source": "x.json", "measured": 1.5} for c in ("a", "b", "c")]
    pred = {(0.57, 1.0): 1.2, (0.65, 1.0): 1.5, (0.57, 0.8): 1.5, (0.65, 0.8): 2.0}
    table = {c: {"compile_e+compile_fusion": dict(pred)} for c in ("a", "b", "c")}
    best = _fit(rows, table, "compile_e+compile_fusion", tuple(pred), prior=(0.57, 1.0))
    assert best in ((0.65, 1.0), (0.57, 0.8)) and math.isclose(pred[best], 1.5)


def test_repetitions_are_sized_from_the_measured_spread():
    """The harness adds interleaved pairs until the ratio's 95% interval is within 5% of it: three
    tight pairs are enough, three spread ones (a shared 2-CPU machine under load) are not."""
    from scripts.ledger import pinned, ratio_interval
    assert pinned([0.877, 0.903, 0.900])
    assert not pinned([2.22, 1.91, 0.61])
    g, lo, hi = ratio_interval([2.22, 1.91, 0.61])
    assert lo < 1.0 < hi and lo < g < hi


def test_the_heldout_reads_the_public_ledger_without_measured_rows():
    from pathlib import Path

    from scripts.ledger import measured_rows
    public = sorted((LEDGER / "public").glob("*.json"))
    rows = measured_rows([Path(p) for p in public])
    assert all(r["measured"] > 0 for r in rows)      # 'not applicable generically' rows are left out
