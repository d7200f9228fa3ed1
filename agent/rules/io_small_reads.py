"""io.small_reads: the input pipeline is dominated by opening, reading and closing small files.

Facts from the syscall probe, per data-producing process (each DataLoader worker, or the training
process itself when it loads its own batches), over the traced window:
    opens per second, and per batch where workers load (a batch is one message received on a
    worker's index queue; with num_workers=0 no batch boundary is visible from outside),
    the mean size of the reads that returned data from files,
    s_lo  share of the window inside open/read/stat/lseek/close of files (the syscalls alone),
    s_hi  share of the window from each file's open to its close (the syscalls plus the Python
          between them: the whole cost of handling one small file; an upper bound).
Shards (one large file read sequentially per many samples) remove most of that cost. If the loop
waits on data a share f of its time (py-spy), the step shrinks by at most min(s, f): the expected
speedup is 1 / (1 - min(s_hi, f)). Without py-spy the rule cannot tell whether the loop waits at all
and quotes the lower bound 1 / (1 - s_lo) with low confidence.
"""
from __future__ import annotations

import shlex
from typing import Any

from trainprobe.agent.combiners import step_model
from trainprobe.agent.evidence import Evidence
from trainprobe.agent.findings import Fact, Finding, Fix, pct
from trainprobe.agent.rules import rule

SMALL_READ_BYTES = 64 * 1024     # a read returning less than this from a file is "small"
OPENS_PER_S = 100.0              # per data-producing process
FILE_SHARE = 0.10                # open-to-close share of the producers' time
DATA_SHARE = 0.05                # the loop waits on data at least this share (when py-spy says)
LOOP_SLOWDOWN_HI = 0.9           # the DataLoader model's high loop slowdown per busy producer per CPU


def _producers(ev: Evidence) -> tuple[list[dict[str, Any]], str]:
    sc = ev.get("syscalls") or {}
    proc = ev.get("process") or {}
    roles = {p["pid"]: p.get("role") for p in proc.get("processes", [])}
    kids = [p for p in sc.get("children", []) if p.get("opens")]
    workers = [p for p in kids if roles.get(p["pid"], "dataloader_worker") == "dataloader_worker"]
    if workers:
        return workers, "workers"
    main = sc.get("main")
    return ([main] if main and main.get("opens") else []), "training process"


def _measure(ev: Evidence, prods: list[dict[str, Any]], who: str) -> dict[str, Any]:
    """Opens, read sizes and file-handling shares of the data producers over the traced window."""
    sc = ev.get("syscalls") or {}
    win = float(sc.get("window_s") or 0.0) or 1e-6
    n = len(prods)
    opens = sum(p["opens"] for p in prods)
    reads = sum(p["file_reads"]["reads"] - p["file_reads"].get("eof_reads", 0) for p in prods)
    nbytes = sum(p["file_reads"]["bytes"] for p in prods)
    s_lo = sum(p["file_syscall_share"] for p in prods) / n
    s_hi = max(sum(p["file_open_to_close_share"] for p in prods) / n, s_lo)
    # A batch is one message on a worker's index queue. With num_workers=0 nothing outside the
    # process marks a batch (py-spy's samples merge short steps), so no per-batch figure is given.
    batches = sum(p.get("queue_messages", 0) for p in prods) if who == "workers" else 0
    dirs: dict[str, int] = {}
    for p in prods:
        for d in p.get("open_dirs", []):
            dirs[d["dir"]] = dirs.get(d["dir"], 0) + d["opens"]
    return {"n": n, "opens_ps": opens / win, "mean_read": nbytes / reads if reads else None, "s_lo": s_lo,
            "s_hi": s_hi, "batches": batches, "opens_per_batch": opens / batches if batches else None,
            "dirs": dirs, "top_dir": max(dirs.items(), key=lambda kv: kv[1])[0] if dirs else None}


def _facts(ms: dict[str, Any], who: str, f: float | None) -> list[Fact]:
    whose = "workers'" if who == "workers" else "training process's"
    facts = [
        Fact("syscalls", f"files opened per second by the {ms['n']} {who}" if who == "workers"
             else "files opened per second by the training process", round(ms["opens_ps"], 1)),
        Fact("syscalls", "mean bytes per read that returned file data", round(ms["mean_read"], 1)),
        Fact("syscalls", f"share of the {whose} time inside open/read/stat/close of files", round(ms["s_lo"], 3)),
        Fact("syscalls", f"share of the {whose} time from each file's open to its close", round(ms["s_hi"], 3)),
    ]
    if ms["opens_per_batch"] is not None:
        facts.append(Fact("syscalls", "files opened per batch (index-queue messages received by the workers)",
                          round(ms["opens_per_batch"], 1)))
    if ms["top_dir"]:
        facts.append(Fact("syscalls", f"most opens are under {ms['top_dir']}", ms["dirs"][ms["top_dir"]]))
    if f is not None:
        facts.append(Fact("pyspy", "share of the training thread waiting for or loading batches", round(f, 3)))
    return facts


def _gain(ev: Evidence, ms: dict[str, Any], who: str,
          f: float | None) -> tuple[float, str, str, tuple[float, float] | None]:
    """(speedup, bound, confidence, interval): shards remove most of the small-file time the loop waits on."""
    s_lo, s_hi, n = ms["s_lo"], ms["s_hi"], ms["n"]
    whose = "workers'" if who == "workers" else "training process's"
    if f is None:
        speedup = 1.0 / (1.0 - min(s_lo, 0.95))
        bound = (f"no py-spy evidence of the loop waiting on data; lower bound from the time inside the file "
                 f"syscalls alone: 1/(1-{s_lo:.2f})={speedup:.2f}x")
        return speedup, bound, "low", None
    s = min(s_hi, f)
    # Shards do not remove all of it: reading a record from a shard costs something too. e is the
    # step model's shard_e, fitted to one job's measured fixes (docs/models.md): 2.51x and 2.81x on
    # the CPU ledger's small-files job, 1.59x on an earlier capture.
    shard_e = step_model.calibration().shard_e[1]
    speedup = 1.0 / (1.0 - min(shard_e * s, 0.95))
    bound = (f"s={s_hi:.2f} of the {whose} time goes to handling small files (open to close; {s_lo:.2f} inside "
             f"the syscalls) and the loop waits on data f={f:.2f}: shards remove about {shard_e:g} of the "
             f"smaller: 1/(1-{shard_e:g} min(s,f))={speedup:.2f}x")
    conf = "high" if s_hi >= 0.2 and f >= 0.2 else "medium"
    # Low end: only the time inside the file syscalls goes. High end: the whole data wait goes and
    # the loop, no longer sharing its CPUs with busy producers, runs up to LOOP_SLOWDOWN_HI * n / P
    # faster (the DataLoader model's loop slowdown; the ledger measured 3.90x against 2.91x here).
    p_cpus = float((ev.get("process") or {}).get("cpus_available") or 0.0) or float(n + 1)
    interval = (min(speedup, 1.0 / (1.0 - min(s_lo, f, 0.95))),
                max(speedup, (1.0 + LOOP_SLOWDOWN_HI * n / p_cpus) / max(1.0 - f, 0.05)))
    return speedup, bound, conf, interval


def _fixes(ms: dict[str, Any]) -> list[Fix]:
    src = ms["top_dir"] or "DATA_DIR"
    fixes = [
        Fix("Pack the small files into shards and read each shard sequentially",
            change="tar/WebDataset shards of ~100 MB (webdataset.WebDataset('shards/{000000..000099}.tar')), "
                   "or one memory-mapped array; one open per shard instead of one per sample",
            command=shlex.join(["tar", "--sort=name", "-cf", "/path/to/shards/shard-000000.tar", "-C", src, "."]),
            knobs={"storage": "shards"}),
        Fix("Cache what the workers decode, so later epochs skip the files",
            change="decode once into a NumPy memmap / local cache and index it in __getitem__",
            knobs={"storage": "cache"}),
    ]
    if ms["mean_read"] < 16 * 1024:
        fixes.append(Fix("Read larger blocks where files must stay separate",
                         change="read each file whole in one call (f.read() on open(path, 'rb', buffering=1 << 20)), "
                                "and keep many files per directory listing"))
    return fixes


@rule("io.small_reads", requires=("syscalls",), uses=("process", "pyspy"),
      description="DataLoader workers (or the loop) spend their time opening and reading small files")
def io_small_reads(ev: Evidence) -> Finding | None:
    prods, who = _producers(ev)
    if not prods:
        return None
    ms = _measure(ev, prods, who)
    if (ms["opens_ps"] / ms["n"] < OPENS_PER_S or ms["mean_read"] is None or ms["mean_read"] >= SMALL_READ_BYTES
            or ms["s_hi"] < FILE_SHARE):
        return None
    bd = ((ev.get("pyspy") or {}).get("training_thread") or {}).get("breakdown") or {}
    f = (bd.get("data_wait", 0.0) + bd.get("data_load", 0.0)) if bd else None
    if f is not None and f < DATA_SHARE:
        return None                    # the loop does not wait on its input: nothing to gain here
    speedup, bound, conf, interval = _gain(ev, ms, who, f)
    per_batch = f" ({ms['opens_per_batch']:.0f} per batch)" if ms["opens_per_batch"] else ""
    verb, its = ("open", "their") if who == "workers" else ("opens", "its")
    title = (f"The {who} {verb} {ms['opens_ps']:.0f} files/s{per_batch} and read {ms['mean_read']:.0f} bytes at a "
             f"time: {pct(ms['s_hi'])} of {its} time goes to small-file handling")
    return Finding("io.small_reads", title, speedup, bound, conf, _facts(ms, who, f), _fixes(ms), risk="medium",
                   interval=interval,
                   details={"producers": [p["pid"] for p in prods], "opens_per_second": round(ms["opens_ps"], 1),
                            "opens_per_batch": None if ms["opens_per_batch"] is None else round(ms["opens_per_batch"], 1),
                            "batches": round(ms["batches"], 1) if ms["batches"] else None,
                            "mean_read_bytes": round(ms["mean_read"], 1), "file_syscall_share": round(ms["s_lo"], 4),
                            "file_open_to_close_share": round(ms["s_hi"], 4), "top_dir": ms["top_dir"]})
