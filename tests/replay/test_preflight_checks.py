"""Preflight check logic on captured host trees (real readers, root-injected), on GPU reads built from
the real H200 captures and failing edits of them, and the engine's timeouts, profiles and outputs."""
from __future__ import annotations

import json
import threading
import time

import pytest

from trainprobe.agent.preflight import EXIT_CODES, Result
from trainprobe.agent.preflight import profile as profiles
from trainprobe.agent.preflight import report as preport
from trainprobe.agent.preflight.engine import CheckSpec, Context, Reads, ReadSpec, collect, evaluate
from trainprobe.agent.preflight.runner import run
from trainprobe.probes import gpuhealth
from trainprobe.probes.parsers import hostfacts
from trainprobe.probes.errors import BadInput
from trainprobe.probes.support.nvml import Nvml
from tests.preflight_fixtures import (SMI_Q, TREES, edit, gpu_read_from_nvml_block, gpu_read_from_smi, h200_raw,
                                      tree)


def prof(**over):
    """The default profile with some keys changed: prof(host={"min_shm_gib": 2})."""
    p = profiles.load(None)
    for sec, vals in over.items():
        p[sec].update(vals)
    return p


def run_tree(scenario, tmp_path, p=None, tiers=("host", "gpu")):
    root = tree(scenario, tmp_path / scenario)
    ctx = Context(profile=p or prof(), root=str(root), disk_paths=["/"], job_cpus=None)
    res = run(ctx, tiers, deadline_s=20)
    assert not res.abandoned
    return res.raw, {(r.check, r.result.target): r for r in res.records}


def status(recs, check, target=None):
    return recs[(check, target)].result.status


# -- host checks on captured trees ------------------------------------------------------------------

def test_base_tree_reads_as_this_host_did(tmp_path):
    raw, recs = run_tree("base", tmp_path)
    # The captured tree is this VM: 2 CPUs, one NUMA node, a 24 GiB /dev/shm, THP madvise.
    assert status(recs, "host.cpus_online") == "ok"
    assert status(recs, "host.shm") == "ok"
    assert status(recs, "host.thp") == "ok"
    # No cpufreq here: the governor the default profile expects cannot be read, so it is not OK.
    assert status(recs, "host.cpu_governor") == "unknown"
    assert "cannot tell" in recs[("host.cpu_governor", None)].result.message
    assert status(recs, "host.kernel_log") == "ok"
    # No GPU and no driver in a tree: the GPU tier says so and is unknown, not ok.
    assert status(recs, "gpu.count") == "unknown"
    assert "cannot run" in recs[("gpu.count", None)].result.message


def test_small_shm_is_critical(tmp_path):
    _, recs = run_tree("small-shm", tmp_path)
    r = recs[("host.shm", None)].result
    assert r.status == "critical"
    assert r.value == 64 << 20                      # size=65536k from the mount line
    assert "Bus error" in r.message and "--shm-size" in r.remediation


def test_low_memlock_warns_by_default_and_is_critical_for_rdma_nodes(tmp_path):
    _, recs = run_tree("low-memlock", tmp_path)
    assert status(recs, "host.memlock") == "warn"
    assert recs[("host.memlock", None)].result.value == 65536
    p = profiles.load("h200-8gpu")
    _, recs8 = run_tree("low-memlock", tmp_path / "8", p=p)
    assert status(recs8, "host.memlock") == "critical"
    assert "LimitMEMLOCK=infinity" in recs8[("host.memlock", None)].result.remediation


def test_powersave_governor_warns(tmp_path):
    _, recs = run_tree("powersave", tmp_path)
    r = recs[("host.cpu_governor", None)].result
    assert r.status == "warn"
    assert r.observed == "powersave on 2 of 2 CPUs"
    assert "cpupower frequency-set -g performance" in r.remediation
    _, ok = run_tree("powersave", tmp_path / "any", p=prof(host={"governors": []}))
    assert status(ok, "host.cpu_governor") == "ok"


def test_offline_cpu_warns_and_too_few_is_critical(tmp_path):
    _, recs = run_tree("offline-cpu", tmp_path)
    r = recs[("host.cpus_online", None)].result
    assert r.status == "warn" and "CPUs 1 are present but offline" in r.message
    _, recs2 = run_tree("base", tmp_path / "b", p=prof(host={"cpus_online": 16}))
    assert status(recs2, "host.cpus_online") == "critical"


def test_downtrained_link_on_the_pci_bus_without_a_driver(tmp_path):
    _, recs = run_tree("downtrained-link", tmp_path)
    # The GPU is on the bus but there is no driver: fail closed.
    assert status(recs, "gpu.count") == "critical"
    assert "1 NVIDIA GPU(s) on the PCI bus but NVML cannot start" in recs[("gpu.count", None)].result.message
    # Its link is read from sysfs, which needs no driver: x8 of x16.
    r = recs[("gpu.pcie_link", "0000:00:06.0")].result
    assert r.status == "critical"
    assert r.observed == "Gen5 x8 (max Gen5 x16)"
    assert "50% of the bandwidth" in r.message


def test_kernel_errors(tmp_path):
    _, recs = run_tree("kernel-errors", tmp_path)
    r = recs[("host.kernel_log", None)].result
    assert r.status == "critical"
    kinds = [e["kind"] for e in r.details["events"]]
    # Xid 13 (an application's fault), a machine check, Xid 79, and the multi-line "fallen off the bus".
    assert kinds == ["xid", "mce", "xid", "fallen_off_bus"]
    ev = r.details["events"]
    assert ev[0]["status"] == "warn" and ev[2]["status"] == "critical" and ev[3]["device"] == "0000:00:06.0"
    assert ev[2]["age_s"] == pytest.approx(50.0)        # uptime 7200 s, logged at 7150 s
    assert "Xid 79" in r.message
    # The same events seen as older than the window only warn.
    _, old = run_tree("kernel-errors", tmp_path / "old", p=prof(host={"kernel_log_hours": 0.01}))
    assert status(old, "host.kernel_log") == "warn"


def test_kernel_log_unreadable_is_unknown():
    reads = Reads({"kernel_log": {"data": None, "timed_out": False, "seconds": 0.0,
                                  "error": {"kind": "permission_denied", "message": "/dev/kmsg: permission denied"}}})
    from trainprobe.agent.preflight.host_checks import kernel_log
    r = kernel_log(reads, prof())
    assert r.status == "unknown" and "dmesg_restrict" in r.remediation


def test_disk_thresholds():
    from trainprobe.agent.preflight.host_checks import disk
    g = 1 << 30
    reads = Reads({"disk": {"data": {
        "/": {"total": 100 * g, "free": 50 * g, "avail": 45 * g},
        "/full": {"total": 100 * g, "free": 8 * g, "avail": 3 * g},
        "/busy": {"total": 100 * g, "free": 9 * g, "avail": 8 * g},
        "/nope": {"error": "/nope: no such file or directory"}}, "error": None, "seconds": 0.0}})
    res = {r.target: r for r in disk(reads, prof())}
    assert res["/"].status == "ok" and res["/"].observed == "45 GiB available, 53% used"  # df's Use%
    assert res["/full"].status == "critical"
    assert res["/busy"].status == "warn"
    assert res["/nope"].status == "unknown"


def test_shm_parse_from_mount_line_and_statvfs():
    line = "shm /dev/shm tmpfs rw,nosuid,nodev,noexec,relatime,size=65536k,inode64 0 0"
    assert hostfacts.parse_shm({"mount_lines": [line], "statvfs": None})["size_bytes"] == 64 << 20
    s = hostfacts.parse_shm({"mount_lines": [line], "statvfs": {"total": 5, "free": 4, "avail": 3}})
    assert (s["size_bytes"], s["free_bytes"]) == (5, 3)
    assert not hostfacts.parse_shm({"mount_lines": [], "statvfs": None})["mounted"]


# -- GPU checks on reads built from the real H200 capture ------------------------------------------

def run_gpu(gpu_read=None, p=None, gpubench=None, tiers=("gpu",)):
    raw = h200_raw(gpu_read, gpubench)
    ctx = Context(profile=p or profiles.load("h200-1gpu"))
    records = run(ctx, tiers, replay=raw).records
    return {(r.check, r.result.target): r for r in records}


def test_h200_capture_is_healthy():
    recs = run_gpu()
    assert {k: r.result.status for k, r in recs.items()} == {k: "ok" for k in recs}
    assert recs[("gpu.count", None)].result.observed == "1 on the PCI bus; NVML sees 1; driver 580.159.04"
    assert recs[("gpu.pcie_link", "gpu0")].result.observed == "Gen5 x16 (max Gen5 x16); 0 replays"
    assert recs[("gpu.ecc", "gpu0")].result.value == 0
    assert "not applicable" in recs[("gpu.nvlink", "gpu0")].result.message
    # Retired pages are N/A on Hopper (it remaps rows): that is ok, not unknown.
    assert recs[("gpu.retired_pages", "gpu0")].result.status == "ok"
    assert recs[("gpu.numa_affinity", "gpu0")].result.status == "ok"


def test_ecc_errors():
    crit = run_gpu(gpu_read_from_smi(edit(SMI_Q, "Volatile", "DRAM Uncorrectable", "3")))
    r = crit[("gpu.ecc", "gpu0")].result
    assert r.status == "critical" and r.value == 3 and "(DRAM)" in r.message
    warn = run_gpu(gpu_read_from_smi(edit(SMI_Q, "Volatile", "DRAM Correctable", "12000")))
    assert warn[("gpu.ecc", "gpu0")].result.status == "warn"
    hist = run_gpu(gpu_read_from_smi(edit(SMI_Q, "Aggregate", "SRAM Uncorrectable SEC-DED", "1")))
    assert hist[("gpu.ecc", "gpu0")].result.status == "warn"
    off = run_gpu(gpu_read_from_smi(edit(SMI_Q, "ECC Mode", "Pending", "Disabled")))
    assert "waits for a GPU reset" in off[("gpu.ecc", "gpu0")].result.message


def test_downtrained_link_from_nvml():
    recs = run_gpu(gpu_read_from_smi(edit(SMI_Q, "Link Width", "Current", "8x")))
    r = recs[("gpu.pcie_link", "gpu0")].result
    assert r.status == "critical" and r.observed.startswith("Gen5 x8 (max Gen5 x16)")
    # Slower generation: fine when the GPU is idle (it saves power), a warning when it is not.
    idle = run_gpu(gpu_read_from_smi(edit(SMI_Q, "PCIe Generation", "Current", "1")))
    assert idle[("gpu.pcie_link", "gpu0")].result.status == "ok"
    busy_text = edit(edit(SMI_Q, "PCIe Generation", "Current", "4"), "Clocks Event Reasons", "Idle", "Not Active")
    assert run_gpu(gpu_read_from_smi(busy_text))[("gpu.pcie_link", "gpu0")].result.status == "warn"
    # A slot that cannot reach what the profile expects.
    slot = run_gpu(gpu_read_from_smi(edit(SMI_Q, "PCIe Generation", "Max", "4")))
    assert "the slot, riser or BIOS" in slot[("gpu.pcie_link", "gpu0")].result.message


def test_memory_repair_and_recovery_states():
    pend = run_gpu(gpu_read_from_smi(edit(SMI_Q, "Remapped Rows", "Pending", "Yes")))
    assert pend[("gpu.remapped_rows", "gpu0")].result.status == "critical"
    fail = run_gpu(gpu_read_from_smi(edit(SMI_Q, "Remapped Rows", "Remapping Failure Occurred", "Yes")))
    assert "ran out of spare rows" in fail[("gpu.remapped_rows", "gpu0")].result.message
    reset = run_gpu(gpu_read_from_smi(edit(SMI_Q, "GPU Recovery Action", "GPU Recovery Action", "GPU Reset")))
    r = reset[("gpu.recovery_action", "gpu0")].result
    assert r.status == "critical" and "GPU reset" in r.message


def test_clock_events_temperature_power_persistence():
    hw = run_gpu(gpu_read_from_smi(edit(SMI_Q, "Clocks Event Reasons", "HW Thermal Slowdown", "Active")))
    assert hw[("gpu.clock_events", "gpu0")].result.status == "critical"
    hot = run_gpu(gpu_read_from_smi(edit(SMI_Q, "Temperature", "GPU Current Temp", "92 C")))
    assert hot[("gpu.temperature", "gpu0")].result.status == "critical"
    capped = run_gpu(gpu_read_from_smi(edit(SMI_Q, "GPU Power Readings", "Current Power Limit", "500.00 W")))
    assert capped[("gpu.power", "gpu0")].result.status == "warn"
    pm = run_gpu(gpu_read_from_smi(edit(SMI_Q, "Persistence Mode", "Persistence Mode", "Disabled")))
    assert pm[("gpu.persistence_mode", "gpu0")].result.status == "warn"


def test_reads_taken_while_a_job_ran():
    # The "healthy" capture: a compute-bound job on the GPU (8.9 GB in use, SW power cap active at 690 W).
    recs = run_gpu(gpu_read_from_nvml_block("healthy"))
    assert recs[("gpu.busy", "gpu0")].result.status == "critical"
    assert recs[("gpu.clock_events", "gpu0")].result.observed == "0x4 (SW power cap)"
    assert recs[("gpu.clock_events", "gpu0")].result.status == "ok"
    assert recs[("gpu.power", "gpu0")].result.value == pytest.approx(690.682)
    allow = run_gpu(gpu_read_from_nvml_block("healthy"), p=prof(gpu={"busy_status": "warn"}))
    assert allow[("gpu.busy", "gpu0")].result.status == "warn"


def test_gpu_count_against_bus_and_profile():
    lost = gpu_read_from_smi()
    lost["count"], lost["gpus"] = 0, []
    r = run_gpu(lost)[("gpu.count", None)].result
    assert r.status == "critical" and "NVML sees 0 of the 1 GPUs on the PCI bus" in r.message
    eight = run_gpu(p=profiles.load("h200-8gpu"))
    assert eight[("gpu.count", None)].result.status == "critical"
    assert eight[("gpu.nvlink", "gpu0")].result.status == "critical"       # the profile expects 18 NVLinks


def test_numa_affinity_remote_cpus():
    read = gpu_read_from_smi(cpulist="0-7")
    raw = h200_raw(read)
    raw["reads"]["cpus"]["data"].update({"online": "0-15", "job_cpus": "8-15"})
    raw["reads"]["numa"]["data"] = {"online": "0-1", "nodes": {"0": {"cpulist": "0-7"}, "1": {"cpulist": "8-15"}}}
    raw["reads"]["nvml"]["data"]["gpus"][0]["numa_node"] = 0
    records = run(Context(profile=profiles.load("h200-1gpu")), ("gpu",), replay=raw).records
    r = next(x.result for x in records if x.check == "gpu.numa_affinity")
    assert r.status == "warn" and "numactl --cpunodebind=0" in r.remediation


# -- the active tier's judgement -------------------------------------------------------------------

def bench(h2d=52.0, d2h=53.0, tflops=700.0, err=3e-7, finite=True):
    return {"schema": "trainprobe.gpubench/1", "error": None, "devices": [{
        "device": "cuda:0", "name": "NVIDIA H200", "bus_id": "00000000:00:06.0",
        "matmul": {"n": 1024, "finite": finite, "max_rel_error": err},
        "gemm": {"n": 8192, "dtype": "bfloat16", "reps": 400, "seconds": 0.6, "tflops": tflops},
        "copy": {"bytes": 256 << 20, "reps": 10, "pinned": True, "h2d_gbps": h2d, "d2h_gbps": d2h}}]}


def test_active_checks_against_peak_and_link():
    ok = run_gpu(gpubench=bench(), tiers=("active",))
    assert {k[0]: r.result.status for k, r in ok.items()} == {
        "active.matmul": "ok", "active.gemm": "ok", "active.h2d_bandwidth": "ok", "active.d2h_bandwidth": "ok"}
    assert ok[("active.h2d_bandwidth", "gpu0")].result.details["link_gbps"] == pytest.approx(63.0, abs=0.1)
    bad = run_gpu(gpubench=bench(h2d=25.0, d2h=12.0, tflops=300.0, err=0.5), tiers=("active",))
    assert bad[("active.h2d_bandwidth", "gpu0")].result.status == "warn"        # 40% of Gen5 x16
    assert bad[("active.d2h_bandwidth", "gpu0")].result.status == "critical"    # 19%
    assert bad[("active.gemm", "gpu0")].result.status == "warn"                 # 30% of 989
    assert bad[("active.matmul", "gpu0")].result.status == "critical"
    nan = run_gpu(gpubench=bench(finite=False, err=None), tiers=("active",))
    assert "NaN" in nan[("active.matmul", "gpu0")].result.observed


def test_active_tier_without_cuda_is_unknown():
    recs = run_gpu(gpubench={"schema": "trainprobe.gpubench/1", "devices": [],
                             "error": "torch 2.13.0+cpu sees no CUDA device (a CPU-only build)"}, tiers=("active",))
    assert {r.result.status for r in recs.values()} == {"unknown"}
    assert all("CPU-only build" in r.result.message for r in recs.values())


# -- the engine: timeouts, broken checks ------------------------------------------------------------

def test_a_hung_read_is_abandoned_and_named():
    release = threading.Event()
    p = prof()
    specs = [ReadSpec("slow", "host", lambda c, pr: release.wait(30), lambda c, pr: 0.3, "critical", "the slow read"),
             ReadSpec("fast", "host", lambda c, pr: 42, lambda c, pr: 5.0)]
    t0 = time.monotonic()
    recs, abandoned = collect(specs, Context(profile=p), time.monotonic() + 10)
    elapsed = time.monotonic() - t0
    release.set()
    assert elapsed < 2.0 and len(abandoned) == 1
    assert recs["slow"]["timed_out"] and recs["fast"]["data"] == 42
    checks = [CheckSpec("x.slow", "host", ("slow",), lambda r, pp: Result("ok", "", "", "")),
              CheckSpec("x.broken", "host", ("fast",), lambda r, pp: 1 / 0)]
    out = evaluate(checks, Reads(recs), p, {s.name: s for s in specs})
    assert out[0].result.status == "critical" and out[0].timed_out
    assert "the slow read did not answer within 0.3 s" in out[0].result.message
    assert out[1].result.status == "unknown" and "ZeroDivisionError" in out[1].result.message


class _HangingNvml(Nvml):
    """NVML at its boundary: a module whose nvmlDeviceGetCount never returns (a hung driver)."""

    def open(self):
        class Mod:
            NVML_ERROR_NOT_SUPPORTED = 3

            @staticmethod
            def nvmlSystemGetDriverVersion():
                return "580.159.04"

            @staticmethod
            def nvmlSystemGetCudaDriverVersion():
                return 13000

            @staticmethod
            def nvmlSystemGetNVMLVersion():
                return "13.580.159.04"

            @staticmethod
            def nvmlDeviceGetCount():
                time.sleep(30)

            @staticmethod
            def nvmlShutdown():
                time.sleep(30)
        self.pynvml = Mod


def test_nvml_reader_stops_after_a_hung_call():
    t0 = time.monotonic()
    out = gpuhealth.read_gpus(call_timeout_s=0.3, nvml_factory=_HangingNvml)
    assert time.monotonic() - t0 < 2.0          # count hung (0.3 s), shutdown hung (0.3 s), nothing else waited
    assert out["driver"] == "580.159.04"
    assert out["hung_call"] == "nvmlDeviceGetCount"
    assert "did not return within 0.3 s" in out["count"]["na"]
    recs = run_gpu(out)
    assert recs[("gpu.count", None)].result.status == "critical"


def test_affinity_words_and_plain_values():
    from trainprobe.probes.parsers.hw import cpus_from_nvml_words
    assert cpus_from_nvml_words([0b1011, 1]) == [0, 1, 3, 64]
    assert gpuhealth._plain(b"NVIDIA H200") == "NVIDIA H200"
    from trainprobe.probes.support.nvml import NA
    assert gpuhealth._plain(NA("not supported on this GPU or driver")) == {"na": "not supported on this GPU or driver"}
    assert gpuhealth.na({"na": "x"}) and not gpuhealth.na({"na": "x", "y": 1})


# -- profiles, status, outputs -------------------------------------------------------------------------

def test_profiles_load_and_reject_typos(tmp_path):
    for name in profiles.available():
        assert profiles.load(name)["name"] == name
    assert profiles.load("h200-8gpu")["gpu"]["count"] == 8
    assert profiles.load("h200-8gpu")["host"]["min_nofile"] == 65536      # inherited from the default
    bad = tmp_path / "bad.toml"
    bad.write_text("[host]\nmin_shm_gb = 4\n")
    with pytest.raises(BadInput, match="unknown profile key 'host.min_shm_gb'"):
        profiles.load(str(bad))
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"gpu": {"count": "eight"}}))
    with pytest.raises(BadInput, match="gpu.count"):
        profiles.load(str(wrong))
    good = tmp_path / "site.json"
    good.write_text(json.dumps({"name": "site", "gpu": {"count": 4}, "checks": {"disable": ["host.thp"]}}))
    p = profiles.load(str(good))
    assert p["gpu"]["count"] == 4 and p["checks"]["disable"] == ["host.thp"]
    with pytest.raises(BadInput, match="no profile named"):
        profiles.load("h100-9gpu")


def test_node_status_and_exit_codes():
    recs = run_gpu(gpu_read_from_smi(edit(SMI_Q, "Volatile", "DRAM Uncorrectable", "3")))
    status = preport.node_status(list(recs.values()))
    assert status == "critical"
    assert preport.exit_code("critical", slurm=False) == 2 and preport.exit_code("critical", slurm=True) == 2
    assert preport.exit_code("warn", slurm=False) == 1 and preport.exit_code("warn", slurm=True) == 0
    assert preport.exit_code("unknown", slurm=False) == 3 and preport.exit_code("unknown", slurm=True) == 0
    assert EXIT_CODES == {"ok": 0, "warn": 1, "critical": 2, "unknown": 3}


def test_drain_reason_is_one_prefixed_line():
    checks = [{"check": "gpu.ecc", "target": "gpu3", "status": "critical", "informational": False,
               "message": "12 uncorrectable ECC error(s)\nsince the driver loaded " + "x" * 300},
              {"check": "host.shm", "target": None, "status": "critical", "informational": False, "message": "small"},
              {"check": "trainprobe.btf", "target": None, "status": "critical", "informational": True, "message": "-"}]
    line = preport.drain_reason(checks)
    assert line.startswith("trainprobe: gpu.ecc[gpu3]: 12 uncorrectable")
    assert "\n" not in line and len(line) <= preport.DRAIN_REASON_MAX and line.endswith("(+1 more)")
    assert preport.drain_reason([c for c in checks if c["check"] != "gpu.ecc" and c["check"] != "host.shm"]) is None


def test_prometheus_file_parses(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    from trainprobe.reports import output
    recs = run_gpu(gpu_read_from_smi(edit(SMI_Q, "Link Width", "Current", "8x")))
    rep = preport.build(h200_raw(), list(recs.values()), profiles.load("h200-1gpu"), False, 0.5)
    path = tmp_path / "trainprobe.prom"
    output.save("preflight", "prometheus", rep, str(path))
    fams = {f.name: f for f in text_string_to_metric_families(path.read_text())}
    st = {(s.labels["check"], s.labels["target"]): s.value for s in fams["trainprobe_preflight_check_status"].samples}
    assert st[("gpu.pcie_link", "gpu0")] == 2.0 and st[("gpu.ecc", "gpu0")] == 0.0
    assert len(st) == len(rep["checks"])
    vals = {s.labels["check"]: s for s in fams["trainprobe_preflight_check_value"].samples}
    assert vals["gpu.pcie_link"].value == 8.0 and vals["gpu.pcie_link"].labels["unit"] == "lanes"
    assert fams["trainprobe_preflight_status"].samples[0].value == 2.0
    assert fams["trainprobe_preflight_exit_code"].samples[0].value == 2.0
    assert [p.name for p in tmp_path.iterdir()] == ["trainprobe.prom"]   # the temporary file was renamed
    assert path.stat().st_mode & 0o777 == 0o644                          # node_exporter reads it


def test_the_exposition_is_prometheus_clients():
    from prometheus_client import CollectorRegistry, generate_latest

    from trainprobe.reports import prometheus
    from tests.helpers import REPO
    rep = {"host": {"hostname": "h"}, "profile": {"name": "p"}, "status": "ok", "exit_code": 0, "duration_s": 0.1,
           "started_unix": 1.0, "checks": []}
    reg = prometheus.registry(rep)
    assert isinstance(reg, CollectorRegistry)
    assert prometheus.render(rep) == generate_latest(reg).decode()
    assert "# HELP" not in (REPO / "reports" / "prometheus.py").read_text()   # nothing hand-formatted


def test_label_escaping_survives_the_parser(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    from trainprobe.reports import prometheus
    rep = {"host": {"hostname": 'odd"host\\name'}, "profile": {"name": "p"}, "status": "ok", "exit_code": 0,
           "duration_s": 0.1, "started_unix": 1.0,
           "checks": [{"check": "host.disk", "category": "host", "target": '/mnt/"x"\\y', "status": "warn",
                       "value": 1.5, "unit": "bytes", "duration_s": 0.01, "timed_out": False, "informational": False}]}
    fams = {f.name: f for f in text_string_to_metric_families(prometheus.render(rep))}
    assert fams["trainprobe_preflight_check_status"].samples[0].labels["target"] == '/mnt/"x"\\y'
    assert fams["trainprobe_preflight_status"].samples[0].labels["hostname"] == 'odd"host\\name'


def test_trees_hold_only_what_preflight_reads():
    # The captured base tree names no host and holds only the /dev/shm mount line.
    mounts = (TREES / "base/proc/self/mounts").read_text().splitlines()
    assert mounts and all(ln.split()[1] == "/dev/shm" for ln in mounts)
    assert not (TREES / "base/proc/sys/kernel/hostname").exists()


# -- the NVML reader's plumbing, with NVML faked at its boundary ------------------------------------

def _fake_pynvml():
    """pynvml's constants and structures, with functions that return what an idle H200 returned
    (tests/data/h200/host/nvidia-smi-q.txt) in the types pynvml returns them."""
    import ctypes
    import types

    import pynvml as real

    def ns(*a):
        raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)

    def field_values(h, ids):
        arr = (real.c_nvmlFieldValue_t * len(ids))()
        arr[0].fieldId, arr[0].nvmlReturn, arr[0].valueType, arr[0].value.uiVal = ids[0], 0, 1, 0
        return arr

    def memory(h, version=None):
        m = real.c_nvmlMemory_v2_t()
        m.total, m.reserved, m.used, m.free = 143771 << 20, 616 << 20, 0, 143156 << 20
        return m

    m = types.SimpleNamespace(**{k: getattr(real, k) for k in dir(real) if k.startswith(("NVML_", "nvmlMemory"))})
    m.__dict__.update(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlSystemGetDriverVersion=lambda: "580.159.04",
        nvmlSystemGetCudaDriverVersion=lambda: 13000, nvmlSystemGetNVMLVersion=lambda: "13.580.159.04",
        nvmlDeviceGetCount=lambda: 1, nvmlDeviceGetHandleByIndex=lambda i: object(),
        nvmlDeviceGetName=lambda h: "NVIDIA H200", nvmlDeviceGetUUID=lambda h: "GPU-6e4e17a9",
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=b"00000000:00:06.0"),
        nvmlDeviceGetVbiosVersion=lambda h: "96.00.A5.00.1A", nvmlDeviceGetPersistenceMode=lambda h: 1,
        nvmlDeviceGetComputeMode=lambda h: 0, nvmlDeviceGetMigMode=lambda h: [0, 0],
        nvmlDeviceGetEccMode=lambda h: [1, 1], nvmlDeviceGetTotalEccErrors=lambda h, t, c: 0,
        nvmlDeviceGetMemoryErrorCounter=lambda h, t, c, loc: 0, nvmlDeviceGetRemappedRows=lambda h: (0, 0, 0, 0),
        nvmlDeviceGetRetiredPages=ns, nvmlDeviceGetRetiredPagesPendingStatus=ns,
        nvmlDeviceGetFieldValues=field_values, nvmlDeviceGetCurrentClocksEventReasons=lambda h: 1,
        nvmlDeviceGetClockInfo=lambda h, c: 345, nvmlDeviceGetMaxClockInfo=lambda h, c: 1980,
        nvmlDeviceGetTemperature=lambda h, s: 39, nvmlDeviceGetTemperatureThreshold=ns,
        nvmlDeviceGetPowerUsage=lambda h: 81150, nvmlDeviceGetEnforcedPowerLimit=lambda h: 700000,
        nvmlDeviceGetPowerManagementDefaultLimit=lambda h: 700000,
        nvmlDeviceGetCurrPcieLinkGeneration=lambda h: 5, nvmlDeviceGetCurrPcieLinkWidth=lambda h: 16,
        nvmlDeviceGetMaxPcieLinkGeneration=lambda h: 5, nvmlDeviceGetMaxPcieLinkWidth=lambda h: 16,
        nvmlDeviceGetGpuMaxPcieLinkGeneration=lambda h: 5, nvmlDeviceGetPcieReplayCounter=lambda h: 0,
        nvmlDeviceGetNvLinkState=ns, nvmlDeviceGetGraphicsRunningProcesses=lambda h: [],
        nvmlDeviceGetComputeRunningProcesses=lambda h: [types.SimpleNamespace(pid=4242, usedGpuMemory=None)],
        nvmlDeviceGetMemoryInfo=memory, nvmlDeviceGetNumaNodeId=ns,
        nvmlDeviceGetCpuAffinity=lambda h, n: (ctypes.c_ulonglong * n)(0xFFFF))
    return m


class _FakeNvml(Nvml):
    def open(self):
        self.pynvml = _fake_pynvml()


def test_nvml_reader_turns_pynvml_types_into_json():
    out = gpuhealth.read_gpus(nvml_factory=_FakeNvml)
    json.dumps(out)                                      # plain JSON all the way down
    g = out["gpus"][0]
    assert g["bus_id"] == "00000000:00:06.0" and g["recovery_action"] == 0
    assert g["memory"] == {"total": 143771 << 20, "used": 0, "free": 143156 << 20, "reserved": 616 << 20}
    assert g["cpu_affinity"]["cpulist"] == "0-15"
    assert g["retired_pages"]["single_bit"] == {"na": "not supported on this GPU or driver"}
    assert g["nvlink"] == {"supported": False, "reason": "not supported on this GPU or driver"}
    assert g["processes"] == [{"pid": 4242, "type": "compute", "used_memory_bytes": None}]
    assert set(out["timing"]) >= {"ecc", "pcie", "processes"}
    # What it read judges like the nvidia-smi capture of the same GPU, except the process it lists.
    recs = run_gpu(out)
    assert recs[("gpu.busy", "gpu0")].result.status == "critical"
    assert all(r.result.status == "ok" for k, r in recs.items() if k[0] != "gpu.busy")


def test_the_gpuhealth_probe_records_what_nvml_said_and_parses_it_back():
    import threading

    from trainprobe.probes.base import WatchSpec, run_read
    from trainprobe.probes.gpuhealth import GpuHealthProbe

    class Probe(GpuHealthProbe):
        nvml_factory = _FakeNvml

    cap = run_read(Probe(), "nvml", WatchSpec(pid=0, window_s=0.0), threading.Event())
    rec = Probe.parse(cap)["nvml"]
    assert rec["error"] is None and not rec["timed_out"]
    direct = gpuhealth.read_gpus(nvml_factory=_FakeNvml)
    for key in ("read_unix", "seconds", "timing"):
        rec["data"].pop(key), direct.pop(key)
    assert rec["data"] == direct                        # the artifact holds the read, unchanged
    assert [p["kind"] for p in cap.provenance] == ["nvml", "read"]
    assert run_gpu(Probe.parse(cap)["nvml"]["data"])[("gpu.ecc", "gpu0")].result.status == "ok"


# -- conformance -------------------------------------------------------------------------------------

def test_every_check_is_registered_once_reads_what_exists_and_is_documented():
    from trainprobe.agent.preflight.engine import CATEGORY_TIER, all_checks
    from trainprobe.agent.preflight.runner import READS
    from tests.helpers import REPO
    readme = (REPO / "docs" / "preflight.md").read_text()
    checks = all_checks()
    ids = [c.id for c in checks]
    assert len(ids) == len(set(ids))
    for c in checks:
        assert c.category in CATEGORY_TIER and c.id.split(".")[0] == c.category
        assert set(c.reads) <= set(READS), c.id
        assert f"`{c.id}`" in readme, f"{c.id} is not in docs/preflight.md"


H200_FIXTURE = TREES.parent / "gpu" / "h200-raw.json"


@pytest.mark.skipif(not H200_FIXTURE.exists(), reason="the H200 raw reads are not captured yet: run "
                    "benchmarks/preflight_gpu.sh on the GPU node and save h200-raw.json there")
def test_h200_raw_reads_replay():
    raw = json.loads(H200_FIXTURE.read_text())
    records = run(Context(profile=profiles.load("h200-1gpu")), ("gpu", "active"), replay=raw).records
    recs = {(r.check, r.result.target): r.result for r in records}
    assert recs[("gpu.count", None)].status == "ok"
    assert recs[("gpu.pcie_link", "gpu0")].observed.startswith("Gen5 x16")
    assert not [k for k, r in recs.items() if r.status == "critical"]
    assert recs[("active.matmul", "gpu0")].status == "ok"
    assert recs[("active.gemm", "gpu0")].value > 0.25 * 989
    assert recs[("active.h2d_bandwidth", "gpu0")].value > 0.35 * 63


def test_a_read_that_times_out_by_itself_counts_as_timed_out():
    from trainprobe.probes.errors import TimedOut

    def killed(c, pr):
        raise TimedOut("the active GPU tier did not finish within 88 s and was killed (a hung CUDA call?)")
    spec = ReadSpec("gpubench", "active", killed, lambda c, pr: 90.0, "critical", "the active GPU tier (torch)")
    recs, abandoned = collect([spec], Context(profile=prof()), time.monotonic() + 10)
    assert recs["gpubench"]["timed_out"] and not abandoned
    out = evaluate([CheckSpec("active.gemm", "active", ("gpubench",), lambda r, pp: r.data("gpubench"))],
                   Reads(recs), prof(), {"gpubench": spec})
    assert out[0].result.status == "critical" and "was killed" in out[0].result.message


def test_no_cpufreq_is_ok_only_when_the_profile_allows_any_governor(tmp_path):
    _, recs = run_tree("base", tmp_path, p=prof(host={"governors": []}))
    assert status(recs, "host.cpu_governor") == "ok"


def test_rapl_power_pmu_is_not_a_hardware_pmu():
    # The H200 node and this VM expose RAPL's "power" PMU and no core PMU: IPC cannot be counted.
    from trainprobe.agent.preflight import prereq_checks
    from trainprobe.agent.preflight.engine import Reads

    def run(pmus):
        return prereq_checks.hw_counters(Reads({"prereqs": {"data": {"pmus": pmus}, "error": None}}), {})

    assert run(["breakpoint", "msr", "power", "software", "tracepoint", "uprobe"]).status == "warn"
    assert run(["cpu", "power", "software"]).status == "ok"
    assert run(["cpu_core", "cpu_atom", "software"]).status == "ok"
    assert run(["armv8_pmuv3_0", "software"]).status == "ok"
