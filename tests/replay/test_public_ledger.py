"""The ledger on public training code, re-diagnosed offline with the current rules.

tests/data/ledger/public/public-ledger-KIND.json are ledgers written by
`benchmarks/public_ledger.py --kind KIND` on public scripts (pytorch/examples, nanoGPT, timm) run
unmodified, the printed fix applied by the injected start-up module; bundles/JOB.tar.gz are the
bundles saved while each job was diagnosed. `--to-tests` records each bundle's top finding under
the rules of that day (`replay_top`). Here every bundle must replay, its top finding must still be
that one (a rule change that moves it re-runs `--to-tests` and says so in its commit), background
threads that hold no GIL must get no gil.contention, and the accuracy targets of the ledger are
reported, xfail until the models meet them.
"""
import json
import math
import statistics

import pytest

from tests.helpers import DATA, run_cli

PUBLIC = DATA / "ledger" / "public"


def ledger_rows():
    out = []
    for path in sorted(PUBLIC.glob("public-ledger-*.json")):
        for r in json.loads(path.read_text())["rows"]:
            if r.get("bundle") and (PUBLIC / r["bundle"]).exists():
                out.append(pytest.param(r, id=f"{path.stem.rsplit('-', 1)[-1]}-{r['job']}"))
    return out


ROWS = ledger_rows()


def replay(row):
    r = run_cli("report", str(PUBLIC / row["bundle"]), "--json")
    assert r.rc == 0, r.err
    return r.json()


def test_the_public_ledger_has_its_jobs():
    rows = [p.values[0] for p in ROWS]
    assert len({r["job"] for r in rows}) >= 5
    for r in rows:
        assert r["repo"] and len(r["commit"]) == 40 and r["command"]


@pytest.mark.parametrize("row", ROWS)
def test_bundle_replays_with_the_same_top_finding(row):
    fs = replay(row)["findings"]
    assert (fs[0]["id"] if fs else None) == row["replay_top"], [(f["id"], f["expected_speedup"]) for f in fs]


def check(ok, detail, row, what):
    """Assert ok, unless --to-tests recorded this row as a miss of the rules of its day: then it must
    still miss (xfail with the reason), and a row that starts passing fails until --to-tests is re-run."""
    why = (row.get("misses") or {}).get(what)
    if why and ok:
        pytest.fail(f"{row['job']} now meets '{what}': re-run benchmarks/public_ledger.py --to-tests ({why})")
    if why:
        pytest.xfail(why)
    assert ok, detail


@pytest.mark.parametrize("row", [p for p in ROWS if "gil.contention" in p.values[0].get("expect_not", ())])
def test_no_gil_finding_where_no_thread_holds_the_gil(row):
    fs = replay(row)["findings"]
    check(all(f["id"] != "gil.contention" for f in fs), [(f["id"], f["expected_speedup"]) for f in fs],
          row, "expect_not")


@pytest.mark.parametrize("row", [p for p in ROWS if p.values[0].get("expect")])
def test_a_known_cause_is_found(row):
    fs = replay(row)["findings"]
    check(any(f["id"] == row["expect"] for f in fs), [(f["id"], f["expected_speedup"]) for f in fs], row, "expect")


def measured_rows():
    """Every measured fix of the public ledgers, with the settings applied when it was measured."""
    from scripts.ledger import measured_rows as ledger_rows
    return ledger_rows(sorted(PUBLIC.glob("public-ledger-*.json")))


def _public_predictions():
    from trainprobe.agent.combiners import step_model
    from scripts.ledger import _predict
    out = []
    for r in measured_rows():
        est, (lo, hi), _ = _predict(r, step_model.calibration())
        out.append((r["case"], est / r["measured"], lo <= r["measured"] <= hi))
    return out


def test_public_code_has_no_systematic_sign_and_its_intervals_cover_it():
    """The two targets met on public code: the median pred/meas within 0.95-1.05 and the printed
    interval holding the measured speedup in at least 90% of rows (22 of 22 on 2026-12-02)."""
    rows = _public_predictions()
    assert len(rows) >= 15
    assert 0.95 <= statistics.median(x for _, x, _ in rows) <= 1.05, rows
    assert sum(c for *_, c in rows) >= 0.9 * len(rows), [r for r in rows if not r[2]]


# Fixes printed worth acting on that measured no gain, each with why (docs/ledger.md). A row listed
# here that measures a gain again, or a new row that does not, fails the test below.
NO_GAIN_YET = {
    "lightning-backbone-cpu": "2 CPUs both busy (1.88 of 2): one worker and one intra-op thread on 8 ms "
                              "steps (batch 32, about 120 steps/s); 1.21x printed (0.65-1.32x), 1.02x measured",
    "lightning-backbone-cpu-r2": "the same job with its second intra-op thread measured (CPU-clock samples: it "
                                 "spun 93% of its CPU, e = 0.07), so the cap costs nothing; 1.46x printed "
                                 "(0.91-1.82x), 1.01x measured. With the fix the loop and its worker each used "
                                 "0.7 of a core and the 2 CPUs idled 19% (perf, system-wide): each 8 ms step "
                                 "hands a batch from the worker to the loop (its feeder and fd-sharing threads, "
                                 "the loop's receive, about 2 ms), a round trip the window cannot size without "
                                 "the step's length (docs/ledger.md)",
    "lightning-gan-gpu-r4": "Lightning's GAN template on an H100 (16 workers re-created each epoch of about "
                            "20 s: 55,000 images in batches of 32 at 85 a second): the window saw them started "
                            "once, 0.35 s of queues and locks; persistent workers "
                            "printed 1.30x then, 1.13x now (0.96-1.40x: a single start's share of the job is not "
                            "known), 0.98x measured (0.91-1.11x over 8 pairs, the job slowing from 240 to 175 "
                            "steps/s over the run in both arms); the job's latest run (-r8, the agent with worker lives "
                            "recorded, 2026-12-07) printed no fix (docs/ledger.md)",
}
# The latest run of a job whose fix printed worth acting on measured no gain, with why: open misses.
# (Lightning's GAN template, lightning-gan-gpu-r4: persistent workers 1.13x held out, 0.98x measured,
# is no longer one: the job's latest run, -r8, with worker lives recorded, printed no fix. Nor is
# Lightning's backbone classifier as two ddp_spawn ranks on 2 CPUs, lightning-backbone-cpu-ddp: a worker
# a rank, 1.24x printed, 0.80x measured; with no CPU left beside a rank's compute the workers' CPU is
# the loop's (step_model.no_cpu_for_workers), 1.00x now, and its third run, 1.16x printed with the
# ranks' steps timed, replays at 1.00x against 0.87x measured.)
OPEN_MISSES: set[str] = set()


def test_every_fix_printed_worth_acting_on_measured_a_gain():
    """A fix the current rules print at or above the report's limit (1.1x) measured at least 1.05x on
    public code: where they print less (MNIST on 2 CPUs, 1.01x for a fix that measured 0.79x; compiling
    a model whose graph breaks, 1.00x for 0.87x and 0.93x), the report says it is not worth acting on.
    The exceptions are listed with their reason (NO_GAIN_YET)."""
    from trainprobe.agent.combiners import step_model
    from trainprobe.reports.values import WORTH_ACTING_X
    from scripts.ledger import _predict
    worth = [(r["case"], est, r["measured"]) for r in measured_rows()
             for est in [_predict(r, step_model.calibration())[0]] if est >= WORTH_ACTING_X]
    assert len(worth) >= 15, worth
    short = {c for c, _, m in worth if m < 1.05}
    assert short == set(NO_GAIN_YET), [w for w in worth if w[2] < 1.05]


def test_each_jobs_latest_fix_worth_acting_on_measured_a_gain():
    """Job by job, the fix of its latest run (the ledgers append runs as they were measured), where the
    current rules put it at or above the report's limit, measured at least 1.05x: the exceptions of
    NO_GAIN_YET are older runs of a job whose later runs' fixes did gain, or whose latest run printed
    no fix at all (an abstention as the agent ships), but for OPEN_MISSES."""
    from trainprobe.agent.combiners import step_model
    from trainprobe.reports.values import WORTH_ACTING_X
    from scripts.ledger import _predict, job_of, latest_abstentions
    abstained = latest_abstentions(sorted(PUBLIC.glob("public-ledger-*.json")))
    assert ("public-ledger-gpu.json", "lightning-gan-gpu") in abstained, abstained
    latest = {}
    for r in measured_rows():
        if (r["source"], job_of(r["case"])) not in abstained:
            latest[(r["source"], job_of(r["case"]), r["finding"])] = r
    worth = [(r["case"], est, r["measured"]) for r in latest.values()
             for est in [_predict(r, step_model.calibration())[0]] if est >= WORTH_ACTING_X]
    assert len(worth) >= 20, worth
    assert {c for c, _, m in worth if m < 1.05} == OPEN_MISSES, [w for w in worth if w[2] < 1.05]
    assert not {c for c, _, _ in worth} & (set(NO_GAIN_YET) - OPEN_MISSES)


@pytest.mark.xfail(reason="the targets are not met on every public run (2026-12-08, twenty-fifth round: "
                          "karpathy's makemore on 2 CPUs joined, and no workers for a team that fills its CPUs; "
                          "120 of 141 before): with the calibration as it ships, 124 of 145 runs within 0.8-1.25 "
                          "(86%, the target 90%; median |log| 0.068, median ratio 1.00, 139 of 145 covered). "
                          "Outside: mnist_rnn on 2 CPUs, "
                          "whose fix measured 1.28-1.55x in every run, rated below it (its measured abstentions), MNIST "
                          "on 2 CPUs (1.27; 1.67 where its fix, rated at the contract's 1.0x floor with an interval "
                          "reaching 1.22x, measured 0.60x), "
                          "timm's JPEG pipeline on 15-batch epochs (1.65, 1.53, 1.86), Lightning's backbone and "
                          "autoencoder on 2 CPUs in their second runs (1.44, 1.29) and on the GPU (1.43, 1.30), minGPT's "
                          "adder's first run (1.30), the VAE on the GPU (1.25), Fabric's MNIST's first run (0.79), chargpt's "
                          "sixth (0.76: 2.11x printed, 2.79x measured over 3 pairs), and the first runs by the agent as it "
                          "ships of ImageNet on FakeData (1.29: the same fix measured 4.67x and 5.50x before, 4.24x here), "
                          "ImageNet on JPEGs (0.57: a validation pass in the window) and MNIST on the GPU (0.75: py-spy's "
                          "share of the wait at 6 ms steps). mnist_hogwild on 16 CPUs (its cap to 8 threads a process "
                          "measured 32.98x) and its fourth and fifth 2-CPU runs (5.32x for 2.67x, 4.37x for 21.56x: a job "
                          "in two regimes before the fix). Each job once the band, median and ratio are met "
                          "(test_accuracy_targets_on_public_code_each_job_once; held out 40 of 44, docs/ledger.md)",
                   strict=False)
def test_accuracy_targets_on_public_code():
    """The current rules at the settings that were applied and measured (not at what they would
    propose today), with the step model's calibration as it ships."""
    from trainprobe.agent.combiners import step_model
    from scripts.ledger import _predict
    ms = measured_rows()
    assert len(ms) >= 5, f"{len(ms)} measured rows"
    ratios, covered = [], 0
    for r in ms:
        est, (lo, hi), _ = _predict(r, step_model.calibration())
        ratios.append(est / r["measured"])
        covered += lo <= r["measured"] <= hi
    assert sum(0.8 <= x <= 1.25 for x in ratios) >= 0.9 * len(ratios), ratios
    assert statistics.median(abs(math.log(x)) for x in ratios) <= 0.10, ratios
    assert 0.95 <= statistics.median(ratios) <= 1.05, ratios
    assert covered >= 0.9 * len(ratios), ratios


def test_accuracy_targets_on_public_code_each_job_once():
    """Issue 26's targets with each public job counted once (the geometric mean of its runs' pred/meas,
    as docs/ledger.md's held-out figures count them), the current rules at the settings that were
    applied and measured, the calibration as it ships: within 0.8-1.25x in at least 90% of jobs, median
    |log| <= 0.10, median ratio 0.95-1.05, every run of at least 90% of jobs inside its interval.
    In-sample: 40 of 44, 0.059, 1.020 (2026-12-08; 39 of 43, 0.062, 1.015 before makemore joined);
    held out (leave-one-job-out, minutes to fit, so in the docs, not here): 40 of 44, 0.068, 1.015.
    The intervals' share is test_interval_coverage_on_public_code_each_job_once's."""
    from trainprobe.agent.combiners import step_model
    from scripts.ledger import _predict, per_job
    out = []
    for r in measured_rows():
        est, (lo, hi), _ = _predict(r, step_model.calibration())
        out.append(dict(r, ratio=est / r["measured"], in_interval=lo <= r["measured"] <= hi))
    jobs = per_job(out)
    ratios = [j["ratio"] for j in jobs]
    assert len(jobs) >= 40, len(jobs)
    assert sum(0.8 <= x <= 1.25 for x in ratios) >= 0.9 * len(jobs), sorted(zip(ratios, [j["job"] for j in jobs]))
    assert statistics.median(abs(math.log(x)) for x in ratios) <= 0.10
    assert 0.95 <= statistics.median(ratios) <= 1.05


@pytest.mark.xfail(strict=True, reason=(
    "39 of 44 public jobs have every run inside its interval (88.6%, the target 90%; 39 of 43 until "
    "karpathy's makemore joined, 2026-12-08): its first run measured one worker at 0.97x (8 noisy pairs) "
    "against 0.97-1.11x. The others outside: mnist_hogwild (two regimes), timm's MobileNetV3 with two "
    "workers at 64 px, Lightning's ImageNet template and its backbone classifier on the GPU"))
def test_interval_coverage_on_public_code_each_job_once():
    """Issue 26's fourth target, each public job once: every run of at least 90% of the jobs inside its
    interval, the current rules at the settings that were applied and measured, the calibration as it
    ships."""
    from trainprobe.agent.combiners import step_model
    from scripts.ledger import _predict, per_job
    out = []
    for r in measured_rows():
        est, (lo, hi), _ = _predict(r, step_model.calibration())
        out.append(dict(r, ratio=est / r["measured"], in_interval=lo <= r["measured"] <= hi))
    jobs = per_job(out)
    assert sum(j["in_interval"] for j in jobs) >= 0.9 * len(jobs), [j["job"] for j in jobs if not j["in_interval"]]


def test_reaped_workers_count_only_their_cpu_inside_the_window():
    """pytorch/examples ImageNet on the H100 (2 workers, re-created each epoch): its window
    saw the epoch's two workers joined and the validation pass's two started. The parent's cutime +
    cstime holds the joined workers' whole lives (60 CPU-s for a 4.9 s window): counted whole, the
    workers 'used' 13 cores and more workers were rated 1.00x (measured 6.07x). Their CPU before the
    window (at the start snapshot) is not the window's."""
    fs = run_cli("report", str(PUBLIC / "bundles" / "imagenet-jpeg-j2-r3.tar.gz"), "--json").json()["findings"]
    f = next(f for f in fs if f["id"] == "dataloader.starved")
    cores = f["details"]["step_model"]["worker_cores"]
    assert 1.0 <= cores <= 2.5, cores          # 4 workers, two at a time: 1.73 cores
    assert f["expected_speedup"] >= 1.5


@pytest.mark.parametrize("case", ["timm-cpu-resnet18-j1-64", "lightning-imagenet-cpu"])
def test_a_fix_the_model_is_sure_would_slow_the_job_says_by_how_much(case):
    """A thread cap on 2 CPUs whose whole interval lies below 1.0x: timm's resnet18 at 64 px (one
    worker beside two intra-op threads; the cap priced at the team's CPU-clock samples, e = 0.65) and
    Lightning's ImageNet template with mobilenet_v3_small (two workers re-created each epoch). The
    finding keeps the contract's 1.0x floor (not worth acting on) and says what the fix would cost
    (`expected_change`, in the headline and the text view); the ledger scores that figure, which the
    measured 0.71x and 0.62x match within the band."""
    from trainprobe.agent.combiners import step_model
    from trainprobe.agent.ranking import headline
    from trainprobe.reports.text import Style, render_findings
    from scripts.ledger import _predict_full
    row = next(r for r in measured_rows() if r["case"] == case)
    printed, (lo, hi), how, own = _predict_full(row, step_model.calibration())
    assert own is None and hi < 1.0 and "would slow the job" in how
    assert 0.8 <= printed / row["measured"] <= 1.25
    fs = replay({"bundle": f"bundles/{case}.tar.gz"})["findings"]
    f = next(f for f in fs if f["id"] == "cpu.oversubscribed")
    assert f["expected_speedup"] == 1.0 and f["expected_change"] == printed
    assert f["expected_change_interval"][1] < 1.0
    gains = [x for x in fs if x["id"] != "compute.bound"]
    assert "would slow the job: about" in headline(fs) or gains[0]["id"] != "cpu.oversubscribed"
    assert any("would slow the job" in line for line in render_findings(fs, Style(False)))


def test_a_fix_whose_interval_reaches_a_gain_stays_at_the_floor():
    """MNIST on 2 CPUs, its loader fix with one intra-op thread: the derivation reads 0.75x but its
    interval reaches 1.22x, so the finding says only 1.0x, not worth acting on (the measured 0.60x is
    then outside the band, as printed)."""
    fs = replay({"bundle": "bundles/mnist-cpu-r6.tar.gz"})["findings"]
    f = next(f for f in fs if f["id"] == "dataloader.starved")
    assert f["expected_speedup"] == 1.0 and "expected_change" not in f


def test_a_worker_that_queues_counts_as_busy_so_the_fix_changes_something():
    """timm's EfficientNet-B0 on 2 CPUs: two intra-op threads and one worker that ran 0.098 cores and
    queued 0.07 of the window. Counted idle by its CPU alone, the worker left both CPUs to the team
    and the fix proposed the team's own 2 threads (a change of nothing, printed at 1.02x); as a busy
    thread it leaves one, and the cap to one thread is priced as the loss it is."""
    fs = replay({"bundle": "bundles/timm-cpu-effnet-j1-96.tar.gz"})["findings"]
    f = next(f for f in fs if f["id"] == "cpu.oversubscribed")
    assert f["details"]["proposed_intra_op_threads"] == 1
    assert any(x.get("knobs", {}).get("intra_op_threads") == 1 for x in f["fixes"]), f["fixes"]
    assert f["expected_speedup"] == 1.0


def _row(job):
    return next(p.values[0] for p in ROWS if p.values[0]["job"] == job)


def test_fewer_workers_that_keep_up_are_not_priced_as_the_loops_wait():
    """minGPT's adder on 2 CPUs: 4 workers beside a team of 2 intra-op threads, the loop waiting on
    them 10% of the window. Cutting them to 1 hands no batch over sooner, so the wait stays in the
    step: the second run's window printed 1.14x for it (the first run measured the same fix at
    1.01x). With no CPU left beside the team's compute the workers take theirs from it, and no workers
    at all, the loop loading its cheap in-memory batches, is the fix now, priced at what the team
    loses to them (measured 1.12x in the job's audit). In the third run's window the loop waited 11%
    and fewer workers were no fix; the rule then printed `torch.set_num_threads(2)` on a team of 2
    (1.14x printed, 1.00x measured): a cap that changes nothing is no finding."""
    fs = {f["id"]: f for f in replay(_row("mingpt-adder-cpu-r2"))["findings"]}
    f = fs["cpu.oversubscribed"]
    assert f["fixes"][0]["knobs"] == {"num_workers": 0}
    assert 1.05 <= f["expected_speedup"] <= 1.16
    assert "take their CPU from its intra-op team" in f["fixes"][0]["title"]
    third = replay(_row("mingpt-adder-cpu-r3"))
    assert "cpu.oversubscribed" not in {f["id"] for f in third["findings"]}
    assert any("no thread or worker setting of the job removes the rest" in n for n in third.get("notes", []))


@pytest.mark.parametrize("job", ["mingpt-adder-cpu-r5", "makemore-cpu-r3"])
def test_no_workers_is_priced_at_what_the_team_gets_back(job):
    """minGPT's adder and karpathy's makemore on 2 CPUs: 4 workers over an in-memory data set beside a
    team of 2 intra-op threads that fills both CPUs. The workers' CPU comes out of the team's, so the
    rule prints no workers at all (the loop loads its cheap batches), priced at what the team gets
    back (the step model's workers_to_loop); applied as printed, num_workers=0 measured 1.19x and 1.09x
    (makemore's first audit, under the agent before this fix: 1.14x)."""
    row = _row(job)
    f = next(f for f in replay(row)["findings"] if f["id"] == "cpu.oversubscribed")
    assert f["fixes"][0]["knobs"] == {"num_workers": 0}
    e = row["applied"][0]
    assert e["knobs"] == {"num_workers": 0} and e["measured"] >= 1.05
    assert 0.8 <= f["expected_speedup"] / e["measured"] <= 1.25
    lo, hi = f["expected_speedup_interval"]
    assert lo <= e["measured"] <= hi
    assert "came out of its intra-op team's" in f["speedup_bound"]
