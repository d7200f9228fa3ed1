"""The DataLoader speedup model and the worker proposal, as pure functions."""
from agent.rules.dataloader import propose_workers, step_time


def test_balanced_inloop_job_on_two_cores_needs_one_worker():
    # Half the loop loads data, one core of compute, two CPUs: one worker overlaps it all.
    w, t = propose_workers(c=0.5, d=0.5, u=1.0, p=2, w_cap=2)
    assert w == 1 and abs(1 / t - 2.0) < 1e-9


def test_capacity_bounds_the_speedup():
    w, t = propose_workers(c=0.2, d=0.8, u=1.0, p=2, w_cap=2)
    assert w == 2 and abs(t - 0.5) < 1e-9        # U/P binds, not the loop


def test_many_cores_many_workers():
    w, t = propose_workers(c=0.1, d=0.9, u=1.0, p=16, w_cap=16)
    assert w == 9 and abs(t - 0.1) < 1e-9


def test_never_more_workers_than_the_cap():
    w, _ = propose_workers(c=0.01, d=0.99, u=1.0, p=4, w_cap=4)
    assert w <= 4


def test_step_time_is_the_largest_bound():
    assert step_time(2, 0.3, 1.0, 1.3, 2) == 0.65
