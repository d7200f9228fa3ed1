"""Where the training loop calls its modules from (probes/parsers/pystacks.module_call_site) and
the step model's reading of it (agent/combiners/step_model.interleaved_calls)."""
from trainprobe.agent.combiners.step_model import interleaved_calls
from trainprobe.probes.parsers.pystacks import Frame, module_call_site

TORCH = "/usr/lib/python3/site-packages/torch/nn/modules/module.py"


def stack(*frames):
    return tuple(Frame(n, f, line) for n, f, line in frames)


def test_the_site_is_the_caller_of_the_outermost_module_call():
    s = stack(("<module>", "/job/main.py", 241), ("Module._wrapped_call_impl", TORCH, 1779),
              ("Module._call_impl", TORCH, 1790), ("Net.forward", "/job/main.py", 90),
              ("Module._wrapped_call_impl", TORCH, 1779), ("Linear.forward", "/x/torch/nn/modules/linear.py", 134))
    assert module_call_site(s) == "<module> (main.py:241)"


def test_no_module_call_no_site():
    assert module_call_site(stack(("<module>", "/job/main.py", 10), ("step", "/x/torch/optim/adam.py", 3))) is None
    # a frame named like torch's but not torch's own file is not a module call
    assert module_call_site(stack(("f", "/job/a.py", 1), ("Module._call_impl", "/job/mine.py", 2))) is None


def test_alternating_sites_are_interleaved_a_periodic_phase_is_not():
    assert interleaved_calls({"module_call_samples": 26, "module_site_switches": 17})     # a GAN
    assert not interleaved_calls({"module_call_samples": 50, "module_site_switches": 2})  # train, sample, train
    assert not interleaved_calls({"module_call_samples": 5, "module_site_switches": 3})   # too few to tell
    assert not interleaved_calls({})


def test_a_forward_inside_the_optimizers_step_runs_in_its_closure():
    from trainprobe.probes.parsers.pystacks import classify_training, in_optimizer_step
    optim = "/x/torch/optim/optimizer.py"
    lightning = stack(("run", "/x/lightning/pytorch/loops/optimization/automatic.py", 270),
                      ("Optimizer.profile_hook_step.<locals>.wrapper", optim, 493),
                      ("Adam.step", "/x/torch/optim/adam.py", 213),
                      ("Closure.__call__", "/x/lightning/pytorch/loops/optimization/automatic.py", 146),
                      ("LitClassifier.training_step", "/job/backbone_image_classifier.py", 79),
                      ("Module._wrapped_call_impl", TORCH, 1779), ("Module._call_impl", TORCH, 1790))
    assert classify_training(lightning, {}) == "forward" and in_optimizer_step(lightning)
    plain = stack(("<module>", "/job/main.py", 241), ("Module._wrapped_call_impl", TORCH, 1779),
                  ("Module._call_impl", TORCH, 1790), ("Net.forward", "/job/main.py", 90))
    assert classify_training(plain, {}) == "forward" and not in_optimizer_step(plain)
