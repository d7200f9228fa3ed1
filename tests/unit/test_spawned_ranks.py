"""Training processes a job spawns itself (torch.multiprocessing.spawn, mp.Process under spawn) against
torch's DataLoader workers and multiprocessing's helpers; whether ranks step together."""
from pathlib import Path

from trainprobe.agent.combiners.training_ranks import lockstep
from trainprobe.agent.evidence import Evidence
from trainprobe.probes import process
from trainprobe.probes.support import ranks

SPAWNED = ("/usr/bin/python3 -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=13, "
           "pipe_handle=17) --multiprocessing-fork")
TRACKER = "/usr/bin/python3 -c from multiprocessing.resource_tracker import main;main(12)"


def test_torch_names_its_workers_from_2_4_on():
    assert ranks.names_workers("2.13.0+cpu") and ranks.names_workers("2.4.0a0+git123")
    assert not ranks.names_workers("2.3.1") and not ranks.names_workers("1.13.1")
    assert not ranks.names_workers(None) and not ranks.names_workers("")


def test_torch_version_is_read_from_the_package_next_to_the_mapped_libtorch(tmp_path: Path):
    lib = "/opt/venv/lib/python3.12/site-packages/torch/lib/libtorch_cpu.so"
    pkg = tmp_path / "opt/venv/lib/python3.12/site-packages/torch"
    pkg.mkdir(parents=True)
    (pkg / "version.py").write_text("__version__ = '2.13.0+cpu'\ngit_version = 'abc'\n")
    libs = ["/usr/lib/x86_64-linux-gnu/libpython3.12.so.1.0", lib]
    assert ranks.torch_dir(libs) == "/opt/venv/lib/python3.12/site-packages/torch"
    assert ranks.torch_version(libs, str(tmp_path)) == "2.13.0+cpu"
    assert ranks.torch_version(["/usr/lib/libgomp.so.1"], str(tmp_path)) is None
    assert ranks.torch_version([lib], str(tmp_path / "nowhere")) is None


def test_a_spawned_child_not_named_a_worker_is_a_training_process_under_a_naming_torch():
    assert ranks.spawned_trainer(SPAWNED, "python3", "2.13.0")
    assert not ranks.spawned_trainer(SPAWNED, "pt_data_worker", "2.13.0")     # a spawned DataLoader worker
    assert not ranks.spawned_trainer(SPAWNED, "python3", "2.3.0")             # an older torch names none
    assert not ranks.spawned_trainer(SPAWNED, "python3", None)
    assert not ranks.spawned_trainer("/usr/bin/python3 train.py", "python3", "2.13.0")   # a forked child
    assert ranks.is_helper(TRACKER) and not ranks.spawned_trainer(TRACKER, "python3", "2.13.0")


def test_process_roles_of_a_spawning_job():
    parents = {5: 1, 6: 1, 7: 1, 8: 5}
    role = lambda pid, cmd, comm, torch="2.13.0+cpu": process._role(  # noqa: E731
        pid, 1, parents, {}, cmd, "/usr/bin/python3 main.py", {}, comm=comm, torch=torch)
    assert role(5, SPAWNED, "python3") == "rank"
    assert role(7, TRACKER, "python3") == "child"
    assert role(8, "/usr/bin/python3 main.py", "pt_data_worker") == "dataloader_worker"
    # captures without the torch version (before 2026-12-07), or an older torch: as before
    assert role(5, SPAWNED, "python3", None) == "dataloader_worker"
    assert role(5, SPAWNED, "python3", "2.1.2") == "dataloader_worker"


def _ev(ranks_env, distributed):
    ev = Evidence()
    ev.parsed["process"] = {"processes": [
        {"pid": 1, "role": "main", "env": {}},
        *({"pid": 10 + i, "role": "rank", "env": env} for i, env in enumerate(ranks_env))]}
    ev.parsed["pyspy"] = {"ranks": [{"pid": 10 + i, "training_thread": {"distributed_fraction": d}}
                                    for i, d in enumerate(distributed)]}
    return ev


def test_ranks_step_together_when_a_launcher_started_them_or_they_run_distributed_code():
    assert lockstep(_ev([{"LOCAL_RANK": "0"}, {"LOCAL_RANK": "1"}], [0.0, 0.0]))      # torchrun
    assert lockstep(_ev([{}, {}], [0.0, 0.41]))                                      # mp.spawn + DDP
    assert not lockstep(_ev([{}, {}], [0.0, 0.0]))                                   # hogwild
    assert lockstep(Evidence())                                                      # no process evidence


def test_a_named_worker_is_a_worker_whatever_local_rank_its_rank_set_before_forking_it():
    parents = {5: 1, 8: 5}
    environ = {"5": {}, "8": {"LOCAL_RANK": "0"}}
    role = lambda comm: process._role(8, 1, parents, {"LOCAL_RANK": "0"}, SPAWNED, "/usr/bin/python3 main.py",  # noqa: E731
                                      environ, comm=comm, torch="2.13.0+cpu")
    assert role("pt_data_worker") == "dataloader_worker"
    assert role("python3") == "rank"          # unnamed, the first process with LOCAL_RANK: a rank, as before
