"""Pure functions over Python stacks: read py-spy's chrometrace into time spans, and classify what
a training thread or a DataLoader worker was doing in each span.

A stack is a tuple of Frame, root first. Classification never reads the host: the source lines it
needs were read at capture time and are passed in as a mapping "filename:line" -> text.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from trainprobe.probes.errors import parser

TRAIN_CATEGORIES = ("data_wait", "data_load", "h2d_copy", "host_sync", "forward", "backward",
                    "optimizer", "other")
WORKER_CATEGORIES = ("getitem", "transform", "collate", "idle", "other")


@dataclass(frozen=True)
class Frame:
    name: str
    filename: str
    line: int

    @property
    def short(self) -> str:
        return self.filename.rsplit("/", 1)[-1]

    def label(self) -> str:
        if not self.filename:
            return self.name
        return f"{self.name} ({self.short}:{self.line})"


@dataclass
class Span:
    t0: float           # seconds since the recorder started
    t1: float
    stack: tuple[Frame, ...]

    @property
    def seconds(self) -> float:
        return max(self.t1 - self.t0, 0.0)


@dataclass
class ThreadTrace:
    pid: int
    thread_key: int           # py-spy's thread id (pthread id)
    os_tid: int | None
    name: str | None
    spans: list[Span]
    ancestry: tuple[int, ...] = ()   # process ids from the traced root down to this process

    @property
    def parent_pid(self) -> int | None:
        return self.ancestry[-2] if len(self.ancestry) >= 2 else None

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.spans)


_THREAD_FRAME = re.compile(r"^thread \((\d+)\)(?::\s*(.*))?$")    # a thread without a name has no ": name"
_PROCESS_FRAME = re.compile(r'^process (\d+):')


@parser("py-spy chrometrace read_chrometrace")
def read_chrometrace(events: list[dict[str, Any]]) -> list[ThreadTrace]:
    """py-spy `record -f chrometrace` -> one ThreadTrace per (pid, thread).

    py-spy writes B/E events only when a thread's stack changes from the previous sample *of the same
    thread id*, and it keys that comparison by the pthread id alone. Forked DataLoader workers share
    their parent's pthread ids, so one event stream interleaves several processes. The stream is
    therefore replayed per thread id, in file order: each group of events with one (pid, timestamp)
    is one sample of that pid, and the stack after applying it is exactly what was sampled. A pid's
    stack then holds until its next sample. Pseudo-frames that py-spy prepends (`process PID:"cmd"`
    with --subprocesses, `thread (TID): name` with --threads) are lifted into the ThreadTrace.
    """
    stacks: dict[int, list[Frame]] = {}
    group: dict[int, tuple[int, float]] = {}            # tid -> (pid, ts) of the group being read
    samples: dict[tuple[int, int], list[tuple[float, tuple[Frame, ...]]]] = {}

    def close(tid: int) -> None:
        if tid in group:
            pid, ts = group.pop(tid)
            samples.setdefault((pid, tid), []).append((ts, tuple(stacks.get(tid, ()))))

    for ev in events:
        ph = ev.get("ph")
        if ph not in ("B", "E"):
            continue
        tid, pid, ts = int(ev["tid"]), int(ev["pid"]), float(ev.get("ts", 0)) / 1e6
        if group.get(tid) != (pid, ts):
            close(tid)
            group[tid] = (pid, ts)
        stack = stacks.setdefault(tid, [])
        if ph == "B":
            args = ev.get("args") or {}
            stack.append(Frame(str(ev.get("name", "")), str(args.get("filename") or ""), int(args.get("line") or 0)))
        elif stack:
            stack.pop()
    for tid in list(group):
        close(tid)

    traces: list[ThreadTrace] = []
    for (pid, tid), seq in samples.items():
        tr = ThreadTrace(pid, tid, None, None, [])
        for (t0, st), (t1, _next) in zip(seq, seq[1:]):
            if st and t1 > t0:
                _append(tr, t0, t1, st)
        _lift_pseudo_frames(tr)
        if tr.spans:
            traces.append(tr)
    return traces


def _append(tr: ThreadTrace, t0: float, t1: float, stack: tuple[Frame, ...]) -> None:
    if tr.spans and tr.spans[-1].stack == stack and abs(tr.spans[-1].t1 - t0) < 1e-9:
        tr.spans[-1].t1 = t1
    else:
        tr.spans.append(Span(t0, t1, stack))


def _lift_pseudo_frames(tr: ThreadTrace) -> None:
    for sp in tr.spans:
        kept = []
        chain: list[int] = []
        for f in sp.stack:
            if not f.filename:
                m = _THREAD_FRAME.match(f.name)
                if m:
                    tr.os_tid = int(m.group(1))
                    tr.name = m.group(2) or tr.name
                    continue
                pm = _PROCESS_FRAME.match(f.name)
                if pm:
                    chain.append(int(pm.group(1)))
                    continue
            kept.append(f)
        sp.stack = tuple(kept)
        if len(chain) > len(tr.ancestry):
            tr.ancestry = tuple(chain)


# -- what code is whose --------------------------------------------------------------------------

_LIB_MARKERS = ("site-packages/", "dist-packages/", "<frozen", "/lib/python3", "/lib64/python3")


def is_library(filename: str) -> bool:
    return (not filename) or any(m in filename for m in _LIB_MARKERS)


def is_torch(filename: str) -> bool:
    return "/torch/" in filename


# Source-line patterns for user code that calls into C (no Python frame below it).
_SYNC_LINE = re.compile(r"\.item\(\)|\.cpu\(\)|\.tolist\(\)|\.numpy\(\)|cuda\.synchronize\(|"
                        r"\bsynchronize\(\)|\bprint\(|\.nonzero\(|float\(\s*\w+\s*\)|torch\.equal\(")
_H2D_LINE = re.compile(r"\.cuda\(|\.to\([^)]*(cuda|device|non_blocking)|\.to\(\s*\w*dev|\.copy_\(|"
                       r"torch\.as_tensor\([^)]*device|\.pin_memory\(")


def leaf_user_line(stack: tuple[Frame, ...], source: Mapping[str, str]) -> tuple[Frame, str] | None:
    """The deepest frame when it is user code, and its source line (if it was read)."""
    if not stack:
        return None
    leaf = stack[-1]
    if is_library(leaf.filename):
        return None
    text = source.get(f"{leaf.filename}:{leaf.line}")
    return (leaf, text) if text is not None else None


def classify_training(stack: tuple[Frame, ...], source: Mapping[str, str]) -> str:
    """Where one sample of the training thread was: one of TRAIN_CATEGORIES."""
    names = [f.name for f in stack]
    joined = "\n".join(names)
    if "_MultiProcessingDataLoaderIter" in joined:
        return "data_wait"
    if ("_SingleProcessDataLoaderIter" in joined or "_MapDatasetFetcher.fetch" in joined
            or "_IterableDatasetFetcher.fetch" in joined):
        return "data_load"
    if any(n.endswith("_BaseDataLoaderIter.__next__") for n in names):
        return "data_wait"
    leaf_line = leaf_user_line(stack, source)
    if leaf_line is not None:
        _frame, text = leaf_line
        code = text.split("#", 1)[0]
        if _H2D_LINE.search(code):
            return "h2d_copy"
        if _SYNC_LINE.search(code):
            return "host_sync"
    if stack:
        leaf = stack[-1]
        if leaf.name == "synchronize" and "torch/cuda" in leaf.filename:
            return "host_sync"
        if leaf.name.endswith("pin_memory") and is_torch(leaf.filename):
            return "h2d_copy"
    for f in stack:
        if is_torch(f.filename) and (f.name in ("backward", "_engine_run_backward", "Tensor.backward")
                                     or "/torch/autograd/" in f.filename):
            return "backward"
    # The innermost of the two wins: a loop that runs its forward inside optimizer.step(closure)
    # (Lightning's automatic optimization, LBFGS) is in the forward there, not in the optimizer.
    for f in reversed(stack):
        if _optimizer_frame(f) or f.name.endswith(".zero_grad"):
            return "optimizer"
        if f.name in MODULE_CALL or (f.name.endswith(".forward") and not is_library(f.filename)):
            return "forward"
    return "other"


MODULE_CALL = ("Module._wrapped_call_impl", "Module._call_impl", "Module.__call__")


# py-spy runs --nonblocking (the target is never stopped), so it reads a thread's frames while they
# change: a read can fail (py-spy counts it as an error and drops the sample) or stop early, leaving
# the innermost frames only. Such a truncated stack lacks the DataLoader frames `classify_training`
# looks for, so a loop's own loading (PIL, transforms, collate: many short Python calls, where frames
# change fastest) read that way counted as its other work, even as its forward (torchvision's
# Normalize is an nn.Module). Measured on pytorch/examples' mnist_rnn on 2 CPUs, 5 s windows at
# 30 Hz alternated with blocking py-spy in the same run (benchmarks/pyspy_nonblocking.py, 8 pairs):
# non-blocking read the loop's loading at 0.52, 0.55 with the truncated stacks counted as loading,
# blocking at 0.57 (docs/probes.md).
THREAD_ROOTS = ("<module>",)


def truncated(stack: tuple[Frame, ...]) -> bool:
    """The stack does not reach its thread's outermost frame (a module's top level, runpy, or a
    threading bootstrap): py-spy's nonblocking read stopped early."""
    if not stack:
        return False
    top = stack[0]
    return not (top.name in THREAD_ROOTS or top.name.endswith("_bootstrap") or "runpy" in top.filename)


_LOADING_FILES = ("/torch/utils/data/", "/torchvision/transforms/", "/torchvision/datasets/", "/PIL/")


def loading_code(stack: tuple[Frame, ...]) -> bool:
    """A frame of the stack is a dataset's item, a transform, image decoding or the DataLoader's own
    fetch and collate code."""
    return any(any(m in f.filename for m in _LOADING_FILES) or f.name.endswith(("__getitem__", "__getitems__"))
               for f in stack)

_DISTRIBUTED_FILES = ("/torch/distributed/", "/torch/nn/parallel/distributed.py", "/deepspeed/")


def in_distributed(stack: tuple[Frame, ...]) -> bool:
    """A frame of the stack is torch.distributed's (collectives, FSDP) or a data-parallel wrapper's
    (DistributedDataParallel, DeepSpeed): a rank that steps together with others."""
    return any(any(m in f.filename for m in _DISTRIBUTED_FILES) for f in stack)


# torch modules whose forward dynamo graph-breaks in by default, so torch.compile of a model that
# runs them gives several graphs with eager code between them: recurrent modules (not traced unless
# torch._dynamo.config.allow_rnn), and nn.TransformerEncoder / TransformerDecoder, whose causal-mask
# check (_detect_is_causal_mask: a data-dependent bool over the mask, when a mask comes without an
# is_causal hint) breaks the graph.
GRAPH_BREAK_MODULES = (
    ("rnn", "torch/nn/modules/rnn.py", ("LSTM.forward", "GRU.forward", "RNN.forward", "RNNBase.forward")),
    ("transformer", "torch/nn/modules/transformer.py",
     ("TransformerEncoder.forward", "TransformerDecoder.forward", "_detect_is_causal_mask")),
)


ITERATOR_METHODS = ("__iter__", "__next__")


def loader_site(stack: tuple[Frame, ...]) -> Frame | None:
    """The frame that iterates the DataLoader a data sample waits on or loads from (the caller of
    the first torch.utils.data frame): `train (main.py:49)` and `test (main.py:66)` are two loaders.
    An iterator around the loader only passes the iteration on (Fabric's _FabricDataLoader.__iter__,
    timm's PrefetchLoader.__iter__, Lightning's fetchers and CombinedLoader.__next__, accelerate's
    DataLoaderShard.__iter__): the site is the first caller outside such methods, so a training
    loop's loader and an evaluation pass's are told apart through the same wrapper."""
    for i, f in enumerate(stack):
        if "torch/utils/data/" in f.filename:
            j = i - 1
            while j > 0 and stack[j].name.rsplit(".", 1)[-1] in ITERATOR_METHODS:
                j -= 1
            return stack[j] if j >= 0 else None
    return None


def graph_break_module(stack: tuple[Frame, ...]) -> str | None:
    """The kind of GRAPH_BREAK_MODULES a sample is inside ("rnn", "transformer"), or None."""
    for f in stack:
        for kind, path, names in GRAPH_BREAK_MODULES:
            if f.name in names and f.filename.endswith(path):
                return kind
    return None


def _optimizer_frame(f: Frame) -> bool:
    return "/torch/optim/" in f.filename or f.name.endswith("Optimizer.step")


def in_optimizer_step(stack: tuple[Frame, ...]) -> bool:
    """A sample inside an optimizer's step: for a forward or backward sample, the model runs inside
    the optimizer's closure (Lightning's automatic optimization, LBFGS), not in a loop of its own."""
    return any(_optimizer_frame(f) for f in stack)


def module_call_site(stack: tuple[Frame, ...]) -> str | None:
    """The frame that called the outermost nn.Module (its function and line: `netD(real)` and
    `netD(fake.detach())` are two sites), or None when no module is being called."""
    for i, f in enumerate(stack):
        if f.name in MODULE_CALL and is_torch(f.filename):
            return stack[i - 1].label() if i > 0 else None
    return None


def classify_worker(stack: tuple[Frame, ...]) -> str:
    """Where one sample of a DataLoader worker's main thread was: one of WORKER_CATEGORIES."""
    names = [f.name for f in stack]
    if not any("_worker_loop" in n for n in names):
        return "other"
    in_fetch = False
    getitem_depth = None
    for i, f in enumerate(stack):
        if f.name.endswith("Fetcher.fetch"):
            in_fetch = True
        if "collate" in f.name and is_torch(f.filename):
            return "collate"
        if in_fetch and getitem_depth is None and (f.name.endswith("__getitem__") or f.name.endswith("__getitems__")
                                                   or f.name.endswith("__iter__") or f.name.endswith("__next__")):
            getitem_depth = i
    if getitem_depth is not None:
        below = stack[getitem_depth + 1:]
        if any(_is_transform(f) for f in below):
            return "transform"
        return "getitem"
    if in_fetch:
        return "getitem"
    return "idle"


def _is_transform(f: Frame) -> bool:
    return ("/transforms/" in f.filename or "Compose" in f.name or "transform" in f.name.lower()
            or "augment" in f.name.lower())


def is_worker_trace(tr: ThreadTrace) -> bool:
    return any("_worker_loop" in f.name for sp in tr.spans[:50] for f in sp.stack)


def is_idle_stack(stack: tuple[Frame, ...]) -> bool:
    """A thread parked in a wait (py-spy would call it idle) rather than running."""
    if not stack:
        return True
    leaf = stack[-1].name
    return leaf.endswith((".wait", ".get", "poll", "select", "_poll", ".acquire", "sleep", "Event.wait",
                          "Condition.wait", "_recv", "recv_bytes", "_wait_for_tstate_lock", ".join"))


# -- where the training thread waits --------------------------------------------------------------
#
# py-spy shows Python frames only: a thread inside a C call shows the Python frame that made it. What
# a sample's frames say is where the thread was; whether it was on a CPU comes from the OS (its CPU
# time), and whether it waited for the GIL only from who held the GIL (py-spy --gil). The kinds below
# name the place; pyspy.allocate_waits turns them into off-CPU shares of the window.

# Frame kinds of a training-thread sample. The first five block by nature (the GIL is released while
# they wait); "native" is code known to wait inside native code (autograd's engine waiting for its
# device threads, a future); "code" is Python or torch code, where a GIL wait can hide.
FRAME_KINDS = ("data", "h2d_copy", "host_sync", "collective", "io", "idle_wait", "native", "code")
BLOCKING_KINDS = ("data", "h2d_copy", "host_sync", "collective", "io", "idle_wait")
# Off-CPU shares of the window (pyspy.allocate_waits): the blocking kinds, then the GIL wait (only
# where another thread was seen holding the GIL), native waits, and what nothing explains.
WAIT_KEYS = ("gil", "data", "h2d_copy", "host_sync", "collective", "io", "idle_wait", "native_other", "unexplained")

_COLLECTIVES = frozenset((
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_object",
    "_all_gather_base", "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "broadcast",
    "broadcast_object_list", "barrier", "monitored_barrier", "send", "recv", "isend", "irecv", "wait",
    "all_to_all", "all_to_all_single", "gather", "scatter", "reduce", "batch_isend_irecv", "_wait",
    "wait_tensor", "_wait_for_all"))
_COLLECTIVE_LINE = re.compile(r"\b(?:dist|distributed|c10d|funcol)\.(?:" + "|".join(sorted(_COLLECTIVES)) + r")\(|"
                              r"\b(?:all_reduce|barrier|all_gather\w*|reduce_scatter\w*|broadcast)\(")
# Leaf frames of the standard library and common packages that block in a system call.
_IO_NAMES = frozenset((
    "read", "readinto", "readline", "readlines", "read1", "recv", "recv_into", "recvfrom", "recvmsg",
    "recv_bytes", "_recv_bytes", "_recv", "_recv_msg", "recv_msg", "select", "poll", "_poll", "epoll",
    "accept", "sendall", "send", "sendmsg", "connect", "create_connection", "communicate", "_communicate",
    "getaddrinfo", "urlopen", "fsync", "_read_status", "_readinto", "do_handshake", "_wait_for_data"))
_IO_FILES = ("/socket.py", "/selectors.py", "/ssl.py", "/subprocess.py", "multiprocessing/connection.py",
             "/http/client.py", "/asyncio/", "/urllib3/", "/requests/", "/grpc/", "/zmq/")
_IO_LINE = re.compile(r"\bos\.(?:read|readv|pread|write|waitpid|wait)\(|\.(?:recv|recv_into|recvfrom|accept|"
                      r"sendall|read|readinto|readline)\(|\bselect\.(?:select|poll|epoll)\b|\.communicate\(|"
                      r"\.poll\(|subprocess\.(?:run|call|check_call|check_output)\(")
_IDLE_NAMES = frozenset((
    "wait", "wait_for", "acquire", "_acquire_restore", "sleep", "get", "join", "_wait_for_tstate_lock",
    "_wait", "get_nowait"))
_IDLE_FILES = ("/threading.py", "/queue.py", "multiprocessing/queues.py", "multiprocessing/synchronize.py",
               "/concurrent/futures/", "multiprocessing/pool.py")
_IDLE_LINE = re.compile(r"\btime\.sleep\(|\bsleep\(|\.wait\(|\.acquire\(|\.join\(|\.get\(\s*(?:block|timeout|\))")
# Native code that waits: autograd's engine (a CUDA backward runs on the engine's device threads while
# the calling thread waits), a TorchScript or torch future.
_NATIVE_WAITS = ("_engine_run_backward", "run_backward")
_NATIVE_FILES = ("/torch/autograd/", "/torch/jit/_async.py", "/torch/futures/")


def _base_name(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def classify_wait(stack: tuple[Frame, ...], source: Mapping[str, str], cat: str | None = None) -> str:
    """Where one training-thread sample was, as one of FRAME_KINDS (see the comment above); `cat`:
    its classify_training category where the caller has it already."""
    cat = classify_training(stack, source) if cat is None else cat
    if cat in ("data_wait", "data_load"):
        return "data"
    if cat in ("h2d_copy", "host_sync"):
        return cat
    if not stack:
        return "code"
    leaf = stack[-1]
    base = _base_name(leaf.name)
    if any("/torch/distributed/" in f.filename and _base_name(f.name) in _COLLECTIVES for f in stack):
        return "collective"
    line = leaf_user_line(stack, source)
    code = line[1].split("#", 1)[0] if line else ""
    if code and _COLLECTIVE_LINE.search(code):
        return "collective"
    if base in _IO_NAMES and (is_library(leaf.filename) or any(m in leaf.filename for m in _IO_FILES)):
        return "io"
    if any(m in leaf.filename for m in _IO_FILES):
        return "io"
    if base in _IDLE_NAMES and (any(m in leaf.filename for m in _IDLE_FILES) or base == "sleep"):
        return "idle_wait"
    if code and _IO_LINE.search(code):
        return "io"
    if code and _IDLE_LINE.search(code):
        return "idle_wait"
    for f in stack:
        if _base_name(f.name) in _NATIVE_WAITS and is_torch(f.filename):
            return "native"
        if f.name.endswith("wait") and any(m in f.filename for m in _NATIVE_FILES[1:]):
            return "native"
    return "code"


# -- who held the GIL (py-spy record --gil -f speedscope) ------------------------------------------

_SPEEDSCOPE_THREAD = re.compile(r'^Thread (\d+)(?: "(.*)")?$', re.S)


@dataclass
class GilHolding:
    tid: int | None
    name: str | None
    samples: int                        # samples in which this thread held the GIL
    leaves: dict[str, int]              # its innermost frame in those samples -> count
    files: dict[str, int] = field(default_factory=dict)   # every source file on those stacks -> samples


@parser("py-spy speedscope read_gil_speedscope")
def read_gil_speedscope(doc: Mapping[str, Any]) -> list[GilHolding]:
    """py-spy `record --gil --threads -f speedscope` -> one GilHolding per thread that held the GIL.

    With --gil py-spy keeps, of each sample, only the thread that held the GIL at that instant (read
    from the interpreter's state, not guessed from frames); a sample in which no thread held it
    leaves nothing. Each speedscope profile is one thread; its samples are frame-index lists, root
    first, with the `thread (TID): NAME` pseudo-frame that --threads adds at the root.
    """
    frames = [f for f in ((doc.get("shared") or {}).get("frames") or []) if isinstance(f, Mapping)]
    out: list[GilHolding] = []
    for prof in doc.get("profiles") or []:
        if not isinstance(prof, Mapping):
            continue
        samples = [s for s in (prof.get("samples") or []) if isinstance(s, list)]
        tid, name = None, None
        m = _SPEEDSCOPE_THREAD.match(str(prof.get("name") or ""))
        if m:
            tid, name = int(m.group(1)), m.group(2)
        leaves: dict[str, int] = {}
        files: dict[str, int] = {}
        for s in samples:
            idx = [i for i in s if isinstance(i, int) and 0 <= i < len(frames)]
            real = [frames[i] for i in idx if frames[i].get("file")]
            pseudo = [frames[i] for i in idx if not frames[i].get("file")]
            for p in pseudo:
                tm = _THREAD_FRAME.match(str(p.get("name") or ""))
                if tm:
                    tid, name = int(tm.group(1)), tm.group(2) or name
            for f in {str(fr_.get("file")) for fr_ in real}:
                files[f] = files.get(f, 0) + 1
            if real:
                f = real[-1]
                fr = Frame(str(f.get("name") or ""), str(f.get("file") or ""), int(f.get("line") or 0))
                lab = f"{fr.name} ({fr.short}:{fr.line})" if fr.line else f"{fr.name} ({fr.short})"
                leaves[lab] = leaves.get(lab, 0) + 1
        if samples:
            out.append(GilHolding(tid, name, len(samples), leaves, files))
    return out


def fold(stack: Iterable[Frame], prefix: Iterable[str] = ()) -> str:
    """A folded-stack key (root first, ';' separated) for Brendan Gregg's format."""
    parts = list(prefix) + [f.label().replace(";", ":") for f in stack]
    return ";".join(parts)


# -- folded stacks for flamegraphs ---------------------------------------------------------------

_PKG_MARKERS = ("/site-packages/", "/dist-packages/")
_STDLIB = re.compile(r"/lib(?:64)?/python\d+(?:\.\d+)*t?/")


def short_path(filename: str) -> str:
    """A readable path for a frame: the package-relative path for installed code
    (`torch/nn/modules/module.py`), the path under the stdlib directory (`multiprocessing/queues.py`),
    the file name for anything else (the user's script)."""
    if not filename or not filename.startswith("/"):
        return filename             # already relative (or `<frozen ...>`): keep it, so this is idempotent
    for m in _PKG_MARKERS:
        i = filename.rfind(m)
        if i >= 0:
            return filename[i + len(m):]
    m = None
    for m in _STDLIB.finditer(filename):
        pass
    if m is not None:
        return filename[m.end():]
    return filename.rsplit("/", 1)[-1]


def frame_label(f: Frame) -> str:
    """`function (path.py:line)`: one flamegraph frame, safe for the folded format."""
    name = f.name.replace(";", ":").replace("\n", " ")
    if not f.filename:
        return name
    return f"{name} ({short_path(f.filename).replace(';', ':')}:{f.line})"


def fold_traces(traces: Iterable[ThreadTrace], threads: bool = False, processes: bool = False) -> dict[str, int]:
    """Folded stacks (root first) weighted by the integer microseconds each stack was seen for.

    `processes` puts a `process (PID)` frame at the root, `threads` a `thread (TID, NAME)` frame
    under it, as py-spy does with --subprocesses and --threads; without them all threads merge.
    (No frame name ends in a number: a folded line `... name 12 34` reads as a differential one.)
    Time in which py-spy saw no Python frame at all is left out.
    """
    labels: dict[Frame, str] = {}
    keys: dict[tuple[Frame, ...], str] = {}
    out: dict[str, int] = {}
    for tr in traces:
        prefix = []
        if processes:
            prefix.append(f"process ({tr.pid})")
        if threads:
            tid = tr.os_tid if tr.os_tid is not None else tr.thread_key
            name = (tr.name or "").replace(";", ":").replace("\n", " ").replace(")", "]").strip()
            prefix.append(f"thread ({tid}, {name})" if name else f"thread ({tid})")
        head = ";".join(prefix)
        for sp in tr.spans:
            us = int(round(sp.seconds * 1e6))
            if us <= 0:
                continue
            body = keys.get(sp.stack)
            if body is None:
                parts = []
                for fr in sp.stack:
                    lab = labels.get(fr)
                    if lab is None:
                        lab = labels[fr] = frame_label(fr)
                    parts.append(lab)
                body = keys[sp.stack] = ";".join(parts)
            key = f"{head};{body}" if head and body else (head or body)
            if not key:
                continue
            out[key] = out.get(key, 0) + us
    return out
