"""Copy the files `trainprobe preflight` reads on a host into a tree, for TRAINPROBE_ROOT=TREE.

    python tests/data/preflight/capture_tree.py OUT_DIR

Copies only what the host checks read, and of those only the parts they use: the /dev/shm line
of the mount table, the kernel-log records the checks look for, the NVIDIA PCI functions. Nothing
that names the host (hostname, command line, other mounts) is copied.
"""
from __future__ import annotations

import glob
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

from probes import host  # noqa: E402

FILES = [
    "proc/meminfo", "proc/self/limits", "proc/uptime", "proc/sys/kernel/numa_balancing",
    "sys/devices/system/cpu/online", "sys/devices/system/cpu/present", "sys/devices/system/cpu/possible",
    "sys/devices/system/node/online", "sys/kernel/mm/transparent_hugepage/enabled",
    "sys/kernel/mm/transparent_hugepage/defrag",
]
GLOBS = ["sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor", "sys/devices/system/cpu/cpu0/cpufreq/scaling_driver",
         "sys/devices/system/node/node[0-9]*/cpulist"]
PCI_ATTRS = ["vendor", "device", "class", "numa_node", "local_cpulist", "current_link_speed", "current_link_width",
             "max_link_speed", "max_link_width", "aer_dev_fatal", "aer_dev_nonfatal"]


def put(out: str, rel: str, text: str) -> None:
    dst = os.path.join(out, rel)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(dst, "w") as fh:
        fh.write(text)


def main(out: str) -> None:
    for rel in FILES:
        src = "/" + rel
        if os.path.exists(src):
            with open(src) as fh:
                put(out, rel, fh.read())
    for pat in GLOBS:
        for src in glob.glob("/" + pat):
            with open(src) as fh:
                put(out, src.lstrip("/"), fh.read())
    with open("/proc/self/mounts") as fh:
        put(out, "proc/self/mounts", "".join(ln for ln in fh if len(ln.split()) > 2 and ln.split()[1] == "/dev/shm"))
    try:
        kl = host.read_kernel_log("/")
        put(out, "dev/kmsg", "".join(ln + "\n" for ln in kl["lines"]))
    except Exception as exc:  # noqa: BLE001
        print(f"kernel log not captured: {exc}", file=sys.stderr)
    for dev in host.read_pci_gpus("/"):
        for attr in PCI_ATTRS:
            src = f"/sys/bus/pci/devices/{dev['bdf']}/{attr}"
            if os.path.exists(src):
                with open(src) as fh:
                    put(out, src.lstrip("/"), fh.read())
    os.makedirs(os.path.join(out, "sys/bus/pci/devices"), exist_ok=True)
    print(f"captured into {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    shutil.rmtree(sys.argv[1], ignore_errors=True)
    main(sys.argv[1])
