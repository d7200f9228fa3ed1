"""Writes the sysfs/procfs trees in this folder (run from anywhere: `python tests/data/topo/build.py`).

Each tree is a root the topology and placement readers take, laid out as the kernel lays out /sys
and /proc (symlinked PCI devices under their ports, stat lines with all 52 fields, numa_maps
lines as the kernel prints them). See README.md beside this file for what each tree models.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
H200_HOST = HERE.parent / "h200" / "host"


class Tree:
    def __init__(self, root: Path):
        self.root = root
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)

    def write(self, rel: str, text: str | bytes) -> None:
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            p.write_bytes(text)
        else:
            p.write_text(text)

    def link(self, rel: str, target: str) -> None:
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, p)

    # -- sysfs -------------------------------------------------------------------------------
    def nodes(self, nodes: list[tuple[str, int, list[int]]], cpus_online: str) -> None:
        """nodes: (cpulist, MemTotal kB, distances)."""
        self.write("sys/devices/system/cpu/online", cpus_online + "\n")
        self.write("sys/devices/system/node/online", f"0-{len(nodes) - 1}\n" if len(nodes) > 1 else "0\n")
        self.write("sys/devices/system/node/possible", f"0-{len(nodes) - 1}\n" if len(nodes) > 1 else "0\n")
        for i, (cpus, mem_kb, dist) in enumerate(nodes):
            base = f"sys/devices/system/node/node{i}"
            self.write(f"{base}/cpulist", cpus + "\n")
            self.write(f"{base}/distance", " ".join(str(d) for d in dist) + "\n")
            self.write(f"{base}/meminfo", f"Node {i} MemTotal:       {mem_kb} kB\nNode {i} MemFree:        "
                                          f"{mem_kb // 2} kB\nNode {i} MemUsed:        {mem_kb - mem_kb // 2} kB\n")

    def _pci_files(self, path: str, vendor: str, device: str, cls: str, numa: int, local: str,
                   link: tuple[str, int, str, int] | None) -> None:
        self.write(f"{path}/vendor", vendor + "\n")
        self.write(f"{path}/device", device + "\n")
        self.write(f"{path}/class", cls + "\n")
        self.write(f"{path}/numa_node", f"{numa}\n")
        self.write(f"{path}/local_cpulist", local + "\n")
        if link:
            cur_s, cur_w, max_s, max_w = link
            self.write(f"{path}/current_link_speed", cur_s + "\n")
            self.write(f"{path}/current_link_width", f"{cur_w}\n")
            self.write(f"{path}/max_link_speed", max_s + "\n")
            self.write(f"{path}/max_link_width", f"{max_w}\n")

    def pci(self, root_bus: str, port: str, bdf: str, vendor: str, device: str, cls: str, numa: int, local: str,
            link: tuple[str, int, str, int] | None, port_link: tuple[str, int] = ("16.0 GT/s PCIe", 16)) -> str:
        port_path = f"sys/devices/pci{root_bus}/{port}"
        if not (self.root / port_path / "class").exists():
            self._pci_files(port_path, "0x8086", "0x347a", "0x060400", numa, local,
                            (port_link[0], port_link[1], port_link[0], port_link[1]))
            self.link(f"sys/bus/pci/devices/{port}", f"../../../devices/pci{root_bus}/{port}")
        dev_path = f"{port_path}/{bdf}"
        self._pci_files(dev_path, vendor, device, cls, numa, local, link)
        self.link(f"sys/bus/pci/devices/{bdf}", f"../../../devices/pci{root_bus}/{port}/{bdf}")
        return f"devices/pci{root_bus}/{port}/{bdf}"

    def class_link(self, cls: str, name: str, dev: str) -> None:
        (self.root / "sys" / dev / cls / name).mkdir(parents=True, exist_ok=True)
        self.link(f"sys/class/{cls}/{name}", f"../../{dev}/{cls}/{name}")

    # -- procfs ------------------------------------------------------------------------------
    def process(self, pid: int, ppid: int, argv: list[str], env: dict[str, str], cpus_allowed: str,
                mems_allowed: str, threads: list[tuple[int, str, int, int, int]], numa_maps: str,
                children: list[int], vm_rss_kb: int) -> None:
        """threads: (tid, comm, utime_ticks, stime_ticks, processor)."""
        base = f"proc/{pid}"
        self.write(f"{base}/cmdline", b"\0".join(a.encode() for a in argv) + b"\0")
        self.write(f"{base}/environ", b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0")
        self.write(f"{base}/numa_maps", numa_maps)
        ut = sum(t[2] for t in threads)
        st = sum(t[3] for t in threads)
        self.write(f"{base}/stat", stat_line(pid, threads[0][1], ppid, ut, st, len(threads), threads[0][4]))
        self.write(f"{base}/status", status_text(pid, ppid, threads[0][1], len(threads), cpus_allowed,
                                                 mems_allowed, vm_rss_kb))
        for tid, comm, u, s, cpu in threads:
            self.write(f"{base}/task/{tid}/stat", stat_line(tid, comm, ppid, u, s, len(threads), cpu))
            self.write(f"{base}/task/{tid}/children", " ".join(str(c) for c in children) + (" " if children else "")
                       if tid == pid else "")


def stat_line(pid: int, comm: str, ppid: int, utime: int, stime: int, nthreads: int, processor: int) -> str:
    fields = [str(pid), f"({comm})", "R", str(ppid), str(ppid), str(ppid), "0", "-1", "4194304",
              "250000", "0", "120", "0", str(utime), str(stime), "0", "0", "20", "0", str(nthreads), "0",
              "180000", "21474836480", "262144", "18446744073709551615", "94000000000000", "94000000003000",
              "140700000000000", "0", "0", "0", "0", "16781312", "16386", "0", "0", "0", "17", str(processor),
              "0", "0", "0", "0", "0", "94000000010000", "94000000012000", "94000010000000",
              "140700000010000", "140700000010100", "140700000010100", "140700000020000", "0"]
    assert len(fields) == 52
    return " ".join(fields) + "\n"


def status_text(pid: int, ppid: int, name: str, threads: int, cpus: str, mems: str, rss_kb: int) -> str:
    return (f"Name:\t{name}\nUmask:\t0022\nState:\tR (running)\nTgid:\t{pid}\nNgid:\t0\nPid:\t{pid}\n"
            f"PPid:\t{ppid}\nTracerPid:\t0\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nVmRSS:\t{rss_kb:>8} kB\n"
            f"Threads:\t{threads}\nCpus_allowed_list:\t{cpus}\nMems_allowed_list:\t{mems}\n"
            "voluntary_ctxt_switches:\t1200\nnonvoluntary_ctxt_switches:\t300\n")


def numa_maps(data_nodes: dict[int, int], shm_nodes: dict[int, int] | None = None, cuda: bool = True) -> str:
    """A training process's numa_maps: the interpreter, torch and CUDA libraries (page cache spread
    over both nodes), its heap and anonymous arenas on `data_nodes` (pages per node), optional
    DataLoader shared-memory batches, and its stack."""
    lines = ["55d4c8a00000 default file=/usr/bin/python3.12 mapped=900 mapmax=9 N0=600 N1=300 kernelpagesize_kB=4",
             "7f2a10000000 default file=/usr/lib/python3/dist-packages/torch/lib/libtorch_cpu.so mapped=52000 "
             "mapmax=9 N0=30000 N1=22000 kernelpagesize_kB=4"]
    if cuda:
        lines.append("7f2a40000000 default file=/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04 mapped=9000 "
                     "mapmax=9 N1=9000 kernelpagesize_kB=4")
    split = {n: p // 4 for n, p in data_nodes.items()}
    heap = " ".join(f"N{n}={p}" for n, p in sorted(split.items()) if p)
    lines.append(f"55d4ca000000 default heap anon={sum(split.values())} dirty={sum(split.values())} {heap} "
                 "kernelpagesize_kB=4")
    rest = {n: p - split[n] for n, p in data_nodes.items()}
    arena = " ".join(f"N{n}={p}" for n, p in sorted(rest.items()) if p)
    lines.append(f"7f1c00000000 default anon={sum(rest.values())} dirty={sum(rest.values())} active=0 {arena} "
                 "kernelpagesize_kB=4")
    if shm_nodes:
        shm = " ".join(f"N{n}={p}" for n, p in sorted(shm_nodes.items()))
        lines.append(f"7f1b00000000 default file=/dev/shm/torch_4101_2718281828_0 dirty={sum(shm_nodes.values())} "
                     f"mapmax=2 {shm} kernelpagesize_kB=4")
    first = min(data_nodes)
    lines.append(f"7ffd5a000000 default stack anon=40 dirty=40 N{first}=40 kernelpagesize_kB=4")
    return "\n".join(lines) + "\n"


SECRET_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root",
              "WANDB_API_KEY": "fixture-secret-wandb-0c1d2e3f", "HF_TOKEN": "hf_fixtureSecretToken42"}
A100 = ("0x10de", "0x20b5", "0x030200")
GEN4_X16 = ("16.0 GT/s PCIe", 16, "16.0 GT/s PCIe", 16)


def two_socket_host(t: Tree, ib_nodes: tuple[int, ...] = (0, 1)) -> dict[str, str]:
    """Two sockets of 8 cores (node 0: CPUs 0-7, node 1: CPUs 8-15), 64 GB each, SLIT 10/21, two
    A100 GPUs per socket, a ConnectX-6 per socket (ib_nodes), an onboard X550 NIC and an NVMe drive
    on socket 0. Returns the GPUs' sysfs paths by index."""
    t.nodes([("0-7", 65536000, [10, 21]), ("8-15", 65536000, [21, 10])], "0-15")
    gpus = {
        "0": t.pci("0000:16", "0000:16:01.0", "0000:18:00.0", *A100, 0, "0-7", GEN4_X16),
        "1": t.pci("0000:38", "0000:38:01.0", "0000:3a:00.0", *A100, 0, "0-7", GEN4_X16),
        "2": t.pci("0000:98", "0000:98:01.0", "0000:9a:00.0", *A100, 1, "8-15", GEN4_X16),
        "3": t.pci("0000:b8", "0000:b8:01.0", "0000:ba:00.0", *A100, 1, "8-15", GEN4_X16),
    }
    if 0 in ib_nodes:
        ib0 = t.pci("0000:38", "0000:38:03.0", "0000:3c:00.0", "0x15b3", "0x101b", "0x020700", 0, "0-7", GEN4_X16)
        t.class_link("infiniband", "mlx5_0", ib0)
        t.class_link("net", "ib0", ib0)
    if 1 in ib_nodes:
        ib1 = t.pci("0000:b8", "0000:b8:03.0", "0000:bc:00.0", "0x15b3", "0x101b", "0x020700", 1, "8-15", GEN4_X16)
        t.class_link("infiniband", "mlx5_1", ib1)
        t.class_link("net", "ib1", ib1)
    eth = t.pci("0000:00", "0000:00:1c.0", "0000:02:00.0", "0x8086", "0x1563", "0x020000", 0, "0-7",
                ("8.0 GT/s PCIe", 4, "8.0 GT/s PCIe", 4), ("8.0 GT/s PCIe", 4))
    t.class_link("net", "eth0", eth)
    t.pci("0000:00", "0000:00:1d.0", "0000:03:00.0", "0x144d", "0xa80a", "0x010802", 0, "0-7",
          ("16.0 GT/s PCIe", 4, "16.0 GT/s PCIe", 4), ("16.0 GT/s PCIe", 4))
    # The platform's own devices (a bridge and a USB controller) that placement does not care about.
    t.pci("0000:00", "0000:00:14.0", "0000:00:14.3", "0x8086", "0xa1af", "0x0c0330", 0, "0-7", None)
    return gpus


def build_2s4g() -> None:
    """torchrun with 4 ranks on a 2-socket 4-GPU host; rank 2 (GPU 2, node 1) was started bound to
    socket 0, and rank 3's DataLoader worker drifted to socket 0. Two moments, 2.00 s apart."""
    for moment, up in (("2s4g", 86400.00), ("2s4g-t1", 86402.00)):
        t = Tree(HERE / moment)
        if not moment.endswith("t1"):
            two_socket_host(t)        # the end moment holds only what changed: /proc
        t.write("proc/uptime", f"{up:.2f} 1300000.00\n")
        d = moment.endswith("t1")
        launcher = ["/usr/bin/python3", "/usr/local/bin/torchrun", "--nproc-per-node=4", "train.py",
                    "--epochs", "10", "--batch-size", "256"]
        rank_argv = ["/usr/bin/python3", "-u", "train.py", "--epochs", "10", "--batch-size", "256"]
        t.process(4000, 3990, launcher, dict(SECRET_ENV), "0-15", "0-1",
                  [(4000, "torchrun", 900 + (1 if d else 0), 120, 15)],
                  numa_maps({0: 20000}, cuda=False), [4101, 4102, 4103, 4104], 400000)
        # (pid, local rank, allowed CPUs, allowed nodes, [(tid, cpu at t0, cpu at t1, ticks in window)],
        #  data pages by node, worker (pid, allowed, cpu t0, cpu t1, ticks), worker data pages by node)
        ranks = [
            (4101, 0, "0-15", "0-1", [(4101, 2, 2, 180), (5101, 3, 3, 20), (6101, 4, 4, 10)], {0: 600000},
             (4201, "0-15", 1, 1, 150), {0: 50000}),
            (4102, 1, "0-15", "0-1", [(4102, 5, 5, 178), (5102, 6, 6, 18), (6102, 5, 7, 8)], {0: 590000},
             (4202, "0-15", 7, 7, 148), {0: 50000}),
            (4103, 2, "0-7", "0", [(4103, 0, 0, 182), (5103, 1, 1, 22), (6103, 0, 1, 9)], {0: 605000},
             (4203, "0-7", 6, 6, 151), {0: 50000}),
            (4104, 3, "0-15", "0-1", [(4104, 9, 9, 179), (5104, 10, 10, 21), (6104, 11, 11, 10)], {1: 598000},
             (4204, "0-15", 3, 4, 149), {0: 50000}),
        ]
        for pid, lr, cpus, mems, threads, pages, worker, wpages in ranks:
            env = dict(SECRET_ENV, LOCAL_RANK=str(lr), RANK=str(lr), WORLD_SIZE="4", LOCAL_WORLD_SIZE="4",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
            trows = [(tid, "python3" if tid == pid else "pt_autograd_0", 5000 + (ticks if d else 0), 300,
                      c1 if d else c0) for tid, c0, c1, ticks in threads]
            t.process(pid, 4000, rank_argv, env, cpus, mems, trows, numa_maps(pages), [worker[0]], 2600000)
            wpid, wcpus, wc0, wc1, wticks = worker
            t.process(wpid, pid, rank_argv, env, wcpus, mems,
                      [(wpid, "pt_data_worker", 3000 + (wticks if d else 0), 100, wc1 if d else wc0)],
                      numa_maps(wpages, shm_nodes={n: 4096 for n in wpages}), [], 900000)


def build_2s4g_degraded() -> None:
    """One training process on socket 0 of a two-socket host whose InfiniBand adapter sits on
    socket 1 only. GPU 0 trained at x8 of x16, GPU 2 at 2.5 GT/s of 16 GT/s, GPU 3 is a Gen5 card in
    a Gen4 slot (as designed), GPU 1 is healthy."""
    t = Tree(HERE / "2s4g-degraded")
    two_socket_host(t, ib_nodes=(1,))
    for name, value in (("current_link_width", "8"),):
        (t.root / "sys/devices/pci0000:16/0000:16:01.0/0000:18:00.0" / name).write_text(value + "\n")
    (t.root / "sys/devices/pci0000:98/0000:98:01.0/0000:9a:00.0/current_link_speed").write_text("2.5 GT/s PCIe\n")
    h100 = "sys/devices/pci0000:b8/0000:b8:01.0/0000:ba:00.0"
    (t.root / h100 / "device").write_text("0x2331\n")
    (t.root / h100 / "max_link_speed").write_text("32.0 GT/s PCIe\n")
    t.write("proc/uptime", "5000.00 9000.00\n")
    argv = ["/opt/venv/bin/python", "train.py", "--config", "configs/base.yaml"]
    t.process(7000, 6990, argv, dict(SECRET_ENV), "0-15", "0-1",
              [(7000, "python", 12000, 400, 2), (7001, "python", 800, 50, 3)], numa_maps({0: 700000}),
              [], 3000000)


def build_h200_vm() -> None:
    """The H200 node of tests/data/h200: a virtual machine with one NUMA node of 16 CPUs (numactl-H.txt),
    its GPU at 0000:00:06.0 (nvidia-smi-q.txt: device 0x2335, class 0x0302, Gen5 x16 of Gen5 x16)
    whose sysfs numa_node reads -1 and local_cpulist is every CPU, behind no PCIe port of its own."""
    numactl = (H200_HOST / "numactl-H.txt").read_text()
    size_mb = int(next(ln for ln in numactl.splitlines() if "size:" in ln).split()[-2])
    t = Tree(HERE / "h200-vm")
    t.nodes([("0-15", size_mb * 1024, [10])], "0-15")
    dev = "sys/devices/pci0000:00/0000:00:06.0"
    t._pci_files(dev, "0x10de", "0x2335", "0x030200", -1, "0-15", ("32.0 GT/s PCIe", 16, "32.0 GT/s PCIe", 16))
    t.link("sys/bus/pci/devices/0000:00:06.0", "../../../devices/pci0000:00/0000:00:06.0")
    virtio = "sys/devices/pci0000:00/0000:00:03.0"
    t._pci_files(virtio, "0x1af4", "0x1041", "0x020000", -1, "0-15", None)
    t.link("sys/bus/pci/devices/0000:00:03.0", "../../../devices/pci0000:00/0000:00:03.0")
    (t.root / virtio / "virtio2/net/eth0").mkdir(parents=True)
    t.link("sys/class/net/eth0", "../../devices/pci0000:00/0000:00:03.0/virtio2/net/eth0")


def build_2n2c() -> None:
    """Two nodes of one CPU each (node 0: CPU 0, node 1: CPU 1), one A100 on each: the shape of this
    project's 2-CPU test machine split into two sockets, so a real job's CPU placement on it can be
    judged against GPUs on both nodes."""
    t = Tree(HERE / "2n2c")
    t.nodes([("0", 12582912, [10, 21]), ("1", 12582912, [21, 10])], "0-1")
    t.pci("0000:16", "0000:16:01.0", "0000:18:00.0", *A100, 0, "0", GEN4_X16)
    t.pci("0000:98", "0000:98:01.0", "0000:9a:00.0", *A100, 1, "1", GEN4_X16)


if __name__ == "__main__":
    build_2s4g()
    build_2s4g_degraded()
    build_h200_vm()
    build_2n2c()
