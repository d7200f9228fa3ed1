"""pytorch/examples' mnist_hogwild on 2 CPUs, as the public ledger ran it: two training processes the
script spawns (no launcher, no LOCAL_RANK, no torch.distributed), each with torch's default two
intra-op threads. Until 2026-12-07 trainprobe took them for DataLoader workers of the idle parent and
said "nothing to fix" (pointed at the parent), or blamed the sibling as another job's process and
printed `renice` for it (pointed at a child). The capped job measured 3.4x and 8.8x."""
from trainprobe.agent import bundle as bundle_mod
from trainprobe.agent.diagnosis import evidence_from
from trainprobe.agent.report import diagnose, target_facts

from tests.helpers import DATA

BUNDLES = [DATA / "ledger" / "public" / "bundles" / name for name in ("hogwild-cpu.tar.gz", "hogwild-cpu-r2.tar.gz")]


def _ev(path):
    b = bundle_mod.load(str(path))
    return evidence_from(b.captures, b.context)


def test_the_spawned_processes_are_ranks_that_step_on_their_own():
    for path in BUNDLES:
        ev = _ev(path)
        roles = {p["pid"]: p["role"] for p in ev.get("process")["processes"]}
        assert sorted(roles.values()).count("rank") == 2, roles
        assert "dataloader_worker" not in roles.values()       # the resource tracker is a "child"
        findings, _ = diagnose(ev)
        assert not any("straggler" in f.title for f in findings)
        assert any("step on their own" in n for n in ev.notes)
        assert len(target_facts(ev)["ranks"]) == 2


def test_the_top_fix_caps_every_rank_at_one_thread_priced_by_its_teams_spin():
    for path in BUNDLES:
        ev = _ev(path)
        findings, _ = diagnose(ev)
        top = findings[0]
        assert top.id == "cpu.oversubscribed", [(f.id, f.expected_speedup) for f in findings]
        fix = top.fixes[0]
        assert fix.knobs == {"intra_op_threads": 1} and "each of the 2 training processes" in fix.title
        assert "OMP_NUM_THREADS=1" in (fix.command or "")
        d = top.details["step_model"]
        assert d["runtime_share"] > 0.3 and len(d["ranks"]) == 2     # their teams spun at OpenMP's barriers
        lo, hi = top.interval
        assert 1.5 < lo < top.expected_speedup < hi
        assert "OpenMP runtime" in top.speedup_bound


def test_on_16_cpus_every_rank_keeps_half_the_cpus_and_the_spin_prices_it():
    """The same script on the GPU node's 16 CPUs (2 processes x 16 threads): every thread spun 94% of
    its CPU in the OpenMP runtime; the cap to 8 threads a process measured 32.98x, where the
    one-thread form's fallback (the switch-rate model) printed 1.01x (18.56x now)."""
    ev = _ev(DATA / "ledger" / "public" / "bundles" / "hogwild-cpu-r3.tar.gz")
    findings, _ = diagnose(ev)
    top = findings[0]
    assert top.id == "cpu.oversubscribed" and top.fixes[0].knobs == {"intra_op_threads": 8}
    d = top.details["step_model"]
    assert d["runtime_share"] > 0.9 and d["threads_per_rank"] == 8 and d["cores_per_rank"] == 8
    lo, hi = top.interval
    assert 10 < top.expected_speedup and lo <= 32.98 <= hi


def test_a_ddp_rank_started_by_mp_spawn_is_a_rank_that_steps_in_lockstep():
    """pytorch/examples' ImageNet script with --multiprocessing-distributed on an H100 (torch 2.11): its
    DDP rank is a spawned child of the script, its two DataLoader workers spawned children of the rank
    that name themselves pt_data_worker; the rank runs DistributedDataParallel, so it steps with the
    others (none here). Its loader fix printed 5.83x and measured 5.64x."""
    ev = _ev(DATA / "ledger" / "public" / "bundles" / "imagenet-dummy-j2-mpd.tar.gz")
    roles = sorted(p["role"] for p in ev.get("process")["processes"])
    assert roles == ["child", "dataloader_worker", "dataloader_worker", "main", "rank"], roles
    assert ev.get("pyspy")["launcher"] is True
    from trainprobe.agent.combiners.training_ranks import lockstep
    assert lockstep(ev)
    findings, _ = diagnose(ev)
    assert findings[0].id == "dataloader.starved" and findings[0].expected_speedup > 3


def test_lightning_ddp_spawn_ranks_at_one_thread_get_no_thread_cap():
    """Lightning's backbone classifier with `--trainer.strategy=ddp_spawn --trainer.devices=2` on 2 CPUs:
    two DDP ranks (gloo) spawned by Lightning, which sets one intra-op thread a rank; each rank's other
    busy threads are gloo's and ran no OpenMP code. An earlier form of the rule counted them as a team
    and the ranks' collective waits as CPU they would get, and rated a cap that changes nothing 1.73x."""
    ev = _ev(DATA / "spawned" / "lightning-ddp-spawn-cpu.tar.gz")
    roles = [p["role"] for p in ev.get("process")["processes"]]
    assert roles.count("rank") == 2 and "dataloader_worker" not in roles
    from trainprobe.agent.combiners.training_ranks import lockstep
    assert lockstep(ev)                       # DistributedDataParallel's frames in the ranks' samples
    findings, _ = diagnose(ev)
    assert all(f.id != "cpu.oversubscribed" or f.expected_speedup < 1.1 for f in findings), \
        [(f.id, f.expected_speedup) for f in findings]
    # a worker a rank would share the rank's one CPU: no fix worth acting on (0.80x measured)
    starved = next(f for f in findings if f.id == "dataloader.starved")
    assert starved.expected_speedup < 1.1 and findings[0].expected_speedup < 1.1


def test_workers_forked_by_ddp_spawn_ranks_are_workers_not_ranks():
    """The same job with a DataLoader worker a rank: Lightning sets LOCAL_RANK in each rank's os.environ
    after the rank started, so /proc shows it in the workers the rank forks but not in the rank's own
    start-up environment. The workers name themselves pt_data_worker: they are workers (until
    2026-12-07 the process and placement probes counted four ranks)."""
    ev = _ev(DATA / "spawned" / "lightning-ddp-spawn-workers-cpu.tar.gz")
    rows = ev.get("process")["processes"]
    workers = [p for p in rows if p["role"] == "dataloader_worker"]
    assert len([p for p in rows if p["role"] == "rank"]) == 2 and len(workers) == 2
    assert all(p["env"].get("LOCAL_RANK") is not None for p in workers)
    placed = {p["pid"]: p["role"] for p in ev.get("placement")["processes"]}
    assert sorted(placed[p["pid"]] for p in workers) == ["dataloader_worker", "dataloader_worker"]
    assert len(target_facts(ev)["ranks"]) == 2


def test_a_ranks_step_is_timed_by_its_own_backward_passes():
    """Lightning's ddp_spawn ranks on 2 CPUs, each loading its own batches (num_workers=0) in steps of
    about 8 ms: the process probe counts each rank's backward passes on its main thread, so the step
    model charges a worker's per-batch hand-off, which at that step length costs more than the loading
    it moves (a worker a rank measured 0.80x; the untimed window printed 1.24x)."""
    from trainprobe.agent.combiners import step_model
    ev = _ev(DATA / "spawned" / "lightning-ddp-spawn-timed-cpu.tar.gz")
    ranked = [p for p in ev.get("process")["processes"] if p["role"] == "rank"]
    assert len(ranked) == 2 and all(p["backward"]["calls"] >= 100 for p in ranked)
    m = step_model.from_evidence(ev)
    assert m is not None and m.ranks == 2 and 0.004 < m.step_s < 0.02
    findings, _ = diagnose(ev)
    starved = next(f for f in findings if f.id == "dataloader.starved")
    assert starved.expected_speedup < 1.1, starved.expected_speedup
