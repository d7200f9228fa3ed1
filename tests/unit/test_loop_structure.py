"""What the py-spy parser reads from the training loop's stacks beyond its categories: the forward
inside an optimizer's closure, the torch modules torch.compile graph-breaks in, and which DataLoader
a wait is on (the training loop's or an evaluation pass's), with the step model's reading of them."""
from trainprobe.agent.combiners import step_model
from trainprobe.agent.combiners.step_model import Change, StepModel
from trainprobe.probes import pyspy
from trainprobe.probes.parsers.pystacks import Frame, classify_training, graph_break_module, loader_site

MOD = "/venv/site-packages/torch/nn/modules/module.py"
OPT = "/venv/site-packages/torch/optim/optimizer.py"
SGD = "/venv/site-packages/torch/optim/sgd.py"
DATA = "/venv/site-packages/torch/utils/data/dataloader.py"
TRANSFORMER = "/venv/site-packages/torch/nn/modules/transformer.py"
PL = "/venv/site-packages/lightning/pytorch/loops/optimization/automatic.py"


def stack(*frames):
    return tuple(Frame(n, f, line) for n, f, line in frames)


def test_a_forward_inside_optimizer_step_closure_is_the_forward():
    # Lightning's automatic optimization: optimizer.step(closure) runs training_step, then backward
    closure = (("_AutomaticOptimization.run", PL, 192), ("Optimizer.profile_hook_step.<locals>.wrapper", OPT, 517),
               ("SGD.step", SGD, 120), ("Closure.__call__", PL, 140),
               ("LanguageModel.training_step", "/job/transformer.py", 16), ("Module._wrapped_call_impl", MOD, 1779),
               ("Module._call_impl", MOD, 1790), ("Transformer.forward", "/job/transformer.py", 74))
    assert classify_training(stack(*closure), {}) == "forward"
    # the optimizer's own update, under the same wrapper, is the optimizer
    update = closure[:3] + (("_multi_tensor_sgd", SGD, 400),)
    assert classify_training(stack(*update), {}) == "optimizer"
    # and a plain loop is unchanged
    plain = (("<module>", "/job/main.py", 50), ("Adam.step", "/venv/site-packages/torch/optim/adam.py", 200))
    assert classify_training(stack(*plain), {}) == "optimizer"


def test_graph_breaking_torch_modules_are_named_by_file_not_by_class_name():
    enc = stack(("TransformerModel.forward", "/job/model.py", 142), ("Module._call_impl", MOD, 1790),
                ("TransformerEncoder.forward", TRANSFORMER, 537))
    assert graph_break_module(enc) == "transformer"
    lstm = stack(("RNNModel.forward", "/job/model.py", 50), ("LSTM.forward", "/venv/torch/nn/modules/rnn.py", 1100))
    assert graph_break_module(lstm) == "rnn"
    # a user's own class of the same name in a file of the same name is not torch's
    mine = stack(("TransformerEncoder.forward", "/job/transformer.py", 20),)
    assert graph_break_module(mine) is None


def test_the_loader_site_is_the_frame_iterating_it():
    s = stack(("<module>", "/job/main.py", 83), ("test", "/job/main.py", 66),
              ("_BaseDataLoaderIter.__next__", DATA, 741), ("_MultiProcessingDataLoaderIter._next_data", DATA, 1500))
    assert loader_site(s).label() == "test (main.py:66)"
    assert loader_site(stack(("<module>", "/job/main.py", 1))) is None


def test_the_loader_site_looks_through_iterators_around_the_loader():
    # Fabric's k-fold example: train and validation both iterate a _FabricDataLoader, whose __iter__
    # is the caller of torch's frames in both; the functions that iterate it are the two sites
    fabric = "/venv/site-packages/lightning/fabric/wrappers.py"
    wrap = (("_FabricDataLoader.__iter__", fabric, 372), ("_BaseDataLoaderIter.__next__", DATA, 741),
            ("_SingleProcessDataLoaderIter._next_data", DATA, 790))
    val = stack(("<module>", "/job/train_fabric.py", 190), ("run", "/job/train_fabric.py", 150),
                ("validate_dataloader", "/job/train_fabric.py", 72), *wrap)
    train = stack(("<module>", "/job/train_fabric.py", 190), ("run", "/job/train_fabric.py", 149),
                  ("train_dataloader", "/job/train_fabric.py", 47), *wrap)
    assert loader_site(val).name == "validate_dataloader"
    assert loader_site(train).name == "train_dataloader"
    # Lightning's Trainer: fetchers and CombinedLoader pass the iteration on from the epoch loop
    fetchers = "/venv/site-packages/lightning/pytorch/loops/fetchers.py"
    combined = "/venv/site-packages/lightning/pytorch/utilities/combined_loader.py"
    epoch = "/venv/site-packages/lightning/pytorch/loops/training_epoch_loop.py"
    pl = stack(("_TrainingEpochLoop.advance", epoch, 220), ("_PrefetchDataFetcher.__next__", fetchers, 133),
               ("_DataFetcher.__next__", fetchers, 61), ("CombinedLoader.__next__", combined, 341),
               ("_MaxSizeCycle.__next__", combined, 78), *wrap[1:])
    assert loader_site(pl).name == "_TrainingEpochLoop.advance"


def test_loaders_split_training_from_evaluation_only_when_a_loader_trains():
    train, test = ("train", "/job/main.py"), ("test", "/job/main.py")
    by = {train: {"label": "train (main.py:49)", "data_wait": 5.5, "data_load": 0.0, "startup": 0.4},
          test: {"label": "test (main.py:66)", "data_wait": 3.2, "data_load": 0.0, "startup": 0.4}}
    rows = pyspy._loaders(by, {train, ("<module>", "/job/main.py")}, 10.0)
    assert [(r["site"], r["trains"]) for r in rows] == [("train (main.py:49)", True), ("test (main.py:66)", False)]
    assert rows[1]["data_wait"] == 0.32
    # a framework's fetcher serves every loop: no loader's own function trains, no split is claimed
    rows = pyspy._loaders(by, {("<module>", "/job/main.py")}, 10.0)
    assert {r["trains"] for r in rows} == {None}
    assert step_model.eval_loaders({"loaders": rows}) == (0.0, 0.0, 0.0)


def test_an_evaluation_loaders_wait_stays_after_a_fix_to_the_training_loader():
    base = dict(f_wait=0.55, f_load=0.0, w_now=4, d=0.37, u=0.73, p=16.0, p_allowed=16.0, loop_cores=1.0, threads_busy=1,
                worker_cores=0.37, gpu_busy=0.03, n_samples=150)
    split = StepModel(f_eval=0.32, **base)
    merged = StepModel(**dict(base, f_wait=0.87))
    ch = Change(workers=6, persistent=True, pin_memory=True)
    a, b = split.after(ch), merged.after(ch)
    assert a.speedup < b.speedup
    # the evaluation pass's wait is in the step after the fix, and is named in today's split
    assert a.mid >= 0.32
    assert any("evaluation pass" in k for k in split.split())


def test_one_evaluation_pass_cut_by_the_window_counts_half_of_its_share_in_log_terms():
    """A window that caught a single pass of an evaluation loader (Fabric's k-fold example: 55% of
    the window, about a sixth of the job) cannot say the pass's share of the job: the middle step is
    the geometric mean of keeping all of it and none of it; a window with two passes or more spans
    the job's cycle and keeps it whole."""
    import math
    base = dict(f_wait=0.35, f_load=0.0, w_now=0, d=0.3, u=0.9, p=16.0, p_allowed=16.0, loop_cores=1.0,
                threads_busy=1, gpu_busy=0.05, n_samples=150, f_eval=0.42)
    ch = Change(workers=8, persistent=True, pin_memory=True)
    one, two = StepModel(eval_passes=1, **base), StepModel(eval_passes=2, **base)
    kept = one._at(ch, "mid", step_model.CAL, eval_kept=True)[0]
    none = one._at(ch, "mid", step_model.CAL, eval_kept=False)[0]
    assert none < kept
    assert math.isclose(one.after(ch).mid, math.sqrt(kept * none), rel_tol=1e-9)
    assert math.isclose(two.after(ch).mid, kept, rel_tol=1e-9)
    lo, hi = one.after(ch).interval
    assert lo <= one.after(ch).speedup <= hi


def test_a_step_that_runs_torchs_transformer_splits_its_graphs():
    m = StepModel(0.0, 0.0, transformer_share=0.19)
    assert m.split_graphs and m.graph_break_kind == "transformer"
    assert StepModel(0.0, 0.0, rnn_share=0.05).graph_break_kind == "rnn"
    assert not StepModel(0.0, 0.0, transformer_share=0.01).split_graphs


def test_reaped_workers_cpu_counts_where_workers_are_re_created():
    me = {"pid": 10}
    proc = {"pid": 10, "processes": [
        {"pid": 11, "ppid": 10, "role": "dataloader_worker", "seen": "both", "alive_at_end": True, "cpu_cores": 0.2},
        {"pid": 12, "ppid": 10, "role": "dataloader_worker", "seen": "start", "alive_at_end": False,
         "cpu_cores": 0.1}],
        "worker_churn": {"appeared": [], "vanished": [12]}, "reaped_children_cores": 1.3}
    _, w_now, cores = step_model.workers_of(proc, me, 0, None, 5.0)
    assert w_now == 2 and round(cores, 6) == 1.5          # the reaped 1.3 plus the survivor's 0.2
    # without churn, or in a capture without the reading, the listings' sum stands
    steady = dict(proc, worker_churn={"appeared": [], "vanished": []})
    assert round(step_model.workers_of(steady, me, 0, None, 5.0)[2], 6) == 0.3
    assert round(step_model.workers_of(dict(proc, reaped_children_cores=None), me, 0, None, 5.0)[2], 6) == 0.3


def test_a_stack_py_spy_read_only_in_part_is_truncated():
    from trainprobe.probes.parsers.pystacks import loading_code, truncated
    full = stack(("<module>", "/job/main.py", 142), ("train", "/job/main.py", 45))
    assert not truncated(full) and not truncated(())
    assert not truncated(stack(("_run_module_as_main", "<frozen runpy>", 198), ("train", "/job/m.py", 3)))
    assert not truncated(stack(("Thread._bootstrap", "/usr/lib/python3.11/threading.py", 995),))
    # pytorch/examples' mnist_rnn, read while its loop converted an image (a nonblocking read stops early)
    part = stack(("get_image_num_channels", "/venv/site-packages/torchvision/transforms/functional.py", 82),
                 ("Image.tobytes", "/venv/site-packages/PIL/Image.py", 790))
    assert truncated(part) and loading_code(part)
    assert not loading_code(stack(("Module._call_impl", MOD, 1790), ("LSTM.forward", "/venv/torch/nn/modules/rnn.py", 1100)))
    assert loading_code(stack(("MyData.__getitem__", "/job/data.py", 12),))
