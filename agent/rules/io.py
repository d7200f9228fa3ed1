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

from trainprobe.agent.evidence import Evidence
from trainprobe.agent.findings import Fact, Finding, Fix, pct
from trainprobe.agent.rules import rule

SHARD_E = 0.85        # share of the small-file time that shards remove (fitted, docs/models.md)
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


@rule("io.small_reads", requires=("syscalls",), uses=("process", "pyspy"),
      description="DataLoader workers (or the loop) spend their time opening and reading small files")
def io_small_reads(ev: Evidence) -> Finding | None:
    sc = ev.get("syscalls") or {}
    prods, who = _producers(ev)
    if not prods:
        return None
    win = float(sc.get("window_s") or 0.0) or 1e-6
    n = len(prods)
    opens = sum(p["opens"] for p in prods)
    opens_ps = opens / win
    reads = sum(p["file_reads"]["reads"] - p["file_reads"].get("eof_reads", 0) for p in prods)
    nbytes = sum(p["file_reads"]["bytes"] for p in prods)
    mean_read = nbytes / reads if reads else None
    s_lo = sum(p["file_syscall_share"] for p in prods) / n
    s_hi = sum(p["file_open_to_close_share"] for p in prods) / n
    s_hi = max(s_hi, s_lo)
    if opens_ps / n < OPENS_PER_S or mean_read is None or mean_read >= SMALL_READ_BYTES or s_hi < FILE_SHARE:
        return None

    spy = ev.get("pyspy") or {}
    tt = spy.get("training_thread") or {}
    bd = tt.get("breakdown") or {}
    f = (bd.get("data_wait", 0.0) + bd.get("data_load", 0.0)) if bd else None
    if f is not None and f < DATA_SHARE:
        return None                    # the loop does not wait on its input: nothing to gain here

    # A batch is one message on a worker's index queue. With num_workers=0 nothing outside the
    # process marks a batch (py-spy's samples merge short steps), so no per-batch figure is given.
    batches = sum(p.get("queue_messages", 0) for p in prods) if who == "workers" else 0
    batch_source = "index-queue messages received by the workers"
    opens_per_batch = opens / batches if batches else None
    dirs: dict[str, int] = {}
    for p in prods:
        for d in p.get("open_dirs", []):
            dirs[d["dir"]] = dirs.get(d["dir"], 0) + d["opens"]
    top_dir = max(dirs.items(), key=lambda kv: kv[1])[0] if dirs else None

    whose = "workers'" if who == "workers" else "training process's"
    facts = [
        Fact("syscalls", f"files opened per second by the {n} {who}" if who == "workers"
             else "files opened per second by the training process", round(opens_ps, 1)),
        Fact("syscalls", "mean bytes per read that returned file data", round(mean_read, 1)),
        Fact("syscalls", f"share of the {whose} time inside open/read/stat/close of files", round(s_lo, 3)),
        Fact("syscalls", f"share of the {whose} time from each file's open to its close", round(s_hi, 3)),
    ]
    if opens_per_batch is not None:
        facts.append(Fact("syscalls", f"files opened per batch ({batch_source})", round(opens_per_batch, 1)))
    if top_dir:
        facts.append(Fact("syscalls", f"most opens are under {top_dir}", dirs[top_dir]))
    if f is not None:
        facts.append(Fact("pyspy", "share of the training thread waiting for or loading batches", round(f, 3)))

    if f is not None:
        s = min(s_hi, f)
        # Shards do not remove all of it: reading a record from a shard costs something too. E is
        # fitted to the three measured fixes (docs/models.md): 2.51x and 2.81x on the CPU ledger's
        # small-files job, 1.59x on an earlier capture.
        speedup = 1.0 / (1.0 - min(SHARD_E * s, 0.95))
        bound = (f"s={s_hi:.2f} of the {whose} time goes to handling small files (open to close; {s_lo:.2f} inside "
                 f"the syscalls) and the loop waits on data f={f:.2f}: shards remove about {SHARD_E:g} of the "
                 f"smaller: 1/(1-{SHARD_E:g} min(s,f))={speedup:.2f}x")
        conf = "high" if s_hi >= 0.2 and f >= 0.2 else "medium"
        # Low end: only the time inside the file syscalls goes. High end: the whole data wait goes and
        # the loop, no longer sharing its CPUs with busy producers, runs up to LOOP_SLOWDOWN_HI * n / P
        # faster (the DataLoader model's loop slowdown; the ledger measured 3.90x against 2.91x here).
        p_cpus = float((ev.get("process") or {}).get("cpus_available") or 0.0) or float(n + 1)
        interval = (min(speedup, 1.0 / (1.0 - min(s_lo, f, 0.95))),
                    max(speedup, (1.0 + LOOP_SLOWDOWN_HI * n / p_cpus) / max(1.0 - f, 0.05)))
    else:
        speedup = 1.0 / (1.0 - min(s_lo, 0.95))
        bound = (f"no py-spy evidence of the loop waiting on data; lower bound from the time inside the file "
                 f"syscalls alone: 1/(1-{s_lo:.2f})={speedup:.2f}x")
        conf = "low"
        interval = None
    per_batch = f" ({opens_per_batch:.0f} per batch)" if opens_per_batch else ""
    src = top_dir or "DATA_DIR"
    fixes = [
        Fix("Pack the small files into shards and read each shard sequentially",
            change="tar/WebDataset shards of ~100 MB (webdataset.WebDataset('shards/{000000..000099}.tar')), "
                   "or one memory-mapped array; one open per shard instead of one per sample",
            command=shlex.join(["tar", "--sort=name", "-cf", "/path/to/shards/shard-000000.tar", "-C", src, "."])),
        Fix("Cache what the workers decode, so later epochs skip the files",
            change="decode once into a NumPy memmap / local cache and index it in __getitem__"),
    ]
    fixes[0].knobs = {"storage": "shards"}
    fixes[1].knobs = {"storage": "cache"}
    if mean_read < 16 * 1024:
        fixes.append(Fix("Read larger blocks where files must stay separate",
                         change="read each file whole in one call (f.read() on open(path, 'rb', buffering=1 << 20)), "
                                "and keep many files per directory listing"))
    verb, its = ("open", "their") if who == "workers" else ("opens", "its")
    title = (f"The {who} {verb} {opens_ps:.0f} files/s{per_batch} and read {mean_read:.0f} bytes at a time: "
             f"{pct(s_hi)} of {its} time goes to small-file handling")
    return Finding("io.small_reads", title, speedup, bound, conf, facts, fixes, risk="medium", interval=interval,
                   details={"producers": [p["pid"] for p in prods], "opens_per_second": round(opens_ps, 1),
                            "opens_per_batch": None if opens_per_batch is None else round(opens_per_batch, 1),
                            "batches": round(batches, 1) if batches else None,
                            "mean_read_bytes": round(mean_read, 1), "file_syscall_share": round(s_lo, 4),
                            "file_open_to_close_share": round(s_hi, 4), "top_dir": top_dir})
