"""The step model: today's training step split into what the probes measured, and the step after a fix.

One fact joined from several probes, computed once per Evidence and read by every rule that
predicts a speedup (dataloader.starved, host.sync, host.launch_bound, h2d.pageable,
cpu.oversubscribed) and by the report's plan. Today's step is 1. Its parts:

    f_load   the loop loads batches itself (py-spy: data_load, num_workers=0)
    f_wait   the loop waits for DataLoader workers (py-spy: data_wait)
    C        the loop's own time, 1 - f_load - f_wait, of which
      s        host-device syncs (py-spy: .item(), .cpu(), synchronize),
      x_launch the GPU idled while the loop issued kernels (NVML + py-spy),
      h_launch the loop ran forward, backward and optimizer (py-spy: issuing kernels; the GPU busy or not),
      x_h2d    the GPU idled while the loop copied batches to it,
    b        the GPU's busy share (NVML): no fix on the host makes the step shorter than that,
    D        CPU-seconds per step of producing batches: the workers' measured CPU, or k f_load when
             the loop loads them itself (k: a batch made in a worker costs more CPU, HANDOFF_K),
    U, P     CPU-seconds the job uses per step and the CPUs it may use (affinity, cgroup quota, its
             share of the node's ranks); where the loop waited for a CPU a share r >= 5% of the
             window, P counts only the CPUs the job gets (P (1 - r)),
    L, n     cores the loop uses while it computes (intra-op threads at work) and its busy threads.

The step after a fix is the largest of what stays in place:
    loop   the loop's own time after the fix (less the sync or copy time removed, less e_c h_graph
           when the step's kernels replay from CUDA graphs: the captured part of the host's forward
           and backward time goes, whether the GPU idled or ran meanwhile, since the host no
           longer issues those kernels one by one; the GPU's own time stays as the gpu term; times
           A_PIN after a pinning fix, times (1 + e (L - 1)) / (1 + e (n' - 1)) when its intra-op
           threads are capped at n', e the parallel efficiency par_eff: L/n' at e = 1),
           plus f_load while the loop still loads batches itself, plus today's wait for workers f_wait
           when the fix leaves the data path as it is (the same workers, batches, pinning and
           re-creation: a wait the workers' pace does not explain, such as re-created workers'
           start-up, stays; where the pace does explain it, the data term sets the step anyway);
           a fix that ends the wait keeps the loop's own work inside it (wait_cpu: its serial
           threads' CPU from /proc beyond py-spy's shares outside the wait, receiving each batch),
    data   k D / (W e(W)): W workers each at the per-worker rate e(W) of today's (e falls as W grows
           beside the P CPUs: memory bandwidth, decode, the CPUs shared with the loop, the pin-memory
           thread and the driver's threads; scale_a below, fitted held out; see docs/models.md),
    pin    q, the pin-memory thread's CPU per step (process probe: its thread's CPU): one thread
           unpickles and pins every batch, so the step is never shorter than its CPU per batch,
    cpu    U' / P, the CPU the job needs after the fix over the CPUs it gets; with more workers the
           same batches cost D / e(W) CPU-seconds (the workers' CPU per batch at the higher rate),
    gpu    b, the GPU's own busy time.
A loop that loads its own batches and is given workers trades loading for a per-batch hand-off
where the step's length is measured (step_s, the window's backward passes): the loop's receive
h_l / step_s joins its term, the worker's sending h_w / step_s and half the receive the data term
(batch_handoff, docs/models.md). Where no whole CPU is left beside the loop's compute (P_allowed less
the loop's cores at n' threads under one: a CPU-only rank on its share of the node, a job held to one
CPU), the workers run on the loop's CPU, waking to refill their queues as the loop takes a batch,
that is as it starts computing (in lockstep, as every rank does): their CPU per step, k D + h_w /
step_s, joins the loop's term instead of filling its waits (no_cpu_for_workers).
torch.compile of an eager model also fuses its kernels, which shortens the GPU's own time and the
loop's by an amount no host evidence predicts: both fall to compile_fusion of what launch capture
alone leaves (0.8, fitted on the ledgers' compiled eager models together with compile_e; the
interval from none, 1.0, to 0.5). Split graphs keep compile_multi of it, as of the capture's gain.
A thread cap (cpu.oversubscribed's fix: no more runnable threads of the job than CPUs) does not
remove the run-queue wait as such: threads that time-share a CPU doing useful work need the same
CPU-seconds after the cap. It shortens the loop's time only by the share sigma of the job's CPU
time that was waste (a thread spinning while its peers wait, the cache refilled after each
preemption), and lengthens it where the job held fewer CPUs than it will (U / H', H' the CPUs it
holds after the cap: its threads and workers, at most P less what other processes take):
    loop' = loop (1 - sigma) U / H',
never less than its compute's work at the n threads' parallel speed, ((C - r) + e (L - 1) C) /
(1 + e (n - 1)) (e the team's CPU-clock samples' where the window has them, else the fitted par_eff).
sigma is read from the team's involuntary context switches per held core (each costs
SWITCH_COST_S of refill and re-wait: a preempted spinner or a thread woken into a busy CPU), at
most SIGMA_MAX; the probes cannot tell a spinning thread from a working one, so the interval runs
from no waste and the others keeping their CPUs (and, where other processes share the job's CPUs,
a team of exactly P threads losing CAP_SHARED_LOSS at its barriers) to twice the waste with all of
P held (others' load on a shared host moves from one window to the next).
A fix is worth 1 / step'. The binding term is the constraint that sets the predicted step; every
other constraint stays in place, so removing a sync on a job that waits for its workers gains what
the workers allow. Where the fix gives W workers and n' intra-op threads more busy threads than P
CPUs, the parallel regions wait for their slowest thread (a thread sharing its CPU with a worker):
the model expects no gain and the fix must cap the threads too (measured on a 2-CPU machine:
num_workers=1 beside 2 intra-op threads 0.82-0.87x, with 1 intra-op thread 1.44x).

The interval runs every calibrated constant over its range (Calibration: the low, middle and high
value of each) plus py-spy's sampling error of the shares. The constants are fitted held out on the
validation ledger (scripts/ledger.py --heldout, docs/ledger.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from trainprobe.agent.analysis import gpu_idle
from trainprobe.agent.combiners.training_ranks import data_share, trainers
from trainprobe.agent.evidence import Evidence


# handoff_ms and handoff_worker_ms with the "file_system" sharing strategy: benchmarks/bench_handoff.py on
# the 2-CPU machine measured the loop's receive 0.34 ms a batch against 0.63 with file descriptors, and the
# worker's send 0.65 ms against 1.07 (2026-12-06, one run of each, 5 repetitions): the fd priors scaled
# by those ratios (0.54, 0.61).
HANDOFF_MS_FS = (0.2, 0.45, 0.7)
HANDOFF_WORKER_MS_FS = (0.35, 0.7, 1.2)


@dataclass(frozen=True)
class Calibration:
    """Fitted constants, each (optimistic, middle, pessimistic) for the step after a fix.

    handoff_k   CPU a batch costs in a worker over what it cost in the loop (D measured in the loop)
    beta        the loop's own time grows by beta W / P as W busy workers share its CPUs
    a_pin       the loop's own time after pin_memory=True, over today's (pageable batches from workers)
    churn_m     time persistent workers return per unit of the loop's start/join share s (the forks'
                copy-on-write faults come back with them)
    scale_a     per-worker rate at W workers: e(W) = 1 / (1 + a max(0, W - max(W_now, 1)) / P)
    compile_e   share of the loop's host time in the model's forward and backward (h_graph) that
                torch.compile(mode="reduce-overhead") takes off the step (the captured graphs' launches and
                Python; what stays: the replays, the guards, the copies into the graphs' static inputs).
                The prior 0.57 is the in-house launch-bound row's (1.89x with h_graph = 0.82)
    switch_us   cost of one involuntary context switch of a busy intra-op thread, in microseconds of
                its CPU (the cap's waste sigma, see the module docstring)
    compile_fusion  the loop's and the GPU's time after torch.compile of an eager model, over what
                launch capture alone leaves (kernel fusion). The middle 0.8 is fitted jointly with
                compile_e (both shorten the same loop: fitted apart, each takes the whole gap) on the
                ledgers' launch-bound rows: the in-house MLP, minGPT's adder and chargpt, nanoGPT eager,
                the Siamese network, Lightning's autoencoder; held out, the folds start from 1.0 (no
                fusion, its value until 2026-12-06) and fit 0.8 or 0.9. Split graphs keep
                compile_multi of it (a GAN, an LSTM, nn.Transformer: 0.87-1.00x measured compiled)
    compile_multi  the share of compile_e left when the loop calls its modules from several places in
                every step, alternating (a GAN: the discriminator on real images, on a detached fake and
                on the fake again, the generator between): each call is a graph of its own, in another
                autograd state, and CUDA graphs of such a step measured no gain (pytorch/examples
                DCGAN 1.00x, Lightning's GAN template 0.92x and 0.97x, where e = compile_e predicted
                1.78-1.95x); the optimistic end keeps all of it. The same holds where the step's
                forward runs a recurrent module (nn.LSTM, GRU, RNN: dynamo graph-breaks around it by
                default): pytorch/examples' word-level LSTM measured 0.87x for a predicted 1.86x
    handoff_ms  what handing one batch from a worker to the loop costs the loop's thread (the queue's read,
                unpickling, each tensor's storage fetched from the worker's fd-sharing thread and mapped),
                in ms of CPU; a prior measured by benchmarks/bench_handoff.py (MNIST-shaped batches of
                32 on the 2-CPU machine: 0.66, 1.09 and 0.90 ms in three runs hours apart, the VM's
                speed moving), not fitted; the ends cover a faster host and a slower hour
    handoff_k_timed  k where the step's length is measured and the per-batch costs below are
                charged apart: only how much slower the same loading runs in a worker (1.13 measured
                by benchmarks/bench_handoff.py for pure-Python items; fitted held out on the rows
                that have the step's length). handoff_k, fitted on rows without it, carries the
                per-batch costs as well
    handoff_worker_ms  what sending it costs the worker beyond k times the loading (pickling, its
                queue's feeder thread, the fd-sharing thread): 1.72 and 1.23 ms measured there
    handoff_ms_fs, handoff_worker_ms_fs  the same two with torch.multiprocessing's "file_system"
                sharing strategy (each storage passed by its shared-memory file's name: no socket
                handshake with a thread of the worker per tensor), measured by
                benchmarks/bench_handoff.py --sharing-strategy file_system; not fitted
    par_eff     how much of the cores the loop uses while it computes (L) is parallel speed: its compute
                with n intra-op threads takes (1 + e (L - 1)) / (1 + e (n - 1)) of today's when capped
                from L to n cores (e = 1: perfect scaling, L / n; e = 0: the other threads spun or
                waited, and the cap costs nothing). Small ops on a few CPUs scale far from perfectly
                (a VAE on MNIST on 2 CPUs: its loop lost under 20% with 1 thread instead of 2). The
                middle 0.5 is the fit over the four ledgers' seven jobs with a thread cap (2 CPUs);
                their folds fit 0.3 or 0.5 held out from the earlier prior 0.2. The team's CPU-clock
                samples (par_measured) read 0.11-0.52 on those jobs where their measured gains imply
                0.2-0.5 and do not track them: they no longer set the middle of such a fix
                (docs/models.md). A thread cap alone (cpu.oversubscribed's, cap_par) is priced at
                the samples' e where the window has them
    gil_alpha   how far the loop's own CPU time per step shrinks once a GIL holder is gone (fewer
                hand-overs, a warm cache): c (1 - g)^alpha (gil.contention). A pure-Python holder
                takes the GIL back at every release for a torch op, and the loop's CPU time under it
                holds that hand-over overhead. The middle 0.8 is the fit over the ledgers' three GIL
                jobs (the in-house spinner and bursty holder, nanoGPT with the injected spinner);
                held out, the folds start from 0 (the loop keeps its CPU time) and fit 0.8 or 1.2,
                the optimistic end. Until 2026-12-06 the middle was 0.46, fitted in-sample to the
                two in-house rows, the ends 0 and 0.8
    shard_e     the share of the small-file time (and the loop's data wait) that packing the files
                into shards removes (io.small_reads: 1/(1 - e min(s, f))); the middle 0.85 is fitted
                to one job's measured fixes (the in-house small-files job, two runs, and an earlier
                capture), so held out it keeps its prior 1.0 (shards remove it all). The rule's
                interval comes from its own bounds (the syscall time alone, the whole wait), not
                from these ends
    """
    handoff_k: tuple[float, float, float] = (1.0, 1.25, 2.0)
    beta: tuple[float, float, float] = (0.0, 0.0, 0.9)
    a_pin: tuple[float, float, float] = (0.6, 0.77, 1.0)
    churn_m: tuple[float, float, float] = (3.0, 2.3, 1.0)
    scale_a: tuple[float, float, float] = (0.0, 0.5, 2.0)
    compile_e: tuple[float, float, float] = (0.85, 0.57, 0.4)
    switch_us: tuple[float, float, float] = (60.0, 30.0, 0.0)
    compile_fusion: tuple[float, float, float] = (0.5, 0.8, 1.0)
    compile_multi: tuple[float, float, float] = (1.0, 0.0, 0.0)
    par_eff: tuple[float, float, float] = (0.0, 0.5, 1.0)
    gil_alpha: tuple[float, float, float] = (1.2, 0.8, 0.0)
    shard_e: tuple[float, float, float] = (1.0, 0.85, 0.7)
    handoff_k_timed: tuple[float, float, float] = (1.0, 1.13, 2.0)
    handoff_ms: tuple[float, float, float] = (0.4, 0.85, 1.3)
    handoff_worker_ms: tuple[float, float, float] = (0.6, 1.2, 2.0)
    handoff_ms_fs: tuple[float, float, float] = HANDOFF_MS_FS
    handoff_worker_ms_fs: tuple[float, float, float] = HANDOFF_WORKER_MS_FS


CAL = Calibration()           # the calibration in use; scripts/ledger.py --heldout replaces it per fold
SAMPLE_Z = 2.0                # sampling error of a share in the interval: this many standard errors
CROWDED_RUNQ = 0.05           # the loop waits for a CPU at least this share: count only the CPUs it gets
BUSY = 0.10                   # a thread on a CPU (or waiting for one) at least this share is busy
PIN_THREAD = ("pin", "pt_data_pin")
PIN_MEMORY_THREAD = "pt_data_pin"   # torch's name for the DataLoader's pin-memory thread
# torch's autograd device threads (one per GPU) wait on the GPU: not intra-op threads on a CPU.
DEVICE_THREAD = ("pt_autograd",)
SCENARIOS = ("lo", "mid", "hi")   # lo: the shortest step (highest speedup); hi: the longest
SIGMA_MAX = 0.6               # at most this share of a team's CPU time is waste the cap removes
CAP_SHARED_LOSS = 0.25        # a team of P threads on CPUs others share waits at its barriers (0.84-0.90x measured)
SHARED_OTHERS = 0.10          # other processes took at least this many of the job's CPUs: they are shared


def calibration() -> Calibration:
    return CAL


def set_calibration(cal: Calibration) -> None:
    global CAL
    CAL = cal


@dataclass(frozen=True)
class Change:
    """What a fix changes, in the step model's terms (None / False: unchanged)."""
    workers: int | None = None            # num_workers after the fix
    intra_threads: int | None = None      # the training process's intra-op threads after the fix
    pin_memory: bool = False              # batches from workers pinned (a CUDA job that copied pageable)
    persistent: bool = False              # re-created workers kept alive across epochs
    sync_removed: bool = False            # no host-device sync per step
    launch_captured: bool = False         # the step's kernels replayed from CUDA graphs
    fusion: bool = False                  # an eager model compiled: its kernels may fuse as well
    h2d_removed: bool = False             # the copy to the GPU off the loop's path
    runq_removed: bool = False            # no more runnable threads of the job than CPUs
    sample_cost: float = 1.0              # each sample's CPU cost scaled by this
    sharing_fs: bool = False              # workers hand tensors over by shared-memory file name
    # gil.contention's fix (no thread holding the GIL beside the loop): the loop's time after it as the
    # GIL model gives it (shortest, middle, longest step; shares of today's step, data waits
    # included), and the cores the holder and the loop's lost CPU time free.
    gil_step: tuple[float, float, float] | None = None
    gil_freed_cores: float = 0.0
    gil_freed_extra: float = 0.0          # more cores freed at the optimistic end (the team's spin)
    # cpu.contended's fix (other processes off the job's CPUs): the training thread's run-queue wait
    # r and the part of it its own threads cause, r_self; the job gets all P CPUs back.
    others_removed: tuple[float, float] | None = None

    def merged(self, other: "Change") -> "Change":
        kw = {}
        for k in self.__dataclass_fields__:
            a, b = getattr(self, k), getattr(other, k)
            if k == "sample_cost":
                kw[k] = min(a, b)
            elif k in ("gil_freed_cores", "gil_freed_extra"):
                kw[k] = max(a, b)
            elif isinstance(a, bool) or isinstance(b, bool):
                kw[k] = bool(a or b)
            else:
                kw[k] = b if b is not None else a
        return Change(**kw)


@dataclass
class Step:
    """The step after a change, today's step = 1: the middle estimate and the interval's ends."""
    mid: float
    lo: float
    hi: float
    binding: str                           # the term that sets the middle estimate
    terms: dict[str, float] = field(default_factory=dict)   # every term at the middle estimate
    oversubscribed: bool = False           # the fix puts more busy threads than CPUs
    capped: bool = False                   # the fix caps the loop's intra-op threads below its cores
    on_loop_cpu: bool = False              # the new workers have no CPU but the loop's (no_cpu_for_workers)

    @property
    def speedup(self) -> float:
        return 1.0 / max(self.mid, 1e-6)

    @property
    def interval(self) -> tuple[float, float]:
        return 1.0 / max(self.hi, 1e-6), 1.0 / max(self.lo, 1e-6)


BINDING_WORDS = {
    "loop": "the loop's own work", "data": "the DataLoader workers' pace", "cpu": "the CPUs the job gets",
    "gpu": "the GPU's busy time", "loading": "the loop's own loading and compute",
    "oversubscribed": "threads waiting for CPUs (more busy threads than CPUs)",
    "pin": "the pin-memory thread's CPU per batch",
}


@dataclass
class StepModel:
    """Today's step, split into what the probes measured (shares of today's step)."""
    f_wait: float
    f_load: float
    s_sync: float = 0.0
    x_launch: float = 0.0
    x_h2d: float = 0.0
    gpu_busy: float | None = None
    h_launch: float = 0.0              # the loop's share in forward, backward and optimizer (issuing kernels)
    h_graph: float | None = None       # of which the model's forward and backward (what compiling the model captures)
    d: float = 0.0                     # CPU-s per step of batch production (k applied where in-loop)
    u: float = 1.0
    p: float = 0.0                     # CPUs the loop can count on (after crowding)
    p_allowed: float = 0.0             # CPUs it may use (affinity, quota, ranks share)
    loop_cores: float = 1.0
    threads_busy: int = 1              # busy threads of the training process now
    w_now: int = 0
    d_inloop: bool = True
    known_p: bool = False
    uses_cuda: bool = False
    recreated: bool = False
    churn_s: float = 0.0               # the loop's share starting and joining re-created workers
    churn_starts: int = 0              # ... starts of the training loader's workers the window saw
    epoch_s: float | None = None       # seconds the workers gone inside the window had lived, start to join
    window_s: float = 0.0              # seconds py-spy watched the training thread
    r_loop: float = 0.0
    n_samples: float = 100.0
    pid: int | None = None
    ranks: int = 1
    p_source: str = ""
    worker_cores: float = 0.0          # cores the DataLoader workers used
    pin_cores: float = 0.0             # CPU-s per step of the pin-memory thread(s) (0: none seen)
    pin_gil: float | None = None       # share of the step the pin-memory thread holds the GIL (py-spy --gil)
    wait_cpu: float = 0.0              # the loop's own threads on a CPU inside its waits for workers (below)
    others: float | None = None        # cores other processes took on the job's CPUs (measured), else None
    switch_rate: float = 0.0           # involuntary switches per second per held core of the busy team
    openmp: str | None = None          # the OpenMP runtime mapped by the job (libgomp, libiomp)
    interleaved_calls: bool = False    # the loop calls its modules from several places, alternating, every step
    rnn_share: float = 0.0             # the loop's share in nn.LSTM / GRU / RNN forwards (graph breaks)
    transformer_share: float = 0.0     # ... in nn.TransformerEncoder / Decoder forwards (their mask check breaks)
    in_closure: float = 0.0            # share of the forward/backward samples inside an optimizer's step
                                       # (the model runs in the optimizer's closure: Lightning's Trainer)
    f_first: float = 0.0               # ... waited for the first batch of workers it had just started
    f_eval: float = 0.0                # the loop waited on or loaded from loaders that do not train (an
                                       # evaluation pass's): a data fix to the training loader leaves it
    eval_passes: int = 0               # separate passes of the loop over such loaders in the window
    par_measured: tuple[float, float, float] | None = None   # e from the threads' CPU samples (lo, mid, hi)
    par_basis: str = ""                # ... in words
    team_cpu: float | None = None      # cores the loop's other intra-op threads used (samples: work, spin, kernel)
    loop_barrier: float | None = None  # cores the loop thread spent in the OpenMP runtime (waiting for its team)
    team_spin: float | None = None     # cores the loop's other intra-op threads spent there (spinning, waiting)
    step_s: float | None = None        # seconds a training step takes (the window's backward passes), None unknown

    @property
    def f(self) -> float:
        return self.f_wait + self.f_load

    @property
    def c(self) -> float:
        return max(1.0 - self.f - self.f_eval, 0.02)

    @property
    def split_graphs(self) -> bool:
        """Compiling the step would give several graphs with eager code between them: modules called
        from several places in turn; a recurrent module (nn.LSTM, GRU, RNN), which dynamo does not
        trace unless told to (torch._dynamo.config.allow_rnn is False by default): it graph-breaks
        around it and the recurrence runs eagerly; or torch's nn.TransformerEncoder / Decoder, whose
        check of a mask given without an is_causal hint (_detect_is_causal_mask) is a data-dependent
        bool: a graph break inside every call (Lightning's demo Transformer on the H200: compiled in
        place it measured 0.92x with mode="reduce-overhead" and 0.94x with the default mode,
        benchmarks/gpu_compile_check.py)."""
        return self.interleaved_calls or self.graph_break_kind is not None

    @property
    def graph_break_kind(self) -> str | None:
        """Which torch module breaks the graph ("rnn", "transformer"), None when none was seen."""
        if self.rnn_share >= RNN_SHARE:
            return "rnn"
        if self.transformer_share >= RNN_SHARE:
            return "transformer"
        return None

    def pin_serial(self, sc: str, keeps_wait: bool) -> float:
        """The pin-memory thread's time under the GIL that lands on the loop once it no longer waits:
        today that thread works while the loop waits for its batches; with the wait gone, its Python
        (receiving each batch's tensors, unpickling them) and the loop's take turns at the GIL. The
        middle counts its measured GIL share (py-spy --gil), the longest step all of its CPU, the
        shortest none; never more than the wait it overlapped today."""
        if keeps_wait or self.pin_cores <= 0 or self.d_inloop or not self.uses_cuda or sc == "lo":
            return 0.0
        held = self.pin_cores if sc == "hi" else min(self.pin_gil or 0.0, self.pin_cores)
        return min(held, self.f_wait)

    def handoff(self, sc: str) -> float:
        """The loop's own work inside what py-spy saw as its wait for workers, which stays when the wait
        goes: the CPU its serial threads (the training thread and the autograd device threads that run
        its backward while it waits) used beyond the shares py-spy put outside the wait (wait_cpu,
        from /proc: receiving each batch from the workers' queues, rebuilding its tensors, handing the
        next indices out; and py-spy's sampling error of the wait, which /proc does not have). The
        shortest step assumes it went with the wait."""
        if sc == "lo":
            return 0.0
        # (the threads' CPU inside an evaluation pass's wait is in f_eval, which stays whole)
        share = self.f_wait / (self.f_wait + self.f_eval) if self.f_wait + self.f_eval > 0 else 1.0
        return min(self.wait_cpu * share, self.f_wait)

    def batch_handoff(self, sc: str, cal: Calibration, fs: bool = False) -> tuple[float, float]:
        """(loop, worker) shares of today's step that handing each batch from a worker costs, where the
        loop loads its own batches today and its step's length is measured: handoff_ms and
        handoff_worker_ms over the step. Per batch, not per second of loading: on a job of 8 ms steps
        a large part of the step, on one of 100 ms steps a small one. (0, 0) where the loop already
        has workers (today's step pays it) or the step's length is unknown (k carries it), and where
        the loop calls its modules from several places in turn (a GAN: several backward passes a
        batch, so the count does not time a batch)."""
        if not self.d_inloop or not self.step_s or self.interleaved_calls:
            return 0.0, 0.0
        i = SCENARIOS.index(sc)
        loop_ms, worker_ms = ((cal.handoff_ms_fs, cal.handoff_worker_ms_fs) if fs
                              else (cal.handoff_ms, cal.handoff_worker_ms))
        return loop_ms[i] / 1000.0 / self.step_s, worker_ms[i] / 1000.0 / self.step_s

    def workers_to_loop(self, n: int, sc: str, cal: Calibration) -> tuple[float, float]:
        """(the loop's loading, the team's time given back) where the loop takes its batches back from
        today's workers (num_workers=0), shares of today's step; the loop's wait on the workers goes
        with them. The loading: the workers' CPU a batch less its hand-off (handoff_worker_ms a
        batch, where the step is timed), over k (a batch costs a worker k times what it costs the
        loop): the reverse of a move to workers. The time given back: where no CPU is left beside
        the loop's compute (a CPU-only job whose intra-op team fills its CPUs), the workers ran on the
        team's CPUs and a parallel region waited for the member a worker displaced, so the team lost
        about the workers' CPU (what the move to workers charges the loop, above: the loading comes
        back as the workers' CPU), never more than the loop thread's measured waits for it: for a CPU
        (run-queue) and at the team's barriers (its CPU-clock samples in the OpenMP runtime, where
        taken). The interval's long end gives back only the loop's own wait for a CPU. Elsewhere the
        workers ran on CPUs of their own, and nothing is given back."""
        i = SCENARIOS.index(sc)
        j = len(SCENARIOS) - 1 - i          # the shortest step takes the cheapest loading: the largest k
        timed = bool(self.step_s) and not self.interleaved_calls
        hand_w = cal.handoff_worker_ms[j] / 1000.0 / self.step_s if timed else 0.0
        k = cal.handoff_k_timed[j] if timed else cal.handoff_k[j]
        back = max(self.worker_cores - hand_w, 0.0) / k
        stall = 0.0
        if self.no_cpu_for_workers(n):
            barrier = (self.loop_barrier or 0.0) if sc != "hi" else 0.0
            stall = min(self.worker_cores, self.r_loop + barrier)
        return back, stall

    def first_wait(self, sc: str) -> float:
        """The wait for the first batch of each epoch's freshly started workers (py-spy: the loop's
        wait right after it started them), which stays with persistent workers and with more of them:
        at each epoch's start every worker builds a batch from its first index, and the loop waits
        for the first one. The shortest step assumes it went with the forks."""
        if sc == "lo" or not self.recreated:
            return 0.0
        return min(self.f_first, self.f_wait)

    def share_err(self, x: float) -> float:
        return SAMPLE_Z * math.sqrt(max(x * (1.0 - x), 0.0) / max(self.n_samples, 1.0))

    def shared(self) -> bool:
        """Other processes share the job's CPUs: measured, or (unmeasured) the job held under P - 0.1
        CPUs while its threads waited for one."""
        if self.others is not None:
            return self.others >= SHARED_OTHERS
        return self.r_loop >= CROWDED_RUNQ and self.u <= self.p_allowed - SHARED_OTHERS

    def sigma(self, sc: str, cal: Calibration) -> float:
        """Share of the job's CPU time the cap removes as waste: the team's involuntary switches per
        held core times their cost."""
        return min(SIGMA_MAX, self.switch_rate * cal.switch_us[SCENARIOS.index(sc)] * 1e-6)

    def cap_factor(self, n: int, w: int, sc: str, cal: Calibration) -> float:
        """The loop's time after capping the job's runnable threads, over today's (module docstring):
        (1 - sigma) U / H', H' the CPUs it holds after the cap."""
        if not self.p_allowed or self.u <= 0:
            return 1.0 - min(self.r_loop, 0.95) if sc == "lo" else 1.0
        workers = self.worker_cores * (min(w, self.w_now) / self.w_now if self.w_now and w else 0.0)
        if sc == "lo":
            # The CPUs the job did not hold may have been its own gaps, and others' load on a shared
            # host moves from one window to the next: the interval's top has all P.
            free = self.p_allowed
        elif self.others is not None:
            free = self.p_allowed - self.others
        else:
            free = min(self.p_allowed, max(self.u, 0.05))   # they went to others, who keep them
        held = max(min(n + workers, free), 0.05)
        # The CPU the job needs after the cap: today's, less what the capped-away threads spent beyond
        # their parallel speed (par_eff: all of it useful at e = 1).
        e = self.cap_par(sc, cal)
        useful = self.u - (1.0 - e) * max(self.loop_cores - n, 0.0) * self.c - self.spin_beyond(n)
        f = (1.0 - self.sigma(sc, cal)) * max(useful, 0.05) / held
        if sc == "hi" and self.shared():
            f *= 1.0 + CAP_SHARED_LOSS
        # However many CPUs the job holds, its compute runs on n threads: it takes at least its work,
        # (C - r) on the loop's thread plus e (L - 1) C on the others (r its wait for a CPU today),
        # at n threads' parallel speed (pytorch/examples' DCGAN on 2 CPUs, two intra-op threads and
        # a worker capped to one thread: the CPU accounting alone printed 1.22x, 1.01x measured).
        if self.c > 0.05 and self.loop_cores > n:
            work = max(self.c - min(self.r_loop, self.c), 0.02) + e * (self.loop_cores - 1.0) * self.c
            f = max(f, work / (1.0 + e * max(n - 1, 0)) / self.c)
        return f

    def par(self, sc: str, cal: Calibration) -> float:
        """The intra-op team's parallel efficiency e: the calibration's par_eff."""
        # The threads' CPU samples (par_measured) are reported, not used here: held out over the four
        # ledgers the fitted constant predicted a cap that comes with workers for the loop's own loading
        # better than they did (docs/models.md).
        return cal.par_eff[SCENARIOS.index(sc)]

    def cap_par(self, sc: str, cal: Calibration) -> float:
        """e for a thread cap alone (cpu.oversubscribed's, cap_factor): the team's CPU-clock samples
        where the window has them, else par(). A team that shares its CPUs with busy workers today
        spends much of its second thread's CPU waiting at its barriers for a preempted peer, which the
        samples see and no one constant holds: timm's train.py on 2 CPUs, one worker, one model, read
        e = 0.17 at 64 px (the cap measured 1.14x) and 0.56 at 128 px (0.86x); held out, the samples
        priced these caps better than par_eff did (docs/models.md)."""
        if self.par_measured is not None:
            return self.par_measured[SCENARIOS.index(sc)]
        return self.par(sc, cal)

    def spin_beyond(self, n: int, c: float | None = None) -> float:
        """Cores of the measured team's CPU beyond (L - 1) C that a cap to n threads removes: spinning
        outside the compute (after each parallel region, while the loop loads or waits), which
        /proc's L, held to the busy threads, does not count; it goes with the capped threads. 0
        without the threads' CPU samples."""
        if self.team_cpu is None or self.loop_cores <= 1.0 or n >= self.loop_cores:
            return 0.0
        c = self.c if c is None else c
        excess = max(self.team_cpu - (self.loop_cores - 1.0) * c, 0.0)
        return excess * (self.loop_cores - n) / (self.loop_cores - 1.0)

    def no_cpu_for_workers(self, n: int) -> bool:
        """No whole CPU is left for a worker while the loop computes: the CPUs the job may use (its
        share of the node's, by affinity and quota; others' crowding is the cpu term's) less the cores
        of the loop's compute at n threads is under one, on a job without a GPU (whose loop has no
        waits on the device for a worker to fill)."""
        return bool(self.p_allowed) and self.gpu_busy is None and not self.uses_cuda \
            and self.p_allowed - min(self.loop_cores, float(max(n, 1))) < 1.0 - 1e-6

    def efficiency(self, w: int, sc: str, cal: Calibration) -> float:
        """e(W): each worker's rate at W workers over today's, 1 / (1 + a max(0, W - max(W_now, 1)) / P)."""
        a = cal.scale_a[SCENARIOS.index(sc)]
        return 1.0 / (1.0 + a * max(0, w - max(self.w_now, 1)) / max(self.p, 1.0))

    def scaling_words(self, w: int, cal: Calibration | None = None) -> str:
        """The assumption the workers' term makes for W workers beyond today's, in words ('' when W is
        not more): each worker's rate at W over today's per-worker rate, middle and range."""
        cal = cal or CAL
        base = max(self.w_now, 1)
        if w <= base or self.d <= 0:
            return ""
        lo, mid, hi = (self.efficiency(w, sc, cal) for sc in SCENARIOS)
        today = (f"today {self.w_now} worker{'s' if self.w_now != 1 else ''} use {self.worker_cores:.2f} cores"
                 if self.w_now else "today the loop loads its own batches")
        at = f"{base} workers" if base > 1 else "one worker"
        return (f"it assumes each of the {w} workers keeps {mid:.2f} ({hi:.2f}-{lo:.2f}) of a worker's rate at "
                f"{at} ({today}; e(W) = 1 / (1 + a_s (W - {base}) / P), a_s = {cal.scale_a[1]:g}): one window at "
                f"today's count cannot measure how the pipeline scales; {MEASURED_WORKER_RATES}")

    # -- the step after a change -----------------------------------------------------------------

    def _at(self, ch: Change, sc: str, cal: Calibration,
            eval_kept: bool | None = None) -> tuple[float, str, dict[str, float], bool]:
        i = SCENARIOS.index(sc)
        if (ch.runq_removed and ch.gil_freed_cores > 0 and ch.intra_threads
                and ch.intra_threads >= self.threads_busy - 1):
            # A thread cap beside the GIL's removal that leaves as many threads as stay busy once the
            # holder is gone (it was one of them) changes nothing: the holder's removal ends the crowd.
            ch = replace(ch, runq_removed=False, intra_threads=None)
        err = self.share_err(self.f) * (-1, 0, 1)[i]
        c = max(self.c + err, 0.02)
        w = self.w_now if ch.workers is None else ch.workers
        loop = c
        if ch.gil_step is not None:
            # The GIL model's step, less the data share the terms below add back.
            loop = min(loop, max(ch.gil_step[i] - self.f, 0.02))
        if ch.others_removed is not None:
            # Without the others the loop's run-queue wait falls from r to r_self (its own threads'):
            # a loop that is runnable whenever it is not waiting on data takes (1 - r) / (1 - r_self);
            # one that waits on data loses the difference.
            r, r_self = (min(x, 0.95) for x in ch.others_removed)
            if self.f >= 0.10:
                loop = max(loop - max(0.0, r - r_self), 0.02)
            else:
                loop = max(loop * (1.0 - r) / (1.0 - r_self), 0.02)
        if ch.sync_removed:
            loop -= self.s_sync
        if ch.launch_captured:
            e_c = cal.compile_e[i] * (cal.compile_multi[i] if self.split_graphs else 1.0)
            loop -= e_c * self.graph_share
        fuse = cal.compile_fusion[i] if (ch.launch_captured and ch.fusion) else 1.0
        if self.split_graphs:
            # Split graphs keep compile_multi of the fusion's gain too (two GANs, an LSTM and
            # nn.Transformer measured 0.87-1.00x compiled: nothing fused shortened their steps either).
            fuse = 1.0 + (fuse - 1.0) * cal.compile_multi[i]
        loop *= fuse
        if ch.h2d_removed:
            loop -= self.x_h2d
        if ch.pin_memory and self.uses_cuda and (not self.d_inloop or i == 0):
            # Pinned batches from workers shorten the loop (a_pin, fitted where workers handed it
            # pageable ones). A loop that loads its own batches may pin them already (transformers'
            # Trainer does by default, and py-spy rarely samples the pinning): the shrink is then only
            # the interval's optimistic end (Lightning Fabric's MNIST, no workers: 0.76 of its loop).
            loop *= cal.a_pin[i]
        n_now = max(self.threads_busy, 1)
        n = ch.intra_threads or n_now
        if ch.runq_removed:
            loop *= self.cap_factor(n, w, sc, cal)
        cap_du = 0.0
        if n < self.loop_cores and not ch.runq_removed:
            # (With the run-queue wait removed, cap_factor has the cap's CPU accounting.)
            # Capped from L cores to n: the compute takes (1 + e (L - 1)) / (1 + e (n - 1)) as long, and
            # uses n cores instead of L while it runs (the CPU the other threads spun or worked with).
            e = self.par(sc, cal)
            grow = (1.0 + e * (self.loop_cores - 1.0)) / (1.0 + e * (n - 1.0))
            cap_du = c * (grow * n - self.loop_cores)
            cap_du -= self.spin_beyond(n, c)
            loop *= grow
        if self.p and w > self.w_now:
            # Busy workers share the loop's CPUs: its time grows by beta W / P (all W workers: today's
            # step already carries today's, but the measured rows cannot separate the two).
            loop *= 1.0 + cal.beta[i] * w / self.p
        w_same = ch.workers is None or ch.workers == self.w_now
        if ch.persistent and self.recreated and self.churn_s > 0 and w_same:
            # (With more workers too, the re-created workers' CPU was hidden from the probes: the new
            # workers' pace, not the forks' cost, is the open question; the ledger's GAN row.)
            # Persistent workers take the start/join share s off the step and the forks' copy-on-write
            # faults, (m - 1) s, off the loop's own time, which can at most halve (CHURN_CAP): the
            # gain is bounded by the loop's remaining work, never hyperbolic in s.
            loop -= min((cal.churn_m[i] - 1.0) * self.churn_s, CHURN_CAP * loop)
        d = self.d * ch.sample_cost
        if sc == "hi" and self.recreated and self.w_now and w > self.w_now:
            # Workers re-created in the window lived between the process probe's readings: their CPU is
            # a lower bound. At most each of today's workers was busy the whole step (D <= W_now).
            d = max(d, float(self.w_now) * ch.sample_cost)
        hand_l, hand_w = self.batch_handoff(sc, cal, ch.sharing_fs) if w > 0 else (0.0, 0.0)
        # The worker's CPU a batch over the loop's loading: k a second of loading (the same Python runs
        # slower in a worker), plus, with the step's length measured, handoff_worker_ms a batch (hand_w).
        if self.d_inloop:
            k = (cal.handoff_k_timed[i] if hand_w > 0 else cal.handoff_k[i]) / CAL_MID_K
        else:
            k = 1.0
        terms: dict[str, float] = {}
        workers_same = (w == self.w_now and ch.sample_cost == 1.0)
        eff = self.efficiency(w, sc, cal)
        # The loop takes its batches back from today's workers: (its loading, the team's time given back)
        to_loop = self.workers_to_loop(n, sc, cal) if w <= 0 and self.w_now > 0 and self.worker_cores > 0 else None
        if to_loop is not None:
            back, stall = to_loop
            terms["loading"] = loop - stall + (back + self.f_load) * ch.sample_cost
        elif w <= 0:
            # The loop still loads its own batches: loading and compute add up.
            terms["loading"] = loop + self.f_load * ch.sample_cost + self.f_wait
        elif workers_same and ch.persistent and self.churn_s > 0:
            # Only the re-creation goes: the wait beyond it stays (the workers' pace is unchanged).
            terms["loop"] = loop + max(self.f_wait - self.churn_s, 0.0)
        else:
            # A fix that leaves the data path as it is (the same workers, batches, pinning and
            # re-creation) leaves today's wait for them in place as well: the workers' pace does not
            # explain a wait they keep up with (re-created workers' start-up, a batch's latency), and
            # where it does, the data term below sets the step anyway.
            # Fewer workers alone (no thread cap beside them) never hand batches over sooner: a loop
            # that waits on workers that keep up with it keeps that wait (minGPT's adder on 2 CPUs, 4
            # workers cut to 1 beside a team of 2: the wait dropped printed 1.14x, 1.01x measured).
            fewer_only = 0 < w < self.w_now and ch.sample_cost == 1.0 and ch.intra_threads is None
            keeps_wait = ((workers_same or fewer_only) and not ch.persistent and not ch.pin_memory
                          and ch.gil_step is None and ch.others_removed is None
                          and (not ch.runq_removed or fewer_only))
            terms["loop"] = (loop + (self.f_wait if keeps_wait else self.handoff(sc) + self.first_wait(sc))
                             + self.pin_serial(sc, keeps_wait) + hand_l)
            # Part of each batch's receive is serial with its worker: the loop fetches each tensor's
            # storage from the worker's fd-sharing thread, a Python thread that waits for the worker's
            # GIL (benchmarks/bench_handoff.py: with nothing else to do, a batch came every L1 +
            # HANDOFF_SERIAL h_loop, L1 the worker's CPU a batch).
            terms["data"] = (k * d + hand_w + HANDOFF_SERIAL * hand_l) / (w * eff) if d > 0 else 0.0
            if self.pin_cores > 0 and not self.d_inloop:
                # One pin-memory thread handles every batch: its CPU per step does not shrink with W.
                terms["pin"] = self.pin_cores
            if self.d_inloop and self.no_cpu_for_workers(n) and d > 0:
                # No CPU is left beside the loop's compute (a CPU-only rank on its share of the node, a
                # job held to one CPU): the workers run on the loop's CPUs. A worker wakes to refill its
                # queue as the loop takes a batch, which is when the loop starts computing (and, in
                # lockstep, when every rank does), so its CPU is taken from the loop's, not from the
                # loop's waits: the loading moves out of the loop and comes back as the workers' CPU
                # (Lightning's ddp_spawn on 2 CPUs, a worker a rank: 0.80x and 0.87x measured where
                # packing the workers into the ranks' collective waits printed 1.24x and 1.16x).
                terms["loop"] += k * d + hand_w
        if self.p > 0 and not ch.runq_removed:
            # (A thread cap's CPU accounting is in cap_factor: the CPUs the job holds after it.)
            if to_loop is not None:
                # The workers' CPU goes, the loop's loading comes back, and so does the CPU the team's
                # other threads spun away at barriers while a worker held a member's CPU (the long
                # end keeps that spin; the short end takes all their CPU in the OpenMP runtime,
                # measured by the CPU-clock samples, for what it is: no work of the step's).
                back, stall = to_loop
                spun = stall * max(self.loop_cores - 1.0, 0.0) if sc != "hi" else 0.0
                if sc == "lo" and self.team_spin is not None:
                    spun = max(spun, self.team_spin)
                u = self.u - self.worker_cores + back - spun
            elif self.d_inloop and w > 0:
                u = self.u - self.f_load + (k * d + hand_w) / eff + hand_l
            else:
                u = self.u - (1.0 - ch.sample_cost) * min(self.d, self.u)
                if w > self.w_now and self.worker_cores > 0:
                    # The workers' CPU per batch at the higher rate: the same batches cost 1/e as much.
                    u += self.worker_cores * ch.sample_cost * (1.0 / eff - 1.0)
            u = max(u + cap_du - ch.gil_freed_cores - (ch.gil_freed_extra if sc == "lo" else 0.0), 0.0)
            # Other processes off its CPUs: the job counts on all it may use.
            p = self.p_allowed if (ch.others_removed is not None and self.p_allowed) else self.p
            if ch.gil_freed_cores > 0 and self.p_allowed and self.p < self.p_allowed and not self.shared():
                # The loop queued for a CPU behind the job's own threads, the GIL's holder among them
                # (nobody else took its CPUs): with the holder gone the job gets every CPU others
                # leave it (pytorch/examples-style nanoGPT with a spinning logger thread: counting
                # today's crowded share alone printed 1.57x for 2.03x measured).
                p = self.p_allowed - (self.others or 0.0)
            # Today's step is 1 by definition: a job whose CPU use already exceeds its CPUs (threads
            # time-sharing them) is held to today's ratio, not counted slower than it is.
            terms["cpu"] = (u / p) / max(1.0, self.u / self.p)
        if eval_kept is None:
            eval_kept = sc != "lo" or self.eval_passes >= EVAL_CYCLE_PASSES
        if self.f_eval > 0 and eval_kept:
            # An evaluation pass's loader: its wait is not the training loader's and stays. The
            # window's share of it estimates the job's (a window placed at random sees each phase in
            # its share of the job's time), but a window that caught a single pass is shorter than
            # the job's cycle of training and evaluation and can hold far more of the pass than the
            # job spends in it (Fabric's k-fold example: 55% of one 5 s window, about a sixth of each
            # fold): the shortest step then counts none of it.
            for t in ("loading", "loop"):
                if t in terms:
                    terms[t] += self.f_eval
        if self.gpu_busy is not None:
            terms["gpu"] = self.gpu_busy * fuse
        over = False
        if self.p_allowed and w > 0 and w > self.w_now and (n + w) > self.p_allowed + 1e-6 and n > 1:
            # More busy threads than CPUs: a parallel region waits for its slowest thread, which shares
            # a CPU with a worker; no gain is expected (the fix must cap the intra-op threads).
            over = True
            terms["oversubscribed"] = 1.0
        binding = max(terms, key=lambda t: terms[t])
        return terms[binding], binding, terms, over

    def after(self, ch: Change, cal: Calibration | None = None) -> Step:
        cal = cal or CAL
        mid, binding, terms, over = self._at(ch, "mid", cal)
        if self.f_eval > 0 and self.eval_passes == 1:
            # The window caught one evaluation pass, cut by its edge (a window shorter than the job's
            # cycle): where the cut falls is uniform whatever the pass's share of the job, so the
            # window's share says nothing of the job's (the k-fold example's 55% against about a
            # sixth). The middle is the geometric mean of the step with all of it kept and with none
            # of it, the two ends' own assumptions. (Captures from before the passes were counted
            # keep all of it.)
            mid = math.sqrt(mid * self._at(ch, "mid", cal, eval_kept=False)[0])
        lo = self._at(ch, "lo", cal)[0]
        hi = self._at(ch, "hi", cal)[0]
        if self.one_start_only(ch):
            # The window saw the workers started once: an epoch longer than the window holds one start
            # in a share of the job the window cannot tell (Lightning's GAN template: 0.35 s of starting
            # 16 workers in a 4.6 s window, in epochs of about 20 s; persistent workers measured 0.98x
            # where the window's share gave 1.22x). Where the workers it saw go had lived longer than
            # the window (their start to their join: the epoch), the start and join take their share
            # of that epoch; else, as with a single evaluation pass, the middle is the geometric mean
            # of the step with the window's share and with none of it. The longest step counts none.
            none = replace(self, churn_s=0.0)
            if self.epoch_known():
                mid = replace(self, churn_s=self.churn_s * self.window_s / self.epoch_s)._at(ch, "mid", cal)[0]
            else:
                mid = math.sqrt(mid * none._at(ch, "mid", cal)[0])
            hi = max(hi, none._at(ch, "hi", cal)[0])
        lo, hi = min(lo, mid), max(hi, mid)
        capped = ch.intra_threads is not None and ch.intra_threads < self.loop_cores
        w = self.w_now if ch.workers is None else ch.workers
        on_loop = self.d_inloop and w > 0 and self.no_cpu_for_workers(ch.intra_threads or max(self.threads_busy, 1))
        return Step(mid, lo, hi, binding, {k: round(v, 4) for k, v in terms.items()}, over, capped, on_loop)

    def epoch_known(self) -> bool:
        """The workers the window saw go had lived longer than the window: their life is the epoch's."""
        return bool(self.epoch_s and self.window_s and self.epoch_s > self.window_s)

    def one_start_only(self, ch: Change) -> bool:
        """The fix keeps re-created workers alive, and the window saw them started once (a capture
        that predates the count: not known, False)."""
        return bool(ch.persistent and self.recreated and self.churn_s > 0 and self.churn_starts == 1)

    @property
    def graph_share(self) -> float:
        """The loop's share in the model's forward and backward: what compiling the model captures (the
        optimizer's step and the Python around the model, such as a framework's closure, hooks and
        logging, stay eager). Without the split (a recorded model), all of forward/backward/optimizer."""
        return self.h_launch if self.h_graph is None else self.h_graph

    # -- words ------------------------------------------------------------------------------------

    def split(self) -> dict[str, float]:
        """Today's step in shares: what the probes measured."""
        parts = {"loading in the loop": self.f_load, "waiting for workers": self.f_wait,
                 "waiting on an evaluation pass's DataLoader (a fix to the training loader leaves it)": self.f_eval,
                 "host-device syncs": self.s_sync, "GPU idle while the loop issues kernels": self.x_launch,
                 "GPU idle while the loop copies batches": self.x_h2d}
        rest = max(0.0, 1.0 - sum(parts.values()))
        parts["the loop's other work (compute, Python)"] = rest
        return {k: round(v, 3) for k, v in parts.items() if v >= 0.01}

    def split_words(self) -> str:
        sp = self.split()
        return "today's step: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in sp.items())

    def derivation(self, what: str, step: Step, fs: bool = False) -> str:
        """'the loop loads batches itself 61% of the step; with ... the step is set by compute (0.69 of
        today's): 1.44x' in words; symbols go into details."""
        lo, hi = step.interval
        if step.oversubscribed:
            return (f"{self.split_words()}; {what} puts more busy threads than the {self.p_allowed:.3g} CPUs: the "
                    "parallel regions wait for a thread that shares its CPU with a worker, so no gain is expected")
        kept = []
        if step.binding == "loop":
            handoff, pin = self.handoff("mid"), self.pin_serial("mid", keeps_wait=False)
            if handoff >= 0.01:
                kept.append(f"the {100 * handoff:.0f}% of the step its threads were on a CPU inside today's wait "
                            "for workers (receiving batches)")
            if pin >= 0.01:
                kept.append(f"the pin-memory thread's {100 * pin:.0f}% under the GIL")
        inside = (", which keeps " + " and ".join(kept)) if kept else ""
        hand_l, hand_w = self.batch_handoff("mid", CAL, fs)
        if hand_l > 0 and step.binding in ("loop", "data", "cpu"):
            loop_ms, worker_ms = ((CAL.handoff_ms_fs, CAL.handoff_worker_ms_fs) if fs
                                  else (CAL.handoff_ms, CAL.handoff_worker_ms))
            inside += (f"; its steps take {1000 * self.step_s:.1f} ms (backward passes counted), and handing each "
                       f"batch from a worker{' by shared-memory file name' if fs else ''} costs the loop about "
                       f"{loop_ms[1]:g} ms and the worker {worker_ms[1]:g} ms beyond the loading "
                       f"({100 * hand_l:.0f}% and {100 * hand_w:.0f}% of today's step), one after the other")
        if step.on_loop_cpu and step.binding in ("loop", "cpu"):
            inside += (f"; no whole CPU is left beside the loop's compute ({self.p_allowed:.3g} CPU(s) for it, "
                       f"{min(self.loop_cores, 1.0 * (self.threads_busy or 1)):.3g} busy while it computes), so the "
                       "worker runs on the loop's CPU as the loop starts each step: the loading comes back as the "
                       "worker's CPU")
        if step.capped:
            inside += (f"; with fewer intra-op threads the loop's compute takes longer (parallel efficiency "
                       f"e = {CAL.par_eff[1]:g}, fitted on the ledgers"
                       + (f"; {self.par_basis}, which would read e = {self.par_measured[1]:.2f}"
                          if self.par_measured is not None and self.par_basis else "") + ")")
        if self.f_eval >= 0.01 and self.eval_passes == 1:
            inside += (f"; the window caught one evaluation pass, cut by its edge, and cannot tell that pass's "
                       f"share of the job: the step is the geometric mean of keeping its {100 * self.f_eval:.0f}% "
                       "and keeping none of it")
        return (f"{self.split_words()}; {what}: the step is set by {BINDING_WORDS.get(step.binding, step.binding)}"
                f"{inside} ({step.mid:.2f} of today's): {step.speedup:.2f}x ({lo:.2f}-{hi:.2f}x over the fitted constants' "
                "ranges and py-spy's sampling error); an estimate")

    def details(self, step: Step | None = None) -> dict[str, Any]:
        d = {"f_wait": round(self.f_wait, 4), "f_load": round(self.f_load, 4), "C": round(self.c, 4),
             "s_sync": round(self.s_sync, 4), "x_launch": round(self.x_launch, 4),
             "h_launch": round(self.h_launch, 4),
             "h_graph": None if self.h_graph is None else round(self.h_graph, 4), "x_h2d": round(self.x_h2d, 4),
             "gpu_busy": None if self.gpu_busy is None else round(self.gpu_busy, 4), "D": round(self.d, 4),
             "U": round(self.u, 4), "P": round(self.p, 3), "P_allowed": self.p_allowed,
             "L": round(self.loop_cores, 3), "threads_busy": self.threads_busy, "W_now": self.w_now,
             "r_loop": round(self.r_loop, 4), "churn_s": round(self.churn_s, 4),
             "epoch_s": None if self.epoch_s is None else round(self.epoch_s, 3),
             "worker_cores": round(self.worker_cores, 3), "pin_cores": round(self.pin_cores, 4),
             "pin_gil": None if self.pin_gil is None else round(self.pin_gil, 4),
             "wait_cpu": round(self.wait_cpu, 4),
             "others": None if self.others is None else round(self.others, 3),
             "switch_rate": round(self.switch_rate, 1), "openmp": self.openmp,
             "interleaved_calls": self.interleaved_calls, "rnn_share": round(self.rnn_share, 4),
             "transformer_share": round(self.transformer_share, 4), "in_closure": round(self.in_closure, 4),
             "f_eval": round(self.f_eval, 4),
             "eval_passes": self.eval_passes,
             "f_first": round(self.f_first, 4),
             "par_measured": None if self.par_measured is None else [round(x, 3) for x in self.par_measured],
             "team_cpu": None if self.team_cpu is None else round(self.team_cpu, 3),
             "loop_barrier": None if self.loop_barrier is None else round(self.loop_barrier, 3),
             "team_spin": None if self.team_spin is None else round(self.team_spin, 3),
             "step_s": None if self.step_s is None else round(self.step_s, 5),
             "calibration": {k: list(getattr(CAL, k)) for k in CAL.__dataclass_fields__}}
        if step is not None:
            d["after"] = {"step": round(step.mid, 4), "step_range": [round(step.lo, 4), round(step.hi, 4)],
                          "binding": step.binding, "terms": step.terms}
        return d


EVAL_CYCLE_PASSES = 2          # a window with this many evaluation passes spans a whole cycle of the job
CHURN_CAP = 0.5               # persistent workers at most halve the loop's own time
# Per-worker rates the ledgers measured when a fix raised the worker count (docs/ledger.md): the rate
# of each worker at the new count over its rate at the old one, quoted beside e(W)'s assumption.
MEASURED_WORKER_RATES = ("the ledger's jobs raised from 2 to 15 workers on 16 CPUs kept 0.36 (timm's train.py "
                         "on JPEG files, 15 batches an epoch: each epoch's first batch waits for one worker), 0.62 "
                         "and at least 0.83 (two FakeData pipelines); timm's JPEG loader kept 0.88 at 12 workers "
                         "on 156-batch epochs")
HANDOFF_SERIAL = 0.5          # the share of the loop's receive a worker's batches wait for: a batch every L1 +
                              # 0.38-0.65 h_l with nothing else to do (bench_handoff.py, three runs, 2026-12-05)
CAL_MID_K = 1.5               # D measured in the loop carries this middle k (scaled to the range)


# -- reading the evidence ----------------------------------------------------------------------------

def spy_worker_cores(workers: dict[str, Any], window_s: float) -> float:
    """Cores the DataLoader workers kept busy, from py-spy's samples of them (0 when unknown)."""
    if not window_s:
        return 0.0
    busy = sum(float(w.get("seconds") or 0.0) * (1.0 - float((w.get("breakdown") or {}).get("idle", 0.0)))
               for w in workers.get("per_worker") or [])
    return busy / window_s


def workers_of(proc: dict[str, Any], me: dict[str, Any], w_now: int, spy_workers: dict[str, Any] | None,
               tt_seconds: float) -> tuple[list[dict[str, Any]], int, float]:
    """(worker processes seen, live workers, cores they used in the window) of one training process.
    Live workers: the most alive at once (at the window's start or end), not every PID seen: workers
    re-created every epoch come and go and would otherwise be counted several times. Their cores: the
    process probe's CPU of each in the window (a worker gone before the end, to its last reading;
    unknown, and left out, where a capture has no reading after the start), at least what py-spy's
    samples of them show."""
    w_proc = [x for x in proc["processes"] if x["role"] == "dataloader_worker" and x.get("ppid") == me["pid"]
              and x.get("seen") != "listing"]
    alive_end = len([x for x in w_proc if x["alive_at_end"]])
    alive_start = len([x for x in w_proc if x.get("seen") in ("both", "start")])
    live = max(alive_end, alive_start)
    w_now = live if w_proc else w_now
    worker_cores = sum(float(x["cpu_cores"]) for x in proc["processes"] if x["role"] == "dataloader_worker"
                       and x.get("ppid") == me["pid"] and x.get("cpu_cores") is not None)
    worker_cores = max(worker_cores, spy_worker_cores(spy_workers or {}, tt_seconds))
    churn = proc.get("worker_churn") or {}
    reaped = proc.get("reaped_children_cores") if me["pid"] == proc.get("pid") else None
    if reaped and (churn.get("appeared") or churn.get("vanished")):
        # Workers re-created every epoch mostly live between the readings: the ones that exited
        # were reaped, and their CPU is in the parent's cutime + cstime (the process probe takes off
        # what those seen at the window's start had spent before it), plus the window's CPU of those
        # alive at the end.
        alive = sum(float(x.get("cpu_cores") or 0.0) for x in w_proc if x["alive_at_end"])
        worker_cores = max(worker_cores, float(reaped) + alive)
    return w_proc, w_now, worker_cores


def _loop_thread_cores(me: dict[str, Any]) -> tuple[float, int]:
    """(cores, busy threads) of the training process's own compute: every thread but the pin-memory
    thread, which runs whatever the loop does."""
    cores, busy = 0.0, 0
    for t in me.get("threads") or []:
        name = (t.get("name") or "")
        if any(p in name for p in PIN_THREAD):
            continue
        cpu = float(t.get("cpu_fraction") or 0.0)
        cores += cpu
        busy += cpu >= BUSY and not name.startswith(DEVICE_THREAD)
    return cores, max(busy, 1)


def _ranks(ev: Evidence) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    ranks = trainers(ev.get("pyspy") or {})
    if not ranks:
        return None
    return ranks, max(ranks, key=lambda r: data_share(r["training_thread"]))


def from_evidence(ev: Evidence, pid: int | None = None) -> StepModel | None:
    """The step model of the training loop that waits longest on data (the straggler rank, or the one
    process), or of the rank `pid`; None without py-spy's training thread. Computed once per Evidence."""
    cache = ev.__dict__.setdefault("_step_models", {})
    if pid in cache:
        return cache[pid]
    m = _build(ev, pid)
    cache[pid] = m
    return m


def process_model(ev: Evidence) -> StepModel | None:
    """The step model of the training process from the process probe alone (no py-spy: the loop's
    data share unknown, taken as 0), for the thread cap; None without the process probe."""
    m = from_evidence(ev)
    if m is not None:
        return m
    cache = ev.__dict__.setdefault("_step_models", {})
    if "process" in cache:
        return cache["process"]
    proc = ev.get("process") or {}
    m = None
    if proc.get("processes") and proc.get("pid") is not None:
        m = StepModel(f_wait=0.0, f_load=0.0, pid=int(proc["pid"]), n_samples=1.0)
        _cpu_terms(ev, m, {"pid": m.pid}, {}, 0.0)
    cache["process"] = m
    return m


def _build(ev: Evidence, pid: int | None) -> StepModel | None:
    got = _ranks(ev)
    if got is None:
        return None
    ranks, worst = got
    if pid is not None:
        worst = next((r for r in ranks if r["pid"] == pid), worst)
    tt = worst["training_thread"]
    bd = tt.get("breakdown") or {}
    spy = ev.get("pyspy") or {}
    workers = worst.get("workers") or {}
    ev_wait, ev_load, ev_start = eval_loaders(tt)
    m = StepModel(f_wait=max(float(bd.get("data_wait", 0.0)) - ev_wait, 0.0),
                  f_load=max(float(bd.get("data_load", 0.0)) - ev_load, 0.0), f_eval=ev_wait + ev_load,
                  eval_passes=sum(int(r.get("passes") or 0) for r in tt.get("loaders") or []
                                  if r.get("trains") is False),
                  w_now=int(workers.get("count") or 0), pid=worst.get("pid"), ranks=len(ranks),
                  window_s=float(tt.get("seconds") or 0.0))
    m.n_samples = max(1.0, m.window_s * float(spy.get("rate_hz") or 25.0))
    _gpu_terms(ev, m)
    _cpu_terms(ev, m, worst, workers, m.window_s)
    m.churn_s = _churn_share(tt, m.f, ev_start)
    m.churn_starts = sum(int(r.get("starts") or 0) for r in tt.get("loaders") or [] if r.get("trains") is not False)
    m.f_first = sum(float(r.get("first_wait") or 0.0) for r in tt.get("loaders") or []
                    if r.get("trains") is not False)
    m.interleaved_calls = interleaved_calls(tt)
    breaks = tt.get("graph_break_modules") or {}
    m.rnn_share = float(breaks.get("rnn", 0.0))
    m.transformer_share = float(breaks.get("transformer", 0.0))
    m.in_closure = float(tt.get("model_in_optimizer_step") or 0.0)
    pins = [t for t in spy.get("other_threads") or [] if "pin_memory" in (t.get("name") or "")
            and t.get("gil_share") is not None]
    if pins and (spy.get("gil") or {}).get("measured", True):
        m.pin_gil = sum(float(t["gil_share"]) for t in pins)
    if tt.get("worker_startup_seconds", 0) > 0:
        m.recreated = True
    return m


def _gpu_terms(ev: Evidence, m: StepModel) -> None:
    if not ev.has("gpu"):
        return
    att = gpu_idle.for_evidence(ev)
    if not att.ok:
        return
    m.s_sync = att.host_share("host_sync")
    m.x_launch = att.idle_share("launch")
    m.h_launch = att.host_share("launch")
    # The part of it in the model's forward and backward (py-spy's categories of the training thread):
    # compiling the model captures those graphs, not the optimizer's step nor what a framework runs
    # around the model inside the optimizer's closure (Lightning's hooks and logging sample as optimizer).
    bd = ((ev.get("pyspy") or {}).get("training_thread") or {}).get("breakdown") or {}
    fb, opt = bd.get("forward", 0.0) + bd.get("backward", 0.0), bd.get("optimizer", 0.0)
    if fb + opt > 0:
        m.h_graph = m.h_launch * fb / (fb + opt)
    m.x_h2d = att.idle_share("h2d_copy")
    m.gpu_busy = att.busy_fraction


def _cpu_terms(ev: Evidence, m: StepModel, worst: dict[str, Any], workers: dict[str, Any], tt_s: float) -> None:
    proc = ev.get("process")
    n = m.ranks
    me = None
    if proc:
        me = next((x for x in proc["processes"] if x["pid"] == m.pid), None) if m.pid else None
        if me is None and n == 1:
            me = next((x for x in proc["processes"] if x["role"] == "main"), None)
    if not proc or me is None:
        p = float(ev.context.get("cpus_available") or 0.0) / max(n, 1)
        m.p = m.p_allowed = p or float(64 * max(m.w_now, 1))
        m.known_p = bool(p)
        m.d = m.f * (CAL_MID_K if not m.w_now else 1.0)
        m.d_inloop = not m.w_now
        m.u = 1.0 + m.w_now
        m.uses_cuda = bool(ev.context.get("uses_cuda"))
        return
    m.known_p = True
    m.uses_cuda = bool(proc.get("uses_cuda"))
    m.p_allowed = float(proc["cpus_available"]) / max(n, 1)
    quota = proc.get("cpu_quota_cores")
    m.p_source = (f"affinity {proc.get('cpus_allowed')} CPUs" + (f", cgroup quota {quota:.3g}" if quota else
                                                                  ", no cgroup quota")
                  + (f", 1/{n} for each of {n} ranks" if n > 1 else ""))
    th = next((t for t in me.get("threads", []) if t["tid"] == me["pid"]), None)
    win = float(proc.get("window_s") or 0.0)
    if th and win and th.get("run_delay_seconds") is not None:
        m.r_loop = float(th["run_delay_seconds"]) / win
    m.p = max(1.0, m.p_allowed * (1.0 - min(m.r_loop, 0.9))) if m.r_loop >= CROWDED_RUNQ else m.p_allowed
    _, m.w_now, worker_cores = workers_of(proc, me, m.w_now, workers, tt_s)
    main_cores = float(me.get("cpu_cores") or 0.0)
    m.u = main_cores + worker_cores if n > 1 else float(proc.get("total_cpu_cores") or (main_cores + worker_cores))
    m.d_inloop = not m.w_now
    m.d = worker_cores + m.f_load if m.w_now else m.f_load * CAL_MID_K
    if m.d <= 0:
        m.d = m.f
    # Cores the loop uses while it computes: its threads' CPU (not the pin-memory thread's) less the
    # loading it does itself, over the time it computes; never more than its busy threads or the CPUs.
    team_cores, busy = _loop_thread_cores(me)
    m.pin_cores = sum(float(t.get("cpu_fraction") or 0.0) for t in me.get("threads") or []
                      if (t.get("name") or "").startswith(PIN_MEMORY_THREAD) or "pin_memory" in (t.get("name") or ""))
    m.threads_busy = busy
    if th is not None and m.f_wait > 0:
        # The loop's serial threads (the training thread, and the autograd device threads that run its
        # backward while it waits) on a CPU beyond the shares py-spy put outside its waits for workers.
        serial = sum(float(t.get("cpu_fraction") or 0.0) for t in me.get("threads") or []
                     if t["tid"] == me["pid"] or (t.get("name") or "").startswith(DEVICE_THREAD))
        m.wait_cpu = max(0.0, serial - m.f_load - m.c)
    m.loop_cores = max(1.0, min((team_cores - m.f_load) / m.c, float(busy), m.p_allowed or busy))
    _measured_par(proc, me, m, win)
    m.step_s = _step_length(proc, me, m, win)
    churn = proc.get("worker_churn", {}) or {}
    m.recreated = bool(churn.get("appeared") or churn.get("vanished"))
    m.epoch_s = churn.get("vanished_lifetime_s")
    m.worker_cores = worker_cores
    m.others = _others(ev, float(proc.get("total_cpu_cores") or m.u))
    m.switch_rate = _switch_rate(me, win)
    libs = " ".join(proc.get("libraries") or [])
    m.openmp = "libiomp" if "libiomp" in libs else ("libgomp" if "libgomp" in libs else None)


PAR_MARGIN = 0.10            # the measured e's interval beyond its sampling error: a thread alone may
                             # run the team's work at another pace (its caches, no barrier hand-offs)
PAR_MIN_SAMPLES = 50         # the team's threads' samples needed to measure e (0.5 s of their CPU)


def _measured_par(proc: dict[str, Any], me: dict[str, Any], m: StepModel, win: float) -> None:
    """e, the intra-op team's parallel efficiency, from where its threads spent their CPU (the
    process probe's CPU-clock samples by library): compute capped to one thread takes the work the
    loop thread did outside the OpenMP runtime plus the work the other team threads did outside it,
    so 1 + e (L - 1) = 1 + (u_team - g_loop) / C, u_team the others' cores of work (their samples
    outside the runtime and the kernel), g_loop the loop thread's cores in the runtime (waiting at
    its barriers for them). A team thread is one that ran the OpenMP runtime's code."""
    oc = proc.get("oncpu") or {}
    threads = oc.get("threads") or {}
    if not threads or not win or m.loop_cores < 1.1 or m.c <= 0.05 or me.get("pid") != proc.get("pid"):
        return
    names = {str(t["tid"]): (t.get("name") or "") for t in me.get("threads") or []}
    period = float(oc.get("period_ms") or 10.0) / 1000.0
    main = threads.get(str(me["pid"]))
    team = [v for tid, v in threads.items() if tid != str(me["pid"]) and v["openmp"] > 0
            and not any(p in names.get(tid, "") for p in PIN_THREAD)
            and not names.get(tid, "").startswith(DEVICE_THREAD)]
    if main is None or not team:
        return
    work = sum(v["samples"] - v["kernel"] - v["openmp"] for v in team)
    if sum(v["samples"] for v in team) < PAR_MIN_SAMPLES:
        return
    g_loop = main["openmp"]
    den = m.c * (m.loop_cores - 1.0) * win / period      # samples of C (L - 1)
    e = (work - g_loop) / den
    err = SAMPLE_Z * math.sqrt(work + g_loop) / den + PAR_MARGIN
    mid = min(max(e, 0.0), 1.0)
    m.par_measured = (max(mid - err, 0.0), mid, min(mid + err, 1.0))
    m.team_cpu = sum(v["samples"] for v in team) * period / win
    m.loop_barrier = g_loop * period / win
    m.team_spin = sum(v["openmp"] for v in team) * period / win
    spun = sum(v["openmp"] for v in team) / max(sum(v["samples"] for v in team), 1)
    m.par_basis = (f"its other intra-op threads worked {work * period / win:.2f} cores and spun or waited in the "
                   f"OpenMP runtime {100 * spun:.0f}% of their CPU, the loop thread waited there "
                   f"{g_loop * period / win:.2f} cores (CPU-clock samples)")


STEP_MIN_CALLS = 10          # backward passes in the window needed to time the step


def _step_length(proc: dict[str, Any], me: dict[str, Any], m: StepModel, win: float) -> float | None:
    """Seconds a training step takes: the time the window spent training (less an evaluation pass's
    share, which runs no backward) over its backward passes (the process probe's count at torch's
    autograd engine). A loop that calls backward several times a batch (a GAN's discriminator and
    generator) counts each: its step reads shorter than it is. None without the count, or with fewer
    than STEP_MIN_CALLS. A rank's own count where the target is its launcher (the rank's main thread's)."""
    bw = (proc.get("backward") if me.get("pid") == proc.get("pid") else me.get("backward")) or {}
    calls = int(bw.get("calls") or 0)
    seconds = float(bw.get("seconds") or win or 0.0)
    if calls < STEP_MIN_CALLS or seconds <= 0:
        return None
    return seconds * max(1.0 - m.f_eval, 0.05) / calls


def _others(ev: Evidence, job_cores: float) -> float | None:
    """Cores other processes took on the job's CPUs: the contention probe's, else the scheduler
    probe's host busy cores less the job's; None when neither ran."""
    con = ev.get("contention") or {}
    if con.get("others_cpu_seconds_on_job_cpus") is not None and con.get("window_s"):
        return float(con["others_cpu_seconds_on_job_cpus"]) / float(con["window_s"])
    sched = ev.get("sched") or {}
    if sched.get("host_busy_cores") is not None:
        return max(0.0, float(sched["host_busy_cores"]) - job_cores)
    return None


def _switch_rate(me: dict[str, Any], win: float) -> float:
    """Involuntary context switches per second per core held, over the training process's busy
    threads (on a CPU or waiting for one at least BUSY of the window)."""
    if not win:
        return 0.0
    n, cores = 0, 0.0
    for t in me.get("threads") or []:
        cpu = float(t.get("cpu_fraction") or 0.0)
        r = float(t.get("run_delay_seconds") or 0.0) / win
        if cpu + r >= BUSY and not (t.get("name") or "").startswith(DEVICE_THREAD):
            n += int(t.get("involuntary_ctxsw") or 0)
            cores += cpu
    return n / win / max(cores, 0.05) if cores else 0.0


INTERLEAVED_SWITCHES = 4      # at least this many changes of the calling site between module-call samples
INTERLEAVED_SHARE = 0.3       # ... and at least this share of them (a periodic eval or sampling phase: 1-2)


def interleaved_calls(tt: dict[str, Any]) -> bool:
    """The loop calls its modules from two or more places, alternating between them all the time
    (py-spy: the caller of the outermost nn.Module call changes between successive samples): a GAN's
    step, not one forward a step with a periodic evaluation or sampling phase beside it."""
    n, sw = int(tt.get("module_call_samples") or 0), int(tt.get("module_site_switches") or 0)
    return sw >= INTERLEAVED_SWITCHES and sw >= INTERLEAVED_SHARE * n


RNN_SHARE = 0.02              # a graph-breaking module's forward at least this share of the step (not a stray sample)


def eval_loaders(tt: dict[str, Any]) -> tuple[float, float, float]:
    """(wait, load, start-up seconds) of the loop at DataLoaders that do not train: iterated from a
    function that never runs backward or the optimizer (an evaluation pass), where another loader's
    function does (py-spy's `loaders`); zeros when no such split was seen."""
    rows = [r for r in tt.get("loaders") or [] if r.get("trains") is False]
    return (sum(float(r["data_wait"]) for r in rows), sum(float(r["data_load"]) for r in rows),
            sum(float(r.get("startup_seconds") or 0.0) for r in rows))


def _churn_share(tt: dict[str, Any], f: float, eval_start: float = 0.0) -> float:
    """The loop's share starting (`_MultiProcessingDataLoaderIter.__init__`) and joining
    (`_shutdown_workers`) the training loader's workers, from py-spy's data-wait stacks (an
    evaluation loader's start-up, `eval_start` seconds of it, is not)."""
    top = (tt.get("top_stacks") or {}).get("data_wait") or []
    start = max(float(tt.get("worker_startup_seconds") or 0.0) - eval_start, 0.0)
    s_start = min(start / max(float(tt.get("seconds") or 0.0), 1e-6), f)
    s_stop = min(sum(x["fraction"] for x in top if any("_shutdown_workers" in fr for fr in x["stack"])),
                 max(f - s_start, 0.0))
    return s_start + s_stop


def with_calibration(cal: Calibration, **kw: tuple[float, float, float]) -> Calibration:
    return replace(cal, **kw)
