"""The ledger harness (scripts/ledger.py, run as benchmarks/ledger.py) without running its jobs: the fix's knobs become the
job's settings exactly, and the GPU plan covers what the ledger promises."""
import json
import subprocess
import sys

from scripts import ledger
from tests.helpers import DATA, REPO


def test_the_printed_knobs_become_the_jobs_settings():
    before = {"_cpu": True, "num_workers": 0, "sample_work": 1500, "threads": 16}
    after = ledger.apply_knobs(before, {"num_workers": 1, "persistent_workers": True, "intra_op_threads": 2,
                                        "non_blocking": True})
    assert after["num_workers"] == 1 and after["persistent_workers"] is True and after["threads"] == 2
    assert "non_blocking" not in after                     # a CPU job has no device copy to change
    argv = ledger.cpu_argv(after)
    assert argv[argv.index("--num-workers") + 1] == "1" and "--persistent-workers" in argv
    assert argv[argv.index("--threads") + 1] == "2"
    gil = ledger.apply_knobs({"_cpu": True, "gil_spinner": True}, {"background_thread_holds_gil": False})
    assert "--gil-spinner" not in ledger.cpu_argv(gil)
    shard = ledger.apply_knobs({"_cpu": True, "small_files": "/d", "_shard": "/s.bin"}, {"storage": "shards"})
    argv = ledger.cpu_argv(shard)
    assert "--small-files" not in argv and argv[argv.index("--shard") + 1] == "/s.bin"
    gpu = ledger.apply_knobs({"job": "tiny", "item_every": 1}, {"compile": "reduce-overhead"})
    assert json.loads(ledger.gpu_argv(gpu)[-1]) == {"job": "tiny", "item_every": 1, "compile": "reduce-overhead"}


def test_gpu_plan_has_eight_jobs_three_from_open_source_frameworks():
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "ledger.py"), "--kind", "gpu", "--dry-run"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    cases = ledger.gpu_cases()
    assert len(cases) >= 8
    assert {"timm", "hf", "lightning"} <= {c.knobs["job"] for c in cases}
    assert {"host.sync", "host.launch_bound", "h2d.pageable", "dataloader.starved", "compute.bound"} <= \
        {c.expect for c in cases}
    assert r.stdout.count("$ ") == len(cases)


def test_docs_page_is_generated_from_the_raw_json():
    led = json.loads((DATA / "ledger" / "cpu.json").read_text())
    page = ledger.render([led])
    for r in led["rows"]:
        assert r["case"] in page
    assert "Top-1 correct" in page
