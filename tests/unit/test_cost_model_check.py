"""scripts/cost_check.py, the cost benchmarks' check of the cost model: the start-up's speed scales the interpreter's
parts only, a probe's native children keep the models' figure."""
from scripts import cost_check


def _window(startup_speed):
    plan = {"speed_factor": 1.0, "startup_speed": startup_speed, "planned_cpu_seconds": 0.30,
            "agent_cpu_seconds": 0.15, "probes": {"pyspy": {"cpu_seconds": 0.10}, "process": {"cpu_seconds": 0.05}}}
    by_probe = {"pyspy": {"thread_cpu_seconds": 0.005, "children_cpu_seconds": 0.09, "parse_cpu_seconds": 0.005},
                "process": {"thread_cpu_seconds": 0.04}}
    return {"ok": True, "plan": plan, "by_probe": by_probe, "tree_cpu_s": 0.26}


def test_the_start_up_speed_scales_the_interpreter_not_py_spy():
    cb = cost_check
    parts = cb.model_parts(_window(0.5), cb._down(_window(0.5)["plan"]))
    # py-spy: 90% of its measured CPU in its native child keeps the model's figure for that share
    assert abs(parts["pyspy"][0] - 0.10 * (0.9 + 0.1 * 0.5)) < 1e-9
    assert abs(parts["process"][0] - 0.05 * 0.5) < 1e-9              # a Python thread: scaled
    assert abs(parts["agent (the tree less its probes)"][0] - 0.15 * 0.5) < 1e-9
    # the tree: everything scaled, then py-spy's native share given back at the models' speed
    assert abs(parts["tree"][0] - (0.30 * 0.5 + 0.10 * 0.9 * 0.5)) < 1e-9
    assert abs(parts["tree"][1] - 0.26) < 1e-9


def test_at_the_models_speed_nothing_is_scaled():
    cb = cost_check
    w = _window(1.3)                     # slower than the models: the plan's own factor applies
    parts = cb.model_parts(w, cb._down(w["plan"]))
    assert parts["pyspy"][0] == 0.10 and parts["tree"][0] == 0.30
    chk = cb.model_check([w])
    assert chk["windows"] == 1 and chk["parts"]["tree"]["planned_median"] == 0.3
