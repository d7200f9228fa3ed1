"""benchmarks/public_knobs.py's arms without running a job (scripts/arms.py): the knob sets, and the
step model's prediction for each arm on a real public job's bundle (the VAE on 2 CPUs,
tests/data/ledger/public)."""
import pytest

from scripts import arms as pk
from tests.helpers import DATA


def test_arms_parse_to_knobs():
    arms = pk.parse_arms("cap:intra_op_threads=1; both:num_workers=1,persistent_workers=true,"
                         "sharing_strategy=file_system")
    assert arms == [("cap", {"intra_op_threads": 1}),
                    ("both", {"num_workers": 1, "persistent_workers": True, "sharing_strategy": "file_system"})]
    with pytest.raises(ValueError):
        pk.parse_arms("nameless")


def test_the_model_prices_each_arm_on_a_real_window():
    bundle = DATA / "ledger" / "public" / "bundles" / "vae-cpu-r5.tar.gz"
    cap = pk.predicted(bundle, {"intra_op_threads": 1})
    both = pk.predicted(bundle, {"num_workers": 1, "persistent_workers": True, "intra_op_threads": 1})
    # The loop loads its own batches on 2 busy CPUs: one thread alone is slower, a worker beside it faster.
    assert cap["speedup"] < 1.0 and cap["binding"] == "loading"
    assert both["speedup"] > 1.1 and both["binding"] in ("loop", "data")
    assert both["interval"][0] <= both["speedup"] <= both["interval"][1]


def test_an_arm_handing_batches_over_by_file_name_is_priced_as_such():
    # Lightning's backbone classifier on 2 CPUs at about 6 ms steps: the per-batch hand-off is a large
    # part of the step, and the file-name hand-off costs less of it.
    bundle = DATA / "ledger" / "public" / "bundles" / "lightning-backbone-cpu-r8.tar.gz"
    both = {"num_workers": 1, "persistent_workers": True, "intra_op_threads": 1}
    fd = pk.predicted(bundle, both)
    fs = pk.predicted(bundle, {**both, "sharing_strategy": "file_system"})
    assert fs["speedup"] > fd["speedup"] * 1.05
