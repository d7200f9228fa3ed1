"""A CUDA build of torch maps libcudart in every process that imports it: on a GPU node a CPU-only
job is not given the GPU's idle time. Whether the target computes on a GPU is read from the
/dev/nvidiaN files it holds open (a CUDA context opens them)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers import H200
from trainprobe.probes.gpu import _Capturer, analyse, normalise


def raw(devices, maps=("libcudart.so.13",)):
    d = normalise(json.loads((H200 / "starved" / "nvml.json").read_text()))
    for g in d["gpus"]:
        g["processes"], g["proc_util"] = [], []          # the target's PID is in no NVML list
    d["target_maps_cuda"], d["target_gpu_devices"] = list(maps), devices
    return d


def test_cuda_libraries_without_a_gpu_device_attribute_no_gpu():
    a = analyse(raw([]))
    assert a["target_gpus"] == [] and a["busy_fraction"] is None
    assert any("no GPU device open" in n for n in a["notes"])


def test_a_gpu_device_open_keeps_the_only_gpu_assumed():
    a = analyse(raw(["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"]))
    assert a["target_gpus"] == [0]
    assert any("assuming it uses the host's only GPU" in n for n in a["notes"])


def test_only_the_control_devices_open_is_no_gpu():
    # nvidiactl alone (NVML or a driver query, no context on a GPU): no GPU is attributed.
    assert analyse(raw(["/dev/nvidiactl"]))["target_gpus"] == []


def test_an_older_capture_without_the_fd_read_keeps_the_old_assumption():
    assert analyse(raw(None))["target_gpus"] == [0]


def test_the_probe_reads_a_real_process_fd_table(tmp_path):
    # A real process holding a file open: its fd table is read, and holds no /dev/nvidia* here.
    p = subprocess.Popen([sys.executable, "-c", "import sys,time; f=open(sys.argv[1],'w'); time.sleep(30)",
                          str(tmp_path / "x")])
    try:
        class Spec:
            root, pid = "/", p.pid

        class Rec:
            def note(self, *a, **k):
                pass

        probe = _Capturer.__new__(_Capturer)
        probe.spec, probe.rec = Spec(), Rec()
        import time
        def holds_x():
            for n in os.listdir(f"/proc/{p.pid}/fd"):
                try:
                    if os.readlink(f"/proc/{p.pid}/fd/{n}").endswith("/x"):
                        return True
                except OSError:            # an fd of the starting interpreter, closed meanwhile
                    pass
            return False
        for _ in range(100):
            if holds_x():
                break
            time.sleep(0.05)
        assert probe._target_gpu_devices() == []
    finally:
        p.kill()
        p.wait()
