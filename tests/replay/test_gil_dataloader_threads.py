"""The DataLoader's own threads are never GIL suspects (agent/combiners/gil_wait.py): Lightning's
GAN template with 16 workers, captured on an H200, where the pin-memory thread held the GIL in 4 of
39 samples (recvfds) and was once blamed for a 1.28x GIL wait."""
from trainprobe.agent import bundle as bundle_mod
from trainprobe.agent.combiners.gil_wait import dataloader_thread, gil_wait, ownership
from trainprobe.agent.diagnosis import evidence_from
from trainprobe.agent.report import diagnose

from tests.helpers import DATA

BUNDLE = DATA / "ledger" / "public" / "bundles" / "lightning-gan-gpu-r2.tar.gz"


def test_the_pin_memory_thread_holds_the_gil_but_is_no_suspect():
    b = bundle_mod.load(str(BUNDLE))
    ev = evidence_from(b.captures, b.context)
    held = {t["name"]: t["share"] for t in ownership(ev)["threads"]}
    pin = next(n for n in held if "_pin_memory_loop" in n)
    assert held[pin] >= 0.05                          # it did hold the GIL: a suspect by share alone
    m = gil_wait(ev)
    assert not m["suspects"] and m["h"] < ownership(ev)["others_share"]
    assert all(f.id != "gil.contention" for f in diagnose(ev)[0])


def test_dataloader_thread_names():
    for name in ("Thread-5 (_pin_memory_loop)", "pt_data_pin", "QueueFeederThread"):
        assert dataloader_thread(name)
    for name in ("injected-gil-spinner", "metrics-spinner", "Thread-3", None):
        assert not dataloader_thread(name)
