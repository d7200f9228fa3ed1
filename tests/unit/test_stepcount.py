"""The step counter's symbol lookup (probes/support/stepcount.py) on real shared libraries, and the
step model's per-batch hand-off term."""
import os
import re
import shutil
import subprocess

import pytest

from trainprobe.agent.combiners import step_model
from trainprobe.agent.combiners.step_model import Change, StepModel
from trainprobe.probes.support import stepcount


def _nm_offset(path: str, name: str) -> int:
    """nm's address of `name`, as a file offset (readelf's program headers)."""
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True, check=True).stdout
    addr = next(int(line.split()[0], 16) for line in out.splitlines() if line.split()[-1].split("@")[0] == name)
    ph = subprocess.run(["readelf", "-lW", path], capture_output=True, text=True, check=True).stdout
    for line in ph.splitlines():
        f = line.split()
        if f and f[0] == "LOAD":
            off, vaddr, filesz = int(f[1], 16), int(f[2], 16), int(f[4], 16)
            if vaddr <= addr < vaddr + filesz:
                return addr - vaddr + off
    raise AssertionError("no segment")


def _libc() -> str:
    for line in open("/proc/self/maps"):
        p = line.split()
        if len(p) == 6 and re.search(r"/libc[.-]", p[5]):
            return p[5]
    pytest.skip("no libc mapping")


@pytest.mark.skipif(not shutil.which("nm") or not shutil.which("readelf"), reason="binutils' nm and readelf")
def test_the_symbol_offset_is_nms_address_in_the_file():
    libc = _libc()
    assert stepcount.symbol_offset(libc, b"malloc_usable_size\0") == _nm_offset(libc, "malloc_usable_size")


@pytest.mark.skipif(not shutil.which("nm") or not shutil.which("readelf"), reason="binutils' nm and readelf")
def test_torchs_engine_execute_is_found_by_its_names_prefix():
    torch = pytest.importorskip("torch")
    lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
    name = next(line.split()[-1] for line in out.splitlines()
                if line.split()[-1].startswith(stepcount.ENGINE_EXECUTE.decode()))
    assert stepcount.symbol_offset(lib) == _nm_offset(lib, name)


def test_a_name_no_library_has_is_none():
    assert stepcount.symbol_offset(_libc(), b"_ZN5torch_not_here") is None


def test_the_library_is_found_among_executable_mappings_only():
    maps = ("7f00-7f10 r--p 0 08:01 1 /v/torch/lib/libtorch_cpu.so\n"
            "7f10-7f90 r-xp 10 08:01 1 /v/torch/lib/libtorch_cpu.so\n")
    assert stepcount.library_path(maps) == "/v/torch/lib/libtorch_cpu.so"
    assert stepcount.library_path(maps.replace("r-xp", "r--p")) is None


def _loading_loop(step_s):
    """A loop that loads its batches itself 52% of the step on 2 CPUs, one intra-op thread."""
    m = StepModel(f_wait=0.0, f_load=0.52, pid=1, n_samples=500.0)
    m.p = m.p_allowed = 2.0
    m.u, m.d, m.d_inloop, m.loop_cores, m.threads_busy = 1.0, 0.52 * step_model.CAL_MID_K, True, 1.0, 1
    m.known_p, m.step_s = True, step_s
    return m


def test_the_handoff_costs_a_short_step_more_than_a_long_one():
    fix = Change(workers=1, persistent=True)
    short, long_, unknown = (_loading_loop(s).after(fix) for s in (0.008, 0.100, None))
    # 8 ms steps: about 0.85 + 1.2 ms of each step's 8 go to handing the batch over
    assert short.speedup < 0.9 * long_.speedup
    assert short.binding == "data"
    # at 100 ms it hardly matters: the step's length only swaps k for handoff_k_timed and the hand-off
    assert abs(long_.speedup / unknown.speedup - 1.0) < 0.12


def test_a_loop_with_workers_already_pays_the_handoff_today():
    m = _loading_loop(0.008)
    m.d_inloop, m.w_now, m.worker_cores, m.f_wait, m.f_load = False, 1, 0.9, 0.5, 0.0
    assert m.batch_handoff("mid", step_model.CAL) == (0.0, 0.0)


def test_the_step_length_comes_from_the_backward_count():
    m = StepModel(f_wait=0.0, f_load=0.5, pid=7, n_samples=100.0, f_eval=0.2)
    proc = {"pid": 7, "backward": {"calls": 400, "seconds": 5.0}}
    assert step_model._step_length(proc, {"pid": 7}, m, 5.0) == pytest.approx(5.0 * 0.8 / 400)
    assert step_model._step_length({"pid": 7, "backward": {"calls": 3, "seconds": 5.0}}, {"pid": 7}, m, 5.0) is None
    assert step_model._step_length({"pid": 7}, {"pid": 7}, m, 5.0) is None


def test_a_bundle_with_the_count_reports_the_step_rate():
    """A real capture (Lightning's backbone classifier on 2 CPUs, its backward passes counted): the
    report's target carries the rate, the text report says it, and the plan's derivation times the
    hand-off with it."""
    import json
    import sys
    from tests.helpers import REPO
    bundle = REPO / "tests" / "data" / "ledger" / "public" / "bundles" / "lightning-backbone-cpu-r3.tar.gz"
    run = lambda *a: subprocess.run([sys.executable, "-m", "trainprobe.agent", "report", str(bundle), *a],
                                    capture_output=True, text=True, cwd=REPO)
    rep = json.loads(run("--json").stdout)
    assert 100 <= rep["target"]["backward_per_s"] <= 160, rep["target"]
    assert "backward passes a second (a step of about" in run().stdout
    plan = rep["plan"]
    assert plan["details"]["step_s"] == pytest.approx(1.0 / rep["target"]["backward_per_s"] * 0.78, rel=0.1)
    assert "handing each batch from a worker" in plan["derivation"] and "costs the loop about" in plan["derivation"]


def test_a_ranks_step_length_comes_from_its_own_backward_count():
    """A launcher's rank: its own main thread's count, not the launcher's (which makes none)."""
    m = StepModel(f_wait=0.0, f_load=0.2, pid=12, n_samples=100.0)
    proc = {"pid": 7, "backward": {"calls": 0, "seconds": 5.0}}
    rank = {"pid": 12, "backward": {"calls": 600, "seconds": 5.0}}
    assert step_model._step_length(proc, rank, m, 5.0) == pytest.approx(5.0 / 600)
    assert step_model._step_length(proc, {"pid": 12}, m, 5.0) is None


def test_workers_with_no_cpu_beside_the_loops_compute_take_their_cpu_from_the_loop():
    """A CPU-only loop that loads its batches 18% of an 8 ms step on one CPU of its own (a rank's share
    of 2 CPUs, or a job held to one): a worker runs on the loop's CPU, so the loading comes back as the
    worker's CPU and its hand-off; with a second CPU, the same worker overlaps the loop."""
    def loop(p):
        m = StepModel(f_wait=0.0, f_load=0.18, pid=1, n_samples=500.0)
        m.p = m.p_allowed = p
        m.u, m.d, m.d_inloop, m.loop_cores, m.threads_busy = 0.75, 0.18 * step_model.CAL_MID_K, True, 1.0, 1
        m.known_p, m.step_s = True, 0.008
        return m
    fix = Change(workers=1, persistent=True)
    one, two = loop(1.0), loop(2.0)
    assert one.no_cpu_for_workers(1) and not two.no_cpu_for_workers(1)
    assert one.after(fix).speedup < 1.0 < two.after(fix).speedup
    gpu = loop(1.0)
    gpu.gpu_busy = 0.3               # a loop that waits on its GPU leaves the worker those waits
    assert not gpu.no_cpu_for_workers(1)
