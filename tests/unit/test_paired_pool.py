"""Pooling paired cost runs (scripts/paired_pool.py, benchmarks/pool_paired.py): the arithmetic on
made-up runs, and the pooled figure docs/cost.md quotes, from the raw runs kept in benchmarks/results."""
import math
from pathlib import Path

import pytest

from scripts.paired_pool import as_is, factor, load, pool

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def test_equal_runs_pool_to_their_ratio_with_a_narrower_interval():
    one = pool([(16, 0.98, 0.10)])
    two = pool([(16, 0.98, 0.10), (16, 0.98, 0.10)])
    assert two["ratio"] == pytest.approx(0.98) and two["pairs"] == 32
    w1 = math.log(one["ci95"][1] / one["ci95"][0])
    w2 = math.log(two["ci95"][1] / two["ci95"][0])
    assert w2 == pytest.approx(w1 / math.sqrt(2))
    assert "random" not in two            # no spread between the runs beyond their errors


def test_a_tighter_run_weighs_more_and_disagreeing_runs_widen_the_random_effects_interval():
    r = pool([(25, 1.00, 0.05), (25, 0.90, 0.20)])
    assert 0.98 < r["ratio"] < 1.0        # mostly the tight run
    far = pool([(30, 1.10, 0.05), (30, 0.90, 0.05)])
    assert "random" in far and far["q"] > far["df"]
    lo, hi = far["random"]["ci95"]
    assert hi / lo > far["ci95"][1] / far["ci95"][0]


def test_the_pairs_needed_for_one_percent_follow_the_spread():
    assert pool([(20, 1.0, 0.10)])["pairs_for_1pct"] == math.ceil((1.96 * 0.10 / math.log(1.01)) ** 2)


def test_the_runs_on_record_pool_to_the_figure_docs_quote():
    files = sorted(RESULTS.glob("h*-gpu-paired-data-w0*.json.gz"))
    runs = []
    for p in files:
        d = load(p)
        if not as_is(d):
            continue
        # the agent at its default: `default` before auto became it, `auto` since
        arms = d["cases"][0]["arms"]
        f = factor(arms.get("default") or arms["auto"], "steps/s")
        if f is not None:
            runs.append(f)
    assert len(runs) == 14
    r = pool(runs)
    assert r["pairs"] == 284
    assert r["ratio"] == pytest.approx(0.985, abs=0.001)
    assert r["ci95"][0] == pytest.approx(0.980, abs=0.001) and r["ci95"][1] == pytest.approx(0.990, abs=0.001)
