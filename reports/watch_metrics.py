"""Prometheus view of `trainprobe watch`'s document, through prometheus_client (its exposition
format; no hand-written format). The same registry serves the HTTP endpoint and, rendered once per
sample, node_exporter's textfile."""
from __future__ import annotations

from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PREFIX = "trainprobe_watch"

TRAINER_GAUGES = (
    ("loop_cpu_share", "Share of the interval the training thread ran on a CPU (/proc)."),
    ("loop_wait_share", "Share of the interval the training thread was off-CPU and not runnable: waiting for "
                        "batches, a collective or the GPU (/proc)."),
    ("loop_run_delay_share", "Share of the interval the training thread was runnable but waiting for a CPU "
                             "(/proc schedstat)."),
    ("voluntary_ctxsw_per_s", "Voluntary context switches of the training thread per second."),
    ("involuntary_ctxsw_per_s", "Involuntary context switches of the training thread per second."),
    ("workers_cpu_cores", "CPU cores the trainer's DataLoader workers used over the interval."),
    ("tree_cpu_cores", "CPU cores the trainer and its workers used over the interval."),
    ("workers", "DataLoader worker processes of the trainer."),
)


def families(doc: dict[str, Any]) -> Iterator[Any]:
    lab = ["root_pid", "pid", "slurm_job"]
    for key, help_ in TRAINER_GAUGES:
        g = GaugeMetricFamily(f"{PREFIX}_{key}", help_, labels=lab)
        for j in doc["jobs"]:
            for t in j["trainers"]:
                if t.get(key) is not None:
                    g.add_metric([str(j["root"]), str(t["pid"]), j["job"]], float(t[key]))
        yield g
    g = GaugeMetricFamily(f"{PREFIX}_gpu_busy_share", "NVML utilisation of a GPU (share of time a kernel ran).",
                          labels=["gpu"])
    for i, v in doc["gpus"].items():
        if v is not None:
            g.add_metric([str(i)], float(v))
    yield g
    g = GaugeMetricFamily(f"{PREFIX}_process_gpu_busy_share", "NVML utilisation of each GPU a training job runs on.",
                          labels=["root_pid", "slurm_job", "gpu"])
    for j in doc["jobs"]:
        for i, v in j["gpus"].items():
            if v is not None:
                g.add_metric([str(j["root"]), j["job"], str(i)], float(v))
    yield g
    jl = ["root_pid", "slurm_job"]
    g = GaugeMetricFamily(f"{PREFIX}_trigger_condition", "1 while the job meets the trigger condition "
                          f"({doc['trigger']}), 0 when not; absent when it cannot be told.", labels=jl)
    h = GaugeMetricFamily(f"{PREFIX}_trigger_held_seconds", "How long the job has met the trigger condition.",
                          labels=jl)
    c = CounterMetricFamily(f"{PREFIX}_diagnoses", "Full diagnoses run on the job by the trigger.", labels=jl)
    ts = GaugeMetricFamily(f"{PREFIX}_last_diagnosis_timestamp_seconds", "When the last diagnosis ended.", labels=jl)
    sp = GaugeMetricFamily(f"{PREFIX}_last_diagnosis_expected_speedup",
                           "Expected speedup of the last diagnosis's top finding.", labels=jl + ["finding"])
    for j in doc["jobs"]:
        key = [str(j["root"]), j["job"]]
        if j["condition"] is not None:
            g.add_metric(key, 1.0 if j["condition"] else 0.0)
        h.add_metric(key, float(j["condition_held_s"]))
        c.add_metric(key, float(j["diagnoses"]))
        if j["last_diagnosis_unix"]:
            ts.add_metric(key, float(j["last_diagnosis_unix"]))
            sp.add_metric(key + [j["last_finding"] or "none"], float(j["last_expected_speedup"] or 1.0))
    yield from (g, h, c, ts, sp)
    yield GaugeMetricFamily(f"{PREFIX}_training_jobs", "Training process trees followed.", value=len(doc["jobs"]))
    yield CounterMetricFamily(f"{PREFIX}_agent_cpu_seconds", "CPU time the watch agent itself used.",
                              value=float(doc["agent_cpu_seconds"]))
    yield CounterMetricFamily(f"{PREFIX}_samples", "Samples taken.", value=float(doc["samples"]))


class WatchCollector:
    """The gauges of the watch document, taken anew (`snapshot()`) at each collection."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]):
        self.snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        return families(self.snapshot())


def registry(snapshot: Callable[[], dict[str, Any]]) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(WatchCollector(snapshot))
    return reg


def render(doc: dict[str, Any]) -> str:
    return generate_latest(registry(lambda: doc)).decode("utf-8")
