"""Scheduler probe (bcc): run-queue delay, off-CPU time and preemptions of every thread of the job.

Attaches BPF programs to the `sched:sched_wakeup`, `sched:sched_wakeup_new` and
`sched:sched_switch` tracepoints (no kprobes: they work on kernels built without them). For each
thread of the target and of its DataLoader workers it keeps, in kernel maps:
  - run-queue delay (woken or preempted -> running) as a histogram with quarter-octave buckets,
    its total, count and maximum;
  - off-CPU time split into sleeping (S), uninterruptible waits (D, usually I/O) and other states,
    counted from the switch-out to the wake-up, and which thread did the waking;
  - involuntary preemptions (switched out while runnable) and yields.
The set of watched threads lives in BPF maps: a new thread or a forked worker of a watched
process is added in the kernel at `sched_wakeup_new`, and the probe re-lists the process tree every
0.25 s to add what it could not see. The tracepoints' record layout is read from tracefs' format
files at run time (no kernel structs are read), so kernel headers of another release compile it.

Cost: the scheduler tracepoints fire on every context switch of the host; the programs return
after one hash lookup for threads that are not watched. The probe measures its own cost with the
kernel's BPF run-time statistics (enabled only while it runs) and reports it in the overhead.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

from trainprobe.probes.support import bcc_support as bs
from trainprobe.probes.parsers import procfs
from trainprobe.probes.base import Availability, Capture, Probe, Recorder, WatchSpec
from trainprobe.probes.schema import SchedEvidence
from trainprobe.probes.errors import Unavailable

TRACEPOINTS = ("sched:sched_switch", "sched:sched_wakeup", "sched:sched_wakeup_new")
REFRESH_S = 0.25

BPF_TEXT = r"""
#define REPORT_MAX __REPORT_MAX__ULL
__SWITCH_STRUCT__
__WAKEUP_STRUCT__
__WAKEUP_NEW_STRUCT__

struct tstats_t {
    u64 runq_ns; u64 runq_n; u64 runq_max_ns;
    u64 oncpu_ns; u64 sleep_ns; u64 sleep_n; u64 block_ns; u64 block_n; u64 other_off_ns;
    u64 preempt_n; u64 yield_n; u64 wakeups;
    u32 tgid; u32 seen;
};
struct off_t { u64 ts; u64 state; };
struct hkey_t { u32 tid; u32 slot; };
struct wkey_t { u32 tid; u32 waker; };
struct wval_t { u64 ns; u64 n; };

BPF_HASH(watch_tgid, u32, u8, 4096);
BPF_HASH(watch_tid, u32, u32, 32768);
BPF_HASH(enq_ts, u32, u64, 32768);
BPF_HASH(off_ts, u32, struct off_t, 32768);
BPF_HASH(on_ts, u32, u64, 32768);
BPF_HASH(stats, u32, struct tstats_t, 32768);
BPF_HASH(hist, struct hkey_t, u64, 65536);
BPF_HASH(wakers, struct wkey_t, struct wval_t, 32768);
BPF_PERCPU_ARRAY(events, u64, 4);

__HELPERS__

static __always_inline struct tstats_t *stats_of(u32 tid) {
    struct tstats_t zero = {};
    return stats.lookup_or_try_init(&tid, &zero);
}

static __always_inline void woken(u32 tid) {
    u64 now = bpf_ktime_get_ns();
    struct tstats_t *s = stats_of(tid);
    struct off_t *o = off_ts.lookup(&tid);
    if (o) {
        u64 d = now - o->ts;
        if (s) {
            if (o->state & 2) { s->block_ns += d; s->block_n++; }
            else if (o->state & 1) { s->sleep_ns += d; s->sleep_n++; }
            else { s->other_off_ns += d; }
        }
        struct wkey_t wk = {};
        wk.tid = tid;
        wk.waker = (u32)bpf_get_current_pid_tgid();
        struct wval_t wz = {};
        struct wval_t *w = wakers.lookup_or_try_init(&wk, &wz);
        if (w) { w->ns += d; w->n++; }
        off_ts.delete(&tid);
    }
    if (s) s->wakeups++;
    enq_ts.update(&tid, &now);
}

int trainprb_wake(struct tp_wakeup *a) {
    count_event(0);
    u32 tid = a->pid;
    if (!watch_tid.lookup(&tid)) return 0;
    woken(tid);
    return 0;
}

int trainprb_wnew(struct tp_wakeup_new *a) {
    count_event(1);
    u32 tid = a->pid;
    u32 ptgid = bpf_get_current_pid_tgid() >> 32;
    if (watch_tgid.lookup(&ptgid)) {
        /* A new thread of a watched process, or a forked worker: watch it, and (harmless for a
           thread) let the threads it creates be followed too. */
        watch_tid.update(&tid, &ptgid);
        u8 one = 1;
        watch_tgid.update(&tid, &one);
    }
    if (!watch_tid.lookup(&tid)) return 0;
    u64 now = bpf_ktime_get_ns();
    enq_ts.update(&tid, &now);
    return 0;
}

int trainprb_switch(struct tp_switch *a) {
    count_event(2);
    u32 prev = a->prev_pid;
    u32 next = a->next_pid;
    u64 now = 0;
    if (prev && watch_tid.lookup(&prev)) {
        now = bpf_ktime_get_ns();
        struct tstats_t *s = stats_of(prev);
        u64 *on = on_ts.lookup(&prev);
        if (s) {
            if (on) s->oncpu_ns += now - *on;
            s->tgid = bpf_get_current_pid_tgid() >> 32;
            s->seen = 1;
        }
        if (on) on_ts.delete(&prev);
        u64 st = (u64)a->prev_state;
        if (st & REPORT_MAX) {
            if (s) s->preempt_n++;
            enq_ts.update(&prev, &now);
        } else if ((st & (REPORT_MAX - 1)) == 0) {
            if (s) s->yield_n++;
            enq_ts.update(&prev, &now);
        } else {
            struct off_t o = {};
            o.ts = now;
            o.state = st;
            off_ts.update(&prev, &o);
        }
    }
    if (next && watch_tid.lookup(&next)) {
        if (!now) now = bpf_ktime_get_ns();
        on_ts.update(&next, &now);
        u64 *e = enq_ts.lookup(&next);
        if (e) {
            u64 d = now - *e;
            struct tstats_t *s = stats_of(next);
            if (s) {
                s->runq_ns += d;
                s->runq_n++;
                if (d > s->runq_max_ns) s->runq_max_ns = d;
            }
            struct hkey_t hk = {};
            hk.tid = next;
            hk.slot = slot_of(d);
            u64 hz = 0;
            u64 *h = hist.lookup_or_try_init(&hk, &hz);
            if (h) (*h)++;
            enq_ts.delete(&next);
        }
    }
    return 0;
}
"""

STAT_FIELDS = ("runq_ns", "runq_n", "runq_max_ns", "oncpu_ns", "sleep_ns", "sleep_n", "block_ns", "block_n",
               "other_off_ns", "preempt_n", "yield_n", "wakeups", "tgid", "seen")


def build_program(formats: dict[str, dict[str, Any]]) -> str:
    return (BPF_TEXT
            .replace("__HELPERS__", bs.BPF_HELPERS)
            .replace("__REPORT_MAX__", hex(bs.task_report_max(formats["sched_switch"])))
            .replace("__SWITCH_STRUCT__", bs.c_struct("tp_switch", formats["sched_switch"]))
            .replace("__WAKEUP_STRUCT__", bs.c_struct("tp_wakeup", formats["sched_wakeup"]))
            .replace("__WAKEUP_NEW_STRUCT__", bs.c_struct("tp_wakeup_new", formats["sched_wakeup_new"])))


def read_formats(rec: Recorder, tracefs: str, tracepoints: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    out = {}
    for tp in tracepoints:
        cat, ev = tp.split(":", 1)
        text = rec.read_file(os.path.join(tracefs, "events", cat, ev, "format"), artifact=f"format/{ev}")
        out[ev] = bs.parse_format(text)
    return out


class ProcessTree:
    """The target, its descendants and their threads, re-listed while the window runs."""

    def __init__(self, pid: int, root: str):
        self.pid, self.root = pid, root
        self.pids: dict[int, int] = {}          # pid -> parent pid
        self.tids: dict[int, int] = {}          # tid -> pid
        self.names: dict[int, str] = {}         # tid -> comm
        self.timeline: list[dict[str, Any]] = []

    def refresh(self) -> tuple[list[int], list[tuple[int, int]]]:
        """New pids and new (tid, pid) since the last call."""
        tree = [(self.pid, 0)] + procfs.descendants_of(self.pid, self.root) \
            if os.path.isdir(procfs.path(self.root, f"proc/{self.pid}")) else []
        new_pids, new_tids = [], []
        for p, pp in tree:
            if p not in self.pids:
                self.pids[p] = pp
                new_pids.append(p)
            try:
                tasks = os.listdir(procfs.path(self.root, f"proc/{p}/task"))
            except OSError:
                continue
            for t in tasks:
                tid = int(t)
                if tid not in self.tids:
                    self.tids[tid] = p
                    new_tids.append((tid, p))
                    comm = procfs.try_read_text(self.root, f"proc/{p}/task/{tid}/comm")
                    if comm is not None:
                        self.names[tid] = comm.strip()
        self.timeline.append({"t_unix": round(time.time(), 3), "pids": [p for p, _ in tree]})
        return new_pids, new_tids


def host_cpu_times(text: str | None) -> dict[str, float] | None:
    """/proc/stat's first line -> busy and total jiffies of the whole host."""
    if not text:
        return None
    for line in text.splitlines():
        if line.startswith("cpu "):
            v = [int(x) for x in line.split()[1:]]
            v += [0] * (10 - len(v))
            user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
            busy = user + nice + system + irq + softirq + steal
            return {"busy": float(busy), "total": float(busy + idle + iowait)}
    return None


class SchedProbe(Probe):
    name = "sched"
    description = "run-queue delay (p50/p99), off-CPU sleep vs I/O wait, preemptions per thread (bcc, sched tracepoints)"
    needs = ("root", "bcc (python3-bpfcc)", "tracefs", "kernel headers", "sched tracepoints")
    cost = "a hash lookup per context switch on the host while attached; measured and reported"
    # Compiling its programs costs ~0.3 CPU-s and 140 MB: opt in with --deep. By default the process
    # probe's schedstat readings give each thread's run-queue delay.
    default_enabled = False
    timeout_s = 20.0
    evidence_schema = SchedEvidence

    def check(self, spec: WatchSpec) -> Availability:
        r = bs.readiness(TRACEPOINTS, spec.root)
        return Availability.yes() if r.ok else Availability.no(r.reason or "eBPF unavailable")

    def capture(self, spec: WatchSpec, rec: Recorder, deadline_monotonic: float) -> None:
        capture_sched(spec, rec, deadline_monotonic)

    @staticmethod
    def parse(capture: Capture) -> SchedEvidence:
        return parse_sched(json.loads(capture.artifacts["sched.json"]),
                           capture.artifacts.get("proc_stat.start"), capture.artifacts.get("proc_stat.end"))


def _say_mount(rec: Recorder) -> Any:
    def say(msg: str) -> None:
        rec.capture.meta.setdefault("notes", []).append(msg)
        bs._stderr(msg)
    return say


def capture_sched(spec: WatchSpec, rec: Recorder, deadline_monotonic: float) -> None:
    import ctypes

    t0 = time.time()
    tracefs, mounted = bs.ensure_tracefs(spec.root, say=_say_mount(rec))
    if mounted:
        rec.note("mount", f"tracefs at {tracefs}", 0, t0, time.time() - t0)
    formats = read_formats(rec, tracefs, TRACEPOINTS)
    text = build_program(formats)
    rec.add("program.c", text)
    c0 = time.monotonic()
    loaded = bs.compile_bpf(text)
    compile_s = time.monotonic() - c0
    rec.note("bpf", "compile sched program (bcc/clang)", 0, t0, compile_s)
    stats_fd = None
    try:
        b = loaded.bpf
        tree = ProcessTree(spec.pid, spec.root)
        u32, u8 = ctypes.c_uint32, ctypes.c_uint8
        w_tgid, w_tid = b[b"watch_tgid"], b[b"watch_tid"]

        def push() -> None:
            new_pids, new_tids = tree.refresh()
            for p in new_pids:
                w_tgid[u32(p)] = u8(1)
            for tid, p in new_tids:
                w_tid[u32(tid)] = u32(p)

        push()
        if not tree.pids:
            raise Unavailable(f"process {spec.pid} exited before the scheduler probe attached")
        if rec.stop.is_set():
            raise Unavailable("stopped before the tracepoints were attached")
        stats_fd = bs.enable_bpf_stats()
        rec.add("proc_stat.start", procfs.try_read_text(spec.root, "proc/stat") or "")
        a0 = time.monotonic()
        for tp, fn in (("sched:sched_wakeup", "trainprb_wake"), ("sched:sched_wakeup_new", "trainprb_wnew"),
                       ("sched:sched_switch", "trainprb_switch")):
            loaded.attach_tracepoint(tp, fn)
        attach_ns, attach_unix = time.monotonic_ns(), time.time()
        attach_s = time.monotonic() - a0
        rec.note("bpf", "attach " + ",".join(TRACEPOINTS), 0, attach_unix, attach_s)
        end = bs.traced_until(spec.window_s, deadline_monotonic, time.monotonic())
        while not rec.stop.is_set() and time.monotonic() < end:
            rec.stop.wait(min(REFRESH_S, max(0.0, end - time.monotonic())))
            push()
            if spec.pid not in tree.timeline[-1]["pids"]:
                break                                  # the target is gone: stop, keep what we have
        # Detach first, so the maps stop changing, then read them; close no matter what.
        for tp in list(loaded.attached):
            b.detach_tracepoint(tp.encode())
        detach_ns, detach_unix = time.monotonic_ns(), time.time()
        rec.note("bpf", "detach " + ",".join(TRACEPOINTS), 0, detach_unix, 0.0)
        rec.add("proc_stat.end", procfs.try_read_text(spec.root, "proc/stat") or "")
        run = {name: bs.prog_run_stats(fd) for name, fd in loaded.prog_fds().items()} if stats_fd is not None else {}
        data = _read_maps(b)
        for tid in set(data["stats"]) | {w for _t, w, _n, _c in data["wakers"]}:
            if int(tid) not in tree.names:
                comm = procfs.try_read_text(spec.root, f"proc/{tid}/comm")
                if comm is not None:
                    tree.names[int(tid)] = comm.strip()
    finally:
        loaded.close()
        if stats_fd is not None:
            os.close(stats_fd)
    window_s = (detach_ns - attach_ns) / 1e9
    events = data.pop("events")
    data.update({
        "pid": spec.pid, "attach_ns": attach_ns, "detach_ns": detach_ns, "attach_unix": attach_unix,
        "detach_unix": detach_unix, "window_s": window_s, "report_max": bs.task_report_max(formats["sched_switch"]),
        "pids": {str(p): pp for p, pp in tree.pids.items()}, "tids": {str(t): p for t, p in tree.tids.items()},
        "names": {str(t): n for t, n in tree.names.items()}, "timeline": tree.timeline,
        "cpus_online": len(procfs.cpus_online(spec.root)),
    })
    rec.add("sched.json", json.dumps(data))
    ev_total = sum(events)
    run_ns = sum(r.get("run_time_ns", 0) for r in run.values())
    ncpu = max(1, data["cpus_online"])
    rec.capture.meta.update({"attach_unix": attach_unix, "window_s": round(window_s, 3)})
    rec.capture.meta["overhead"] = {
        "compile_seconds": round(compile_s, 3), "attach_seconds": round(attach_s, 4),
        "tracepoint_events": ev_total, "events_per_second": round(ev_total / window_s, 1) if window_s > 0 else None,
        "bpf_run_time_ns": run_ns if run else None,
        "bpf_ns_per_event": round(run_ns / max(1, sum(r.get("run_cnt", 0) for r in run.values())), 1) if run else None,
        "host_cpu_fraction": round(run_ns / (window_s * 1e9 * ncpu), 6) if run and window_s > 0 else None,
        "basis": ("kernel BPF run-time statistics (BPF_ENABLE_STATS, on only while attached) over the window's "
                  "CPU capacity" if run else "BPF run-time statistics unavailable: event count only"),
    }


def _read_maps(b: Any) -> dict[str, Any]:
    stats = {}
    for k, v in b[b"stats"].items():
        stats[str(k.value)] = {f: int(getattr(v, f)) for f in STAT_FIELDS}
    hist: dict[str, dict[str, int]] = {}
    for k, v in b[b"hist"].items():
        hist.setdefault(str(k.tid), {})[str(k.slot)] = int(v.value)
    wakers = [[int(k.tid), int(k.waker), int(v.ns), int(v.n)] for k, v in b[b"wakers"].items()]
    pending_runq = {str(k.value): int(v.value) for k, v in b[b"enq_ts"].items()}
    pending_on = {str(k.value): int(v.value) for k, v in b[b"on_ts"].items()}
    pending_off = {str(k.value): [int(v.ts), int(v.state)] for k, v in b[b"off_ts"].items()}
    events = [0, 0, 0]
    for i in range(3):
        try:
            events[i] = int(sum(b[b"events"].getvalue(b[b"events"].Key(i))))
        except Exception:  # noqa: BLE001 - a per-CPU read that fails leaves the count unknown
            events[i] = 0
    watched = sorted(int(k.value) for k in b[b"watch_tid"].keys())
    return {"stats": stats, "hist": hist, "wakers": wakers, "pending_runq": pending_runq, "pending_on": pending_on,
            "pending_off": pending_off, "events": events, "watched_tids": watched}


# -- pure parsing ------------------------------------------------------------------------------------

def slot_bounds(slot: int) -> tuple[float, float]:
    """[lo, hi) in ns of a quarter-octave bucket (the inverse of slot_of in the BPF program)."""
    lvl, sub = divmod(slot, 4)
    if lvl < 2:
        return float(slot), float(slot + 1)
    return float((4 + sub) << (lvl - 2)), float((5 + sub) << (lvl - 2))


def percentile(hist: dict[int, int], q: float) -> float | None:
    """q-quantile (0..1) in ns, interpolated inside its bucket."""
    total = sum(hist.values())
    if total <= 0:
        return None
    want = q * total
    acc = 0.0
    for slot in sorted(hist):
        n = hist[slot]
        if acc + n >= want:
            lo, hi = slot_bounds(slot)
            frac = (want - acc) / n if n else 0.0
            return lo + (hi - lo) * frac
        acc += n
    lo, hi = slot_bounds(max(hist))
    return hi


def merge_hists(hists: list[dict[int, int]]) -> dict[int, int]:
    out: dict[int, int] = {}
    for h in hists:
        for s, n in h.items():
            out[s] = out.get(s, 0) + n
    return out


def _us(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1000.0, 1)


def parse_sched(d: dict[str, Any], stat0: str | None = None, stat1: str | None = None) -> dict[str, Any]:
    """Pure: the maps read at detach -> per-thread and per-process scheduler evidence."""
    pid = int(d["pid"])
    win_ns = max(1, int(d["detach_ns"]) - int(d["attach_ns"]))
    win_s = win_ns / 1e9
    attach, detach = int(d["attach_ns"]), int(d["detach_ns"])
    names = {int(k): v for k, v in d.get("names", {}).items()}
    tid_pid = {int(k): int(v) for k, v in d.get("tids", {}).items()}
    parents = {int(k): int(v) for k, v in d.get("pids", {}).items()}
    hists = {int(t): {int(s): int(n) for s, n in h.items()} for t, h in d.get("hist", {}).items()}
    report_max = int(d.get("report_max", 0x100))

    threads: dict[int, dict[str, Any]] = {}
    for t, s in d.get("stats", {}).items():
        tid = int(t)
        threads[tid] = {"tid": tid, **{k: int(v) for k, v in s.items()}}
    for t in list(d.get("pending_runq", {})) + list(d.get("pending_on", {})) + list(d.get("pending_off", {})):
        threads.setdefault(int(t), {"tid": int(t), **{k: 0 for k in STAT_FIELDS}})
    # Intervals still open at detach count up to the detach.
    for t, ts in d.get("pending_runq", {}).items():
        threads[int(t)]["runq_ns"] += max(0, detach - max(int(ts), attach))
    for t, ts in d.get("pending_on", {}).items():
        threads[int(t)]["oncpu_ns"] += max(0, detach - max(int(ts), attach))
    for t, (ts, state) in d.get("pending_off", {}).items():
        dur = max(0, detach - max(int(ts), attach))
        key = "block_ns" if state & 2 else ("sleep_ns" if state & 1 else "other_off_ns")
        threads[int(t)][key] += dur

    wakers_by: dict[int, list[tuple[int, int, int]]] = {}
    for tid, waker, ns, n in d.get("wakers", []):
        wakers_by.setdefault(int(tid), []).append((int(waker), int(ns), int(n)))

    rows = []
    for tid, s in sorted(threads.items()):
        p = tid_pid.get(tid) or (s.get("tgid") or None)
        h = hists.get(tid, {})
        wk = sorted(wakers_by.get(tid, []), key=lambda x: -x[1])[:5]
        rows.append({
            "tid": tid, "pid": p, "name": names.get(tid),
            "runq_delay_seconds": round(s["runq_ns"] / 1e9, 6),
            "runq_share": round(s["runq_ns"] / win_ns, 4),
            "runq_waits": s["runq_n"],
            "runq_p50_us": _us(percentile(h, 0.50)), "runq_p99_us": _us(percentile(h, 0.99)),
            "runq_max_us": _us(s["runq_max_ns"]) if s["runq_n"] else None,
            "oncpu_seconds": round(s["oncpu_ns"] / 1e9, 6),
            "sleep_seconds": round(s["sleep_ns"] / 1e9, 6), "sleeps": s["sleep_n"],
            "io_wait_seconds": round(s["block_ns"] / 1e9, 6), "io_waits": s["block_n"],
            "other_off_seconds": round(s["other_off_ns"] / 1e9, 6),
            "involuntary_preemptions": s["preempt_n"], "yields": s["yield_n"], "wakeups": s["wakeups"],
            "woken_by": [{"tid": w, "pid": tid_pid.get(w), "name": names.get(w) if w else "interrupt/idle",
                          "seconds": round(ns / 1e9, 6), "count": n} for w, ns, n in wk],
        })

    def group(members: list[dict[str, Any]]) -> dict[str, Any]:
        h = merge_hists([hists.get(r["tid"], {}) for r in members])
        runq = sum(r["runq_delay_seconds"] for r in members)
        return {"threads": len(members), "runq_delay_seconds": round(runq, 6),
                "runq_share_mean": round(runq / win_s / len(members), 4) if members else 0.0,
                "runq_p50_us": _us(percentile(h, 0.50)), "runq_p99_us": _us(percentile(h, 0.99)),
                "runq_waits": sum(h.values()),
                "oncpu_seconds": round(sum(r["oncpu_seconds"] for r in members), 6),
                "io_wait_seconds": round(sum(r["io_wait_seconds"] for r in members), 6),
                "sleep_seconds": round(sum(r["sleep_seconds"] for r in members), 6),
                "involuntary_preemptions": sum(r["involuntary_preemptions"] for r in members),
                "runnable_threads_mean": round((runq + sum(r["oncpu_seconds"] for r in members)) / win_s, 3)}

    by_pid: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        if r["pid"] is not None:
            by_pid.setdefault(int(r["pid"]), []).append(r)
    processes = []
    for p in sorted(set(parents) | set(by_pid)):
        members = by_pid.get(p, [])
        processes.append({"pid": p, "ppid": parents.get(p), "role": "main" if p == pid else "child",
                          **group(members)})
    training = next((r for r in rows if r["tid"] == pid), None)
    children = [r for r in rows if r["pid"] is not None and int(r["pid"]) != pid]
    out: dict[str, Any] = {
        "pid": pid, "window_s": round(win_s, 3), "attach_unix": d.get("attach_unix"),
        "cpus_online": d.get("cpus_online"),
        "threads": rows, "processes": processes,
        "training_thread": training,
        "main_process": group(by_pid.get(pid, [])),
        "children": group(children),
        "job": group([r for r in rows if r["pid"] is not None]),
        "report_max": report_max,
        "histograms": {str(t): {str(s): n for s, n in h.items()} for t, h in hists.items()},
    }
    c0, c1 = host_cpu_times(stat0), host_cpu_times(stat1)
    if c0 and c1 and c1["total"] > c0["total"]:
        ncpu = int(d.get("cpus_online") or 1)
        busy_cores = (c1["busy"] - c0["busy"]) / (c1["total"] - c0["total"]) * ncpu
        out["host_busy_cores"] = round(busy_cores, 3)
    return out
