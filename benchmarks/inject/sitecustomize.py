"""Applies a printed fix to an unmodified training script, and counts its optimizer steps.

Put this folder first on PYTHONPATH of the job (benchmarks/public_ledger.py does). It reads:

  TRAINPROBE_LEDGER_KNOBS     JSON of the fix's knobs, e.g. {"num_workers": 8, "pin_memory": true}:
                              num_workers, pin_memory, persistent_workers, prefetch_factor override
                              the keyword arguments of the script's training DataLoaders (below);
                              worker_threads sets torch.set_num_threads in each worker;
                              intra_op_threads calls torch.set_num_threads; sharing_strategy calls
                              torch.multiprocessing.set_sharing_strategy; compile sets the mode
                              of the script's own torch.compile calls; compile_models (a script
                              that compiles nothing itself) compiles, in place after its first
                              step, the module each optimizer trains (nn.Module.compile(mode=...),
                              what `model = torch.compile(model, mode=...)` does).
  TRAINPROBE_LEDGER_LOADERS   which DataLoaders the loader knobs go to: "train" (the default): every
                              loader first iterated with autograd on, set as it starts iterating
                              (evaluation passes iterate under torch.no_grad or inference_mode:
                              pytorch/examples' test loops, Lightning's validation and sanity
                              check, which builds and iterates the validation loader before the
                              training one; a script that builds a new loader per fold or epoch
                              gets each one); "first": the first one built; "all": every one built.
  TRAINPROBE_LEDGER_PROGRESS  a file: "unix_time steps" is rewritten in place at most every 0.2 s
                              from an optimizer step post-hook (no thread, no output);
                              TRAINPROBE_LEDGER_COUNT=backward counts loss.backward() calls instead,
                              for a loop that updates its parameters without torch.optim;
                              TRAINPROBE_LEDGER_COUNT_ALL=1 counts in every process that steps
                              (training processes the script spawns), each in PROGRESS.PID.
  TRAINPROBE_LEDGER_THREAD    start a background Python thread in the job, labelled as injected:
                              "pipe" blocks in os.read of a pipe (a metrics uploader waiting),
                              "spin" runs pure Python in 20 ms bursts (a GIL holder).

Nothing is imported before the script imports torch itself: the patches are applied right after
`import torch` finishes. Any other sitecustomize on sys.path still runs.
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import json
import os
import sys
import threading
import time

_KNOBS = json.loads(os.environ.get("TRAINPROBE_LEDGER_KNOBS") or "{}")
_PROGRESS = os.environ.get("TRAINPROBE_LEDGER_PROGRESS")
_OWNER = os.environ.setdefault("TRAINPROBE_LEDGER_OWNER", str(os.getpid()))
_IS_OWNER = _OWNER == str(os.getpid())      # children (workers, compile pools) count nothing
_LOADERS = os.environ.get("TRAINPROBE_LEDGER_LOADERS", "train")
_COUNT_ALL = os.environ.get("TRAINPROBE_LEDGER_COUNT_ALL") == "1"   # every process that steps counts
_APPLIED: list[str] = []
_LOADER_KEYS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")


def _log(msg: str) -> None:
    path = os.environ.get("TRAINPROBE_LEDGER_LOG")
    if path and _IS_OWNER:
        with open(path, "a") as fh:
            fh.write(msg + "\n")


def _worker_init(torch, user_init, n: int):
    def worker_init_fn(worker_id, _user=user_init, _n=n):
        torch.set_num_threads(_n)
        if _user is not None:
            _user(worker_id)
    return worker_init_fn


def _fitted(torch, kw: dict, worker_threads, set_prefetch: bool) -> dict:
    """The loader keywords KW (the fix's over the script's) as torch accepts them: without workers no
    persistent_workers or prefetch_factor; with workers a prefetch_factor where one is wanted and
    none is set; worker_threads through the workers' init function."""
    kw = dict(kw)
    if not kw.get("num_workers"):
        kw["persistent_workers"] = False
        kw["prefetch_factor"] = None
    elif kw.get("prefetch_factor") is None and set_prefetch:
        kw["prefetch_factor"] = 2
    if worker_threads and kw.get("num_workers"):
        kw["worker_init_fn"] = _worker_init(torch, kw.get("worker_init_fn"), int(worker_threads))
    return kw


def _patch_dataloader(torch) -> None:
    import inspect

    dl = torch.utils.data.DataLoader
    orig = dl.__init__
    orig_iter = dl.__iter__
    sig = inspect.signature(orig)
    wanted = {k: _KNOBS[k] for k in _LOADER_KEYS if k in _KNOBS}
    worker_threads = _KNOBS.get("worker_threads")
    count = [0]

    @functools.wraps(orig)     # its signature stays DataLoader's: Lightning maps its arguments by it
    def __init__(self, *args, **kwargs):
        count[0] += 1
        object.__setattr__(self, "_tp_ledger_n", count[0])
        if (_LOADERS == "all" or (_LOADERS == "first" and count[0] == 1)) and (wanted or worker_threads):
            try:
                bound = sig.bind(self, *args, **kwargs)
            except TypeError:
                return orig(self, *args, **kwargs)
            kw = dict(bound.arguments)
            kw.pop("self", None)
            extra = kw.pop("kwargs", {}) if "kwargs" in sig.parameters else {}
            before = {k: kw.get(k, sig.parameters[k].default) for k in _LOADER_KEYS if k in sig.parameters}
            kw.update(_fitted(torch, {**kw, **wanted}, worker_threads, "prefetch_factor" in wanted))
            after = {k: kw.get(k, before[k]) for k in before}
            _log(f"DataLoader #{count[0]} ({type(self).__name__}): {before} -> {after}")
            return orig(self, **kw, **extra)
        return orig(self, *args, **kwargs)

    @functools.wraps(orig_iter)
    def __iter__(self):
        # "train": the knobs go to a loader the first time it is iterated with autograd on, set on the
        # built loader as its constructor would have set them (persistent_workers through
        # object.__setattr__: DataLoader refuses it after __init__).
        if (_LOADERS == "train" and (wanted or worker_threads) and not getattr(self, "_tp_ledger_seen", False)):
            object.__setattr__(self, "_tp_ledger_seen", True)
            if torch.is_grad_enabled() and not torch.is_inference_mode_enabled():
                before = {k: getattr(self, k, None) for k in _LOADER_KEYS}
                now = {**before, "worker_init_fn": self.worker_init_fn, **wanted}
                for k, v in _fitted(torch, now, worker_threads, True).items():
                    object.__setattr__(self, k, v)
                after = {k: getattr(self, k, None) for k in _LOADER_KEYS}
                _log(f"DataLoader #{getattr(self, '_tp_ledger_n', '?')} ({type(self).__name__}), iterated "
                     f"with autograd on: {before} -> {after}")
            else:
                _log(f"DataLoader #{getattr(self, '_tp_ledger_n', '?')} ({type(self).__name__}) left as "
                     f"built: first iterated without autograd (an evaluation pass)")
        return orig_iter(self)

    dl.__init__ = __init__
    dl.__iter__ = __iter__


def _patch_compile(torch) -> None:
    mode = _KNOBS["compile"]
    orig = torch.compile

    def compile(*args, **kwargs):  # noqa: A001 - the name the script calls
        _log(f"torch.compile mode {kwargs.get('mode')!r} -> {mode!r}")
        kwargs["mode"] = mode
        return orig(*args, **kwargs)
    torch.compile = compile


def _patch_compile_models(torch) -> None:
    """After each optimizer's first step, compile the module it trains: the deepest module whose
    parameters are all of the optimizer's (the model itself, not a wrapper around it such as DDP or
    Fabric's), else, where no one module holds them all, each deepest module holding only its
    parameters and none of a larger such module's."""
    import gc
    import weakref
    mode = _KNOBS["compile_models"]
    seen: "weakref.WeakSet" = weakref.WeakSet()

    def is_module(o) -> bool:
        try:
            return isinstance(o, torch.nn.Module)
        except ReferenceError:      # a weakref.proxy whose object is gone, among gc's objects
            return False

    def modules_of(opt):
        ids = {id(p) for g in opt.param_groups for p in g["params"]}
        mods = [m for m in gc.get_objects() if is_module(m)]
        cand = []
        for m in mods:
            ps = [id(p) for p in m.parameters()]
            if ps and all(i in ids for i in ps):
                cand.append((m, set(ps)))
        full = [m for m, ps in cand if ps == ids]
        if full:
            # the deepest: no other module holding them all is inside it (one always is)
            ids_full = {id(f) for f in full}
            return [m for m in full if not any(id(c) in ids_full for c in m.modules() if c is not m)][:1]
        inner = {id(c) for m, _ in cand for c in m.modules() if c is not m}
        return [m for m, _ in cand if id(m) not in inner]

    def hook(optimizer, args, kwargs):
        if optimizer in seen:
            return
        seen.add(optimizer)
        for m in modules_of(optimizer):
            m.compile(mode=mode)
            _log(f"compiled {type(m).__name__} in place, mode {mode!r} (the module optimizer "
                 f"{type(optimizer).__name__} trains)")
    importlib.import_module("torch.optim.optimizer").register_optimizer_step_post_hook(hook)


def _count_steps(torch) -> None:
    # several training processes (TRAINPROBE_LEDGER_COUNT_ALL): each its own file, PROGRESS.PID
    path = _PROGRESS if _IS_OWNER else f"{_PROGRESS}.{os.getpid()}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    state = {"n": 0, "last": 0.0}

    def hook(optimizer, args, kwargs):
        state["n"] += 1
        now = time.time()
        if now - state["last"] >= 0.2:
            state["last"] = now
            os.pwrite(fd, f"{now:.4f} {state['n']}".ljust(40).encode() + b"\n", 0)
    if os.environ.get("TRAINPROBE_LEDGER_COUNT") == "backward":
        # a loop that updates its parameters by hand (no torch.optim): one step per loss.backward()
        backward = torch.Tensor.backward

        def counted_backward(self, *args, **kwargs):
            out = backward(self, *args, **kwargs)
            hook(None, args, kwargs)
            return out
        torch.Tensor.backward = counted_backward
    else:
        import importlib
        importlib.import_module("torch.optim.optimizer").register_optimizer_step_post_hook(hook)


def _after_torch(torch) -> None:
    try:
        if any(k in _KNOBS for k in _LOADER_KEYS) or "worker_threads" in _KNOBS:
            _patch_dataloader(torch)
        if "intra_op_threads" in _KNOBS:
            torch.set_num_threads(int(_KNOBS["intra_op_threads"]))
            _log(f"torch.set_num_threads({int(_KNOBS['intra_op_threads'])})")
        if "sharing_strategy" in _KNOBS:
            # how workers hand a batch's tensors to the loop: "file_descriptor" (the default: one fd
            # passed over a socket per storage, answered by a thread in the worker) or "file_system"
            # (the storage's shared-memory file by name)
            import torch.multiprocessing as tmp
            tmp.set_sharing_strategy(str(_KNOBS["sharing_strategy"]))
            _log(f"torch.multiprocessing.set_sharing_strategy({_KNOBS['sharing_strategy']!r})")
        if "compile" in _KNOBS:
            _patch_compile(torch)
        if "compile_models" in _KNOBS and _IS_OWNER:
            _patch_compile_models(torch)
        if _PROGRESS and (_IS_OWNER or _COUNT_ALL):
            _count_steps(torch)
    except Exception as exc:  # noqa: BLE001 - the job runs on; the harness sees the log
        _log(f"patch failed: {type(exc).__name__}: {exc}")


class _ImportHook(importlib.abc.MetaPathFinder):
    """Runs `after(module)` once `import NAME` has finished executing. It stays on sys.meta_path until
    then: a library that only asks whether NAME is installed (`importlib.util.find_spec("torch")`, as
    transformers, datasets and accelerate do before importing it) gets a spec that is never executed,
    and the import that follows must still be seen."""

    def __init__(self, name: str, after) -> None:
        self.name, self.after, self.done = name, after, False

    def find_spec(self, name, path=None, target=None):
        if name != self.name or self.done:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module, _after=self.after):
            run(module)
            if self.done:
                return
            self.done = True
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            try:
                _after(module)
            except Exception as exc:  # noqa: BLE001 - the job runs on; the harness sees the log
                _log(f"patch of {name} failed: {type(exc).__name__}: {exc}")
        spec.loader.exec_module = exec_module
        return spec


def _patch_trainer(module) -> None:
    """Lightning's Trainer keyword: enable_progress_bar (the bar's refresh thread off)."""
    cls = getattr(module, "Trainer", None)
    if cls is None or getattr(cls, "_trainprobe_patched", False):
        return
    init, value = cls.__init__, bool(_KNOBS["enable_progress_bar"])

    def __init__(self, *args, **kwargs):
        before = kwargs.get("enable_progress_bar")
        kwargs["enable_progress_bar"] = value
        _log(f"{module.__name__}.Trainer: enable_progress_bar {before!r} -> {value!r}")
        init(self, *args, **kwargs)
    cls.__init__ = __init__
    cls._trainprobe_patched = True


def _injected_thread(mode: str) -> None:
    if mode == "pipe":
        r, _w = os.pipe()

        def uploader():
            while True:
                if not os.read(r, 4096):       # blocks: no writer ever writes
                    return
        threading.Thread(target=uploader, name="injected-metrics-uploader", daemon=True).start()
    elif mode == "spin":
        def spinner():
            # pure Python in 20 ms bursts with 2 ms sleeps: holds the GIL ~90% of the time
            x = 0
            while True:
                t = time.perf_counter()
                while time.perf_counter() - t < 0.02:
                    x = (x * 31 + 7) % 1000003
                time.sleep(0.002)
        threading.Thread(target=spinner, name="injected-gil-spinner", daemon=True).start()


def _chain() -> None:
    """Run the next sitecustomize on sys.path (the interpreter's own), as if this one were absent."""
    here = os.path.dirname(os.path.abspath(__file__))
    for d in sys.path:
        if not d or os.path.abspath(d) == here:
            continue
        f = os.path.join(d, "sitecustomize.py")
        if os.path.isfile(f):
            with open(f) as fh:
                code = compile(fh.read(), f, "exec")
            exec(code, {"__name__": "sitecustomize", "__file__": f})
            return


if "enable_progress_bar" in _KNOBS and _IS_OWNER:
    for _mod in ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer"):
        if _mod in sys.modules:
            _patch_trainer(sys.modules[_mod])
        else:
            sys.meta_path.insert(0, _ImportHook(_mod, _patch_trainer))
if _KNOBS or _PROGRESS:
    if "torch" in sys.modules:
        _after_torch(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _ImportHook("torch", _after_torch))
if _IS_OWNER and os.environ.get("TRAINPROBE_LEDGER_THREAD"):
    _injected_thread(os.environ["TRAINPROBE_LEDGER_THREAD"])
try:
    _chain()
except Exception:  # noqa: BLE001 - another site's customisation must not stop the job
    pass
