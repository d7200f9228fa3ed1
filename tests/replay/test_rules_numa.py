"""numa.remote through the real readers and rules: the project's trees, the H200 node's own facts."""
import copy
import json
import os
import shlex
import subprocess

import pytest

from trainprobe.agent.evidence import Evidence
from trainprobe.agent.rules import run_rules
from trainprobe.agent.combiners.gpu_locality import gpu_table, rank_gpu
from trainprobe.agent.rules._numa_fixes import numactl_line, torchrun_command, wrapper_script
from trainprobe.probes.placement import PlacementProbe, capture_from_roots
from trainprobe.probes.topology import read_topology
from tests.helpers import DATA, H200

TOPO = DATA / "topo"
MOMENTS = [str(TOPO / "2s4g"), str(TOPO / "2s4g-t1")]
RANK_ARGV = "/usr/bin/python3 -u train.py --epochs 10 --batch-size 256"


def evidence(pid=4000, topo="2s4g", roots=MOMENTS, gpu=None, **extra):
    ev = Evidence()
    ev.parsed["topology"] = read_topology(str(TOPO / topo))
    ev.parsed["placement"] = PlacementProbe.parse(capture_from_roots(pid, roots))
    if gpu is not None:
        ev.parsed["gpu"] = gpu
    ev.parsed.update(extra)
    return ev


def finding(ev, fid="numa.remote"):
    findings, runs = run_rules(ev)
    run = next(r for r in runs if r.finding_id == fid)
    assert run.status in ("fired", "quiet"), run.to_dict()
    return next((f for f in findings if f.id == fid), None)


def commands(f):
    return [fx.command for fx in f.fixes if fx.command]


def test_rank_on_the_wrong_socket_gets_its_numactl_line_and_the_torchrun_wrapper():
    f = finding(evidence(4000))
    assert f is not None
    d = {j["local_rank"]: j for j in f.details["ranks"]}
    assert [lr for lr, j in d.items() if j["remote"]] == [2, 3]
    assert d[2]["gpu_bdf"] == "0000:9a:00.0" and d[2]["gpu_node"] == 1
    assert d[2]["cpu_remote_share"] == 1.0 and d[2]["memory_remote_share"] == 1.0 and d[2]["cpus_exclude_gpu_node"]
    assert d[3]["cpu_remote_share"] == 0.0 and d[3]["workers_cpu_remote_share"] == 1.0
    assert not d[0]["remote"] and not d[1]["remote"]
    cmds = commands(f)
    assert cmds[0] == f"numactl --cpunodebind=1 --membind=1 {RANK_ARGV}"              # rank 2, the worst
    assert cmds[1] == f"numactl --cpunodebind=1 --membind=1 {RANK_ARGV}"              # rank 3 (its worker drifted)
    wrapper = next(fx for fx in f.fixes if fx.change and fx.change.startswith("#!/bin/sh"))
    assert "  0|1) node=0 ;;\n  2|3) node=1 ;;\n" in wrapper.change
    assert 'exec numactl --cpunodebind="$node" --membind="$node" "$@"' in wrapper.change
    assert wrapper.command == ("/usr/bin/python3 /usr/local/bin/torchrun --nproc-per-node=4 --no-python "
                               f"./numa_bind.sh {RANK_ARGV}")
    init = next(fx for fx in f.fixes if fx.change and "worker_init_fn" in fx.change)
    assert ("os.sched_setaffinity(0, {0: range(0, 8), 1: range(0, 8), 2: range(8, 16), 3: range(8, 16)}"
            "[int(os.environ['LOCAL_RANK'])])") in init.change
    # The bound: h=0.91 (main thread busy), r=1, k=21/10.
    assert f.expected_speedup == pytest.approx(1 / (1 - 0.91 * (1 - 10 / 21)), abs=0.01)
    assert f.confidence == "medium"
    assert "h=0.91" in f.speedup_bound and "k=2.10" in f.speedup_bound and "upper bound" in f.speedup_bound
    assert "2 of 4 ranks" in f.title
    facts = " | ".join(e.fact for e in f.evidence)
    assert "rank LOCAL_RANK=2 (PID 4103) uses GPU 2 (0000:9a:00.0) on NUMA node 1" in facts
    assert "Cpus_allowed_list 0-7, Mems_allowed_list 0" in facts


def test_target_one_rank_gets_its_line_and_a_wrapper_for_every_local_rank():
    f = finding(evidence(4103))
    assert commands(f)[0] == f"numactl --cpunodebind=1 --membind=1 {RANK_ARGV}"
    wrapper = next(fx for fx in f.fixes if fx.change and fx.change.startswith("#!/bin/sh"))
    assert "  0|1) node=0 ;;\n  2|3) node=1 ;;\n" in wrapper.change        # ranks not watched, from the topology
    assert wrapper.command.startswith("/usr/bin/python3 /usr/local/bin/torchrun --nproc-per-node=4 --no-python ")
    init = next(fx for fx in f.fixes if fx.change and "worker_init_fn" in fx.change)
    assert "2: range(8, 16)" in init.change


def test_a_well_placed_rank_gets_no_finding():
    assert finding(evidence(4101)) is None
    assert finding(evidence(4102)) is None


def test_nvml_process_list_wins_over_local_rank_and_matches_bus_ids_across_forms():
    """NVML says rank 2 (PID 4103) drives the GPU at 00000000:18:00.0 (node 0): rank 2 is local."""
    gpus = [{"index": i, "bus_id": b, "numa_node": n, "cpu_affinity": c, "uuid": f"GPU-{i}"}
            for i, (b, n, c) in enumerate([("00000000:18:00.0", 0, "0-7"), ("00000000:3A:00.0", 0, "0-7"),
                                           ("00000000:9A:00.0", 1, "8-15"), ("00000000:BA:00.0", 1, "8-15")])]
    gpu = {"gpus": gpus, "processes": [{"pid": 4103, "gpu_index": 0}, {"pid": 4104, "gpu_index": 3}]}
    ev = evidence(4000, gpu=gpu)
    f = finding(ev)
    d = {j["local_rank"]: j for j in f.details["ranks"]}
    assert d[2]["gpu_index"] == 0 and d[2]["gpu_node"] == 0 and not d[2]["remote"]
    assert "NVML's process list" in d[2]["gpu_how"]
    assert d[3]["remote"]                                   # its worker still drifted
    assert ev.notes == []                                   # sysfs and NVML agree


def test_sysfs_and_nvml_disagreements_are_reported():
    gpus = [{"index": 0, "bus_id": "00000000:18:00.0", "numa_node": 1, "cpu_affinity": "8-15"},
            {"index": 1, "bus_id": "00000000:3a:00.0", "numa_node": 0, "cpu_affinity": "0-7"},
            {"index": 2, "bus_id": "00000000:9a:00.0", "numa_node": 1, "cpu_affinity": "8-15"},
            {"index": 3, "bus_id": "00000000:c1:00.0", "numa_node": 1, "cpu_affinity": "8-15"}]
    ev = evidence(4000, gpu={"gpus": gpus, "processes": []})
    rows, notes = gpu_table(ev)
    text = " | ".join(notes)
    assert "GPU 0 (0000:18:00.0): sysfs says NUMA node 0, NVML says 1" in text
    assert "sysfs local_cpulist 0-7 differs from NVML's CPU affinity 8-15" in text
    assert "NVML's GPU 3 (00000000:c1:00.0) is not under /sys/bus/pci/devices" in text
    assert "sysfs lists an NVIDIA GPU at 0000:ba:00.0 that NVML does not report" in text
    assert rows[0]["node"] == 0 and rows[0]["node_source"] == "sysfs numa_node"
    finding(ev)
    assert set(notes) <= set(ev.notes)                       # they reach the report's notes


def test_a_gpu_with_unknown_locality_is_not_judged_never_guessed():
    ev = evidence(4000)
    for d in ev.parsed["topology"]["pci"]:
        if d["bdf"] == "0000:9a:00.0":
            d["numa_node"], d["numa_node_reported"] = None, -1
    f = finding(ev)
    ranks = {j["local_rank"] for j in f.details["ranks"]}
    assert 2 not in ranks and {0, 1, 3} <= ranks
    assert any("LOCAL_RANK=2" in n and "NUMA node is unknown" in n for n in ev.notes)
    assert "node=1" in next(fx.change for fx in f.fixes if fx.change and fx.change.startswith("#!"))
    assert "  2)" not in next(fx.change for fx in f.fixes if fx.change and fx.change.startswith("#!"))


def test_cuda_visible_devices_picks_the_gpu():
    ev = evidence(4103)
    rows, _ = gpu_table(ev)
    procs = {p["pid"]: p for p in ev.parsed["placement"]["processes"]}
    unit = {"pid": 4103, "members": [4103]}

    def gpu_for(cvd, lr):
        p = dict(procs[4103], cuda_visible_devices=cvd, local_rank=lr)
        row, how = rank_gpu(ev, unit, {4103: p}, rows)
        return (row["index"] if row else None), how

    assert gpu_for("2,3", 1)[0] == 3
    assert gpu_for("3", 2)[0] == 3                          # one visible GPU: cuda:0 whatever LOCAL_RANK
    assert gpu_for("1,0", 0)[0] == 1
    assert gpu_for("", 0) == (None, "CUDA_VISIBLE_DEVICES='': the process sees no GPU")
    assert gpu_for("0,1", 5)[0] is None
    assert gpu_for(None, 2)[0] == 2
    assert gpu_for("GPU-3", 0)[0] is None                   # UUIDs need NVML
    nv = {"gpus": [{"index": i, "bus_id": f"0000:{b}:00.0", "uuid": f"GPU-6e4e17a9-{i}"}
                   for i, b in enumerate(("18", "3a", "9a", "ba"))]}
    ev.parsed["gpu"] = nv
    rows, _ = gpu_table(ev)
    p = dict(procs[4103], cuda_visible_devices="GPU-6e4e17a9-2", local_rank=0)
    assert rank_gpu(ev, unit, {4103: p}, rows)[0]["index"] == 2


def test_tight_node_memory_proposes_preferred_over_membind():
    ev = evidence(4000)
    for n in ev.parsed["topology"]["nodes"]:
        n["memory_mb"] = 6000.0
    f = finding(ev)
    assert commands(f)[0] == f"numactl --cpunodebind=1 --preferred=1 {RANK_ARGV}"
    assert "--preferred" in f.speedup_bound


def test_pyspy_of_the_rank_sets_the_host_share():
    spy = {"training_thread": {"pid": 4103, "tid": 4103, "breakdown": {
        "data_wait": 0.2, "data_load": 0.0, "h2d_copy": 0.1, "host_sync": 0.5, "forward": 0.1, "backward": 0.1,
        "optimizer": 0.0, "other": 0.0}}}
    f = finding(evidence(4103, pyspy=spy))
    j = f.details["ranks"][0]
    assert j["h"] == pytest.approx(0.3) and j["w"] == pytest.approx(0.2) and "py-spy" in j["h_source"]
    assert f.expected_speedup == pytest.approx(1 / (1 - (0.3 + 0.2) * (1 - 10 / 21)), abs=0.01)


def test_h200_vm_real_facts_one_node_nothing_remote():
    """The H200 node: sysfs numa_node -1, NVML's bus id in its 8-digit form (from the real nvml.json),
    one node. The GPU maps across the two bus-id forms; nothing is remote; the link is at its max."""
    dev = json.loads((H200 / "starved" / "nvml.json").read_text())
    pid = json.loads((H200 / "starved" / "nvml.json").read_text())["pid"]
    gpu = {"gpus": [{"index": 0, "name": dev["device"]["name"], "bus_id": dev["device"]["busid"],
                     "pcie": {"gen": dev["device"]["pcie_gen"], "width": dev["device"]["pcie_width"],
                              "max_gen": dev["device"]["pcie_max_gen"], "max_width": dev["device"]["pcie_max_width"]},
                     "cpu_affinity": "0-15", "numa_node": 0}],
           "processes": [{"pid": pid, "gpu_index": 0}], "target_gpus": [0]}
    ev = Evidence()
    ev.parsed["topology"] = read_topology(str(TOPO / "h200-vm"))
    ev.parsed["gpu"] = gpu
    rows, notes = gpu_table(ev)
    assert rows[0]["bdf"] == "0000:00:06.0" and rows[0]["sysfs"] is not None
    assert rows[0]["sysfs_numa_node_reported"] == -1
    assert rows[0]["node"] == 0 and rows[0]["node_source"] == "NVML (sysfs numa_node is -1)"
    assert notes == []
    findings, runs = run_rules(ev)
    assert not [f for f in findings if f.id in ("numa.remote", "pcie.degraded")]
    assert {r.finding_id: r.status for r in runs}["pcie.degraded"] == "quiet"
    assert {r.finding_id: r.status for r in runs}["numa.remote"] == "skipped"        # no placement evidence


# -- the fixes themselves ---------------------------------------------------------------------------

def test_numactl_line_quotes_the_real_argv():
    assert numactl_line(1, ["python", "train.py", "--name", "my run"]) == \
        "numactl --cpunodebind=1 --membind=1 python train.py --name 'my run'"


@pytest.mark.parametrize("launcher,rank,expected", [
    ("/usr/bin/python3 /usr/local/bin/torchrun --nproc-per-node=2 train.py --lr 0.1",
     "/usr/bin/python3 -u train.py --lr 0.1",
     "/usr/bin/python3 /usr/local/bin/torchrun --nproc-per-node=2 --no-python ./numa_bind.sh /usr/bin/python3 -u train.py --lr 0.1"),
    ("python -m torch.distributed.run --standalone --nproc_per_node 8 -m pkg.train --cfg a.yaml",
     "/opt/py/bin/python -u -m pkg.train --cfg a.yaml",
     "python -m torch.distributed.run --standalone --nproc_per_node 8 --no-python ./numa_bind.sh /opt/py/bin/python -u -m pkg.train --cfg a.yaml"),
    ("torchrun --no-python --nproc-per-node=2 ./run.sh x",
     "./run.sh x",
     "torchrun --no-python --nproc-per-node=2 ./numa_bind.sh ./run.sh x"),
    ("python launch_all.py", "/usr/bin/python3 -u train.py",
     "torchrun <your options> --no-python ./numa_bind.sh /usr/bin/python3 -u train.py"),
])
def test_torchrun_command_puts_the_wrapper_before_each_rank(launcher, rank, expected):
    assert torchrun_command(shlex.split(launcher), shlex.split(rank)) == expected


def test_wrapper_script_really_binds_by_local_rank(tmp_path):
    """Run the generated wrapper through the real numactl: every LOCAL_RANK goes to node 0 here."""
    if subprocess.run(["sh", "-c", "command -v numactl"], capture_output=True).returncode:
        pytest.skip("numactl is not installed (apt-get install numactl)")
    script = tmp_path / "numa_bind.sh"
    script.write_text(wrapper_script({0: 0, 1: 0}, "--membind"))
    script.chmod(0o755)
    probe = "import os; print(sorted(os.sched_getaffinity(0)), open('/proc/self/status').read().split('Mems_allowed_list:')[1].split()[0])"
    for lr in ("0", "1", "7"):
        out = subprocess.run([str(script), "python3", "-c", probe], env=dict(os.environ, LOCAL_RANK=lr),
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split("] ")[1].strip() == "0"
    bad = subprocess.run(["sh", "-n", str(script)], capture_output=True)
    assert bad.returncode == 0


def test_a_process_that_never_loaded_cuda_is_not_given_a_gpu():
    ev = evidence(7000, topo="2s4g-degraded", roots=[str(TOPO / "2s4g-degraded")] * 2)
    rows, _ = gpu_table(ev)
    procs = {p["pid"]: p for p in ev.parsed["placement"]["processes"]}
    unit = {"pid": 7000, "members": [7000]}
    assert rank_gpu(ev, unit, procs, rows)[0]["index"] == 0                  # libcuda mapped: cuda:0
    cpu_only = {7000: dict(procs[7000], uses_cuda=False)}
    row, how = rank_gpu(ev, unit, cpu_only, rows)
    assert row is None and "no sign" in how
    ev.parsed["process"] = {"pid": 7000, "uses_cuda": True}                  # the process probe saw libcudart
    assert rank_gpu(ev, unit, cpu_only, rows)[0]["index"] == 0
