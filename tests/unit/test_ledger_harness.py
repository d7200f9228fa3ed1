"""The ledger harness (scripts/ledger.py, run as benchmarks/ledger.py) without running its jobs: the fix's knobs become the
job's settings exactly, and the GPU plan covers what the ledger promises."""
import json
import subprocess
import sys

import pytest

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


def _run_injected(tmp_path, script, knobs, **extra_env):
    """Run SCRIPT with benchmarks/inject/sitecustomize.py first on its path and KNOBS applied: the
    finished process and the injection's log file."""
    log = tmp_path / "inject.log"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "benchmarks" / "inject"),
           "TRAINPROBE_LEDGER_KNOBS": json.dumps(knobs), "TRAINPROBE_LEDGER_LOG": str(log), **extra_env}
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120), log


def test_compile_is_applied_to_the_module_each_optimizer_trains(tmp_path):
    # benchmarks/inject/sitecustomize.py on a real torch process: a script that compiles nothing
    # gets the printed `torch.compile(model, mode=...)` as nn.Module.compile on the model its
    # optimizer trains (not a wrapper around it), and a GAN's two models each get theirs.
    script = tmp_path / "job.py"
    script.write_text(
        "import torch\n"
        "class Wrap(torch.nn.Module):\n"
        "    def __init__(self, m):\n"
        "        super().__init__(); self.inner = m\n"
        "net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))\n"
        "w = Wrap(net)\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "g, d = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)\n"
        "gan = Wrap(torch.nn.ModuleList([g, d]))\n"
        "og, od = torch.optim.Adam(g.parameters()), torch.optim.Adam(d.parameters())\n"
        "for o in (opt, og, od):\n"
        "    o.step()\n"
        "print(' '.join(str(m._compiled_call_impl is not None) for m in (net, w, g, d, gan)))\n")
    r, log = _run_injected(tmp_path, script, {"compile_models": "reduce-overhead"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True", "False", "True", "True", "False"], r.stdout
    assert log.read_text().count("compiled ") == 3


def test_loader_knobs_go_to_the_loaders_the_training_loop_iterates(tmp_path):
    # benchmarks/inject/sitecustomize.py on a real torch process: a script that builds and iterates
    # its evaluation loader first (Lightning's sanity check), under no_grad, then one training loader
    # per fold (Fabric's k-fold example): the printed DataLoader knobs go to every training loader,
    # and the evaluation loaders stay as built.
    script = tmp_path / "job.py"
    script.write_text(
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "ds = TensorDataset(torch.arange(8.0))\n"
        "def run(dl):\n"
        "    n = sum(1 for _ in dl)\n"
        "    return f'{dl.num_workers}/{dl.persistent_workers}/{n}'\n"
        "out = []\n"
        "with torch.no_grad():\n"
        "    out.append(run(DataLoader(ds, batch_size=4)))\n"
        "for fold in range(2):\n"
        "    train = DataLoader(ds, batch_size=2)\n"
        "    out.append(run(train)); out.append(run(train))\n"
        "    with torch.inference_mode():\n"
        "        out.append(run(DataLoader(ds, batch_size=4)))\n"
        "print(' '.join(out))\n")
    r, log = _run_injected(tmp_path, script, {"num_workers": 1, "persistent_workers": True})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["0/False/2", "1/True/4", "1/True/4", "0/False/2",
                                "1/True/4", "1/True/4", "0/False/2"], r.stdout
    text = log.read_text()
    assert text.count("iterated with autograd on") == 2 and text.count("left as built") == 3, text


def test_a_library_that_asks_whether_torch_is_installed_does_not_hide_its_import(tmp_path):
    # transformers, datasets and accelerate call importlib.util.find_spec("torch") before they import
    # it: that probe must not use up the hook, or the Trainer's loaders keep their settings and no
    # step is counted (run_clm.py's first run here counted none).
    script = tmp_path / "job.py"
    script.write_text(
        "import importlib.util\n"
        "assert importlib.util.find_spec('torch') is not None\n"
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "dl = DataLoader(TensorDataset(torch.arange(4.0)), batch_size=2)\n"
        "p = torch.zeros(1, requires_grad=True)\n"
        "opt = torch.optim.SGD([p], lr=0.1)\n"
        "for (x,) in dl:\n"
        "    (p * x.sum()).sum().backward(); opt.step()\n"
        "print(dl.num_workers)\n")
    progress = tmp_path / "progress"
    r, log = _run_injected(tmp_path, script, {"num_workers": 1}, TRAINPROBE_LEDGER_PROGRESS=str(progress))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["1"], r.stdout
    assert progress.read_text().split()[1] == "1"      # the first step is written at once
    assert "iterated with autograd on" in log.read_text()


def test_a_compile_applied_to_the_optimizers_modules_is_the_printed_compile():
    # the measured row is evaluated at what was applied: compile_models is the printed compile
    got = ledger.applied_knobs({}, {"injected": {"compile_models": "reduce-overhead", "num_workers": 2}})
    assert got == {"compile": "reduce-overhead", "num_workers": 2}


def test_public_rows_measured_on_another_card_say_which():
    # The public GPU ledger joins runs of several machines: a row from a card other than its
    # section's (the H200's) carries the card after the job's name in the rendered tables.
    import importlib.util
    spec = importlib.util.spec_from_file_location("public_ledger", REPO / "benchmarks" / "public_ledger.py")
    public_ledger = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("public_ledger", public_ledger)     # its dataclasses look their module up
    spec.loader.exec_module(public_ledger)
    led = json.loads((DATA / "ledger" / "public" / "public-ledger-gpu.json").read_text())
    page = public_ledger.render([led])
    others = [r["job"] for r in led["rows"] if r.get("gpu") and r["gpu"] != led["meta"]["gpu"]]
    assert others, "no row from another card"
    for job in others:
        assert f"| {job} (NVIDIA H100 80GB HBM3) |" in page
    same = next(r["job"] for r in led["rows"] if r.get("gpu") == led["meta"]["gpu"] or not r.get("gpu"))
    assert f"| {same} |" in page


def test_an_abstention_is_measured_and_counted():
    # Where the report prints no fix worth acting on, the harness measures its best fix as worded
    # (variant "abstained"): mnist_rnn on 2 CPUs, rated 1.00x behind compute.bound, measured 1.41x.
    # The page labels the row, the summary lists the gain left out, and the held-out rows include it.
    import importlib.util
    from pathlib import Path

    from scripts.ledger import measured_rows
    spec = importlib.util.spec_from_file_location("public_ledger", REPO / "benchmarks" / "public_ledger.py")
    public_ledger = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("public_ledger", public_ledger)
    spec.loader.exec_module(public_ledger)
    path = DATA / "ledger" / "public" / "public-ledger-cpu.json"
    led = json.loads(path.read_text())
    row = next(r for r in led["rows"] if r["job"] == "mnist-rnn-cpu-r8")
    assert row["top"] == "compute.bound" and row["applied"][0]["variant"] == "abstained"
    summ = public_ledger.summary(led["rows"])
    assert "mnist-rnn-cpu-r8" in summ["abstained_gains_left_out"]
    assert "vae-cpu-r8" not in summ["abstained_gains_left_out"]          # 0.95x: a right abstention
    assert "[no fix printed; dataloader.starved's, measured]" in public_ledger.render([led])
    rows = [r for r in measured_rows([Path(path)]) if r["case"] == "mnist-rnn-cpu-r8"]
    assert len(rows) == 1 and rows[0]["finding"] == "dataloader.starved" and rows[0]["measured"] > 1.3


def test_the_held_out_page_counts_the_fixes_below_the_reports_limit():
    """A fix held out below the report's limit is one the report says is not worth acting on: the page
    says how many of those measured no gain, and names each that did gain."""
    from scripts.ledger import render_heldout

    def row(case, pred, meas):
        return {"case": case, "source": "public-ledger-cpu.json", "finding": "dataloader.starved",
                "knobs": {"num_workers": 1}, "predicted": pred, "interval": [pred * 0.8, pred * 1.3],
                "measured": meas, "ratios": [meas], "ratio": round(pred / meas, 3),
                "in_interval": True, "fitted": {}, "priors": []}
    rows = [row("a", 1.5, 1.4), row("b", 1.0, 0.8), row("c", 1.05, 1.3), row("d", 1.02, 1.01)]
    res = {"rows": rows, "summary": {"rows": 4, "median_abs_log": 0.1, "median_ratio": 1.0, "within_band": 3,
                                     "in_interval": 4}, "jobs": []}
    text = render_heldout(res, "cmd")
    line = next(x for x in text.splitlines() if x.startswith("Below the limit"))
    assert "3 of 4 measured fixes" in line and "measured below 1.05x: 2 of them" in line
    assert "gains it left out: c 1.05x for 1.30x" in line
    worth = next(x for x in text.splitlines() if x.startswith("Worth acting on"))
    assert "1 of 4" in worth
    # The public runs whose window timed the step are summarized apart (the agent as it ships).
    rows[0]["step_timed"] = rows[2]["step_timed"] = True
    timed = next(x for x in render_heldout(res, "cmd").splitlines() if x.startswith("Public code, the runs whose"))
    assert timed.split(":")[1].startswith(" 2;") and "within 0.8-1.25x: 2 of 2" in timed


def test_a_job_whose_latest_run_printed_no_fix_leaves_the_latest_runs_count(tmp_path):
    """The agent as it ships, job by job: a job measured with a fix and diagnosed again later with no
    fix printed is an abstention now; its earlier fix leaves the latest runs' count and is named."""
    from scripts.ledger import latest_abstentions, render_heldout

    led = tmp_path / "public-ledger-gpu.json"
    led.write_text(json.dumps({"rows": [
        {"job": "gan", "status": "measured"}, {"job": "gan-r2", "status": "no fix printed"},
        {"job": "mnist", "status": "no fix printed"}, {"job": "mnist-r2", "status": "measured"},
        {"job": "vae", "status": "no fix printed"}, {"job": "vae-r2", "error": "start timed out"},
        # printed none live, but its bundle re-diagnosed rates a fix worth acting on: not an abstention
        {"job": "siamese", "status": "no fix printed", "replay_findings": [
            {"id": "host.launch_bound", "expected_speedup": 1.4}, {"id": "compute.bound", "expected_speedup": 1.0}]}]}))
    assert latest_abstentions([led]) == {("public-ledger-gpu.json", "gan"): "gan-r2",
                                         ("public-ledger-gpu.json", "vae"): "vae"}

    def row(case, pred, meas):
        return {"case": case, "source": "public-ledger-gpu.json", "finding": "dataloader.starved",
                "knobs": {"num_workers": 1}, "predicted": pred, "interval": [pred * 0.8, pred * 1.3],
                "measured": meas, "ratios": [meas], "ratio": round(pred / meas, 3),
                "in_interval": True, "fitted": {}, "priors": []}
    res = {"rows": [row("gan", 1.13, 0.98), row("mnist-r2", 1.9, 2.5)],
           "summary": {"rows": 2, "median_abs_log": 0.1, "median_ratio": 1.0, "within_band": 1, "in_interval": 2},
           "jobs": [], "latest_abstained": latest_abstentions([led])}
    line = next(x for x in render_heldout(res, "cmd").splitlines() if x.startswith("Each job's latest run"))
    assert line.startswith("Each job's latest run: 1 jobs, 1 with") and "measured >= 1.05x: 1 of them." in line
    assert "Left out, as the job's latest run printed no fix: gan-r2 (measured before: gan)." in line


def test_a_row_knows_whether_its_window_timed_the_step():
    # mnist_rnn's eighth run was diagnosed with the backward-pass counter; the VAE's first run predates it.
    from scripts.ledger import _step_timed
    pub = DATA / "ledger" / "public" / "bundles"
    assert _step_timed({"bundle": pub / "mnist-rnn-cpu-r8.tar.gz"}) is True
    assert _step_timed({"bundle": pub / "vae-cpu.tar.gz"}) is False
    assert _step_timed({"bundle": None}) is False


def test_the_sharing_strategy_knob_sets_how_workers_hand_tensors_over(tmp_path):
    # benchmarks/inject/sitecustomize.py on a real torch process: the knob reaches the job's torch
    # before the script runs, and a worker's batch then arrives by shared-memory file name.
    script = tmp_path / "job.py"
    script.write_text(
        "import torch\n"
        "import torch.multiprocessing as tmp\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "ds = TensorDataset(torch.arange(8.0))\n"
        "n = sum(len(b[0]) for b in DataLoader(ds, batch_size=2, num_workers=1))\n"
        "print(tmp.get_sharing_strategy(), n)\n")
    r, log = _run_injected(tmp_path, script, {"sharing_strategy": "file_system"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["file_system", "8"], r.stdout
    assert "set_sharing_strategy('file_system')" in log.read_text()


def test_an_audit_of_a_bare_compute_bound_report_is_kept_apart():
    # Where the report lists no fix at all (compute.bound alone), generic fixes measured by
    # benchmarks/public_knobs.py join the ledger as "audited": each beside the step model's figure,
    # listed in the summary, and left out of the held-out rows (no prediction the report made).
    import importlib.util
    from pathlib import Path

    from scripts.ledger import measured_rows
    for name in ("public_ledger", "public_knobs"):
        spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules.setdefault(name, mod)
        spec.loader.exec_module(mod)
    public_ledger, public_knobs = sys.modules["public_ledger"], sys.modules["public_knobs"]
    path = DATA / "ledger" / "public" / "public-ledger-cpu.json"
    led = json.loads(path.read_text())
    row = next(r for r in led["rows"] if r["job"] == "siamese-cpu-r2")
    assert row["top"] == "compute.bound" and {e["variant"] for e in row["applied"]} == {"audited"}
    summ = public_ledger.summary(led["rows"])
    assert {a["job"] for a in summ["audited"]} >= {"siamese-cpu-r2", "superres-cpu-r2"}
    # the one gain of 1.05x or more an audit found where the report printed no fix: one DataLoader
    # worker for transformers' Trainer on 2 CPUs, 1.075x (1.03-1.09x) in its first audit and 1.03x
    # (0.99-1.08x) in its second, beside a no-op arm at 0.99x
    assert summ["audited_gains_left_out"] == ["hf-clm-cpu-r2"]
    assert not [r for r in measured_rows([Path(path)]) if r["case"] == "siamese-cpu-r2"]
    # A run whose report listed a fix below the limit keeps only the arm that applies it, as abstained.
    res = {"job": {"job": "x"}, "headline": "", "plan": None, "base_rates": [1.0], "wall_s": 1, "when": "w",
           "machine": {"gpu": None}, "command": "python benchmarks/public_knobs.py --job x --out /tmp/k --arms a",
           "findings": [{"id": "compute.bound", "expected_speedup": 1.0, "knobs": {}},
                        {"id": "dataloader.starved", "expected_speedup": 1.0, "interval": [0.4, 1.4],
                         "knobs": {"num_workers": 1}}],
           "arms": [{"arm": a, "knobs": k, "injected": k, "argv_added": [], "model": {"speedup": 0.9, "interval": [0.8, 1]},
                     "ratios": [1.4], "measured": 1.4, "measured_interval": [1.3, 1.5]}
                    for a, k in (("cap", {"intra_op_threads": 1}), ("fix", {"num_workers": 1}))]}
    got = public_knobs.ledger_row(res, "x-r2", "bundles/x-r2.tar.gz")
    assert [(e["variant"], e["arm"], e["finding"]) for e in got["applied"]] == [("abstained", "fix", "dataloader.starved")]
    assert got["measured_by"].endswith("--out DIR --arms a")
    # The top finding worth acting on, applied as printed by an arm: a measured top fix.
    res["findings"] = [{"id": "host.launch_bound", "expected_speedup": 1.9, "interval": [1.4, 3.0],
                        "knobs": {"num_workers": 1}}]
    got = public_knobs.ledger_row(res, "x-r2", "bundles/x-r2.tar.gz")
    assert [(e["variant"], e["finding"], e["predicted"]) for e in got["applied"]] == [("top", "host.launch_bound", 1.9)]
    assert public_ledger.primary(got)["measured"] == 1.4


def test_the_pooled_ratio_follows_where_a_phase_lands_in_few_windows():
    # pytorch/examples ImageNet on JPEGs (H100): three fixed windows ran 28-29 steps/s, one caught
    # the validation pass (4.8): the median ratio is 6.07x, every window's steps together 4.95x.
    import importlib.util
    spec = importlib.util.spec_from_file_location("public_ledger", REPO / "benchmarks" / "public_ledger.py")
    public_ledger = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("public_ledger", public_ledger)
    spec.loader.exec_module(public_ledger)
    led = json.loads((DATA / "ledger" / "public" / "public-ledger-gpu.json").read_text())
    row = next(r for r in led["rows"] if r["job"] == "imagenet-jpeg-j2-r3")
    assert round(public_ledger.pooled_ratio(row["before"], row["applied"][0]["after"]), 2) == 4.95
    assert public_ledger.pooled_ratio([], [1.0]) is None and public_ledger.pooled_ratio([1.0], [1.0, 2.0]) is None
    page = public_ledger.render([led])
    line = next(x for x in page.splitlines() if x.startswith("| imagenet-jpeg-j2-r3 "))
    assert "; pooled 4.95x |" in line
    steady = next(x for x in page.splitlines() if x.startswith("| imagenet-dummy-j2-r3 "))
    assert "pooled" not in steady                     # within 15% of its median: nothing added


def test_the_agent_a_ledger_run_diagnoses_with_has_bytecode(tmp_path, monkeypatch):
    """A frozen copy has no bytecode and the ledger's machines set PYTHONDONTWRITEBYTECODE: the
    harness compiles it once, so each diagnosis starts up as an installed agent does and its plan
    records the machine's speed (agent/cost.py: startup_speed is None after a start-up that compiled)."""
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "mod.py").write_text("X = 1\n")
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    ledger.bytecode_ready(tmp_path)
    assert list((tmp_path / "agent" / "__pycache__").glob("mod.*.pyc"))


def test_repeatability_bounds_a_run_by_the_jobs_other_runs():
    """A job measured three times with one fix: each run against the geometric mean of the other two;
    a job measured once, or with another fix, is not a repeat."""
    import math

    from scripts.ledger import render_heldout, repeatability

    def row(case, pred, meas, knobs=None):
        return {"case": case, "source": "public-ledger-cpu.json", "finding": "dataloader.starved",
                "knobs": knobs or {"num_workers": 1}, "predicted": pred, "interval": [pred * 0.8, pred * 1.3],
                "measured": meas, "ratios": [meas], "ratio": round(pred / meas, 3),
                "in_interval": True, "fitted": {}, "priors": []}
    rows = [row("job", 1.0, 1.0), row("job-r2", 1.0, 1.5), row("job-r3", 1.3, 1.5),
            row("other", 2.0, 2.0), row("job-r4", 1.2, 1.2, {"num_workers": 2})]
    rep = repeatability(rows)
    assert rep["rows"] == 3 and rep["jobs_3plus"] == 1
    # run 1: 1.5 / 1.0 out of the band; runs 2 and 3: sqrt(1.5) / 1.5 = 0.816, inside
    assert rep["oracle"]["within_band"] == 2 and rep["model"]["within_band"] == 2
    assert math.isclose(rep["measured_sd_log"], round(math.sqrt(3) * math.log(1.5) / 3, 3), abs_tol=1e-3)
    assert repeatability([row("alone", 1.0, 1.0)]) is None
    res = {"rows": rows, "summary": {"rows": 5, "median_abs_log": 0.1, "median_ratio": 1.0, "within_band": 4,
                                     "in_interval": 5}, "jobs": []}
    line = next(x for x in render_heldout(res, "cmd").splitlines() if x.startswith("Repeatability"))
    assert "within 0.8-1.25x 2 of 3" in line and "the same runs: 2 of 3" in line


def test_window_spread_reads_a_windows_finding_and_its_step_model():
    from scripts import window_spread as ws
    rep = {"findings": [{"id": "compute.bound", "expected_speedup": 1.0, "details": {}},
                        {"id": "dataloader.starved", "expected_speedup": 1.0, "expected_speedup_interval": [0.4, 1.4],
                         "details": {"step_model": {"f_load": 0.25, "C": 0.75, "after": {"step": 1.25}}}}]}
    row = ws.window_row(rep, None)
    assert row["top"] == "compute.bound" and row["finding"] == "dataloader.starved"
    assert row["model_speedup"] == 0.8 and row["f_load"] == 0.25 and row["expected_speedup"] == 1.0
    s = ws.spread([1.0, 1.21, None])
    assert s["n"] == 2 and s["geomean"] == 1.1 and s["min"] == 1.0 and s["max"] == 1.21


def test_a_later_run_joins_the_kept_ledger_as_a_rerun():
    """benchmarks/public_ledger.py --to-tests --append: a job already kept gets JOB-rN (the next free
    N), a new job its own name; the run's meta joins the kept runs, its bundle is renamed with it."""
    from scripts.ledger import append_runs, job_of, rerun_name

    assert rerun_name("gan", {"vae"}) == "gan"
    assert rerun_name("gan", {"gan", "gan-r2", "gan-r4"}) == "gan-r3"
    meta = {"kind": "gpu", "command": "first", "wall_s": 10.0, "gpu": "H200"}
    led = {"meta": dict(meta), "rows": [{"job": "gan", "bundle": "bundles/gan.tar.gz"},
                                        {"job": "gan-r2", "bundle": "bundles/gan-r2.tar.gz"}]}
    new = {"meta": {"kind": "gpu", "command": "later", "wall_s": 5.0, "gpu": "H100"},
           "rows": [{"job": "gan", "bundle": "bundles/gan.tar.gz"}, {"job": "vae", "bundle": None}]}
    assert append_runs(led, new) == [("gan", "gan-r3"), ("vae", "vae")]
    assert [r["job"] for r in led["rows"]] == ["gan", "gan-r2", "gan-r3", "vae"]
    assert led["rows"][2]["bundle"] == "bundles/gan-r3.tar.gz" and led["rows"][2]["gpu"] == "H100"
    assert led["rows"][3]["bundle"] is None and job_of("gan-r3") == "gan"
    assert [m["command"] for m in led["meta"]["runs"]] == ["first", "later"]
    assert led["meta"]["command"] == "first; later" and led["meta"]["wall_s"] == 15.0


def test_a_job_of_several_training_processes_is_timed_file_by_file():
    """Each training process writes its own progress file, stamped with its own writes' times: the
    job's rate over a window is the sum of each file's rate over its own first and last write, not
    the summed count between the window's first and last point, which may come from two files a
    moment apart (a window of a 250 steps/s job once read 4,706)."""
    import importlib.util
    import time as time_mod
    spec = importlib.util.spec_from_file_location("public_ledger", REPO / "benchmarks" / "public_ledger.py")
    public_ledger = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("public_ledger", public_ledger)
    spec.loader.exec_module(public_ledger)

    class Running:
        def poll(self):
            return None
    job = object.__new__(public_ledger.PublicProc)
    now = time_mod.time()
    # rank a: 100 steps/s from now + 0.1 s; rank b: 100 steps/s, its writes 0.05 s later
    job.file_points = {".progress.1": [(now + 0.1 + 0.2 * i, 1000 + 20 * i) for i in range(6)],
                       ".progress.2": [(now + 0.15 + 0.2 * i, 2000 + 20 * i) for i in range(6)]}
    job.points, job.longest, job.proc, job.tail = [], 5.0, Running(), []
    assert job.rate(0.0) == pytest.approx(200.0)
