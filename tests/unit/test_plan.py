"""The report's plan: fixes that interact, applied together, lead the headline."""
from trainprobe.agent.ranking import headline
from trainprobe.agent.report import change_of


def test_the_headline_leads_with_the_plan():
    top = {"id": "dataloader.starved", "expected_speedup": 1.01, "expected_speedup_interval": [1.0, 1.1],
           "confidence": "medium", "title": "The training loop loads its own batches 61% of the time"}
    plan = {"findings": ["dataloader.starved"], "knobs": {"num_workers": 1, "intra_op_threads": 1},
            "expected_speedup": 1.44, "interval": [1.2, 1.7], "binding": "loop",
            "binding_words": "the loop's own work"}
    line = headline([top], plan)
    assert line.startswith("Plan: apply num_workers=1, intra_op_threads=1 together") and "1.44x" in line
    assert headline([top]).startswith("No fix here")     # without a plan: the finding's own number


def test_a_plan_under_the_small_gain_threshold_does_not_lead():
    top = {"id": "host.sync", "expected_speedup": 1.3, "expected_speedup_interval": [1.1, 1.5],
           "confidence": "high", "title": "t"}
    plan = {"findings": ["host.sync"], "knobs": {"item_every": 100}, "expected_speedup": 1.05,
            "interval": [1.0, 1.1], "binding": "data"}
    assert headline([top], plan).startswith("Top fix: host.sync")


def test_fix_knobs_map_to_the_step_models_changes():
    ch = change_of("dataloader.starved", {"num_workers": 3, "intra_op_threads": 1, "pin_memory": True,
                                          "persistent_workers": True})
    assert (ch.workers, ch.intra_threads, ch.pin_memory, ch.persistent) == (3, 1, True, True)
    assert change_of("host.sync", {"item_every": 100}).sync_removed
    assert change_of("gil.contention", {}) is None      # no step model in its details


def test_gil_and_contention_fixes_join_the_plan_from_their_details():
    from trainprobe.agent.findings import Finding
    gil = Finding("gil.contention", "t", 2.0, "b", "medium", [], [], details={"step_model": {
        "change": {"gil_step": [0.3, 0.5, 0.8], "gil_freed_cores": 0.9}}})
    ch = change_of("gil.contention", {}, gil)
    assert ch.gil_step == (0.3, 0.5, 0.8) and ch.gil_freed_cores == 0.9
    con = Finding("cpu.contended", "t", 1.5, "b", "medium", [], [], details={"step_model": {
        "change": {"others_removed": [0.4, 0.1]}}})
    assert change_of("cpu.contended", {}, con).others_removed == (0.4, 0.1)
    bare = Finding("cpu.contended", "t", 1.5, "b", "medium", [], [])
    assert change_of("cpu.contended", {}, bare) is None


def test_short_steps_get_the_file_name_hand_off_and_long_ones_do_not():
    # Real captures of public jobs on 2 CPUs (tests/data/ledger/public): Lightning's backbone classifier
    # at about 6 ms steps and the VAE at about 20 ms, both loading their own batches. The per-batch
    # hand-off is a fixed cost a batch: the fix hands batches over by file name only on the short steps.
    from tests.helpers import DATA
    from trainprobe.agent import bundle as bundle_mod
    from trainprobe.agent.diagnosis import evidence_from
    from trainprobe.agent.report import diagnose, fix_knobs
    got = {}
    for job in ("lightning-backbone-cpu-r8", "vae-cpu-r5"):
        b = bundle_mod.load(str(DATA / "ledger" / "public" / "bundles" / f"{job}.tar.gz"))
        fs, _ = diagnose(evidence_from(b.captures, b.context))
        f = next(x for x in fs if x.id == "dataloader.starved")
        got[job] = (fix_knobs(f), f)
    knobs, f = got["lightning-backbone-cpu-r8"]
    assert knobs.get("sharing_strategy") == "file_system" and knobs["num_workers"] == 1
    fix = next(x for x in f.fixes if (x.knobs or {}).get("sharing_strategy"))
    assert "set_sharing_strategy(\"file_system\")" in fix.change and "/dev/shm" in fix.title
    assert "by file name" in f.speedup_bound
    assert "sharing_strategy" not in got["vae-cpu-r5"][0]
    ch = change_of("dataloader.starved", knobs)
    assert ch.sharing_fs and not change_of("dataloader.starved", got["vae-cpu-r5"][0]).sharing_fs
