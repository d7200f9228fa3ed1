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
