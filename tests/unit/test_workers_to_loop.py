"""The step once the loop takes its batches back from its DataLoader workers (num_workers=0), in the
step model (agent/combiners/step_model.py: StepModel.workers_to_loop), on model inputs shaped like the
2-CPU windows it was written for: karpathy's makemore and minGPT's adder, 4 workers feeding a loop
whose 2 intra-op threads fill both CPUs (measured there: 1.14x and 1.12x with num_workers=0)."""
from trainprobe.agent.combiners.step_model import CAL, Change, StepModel


def _cpu_job(**kw) -> StepModel:
    # today's step = 1: the loop waits for or receives its batches 4%, loads 1.5%; 4 workers use 0.09
    # cores; the loop thread waited for a CPU 7% of the window and at its team's barriers 0.09 cores
    base = dict(f_wait=0.04, f_load=0.015, pid=10, n_samples=200.0, u=1.91, p=1.85, p_allowed=2.0, loop_cores=1.9,
                w_now=4, worker_cores=0.09, d=0.1, r_loop=0.07, threads_busy=2, step_s=0.029)
    base.update(kw)
    m = StepModel(**base)
    m.loop_barrier = kw.get("loop_barrier", 0.09)
    return m


def test_a_team_that_fills_its_cpus_gets_back_what_the_workers_took():
    m = _cpu_job()
    back, stall = m.workers_to_loop(2, "mid", CAL)
    assert stall == 0.09                   # all of the workers' CPU, within the loop's measured waits
    assert 0.0 < back < 0.09               # the loading costs the loop less than it cost the workers
    st = m.after(Change(workers=0))
    assert 1.03 < st.speedup < 1.15, st
    assert st.interval[0] < st.speedup < st.interval[1]


def test_what_is_given_back_never_exceeds_the_loops_measured_waits():
    # busy workers (0.6 cores) on the same CPUs: the loop waited 7% for a CPU and 9% at its barriers
    m = _cpu_job(worker_cores=0.6, d=0.6)
    _back, stall = m.workers_to_loop(2, "mid", CAL)
    assert abs(stall - 0.16) < 1e-9
    # the long end gives back only the loop's own wait for a CPU
    assert abs(m.workers_to_loop(2, "hi", CAL)[1] - 0.07) < 1e-9
    # their work back in the loop costs more than the team gets back: no gain
    assert m.after(Change(workers=0)).speedup < 1.0


def test_workers_on_cpus_of_their_own_give_nothing_back():
    # a GPU job: its loop's compute leaves CPUs for the workers
    g = _cpu_job(gpu_busy=0.5, uses_cuda=True)
    assert g.workers_to_loop(2, "mid", CAL)[1] == 0.0
    assert g.after(Change(workers=0)).speedup <= 1.0
    # a CPU job with CPUs beside its team (2 intra-op threads on 8 CPUs)
    wide = _cpu_job(p=7.8, p_allowed=8.0, u=2.0)
    assert wide.workers_to_loop(2, "mid", CAL)[1] == 0.0
    assert wide.after(Change(workers=0)).speedup <= 1.0
