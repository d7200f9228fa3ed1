"""The declared shape of every probe's evidence: what its `parse` returns and what rules read.

Each probe class names its evidence's TypedDict (`evidence_schema`). The evidence stays plain dicts
and lists (it goes into bundles and JSON as is); the TypedDicts say which keys each level holds,
whether always, and of what type. `problems` checks a value against them at run time:
tests/replay/test_evidence_schema.py parses every captured and replayed capture in the repository
and asserts that each evidence matches its schema, so a renamed key or a changed type fails a test
instead of a rule.

JSON turns integer keys into strings. The evidence keyed by GPU index (`GpuEvidence.utilization`,
`memory_utilization`, `per_gpu`) is declared `dict[int, ...]`; `from_json` gives such keys back
their declared type, so a rule reads GPU indices as ints whatever the evidence came through.

Written for Python 3.9: `Optional`/`Union` rather than `X | None`, `total=False` bases for the
keys a level holds only sometimes.
"""
from typing import Any, Dict, List, Literal, Optional, Tuple, TypedDict, Union, get_args, get_origin, get_type_hints

# -- process -------------------------------------------------------------------------------------

ProcessRole = Literal["main", "rank", "dataloader_worker", "child"]


class ThreadCpu(TypedDict):
    tid: int
    name: str
    state: str
    cpu_seconds: float
    cpu_fraction: Optional[float]
    voluntary_ctxsw: int
    involuntary_ctxsw: int
    run_delay_seconds: Optional[float]
    last_cpu: Optional[int]
    seen: Literal["both", "start", "end"]


class _ProcessRowSeen(TypedDict):
    pid: int
    ppid: Optional[int]
    role: ProcessRole
    cmdline: str
    cpu_seconds: Optional[float]
    threads: List[ThreadCpu]
    alive_at_end: bool
    seen: Literal["both", "start", "end", "listing"]
    env: Dict[str, str]             # CUDA_VISIBLE_DEVICES and LOCAL_RANK only


class ProcessRow(_ProcessRowSeen, total=False):
    # Absent for a process only seen in a child listing (seen == "listing").
    argv: Optional[List[str]]       # None in captures older than argv
    state: str
    num_threads: int
    # CPU in the window / window; None where unknown: a process gone before the end with no listing's
    # reading after the start (captures before 2026-12-02 read no CPU between the two snapshots).
    cpu_cores: Optional[float]
    # "window": both snapshots; "born_in_window": seen at the end only; "until_exit": gone before the
    # end, to its last listing's reading (its last half second or less is missing); "unknown".
    cpu_basis: Literal["window", "born_in_window", "until_exit", "unknown"]
    cpus_allowed: Optional[str]
    mems_allowed: Optional[str]
    rss_mb: Optional[float]
    # A rank's backward passes (its main thread's; captures from 2026-12-07 on, where torch is mapped)
    backward: "BackwardCalls"


class MainProcess(TypedDict):
    pid: int
    cmdline: str
    argv: Optional[List[str]]
    state: str
    num_threads: int
    cpu_seconds: float
    cpu_cores: float
    cpus_allowed: Optional[str]
    mems_allowed: Optional[str]
    rss_mb: Optional[float]


class WorkerCpu(TypedDict):
    pid: int
    cpu_cores: Optional[float]
    alive_at_end: bool


class _WorkerChurnSeen(TypedDict):
    appeared: List[int]
    vanished: List[int]


class WorkerChurn(_WorkerChurnSeen, total=False):
    vanished_lifetime_s: float              # the vanished workers' median life, start to join (2026-12-07 on)


class OnCpuThread(TypedDict):
    samples: int                            # CPU-clock samples of the thread (one per 10 ms of its CPU)
    kernel: int                             # ... in the kernel
    openmp: int                             # ... in an OpenMP runtime's code (spinning, waiting at a barrier)


class OnCpu(TypedDict):
    """Where the training process's threads spent their CPU, by library (probes/support/oncpu.py)."""
    threads: Dict[str, OnCpuThread]         # tid -> its samples
    period_ms: float
    lost: int
    user_only: bool                         # samples in the kernel were not taken (an unprivileged caller)
    openmp_runtime: List[str]               # the OpenMP runtime(s) mapped


class BackwardCalls(TypedDict):
    """The training process's backward passes in the window, counted at torch's autograd engine
    (probes/support/stepcount.py): one per step of a loop that calls backward once a batch."""
    calls: int                              # torch::autograd::Engine::execute entries, all threads
    seconds: float                          # how long the counters ran
    per_s: float
    threads: Dict[str, int]                 # tid -> its calls (threads with none left out)


class _ProcessEvidenceSeen(TypedDict):
    pid: int
    window_s: float
    target_exited: bool
    cpus_online: int
    cpus_allowed: int
    cpu_quota_cores: Optional[float]
    cpus_available: float
    libraries: List[str]
    uses_torch: bool
    uses_cuda: bool
    python: Optional[str]
    main: MainProcess
    main_thread: Optional[ThreadCpu]
    busy_threads_in_main: int
    processes: List[ProcessRow]
    workers: List[WorkerCpu]
    worker_churn: WorkerChurn
    # CPU in the window of the target's children reaped in it (cutime + cstime, less their CPU before it)
    reaped_children_cpu_s: Optional[float]
    reaped_children_cores: Optional[float]  # ... over the window; None in captures without it
    threads_at_start: Optional[int]
    total_cpu_cores: float


class ProcessEvidence(_ProcessEvidenceSeen, total=False):
    oncpu: OnCpu                            # captures from 2026-12-04 on, where an OpenMP runtime is mapped
    oncpu_unavailable: str                  # ... why the samples could not be taken
    backward: BackwardCalls                 # captures from 2026-12-05 on, where torch is mapped
    backward_unavailable: str               # ... why they could not be counted


# -- pyspy ---------------------------------------------------------------------------------------

class TopStack(TypedDict):
    stack: List[str]
    fraction: float


class ModuleSite(TypedDict):
    site: str                               # "function (file:line)" of the frame calling the module
    fraction: float                         # share of the thread's time under that call


class LoaderSite(TypedDict):
    site: str                               # "function (file:line)" of the frame iterating the loader
    data_wait: float                        # share of the thread's time waiting on it for workers
    data_load: float                        # ... loading batches from it in the thread itself
    startup_seconds: float                  # seconds starting its workers
    starts: int                             # times the loop started its workers in the window
    first_wait: float                       # share waiting for the first batch of just-started workers
    passes: int                             # runs of the thread's data samples at it, between others'
    trains: Optional[bool]                  # that function also runs backward/optimizer; None: unknown


class TrainingThread(TypedDict):
    pid: int
    tid: Optional[int]
    name: Optional[str]
    seconds: float
    busy_fraction: float
    breakdown: Dict[str, float]             # pystacks.TRAIN_CATEGORIES -> share of the thread's time
    seconds_by_category: Dict[str, float]
    top_stacks: Dict[str, List[TopStack]]
    worker_startup_seconds: float
    module_call_sites: List[ModuleSite]     # the callers of the outermost nn.Module calls (forward time)
    module_call_samples: int                # spans under a module call (py-spy's samples, merged while the stack holds)
    module_site_switches: int               # ... whose calling site differs from the previous one's
    graph_break_modules: Dict[str, float]   # share inside torch modules dynamo graph-breaks in ("rnn", "transformer")
    model_in_optimizer_step: Optional[float]  # share of forward/backward time inside an optimizer's step (closure)
    loaders: List[LoaderSite]               # the DataLoaders it waited on, by the frame iterating each
    data_transitions: int
    observed_from: float
    observed_to: float
    truncated_fraction: float               # share in samples py-spy read only in part (nonblocking reads)
    truncated_loading_fraction: float       # ... in loading code, counted as data_load (the loop loads in-loop)
    distributed_fraction: float             # samples in torch.distributed or DDP/FSDP/DeepSpeed code (ranks in lockstep)
    data_load_breakdown: Dict[str, float]
    frame_kinds: Dict[str, float]           # pystacks.FRAME_KINDS -> share of the thread's samples
    cpu_fraction: Optional[float]           # share of the window on a CPU (/proc; None: not read)
    run_delay_fraction: Optional[float]     # share of the window waiting for a CPU (schedstat)
    gil_held_share: Optional[float]         # share of the GIL sampler's samples it held the GIL
    # Off-CPU shares of the window by what it waited for (pystacks.WAIT_KEYS: gil, data, h2d_copy,
    # host_sync, collective, io, idle_wait, native_other, unexplained); None without its CPU time.
    waits: Optional[Dict[str, float]]


class OtherThread(TypedDict):
    tid: Optional[int]
    name: Optional[str]
    seconds: float
    busy_fraction: float                    # share of samples outside a wait-like frame (frames only)
    active_fraction: Optional[float]        # share of the window running or runnable (the OS's counters)
    gil_share: Optional[float]              # share of the GIL sampler's samples it held the GIL
    top: List[TopStack]


class WorkerStacks(TypedDict):
    pid: int
    tid: Optional[int]
    seconds: float
    breakdown: Dict[str, float]             # pystacks.WORKER_CATEGORIES -> share


class WorkersView(TypedDict):
    count: int
    per_worker: List[WorkerStacks]
    breakdown: Dict[str, float]
    busy_fraction: Optional[float]
    top_stacks: List[TopStack]


TimelineSpan = Tuple[float, float, str]     # [start_unix, end_unix, category]


class TrainerView(TypedDict):
    pid: int
    training_thread: TrainingThread
    timeline: List[TimelineSpan]
    other_threads: List[OtherThread]
    workers: WorkersView


class GilHolderShare(TypedDict):
    tid: Optional[int]
    name: Optional[str]
    samples: int                            # GIL sampler samples in which it held the GIL
    share: float                            # of all the sampler's samples
    frame: Optional[str]                    # its innermost frame most often while it held it
    files: list[str]                        # source files on its stacks while it held it, most sampled first


class GilOwnership(TypedDict):
    """Who held the GIL in the training process (py-spy record --gil), or why it was not measured."""
    measured: bool
    reason: Optional[str]
    free_threaded: Optional[bool]           # the target's interpreter has no GIL (python3.13t)
    rate_hz: Optional[float]
    seconds: Optional[float]
    samples: int                            # the sampler's samples (rate x seconds)
    held_share: Optional[float]             # any thread held the GIL
    training_thread_share: Optional[float]
    others_share: Optional[float]           # threads other than the training thread held it
    threads: List[GilHolderShare]


class _PySpySeen(TypedDict):
    pid: int
    rate_hz: Optional[int]
    nonblocking: bool
    anchor_unix: float
    threads_seen: int
    processes_seen: List[int]
    launcher: bool
    training_thread: Optional[TrainingThread]
    gil: GilOwnership


class Unread(TypedDict):
    samples: int                            # the training process's samples py-spy read
    errors: int                             # ... and those its non-blocking reads could not (dropped)
    share: float                            # errors / (samples + errors)


class PySpyEvidence(_PySpySeen, total=False):
    ranks: List[TrainerView]                # when the target's children train (torchrun)
    unread: Unread                          # py-spy's own count, from its log (absent where it printed none)
    # The view of the training thread (the target's, or the rank that waits on data the most);
    # absent when no training thread was seen.
    timeline: List[TimelineSpan]
    other_threads: List[OtherThread]
    workers: WorkersView


# -- gpu -----------------------------------------------------------------------------------------

class PcieLink(TypedDict):
    gen: Optional[int]
    width: Optional[int]
    max_gen: Optional[int]
    max_width: Optional[int]
    link_gbps: Optional[float]
    max_link_gbps: Optional[float]


class GpuDevice(TypedDict):
    index: int
    name: Optional[str]
    uuid: Optional[str]
    bus_id: Optional[str]
    pcie: PcieLink
    cpu_affinity: Optional[str]
    numa_node: Optional[int]
    memory_total_mb: Optional[int]
    errors: Dict[str, str]


class GpuProcess(TypedDict):
    pid: int
    gpu_index: int
    kind: Literal["compute", "graphics", "sampled"]
    used_memory_mb: Optional[float]


class GpuProcessUtilization(TypedDict):
    pid: int
    gpu_index: int
    samples: int
    sm_pct_mean: float
    memory_pct_mean: float
    target: bool


class PcieThroughput(TypedDict):
    rx_kbs_mean: Optional[float]
    tx_kbs_mean: Optional[float]
    rx_gbps_mean: Optional[float]
    tx_gbps_mean: Optional[float]
    rx_kbs_max: Optional[float]
    readings: int
    link_gbps: Optional[float]


class IdleIntervalSeconds(TypedDict):
    count: int
    longest: float
    median: float
    total: float


Interval = Tuple[float, float]              # [start_unix, end_unix]
UtilizationSample = Tuple[float, float]     # [end of the sample period (unix), percent]


class _GpuStatsSeen(TypedDict):
    sample_period_s: Optional[float]
    samples: int
    busy_fraction: Optional[float]
    memory_busy_fraction: Optional[float]
    utilization_source: str
    pcie: PcieThroughput
    memory_used_mb: Optional[float]
    power_w_mean: Optional[float]
    power_limit_w: Optional[float]
    temperature_c_max: Optional[float]
    clocks_event_reasons: Dict[str, float]  # reason -> share of the readings that showed it
    sm_clock_mhz_mean: Optional[float]      # nvmlDeviceGetClockInfo(SM) over the polls, MHz
    sm_clock_mhz_min: Optional[int]
    max_sm_clock_mhz: Optional[int]         # nvmlDeviceGetMaxClockInfo(SM), MHz
    pcie_replays: Optional[int]             # nvmlDeviceGetPcieReplayCounter, over the window
    ecc_corrected: Optional[int]            # volatile ECC errors over the window
    ecc_uncorrected: Optional[int]
    ecc_uncorrected_total: Optional[int]    # since the driver loaded
    polls: int


class GpuStats(_GpuStatsSeen, total=False):
    # Present when NVML's samples covered the window.
    observed_seconds: float
    idle_fraction: float
    busy_seconds: float
    idle_seconds: float
    idle_intervals: List[Interval]
    idle_seconds_unresolved: float
    idle_seconds_in_idle_periods: float
    idle_interval_seconds: IdleIntervalSeconds
    utilization_histogram: Dict[str, int]


class GpuWindow(TypedDict):
    start_unix: float
    end_unix: float
    seconds: float


class GpuEvidence(TypedDict):
    driver: Optional[str]
    nvml_version: Optional[str]
    cuda_driver_version: Optional[int]
    gpus: List[GpuDevice]
    processes: List[GpuProcess]
    process_utilization: List[GpuProcessUtilization]
    target_pid: Optional[int]
    target_gpus: List[int]
    target_gpus_from: Optional[str]
    window: GpuWindow
    sample_period_s: Optional[float]
    busy_fraction: Optional[float]
    idle_fraction: Optional[float]
    idle_intervals: List[Interval]
    utilization: Dict[int, List[UtilizationSample]]           # GPU index -> in-window samples
    memory_utilization: Dict[int, List[UtilizationSample]]
    per_gpu: Dict[int, GpuStats]                              # GPU index -> its statistics
    errors: Dict[str, str]
    notes: List[str]


# -- perfstat ------------------------------------------------------------------------------------

class PerfCounters(TypedDict):
    """perfparse.derive: ratios with their trust, and the counts they come from."""
    ipc: Optional[float]
    ipc_trust: Optional[float]
    llc_miss_ratio: Optional[float]
    llc_miss_trust: Optional[float]
    llc_source: Optional[str]
    llc_mpki: Optional[float]
    llc_mpki_trust: Optional[float]
    task_clock_s: Optional[float]
    cpu_cores: Optional[float]
    instructions: Optional[float]
    cycles: Optional[float]
    llc_loads: Optional[float]
    llc_load_misses: Optional[float]
    cache_references: Optional[float]
    cache_misses: Optional[float]
    context_switches: Optional[int]
    context_switches_per_s: Optional[float]
    cpu_migrations: Optional[int]
    cpu_migrations_per_s: Optional[float]
    page_faults: Optional[int]
    page_faults_per_s: Optional[float]
    major_faults: Optional[int]
    major_faults_per_s: Optional[float]
    user_only: bool


class PerfInterval(TypedDict):
    t: float
    seconds: float
    ipc: Optional[float]
    ipc_trust: Optional[float]
    llc_miss_ratio: Optional[float]
    llc_miss_trust: Optional[float]
    llc_mpki: Optional[float]
    cpu_cores: Optional[float]
    context_switches_per_s: Optional[float]


class PerfGroup(PerfCounters):
    pids: List[int]
    processes: int
    threads_counted: int
    seconds: Optional[float]
    series: List[PerfInterval]


class PerfProcess(PerfCounters):
    pid: Optional[int]
    group: str
    ppid: Optional[int]
    role: Literal["main", "dataloader_worker", "child"]
    comm: Optional[str]
    threads_counted: int


class PerfThread(PerfCounters):
    pid: Optional[int]
    tid: Optional[int]
    comm: Optional[str]
    group: str


class _PerfSessionSeen(TypedDict):
    status: Literal["ok", "failed"]
    pids: List[int]


class PerfSession(_PerfSessionSeen, total=False):
    reason: str                     # failed
    intervals: int                  # ok
    rows: int
    started_on: Optional[str]


class PerfHardware(TypedDict):
    available: bool
    reason: Optional[str]
    core_pmus: Optional[List[str]]
    hypervisor: Optional[bool]


class PerfStatEvidence(TypedDict):
    perf_version: Optional[str]
    interval_s: Optional[float]
    window_s: Optional[float]
    events: Dict[str, str]          # event -> counted / not counted / not supported / not requested
    hardware: PerfHardware
    user_only: bool
    sessions: Dict[str, PerfSession]
    groups: Dict[str, PerfGroup]
    training_thread: Optional[PerfThread]
    processes: List[PerfProcess]
    threads: List[PerfThread]
    unparsed_lines: int


# -- topology ------------------------------------------------------------------------------------

class NumaNode(TypedDict):
    node: int
    cpus: str
    cpu_count: int
    memory_mb: Optional[float]
    distances: List[int]


class LinkSamples(TypedDict):
    speed: List[Optional[float]]    # GT/s at the start and at the end of the window
    width: List[Optional[int]]


class PciLinkState(TypedDict):
    cur_speed: Optional[float]
    cur_width: Optional[int]
    max_speed: Optional[float]
    max_width: Optional[int]
    cur_gen: Optional[int]
    max_gen: Optional[int]
    samples: LinkSamples


class UpstreamLink(TypedDict):
    bdf: Optional[str]
    max_speed: Optional[float]
    max_gen: Optional[int]
    max_width: Optional[int]


# `class` is a keyword: this level is declared in the functional form.
PciDevice = TypedDict("PciDevice", {
    "bdf": str,
    "kind": Literal["gpu", "ib", "nic", "nvme", "other"],
    "vendor": Optional[str],
    "device": Optional[str],
    "class": Optional[str],
    "numa_node": Optional[int],
    "numa_node_reported": Optional[int],
    "local_cpulist": Optional[str],
    "link": PciLinkState,
    "upstream_link": Optional[UpstreamLink],
    "names": List[str],
})


class TopologyEvidence(TypedDict):
    numa_node_count: int
    nodes: List[NumaNode]
    cpus_online: Optional[str]
    pci: List[PciDevice]
    gpu_count: int
    notes: List[str]


# -- placement -----------------------------------------------------------------------------------

class NumaMemory(TypedDict):
    bytes_by_node: Dict[str, int]
    data_bytes_by_node: Dict[str, int]
    policies: Dict[str, int]
    maps_cuda: bool


class PlacedProcess(TypedDict):
    pid: int
    ppid: Optional[int]
    role: ProcessRole
    comm: Optional[str]
    argv: List[str]
    local_rank: Optional[int]
    cuda_visible_devices: Optional[str]
    cpus_allowed: Optional[str]
    mems_allowed: Optional[str]
    nodes_allowed: List[int]
    cpu_seconds: float
    main_thread_cpu_seconds: float
    main_thread_busy: Optional[float]
    cpu_seconds_by_cpu: Dict[str, float]
    cpu_seconds_by_node: Dict[str, float]
    cpu_seconds_unknown_node: float
    cpus_ran_on: Optional[str]
    cpus_seen: Optional[str]
    threads_sampled: int
    memory: Optional[NumaMemory]
    numa_maps_truncated: bool
    numa_maps_skipped: Optional[str]
    uses_cuda: bool
    rank_pid: int


class RankUnit(TypedDict):
    pid: int
    local_rank: Optional[int]
    cuda_visible_devices: Optional[str]
    members: List[int]


class Launcher(TypedDict):
    pid: int
    argv: List[str]
    is_target: bool
    torchrun: bool


class PlacementEvidence(TypedDict):
    pid: int
    window_s: float
    samples: int
    nodes: Dict[str, str]           # NUMA node -> its CPU list
    processes: List[PlacedProcess]
    ranks: List[RankUnit]
    launcher: Optional[Launcher]
    target_is_rank: bool
    reads: Optional[int]


# -- pressure ------------------------------------------------------------------------------------

class Stall(TypedDict):
    avg10: float                     # the kernel's running averages, percent
    avg60: float
    avg300: float
    stall_fraction: Optional[float]  # share of the window stalled, from the total counters


class PressureEvidence(TypedDict):
    window_s: Optional[float]
    host: Dict[str, Dict[str, Stall]]     # resource -> "some" | "full" -> Stall
    cgroup: Dict[str, Dict[str, Stall]]   # the same for the target's cgroup (cgroup v2 only)
    cgroup_path: Optional[str]


# -- throttle ------------------------------------------------------------------------------------

class ThrottleEvidence(TypedDict):
    cgroup_dir: Optional[str]
    cgroup_version: int                         # 1 or 2; 0 when unknown
    window_s: Optional[float]
    quota_cpus: Optional[float]                 # quota / period; None: no quota
    periods: int                                # enforcement periods in the window
    throttled_periods: int                      # of those, the ones that hit the quota
    throttled_period_share: Optional[float]
    throttled_seconds: Optional[float]          # time the cgroup's tasks were held back
    throttled_share_of_window: Optional[float]


# -- contention ----------------------------------------------------------------------------------

class JobThreadWait(TypedDict):
    pid: int
    tid: int
    name: str
    main: bool                       # the process's main thread (tid == pid)
    target: bool                     # a thread of the target process
    cpu_seconds: float               # schedstat on-CPU time over the window
    runq_seconds: float              # schedstat run-queue wait (runnable, not running)
    cpu_share: float                 # of the window
    runq_share: float                # of the window
    last_cpus: List[int]             # the CPUs it was seen on (start, samples, end)
    seen: Literal["both", "start", "end"]


class Competitor(TypedDict):
    pid: int
    ppid: int
    comm: str
    kernel_thread: bool
    cmdline: str                     # redacted; "[comm]" for a kernel thread
    user: Optional[str]
    uid: Optional[int]
    nice: Optional[int]
    cgroup: Optional[str]            # cgroup v2 path
    cpus_allowed: Optional[str]
    cpu_seconds: float               # over the window, on any CPU
    cpu_seconds_on_job_cpus: float
    share_of_job_cpus: float         # cpu_seconds_on_job_cpus / (window * job CPUs)
    attribution: Literal["inside", "outside", "sampled", "overlap"]
    weight: float                    # share of its CPU time placed on the job's CPUs
    started_in_window: bool
    sibling_of_target: bool          # the target's parent and command: another rank of the launch


class CpuWindow(TypedDict):
    run_s: float                     # user + nice + system
    idle_s: float                    # idle + iowait
    irq_s: float                     # irq + softirq
    steal_s: float
    job_s: float                     # the job's threads (spread over the CPUs they were seen on)
    others_s: float                  # run + irq - job


class ContentionEvidence(TypedDict):
    pid: int
    window_s: float
    source: Literal["procfs"]
    job_pids: List[int]
    job_cpus: str
    job_cpu_count: int
    cpu_quota_cores: Optional[float]
    job_cpu_budget: float            # CPUs the job may use: affinity, capped by its cgroup quota
    job_cpu_budget_basis: str
    cpuset_cpus: Optional[str]       # its cgroup's cpuset.cpus.effective: where it may be moved
    cgroup: Optional[str]
    cpus_online: str
    job_threads: List[JobThreadWait]
    job_cpu_seconds: float
    job_runnable_mean: float         # sum of the job's threads' cpu_share + runq_share
    training_thread_runq_share: Optional[float]
    training_thread_cpu_share: Optional[float]
    workers_runq_share_mean: Optional[float]
    per_cpu: Dict[int, CpuWindow]
    others_cpu_seconds_on_job_cpus: Optional[float]   # /proc/stat: job CPUs' run + irq - job - agent
    competitors_cpu_seconds_on_job_cpus: float        # the outside processes', placed on the job's CPUs
    irq_seconds_on_job_cpus: float
    steal_seconds_on_job_cpus: float
    agent_cpu_seconds_on_job_cpus: float
    competitors: List[Competitor]                     # the busiest on the job's CPUs first (at most 20)
    competitors_total: int
    processes_scanned: int
    scan_capped: bool
    max_processes: int
    exited_during_window: int
    ticks: int
    tracked_processes: int
    capture_cpu_seconds: float


# -- sched ---------------------------------------------------------------------------------------

class Waker(TypedDict):
    tid: int
    pid: Optional[int]
    name: Optional[str]
    seconds: float
    count: int


class SchedThread(TypedDict):
    tid: int
    pid: Optional[int]
    name: Optional[str]
    runq_delay_seconds: float
    runq_share: float
    runq_waits: int
    runq_p50_us: Optional[float]
    runq_p99_us: Optional[float]
    runq_max_us: Optional[float]
    oncpu_seconds: float
    sleep_seconds: float
    sleeps: int
    io_wait_seconds: float
    io_waits: int
    other_off_seconds: float
    involuntary_preemptions: int
    yields: int
    wakeups: int
    woken_by: List[Waker]


class SchedGroup(TypedDict):
    threads: int
    runq_delay_seconds: float
    runq_share_mean: float
    runq_p50_us: Optional[float]
    runq_p99_us: Optional[float]
    runq_waits: int
    oncpu_seconds: float
    io_wait_seconds: float
    sleep_seconds: float
    involuntary_preemptions: int
    runnable_threads_mean: float


class SchedProcess(SchedGroup):
    pid: int
    ppid: Optional[int]
    role: Literal["main", "child"]


class _SchedSeen(TypedDict):
    pid: int
    window_s: float
    attach_unix: Optional[float]
    cpus_online: Optional[int]
    threads: List[SchedThread]
    processes: List[SchedProcess]
    training_thread: Optional[SchedThread]
    main_process: SchedGroup
    children: SchedGroup
    job: SchedGroup
    report_max: int
    histograms: Dict[str, Dict[str, int]]   # tid -> quarter-octave slot -> run-queue waits


class SchedEvidence(_SchedSeen, total=False):
    host_busy_cores: float          # when /proc/stat was read at both ends


# -- syscalls ------------------------------------------------------------------------------------

class _SyscallStatSeen(TypedDict):
    count: int
    total_seconds: float
    max_us: float
    mean_us: float
    errors: int


class SyscallStat(_SyscallStatSeen, total=False):
    bytes: int                      # the read family only


class TopSyscall(SyscallStat):
    name: str


class FileReads(TypedDict):
    reads: int
    bytes: int
    eof_reads: int
    seconds: float


class IpcReads(TypedDict):
    reads: int
    bytes: int
    seconds: float


class OpenDir(TypedDict):
    dir: str
    opens: int


class SyscallProcess(TypedDict):
    pid: int
    ppid: Optional[int]
    role: Literal["main", "child"]
    syscalls: Dict[str, SyscallStat]
    calls: int
    syscall_seconds: float
    file_reads: FileReads
    ipc_reads: IpcReads
    queue_messages: int
    calls_per_second: float
    opens: int
    opens_per_second: float
    reads: int
    read_bytes: int
    mean_file_read_bytes: Optional[float]
    median_read_bytes: Optional[float]
    file_syscall_seconds: float
    file_syscall_share: float
    files_closed: int
    file_open_to_close_seconds: float
    file_open_to_close_share: float
    open_dirs: List[OpenDir]
    top_syscalls: List[TopSyscall]


class SyscallsEvidence(TypedDict):
    pid: int
    window_s: float
    attach_unix: Optional[float]
    bounded_to_seconds: Optional[float]
    processes: List[SyscallProcess]
    main: Optional[SyscallProcess]
    children: List[SyscallProcess]
    paths_sampled: int
    paths_capacity: Optional[int]


# -- gil -----------------------------------------------------------------------------------------

class FrameShare(TypedDict):
    frame: str
    share: float


class GilThread(TypedDict):
    tid: int
    name: Optional[str]
    samples: int
    gil_share: float
    active_share: float
    top_frames: List[FrameShare]


class GilHolder(TypedDict):
    tid: int
    name: Optional[str]
    share_of_waits: float
    gil_share: Optional[float]
    frame: Optional[str]


class GilHolderSamples(TypedDict):
    tid: int
    name: Optional[str]
    samples: int


class GilEvidence(TypedDict):
    pid: int
    samples: int
    rate_hz: Optional[float]
    training_thread: Optional[GilThread]
    training_samples: int
    gil_wait_share: Optional[float]
    gil_wait_samples: int
    gil_wait_unconfirmed_samples: int
    gil_held_share: Optional[float]
    holder: Optional[GilHolder]
    holders: List[GilHolderSamples]
    threads: List[GilThread]


# -- the run-time checker ------------------------------------------------------------------------

_NONE = type(None)


def is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


_HINTS: Dict[Any, Dict[str, Any]] = {}


def fields(td: Any) -> Dict[str, Any]:
    """A TypedDict's keys and their types (inherited ones included), resolved once."""
    if td not in _HINTS:
        _HINTS[td] = get_type_hints(td)
    return _HINTS[td]


def type_name(tp: Any) -> str:
    """How a problem names an expected type: `int`, `list[GpuDevice]`, `float | None`."""
    if tp is Any:
        return "Any"
    if tp is _NONE:
        return "None"
    origin, args = get_origin(tp), get_args(tp)
    if origin is Union:
        return " | ".join(type_name(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (list, dict, tuple):
        return f"{origin.__name__}[{', '.join('...' if a is Ellipsis else type_name(a) for a in args)}]"
    return getattr(tp, "__name__", repr(tp))


def _got(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def _scalar_ok(tp: Any, value: Any) -> bool:
    if tp is float:     # a JSON number without a fraction reads back as an int
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is _NONE:
        return value is None
    return isinstance(value, tp)


def problems(value: Any, tp: Any, path: str = "$") -> List[str]:
    """Every place where `value` does not match the declared type `tp`, as "path: expected X, got Y".

    TypedDicts are checked key by key (a missing required key, and a key the schema does not
    declare, are problems too); lists, tuples (a JSON array of fixed length), dicts (keys and
    values), Optional/Union, Literal, int, float (an int is accepted), str, bool and Any."""
    if tp is Any:
        return []
    if is_typeddict(tp):
        return _typeddict_problems(value, tp, path)
    origin, args = get_origin(tp), get_args(tp)
    if origin is Union:
        if any(not problems(value, a, path) for a in args):
            return []
        inner = [a for a in args if a is not _NONE]
        if value is not None and len(inner) == 1:
            return problems(value, inner[0], path)       # Optional[X]: say where X went wrong
        return [f"{path}: expected {type_name(tp)}, got {_got(value)}"]
    if origin is Literal:
        return [] if value in args else [f"{path}: expected {type_name(tp)}, got {value!r}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: expected {type_name(tp)}, got {_got(value)}"]
        return [p for i, v in enumerate(value) for p in problems(v, args[0], f"{path}[{i}]")]
    if origin is tuple:
        return _tuple_problems(value, tp, path)
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: expected {type_name(tp)}, got {_got(value)}"]
        out = []
        for k, v in value.items():
            if not _scalar_ok(args[0], k):
                out.append(f"{path}[{k!r}]: expected a key of type {type_name(args[0])}, got {_got(k)}")
            out.extend(problems(v, args[1], f"{path}[{k!r}]"))
        return out
    if _scalar_ok(tp, value):
        return []
    return [f"{path}: expected {type_name(tp)}, got {_got(value)}"]


def _typeddict_problems(value: Any, td: Any, path: str) -> List[str]:
    if not isinstance(value, dict):
        return [f"{path}: expected {td.__name__}, got {_got(value)}"]
    hints = fields(td)
    out = [f"{path}.{k}: expected a key of {td.__name__}, missing" for k in sorted(td.__required_keys__)
           if k not in value]
    for k, v in value.items():
        if k not in hints:
            out.append(f"{path}.{k}: expected no such key in {td.__name__}, got {_got(v)}")
        else:
            out.extend(problems(v, hints[k], f"{path}.{k}"))
    return out


def _tuple_problems(value: Any, tp: Any, path: str) -> List[str]:
    args = get_args(tp)
    if not isinstance(value, (list, tuple)):
        return [f"{path}: expected {type_name(tp)}, got {_got(value)}"]
    if len(args) == 2 and args[1] is Ellipsis:
        return [p for i, v in enumerate(value) for p in problems(v, args[0], f"{path}[{i}]")]
    if len(value) != len(args):
        return [f"{path}: expected {type_name(tp)}, got {len(value)} items"]
    return [p for i, (v, a) in enumerate(zip(value, args)) for p in problems(v, a, f"{path}[{i}]")]


# -- back from JSON ------------------------------------------------------------------------------

_INT_KEYS: Dict[Any, bool] = {}


def has_int_keys(tp: Any) -> bool:
    """Whether a `dict[int, ...]` lies anywhere below `tp` (what JSON can have turned into strings)."""
    if tp in _INT_KEYS:
        return _INT_KEYS[tp]
    _INT_KEYS[tp] = False                    # a type that refers to itself stops here
    if is_typeddict(tp):
        found = any(has_int_keys(t) for t in fields(tp).values())
    else:
        origin, args = get_origin(tp), get_args(tp)
        found = (origin is dict and args[0] is int) or (
            origin is not Literal and any(has_int_keys(a) for a in args if a is not Ellipsis))
    _INT_KEYS[tp] = found
    return found


def from_json(value: Any, tp: Any) -> Any:
    """`value` with the integer keys that JSON made strings (a GPU index "0") given back as ints,
    wherever `tp` declares `dict[int, ...]`. Everything else is returned as it is, even where it
    does not match `tp` (`problems` says where)."""
    if not has_int_keys(tp):
        return value
    if is_typeddict(tp):
        if not isinstance(value, dict):
            return value
        hints = fields(tp)
        return {k: from_json(v, hints[k]) if k in hints else v for k, v in value.items()}
    origin, args = get_origin(tp), get_args(tp)
    if origin is Union:
        inner = [a for a in args if a is not _NONE and has_int_keys(a)]
        return from_json(value, inner[0]) if len(inner) == 1 and value is not None else value
    if origin is list and isinstance(value, list):
        return [from_json(v, args[0]) for v in value]
    if origin is dict and isinstance(value, dict):
        return {_int_key(k) if args[0] is int else k: from_json(v, args[1]) for k, v in value.items()}
    return value


def _int_key(k: Any) -> Any:
    if isinstance(k, str) and k.lstrip("-").isdigit():
        return int(k)
    return k
