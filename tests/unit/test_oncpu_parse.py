"""The CPU-clock samples' parsing (probes/support/oncpu.py) and the step model's reading of them, on
buffers laid out as the kernel writes them (include/uapi/linux/perf_event.h)."""
import mmap
import struct

from trainprobe.agent.combiners import step_model
from trainprobe.agent.combiners.step_model import Change, StepModel
from trainprobe.probes.support import oncpu

MAPS = """\
7f0000000000-7f0000010000 r--p 00000000 08:01 1 /venv/torch/lib/libgomp-a34b3233.so.1
7f0000010000-7f0000040000 r-xp 00010000 08:01 1 /venv/torch/lib/libgomp-a34b3233.so.1
7f1000000000-7f1004000000 r-xp 00000000 08:01 2 /venv/torch/lib/libtorch_cpu.so
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
"""


def _ring(samples, pages=4, lost=0):
    page = mmap.PAGESIZE
    buf = bytearray((1 + pages) * page)
    data = bytearray()
    for misc, ip in samples:
        data += oncpu.RECORD.pack(oncpu.PERF_RECORD_SAMPLE, misc, oncpu.RECORD.size, ip, 1, 2)
    if lost:
        data += struct.pack("<IHHQQ", oncpu.PERF_RECORD_LOST, 0, 24, 7, lost)
    buf[page:page + len(data)] = data
    struct.pack_into("<Q", buf, 1024, len(data))            # data_head
    struct.pack_into("<QQ", buf, 1040, page, pages * page)  # data_offset, data_size
    return buf


def test_only_the_runtimes_executable_mapping_counts_as_openmp():
    ranges = oncpu.openmp_ranges(MAPS)
    assert ranges == [(0x7f0000010000, 0x7f0000040000, "/venv/torch/lib/libgomp-a34b3233.so.1")]


def test_samples_split_into_kernel_runtime_and_work():
    ranges = oncpu.openmp_ranges(MAPS)
    user, kern = oncpu.MISC_USER, oncpu.MISC_KERNEL
    buf = _ring([(user, 0x7f0000020000)] * 3 + [(user, 0x7f1000000100)] * 5 + [(kern, 0xffffffff81000000)] * 2,
                lost=4)
    c, lost = oncpu._count(buf, 4, ranges)
    assert (c.total, c.kernel, c.openmp, lost) == (10, 2, 3, 4)


def test_an_empty_buffer_counts_nothing():
    c, lost = oncpu._count(_ring([]), 4, [])
    assert (c.total, lost) == (0, 0)


def _model(team_samples, team_openmp, main_openmp, win=5.0):
    """A loop that loads batches itself 40% of the step and computes the rest on two intra-op threads."""
    m = StepModel(f_wait=0.0, f_load=0.4, pid=10, n_samples=500.0)
    m.loop_cores, m.threads_busy, m.p, m.p_allowed, m.u, m.d, m.d_inloop = 2.0, 2, 2.0, 2.0, 1.9, 0.6, True
    proc = {"pid": 10, "oncpu": {"period_ms": 10.0, "threads": {
        "10": {"samples": 500, "kernel": 10, "openmp": main_openmp},
        "11": {"samples": team_samples, "kernel": 0, "openmp": team_openmp}}}}
    me = {"pid": 10, "threads": [{"tid": 10, "name": "python"}, {"tid": 11, "name": "python"}]}
    step_model._measured_par(proc, me, m, win)
    return m


def test_e_is_the_other_threads_work_less_the_loops_barrier_wait_over_its_compute():
    # 300 samples of work by the other thread (3 s of 5: 0.6 cores; one sample in the runtime makes it a
    # team thread), none in the runtime on the loop:
    # e = 0.6 / (0.6 (2 - 1)) = 1
    assert abs(_model(301, 1, 0).par_measured[1] - 1.0) < 1e-9
    # 150 of its 450 samples work, the loop waited 30 samples: (150 - 30) / 300 = 0.4
    m = _model(450, 300, 30)
    assert abs(m.par_measured[1] - 0.4) < 1e-9
    assert abs(m.team_cpu - 0.9) < 1e-9
    assert "spun or waited in the OpenMP runtime 67%" in m.par_basis


def test_the_measure_is_reported_but_the_fitted_efficiency_sets_the_middle():
    # Held out over the four ledgers the team's CPU-clock samples predicted the cap's cost worse than
    # the fitted par_eff (docs/models.md): a spinning and a working team get the same middle, and the
    # derivation names both the fitted e and what the samples read.
    ch = Change(workers=1, intra_threads=1, persistent=True)
    spin_m, work_m = _model(450, 420, 0), _model(301, 1, 0)
    spinning, working = spin_m.after(ch), work_m.after(ch)
    assert spinning.capped and spinning.speedup == working.speedup
    assert spin_m.par("mid", step_model.CAL) == step_model.CAL.par_eff[1]
    assert spin_m.par("hi", step_model.CAL) >= spin_m.par_measured[2]
    words = spin_m.derivation("with 1 worker and 1 intra-op thread", spinning)
    assert f"e = {step_model.CAL.par_eff[1]:g}, fitted on the ledgers" in words and "would read e = " in words


def test_no_samples_keep_the_calibrated_efficiency():
    m = _model(10, 5, 0)                     # too few of the team's samples to measure e
    assert m.par_measured is None
    assert m.par("mid", step_model.CAL) == step_model.CAL.par_eff[1]


def test_a_cap_alone_is_priced_at_the_samples_efficiency_and_without_them_at_the_fitted_one():
    # cpu.oversubscribed's cap (no worker change, the run-queue wait removed): a team whose second
    # thread mostly spun costs little to cap, one whose second thread worked costs more.
    ch = Change(intra_threads=1, runq_removed=True)
    spin_m, work_m, none_m = _model(450, 420, 0), _model(301, 1, 0), _model(10, 5, 0)
    assert spin_m.cap_par("mid", step_model.CAL) == spin_m.par_measured[1]
    assert none_m.cap_par("mid", step_model.CAL) == step_model.CAL.par_eff[1]
    assert spin_m.after(ch).speedup > work_m.after(ch).speedup
