"""A real two-node Slurm cluster on this one host, for tests and benchmarks.

Debian's slurm-wlm and munge: one munged on its own socket and key (nothing global is touched),
one slurmctld, and two slurmd (`-N n1`, `-N n2`) on two ports of this host. Every path (state,
spool, logs, PID files) lives under one directory; `stop()` ends exactly the daemons it started,
by their PID files.

    c = SlurmCluster(tmpdir); c.start()   # both nodes idle, or RuntimeError with the logs' tail
    subprocess.run(["sbatch", ...], env=c.env)
    c.stop_node("n2")                     # one slurmd, by its PID file
    c.stop()

Also runnable: `python -m scripts.slurm_cluster DIR` starts one and waits for Ctrl-C.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

NODES = ("n1", "n2")
DAEMONS = ("munged", "slurmctld", "slurmd", "sinfo", "srun", "sbatch", "scontrol", "squeue")


def missing_commands() -> list[str]:
    return [d for d in DAEMONS if not shutil.which(d) and not os.path.exists(f"/usr/sbin/{d}")]


def _free_ports(n: int) -> list[int]:
    """n consecutive free TCP ports (slurm.conf gives a node range one port range)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65535:
            continue
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("0.0.0.0", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return list(range(base, base + n))
    raise RuntimeError("no free consecutive ports")


def _sbin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmCluster:
    def __init__(self, base: str | os.PathLike, cpus_per_node: int = 2, slurmd_timeout_s: int = 10):
        self.base = Path(base)
        self.cpus = cpus_per_node
        self.slurmd_timeout_s = slurmd_timeout_s
        self.host = socket.gethostname()
        self.conf = self.base / "slurm.conf"
        self.munge_socket = self.base / "munge" / "munge.socket"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.started: list[Path] = []          # PID files of what this object started

    # -- configuration -------------------------------------------------------------------------
    def _write(self) -> None:
        for d in ("state", "spool", "log", "run", "munge"):
            (self.base / d).mkdir(parents=True, exist_ok=True)
        os.chmod(self.base / "munge", 0o700)
        key = self.base / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        ctld_port, *node_ports = _free_ports(1 + len(NODES))
        b = self.base
        self.conf.write_text(f"""\
ClusterName=trainprobe
SlurmctldHost={self.host}
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={b}/state
SlurmdSpoolDir={b}/spool/%n
SlurmctldPidFile={b}/run/slurmctld.pid
SlurmdPidFile={b}/run/slurmd.%n.pid
SlurmctldLogFile={b}/log/slurmctld.log
SlurmdLogFile={b}/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdTimeout={self.slurmd_timeout_s}
SlurmctldTimeout=10
MessageTimeout=5
InactiveLimit=0
KillWait=5
NodeName=n[1-{len(NODES)}] NodeHostname={self.host} NodeAddr=127.0.0.1 Port={node_ports[0]}-{node_ports[-1]} CPUs={self.cpus} State=UNKNOWN
PartitionName=debug Nodes=n[1-{len(NODES)}] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")
        self.node_ports = dict(zip(NODES, node_ports))

    # -- daemons -------------------------------------------------------------------------------
    def _daemon(self, argv: list[str], pidfile: Path) -> None:
        r = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()[-800:]}")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if pidfile.exists() and pidfile.read_text().strip().isdigit():
                self.started.append(pidfile)
                return
            time.sleep(0.1)
        raise RuntimeError(f"{argv[0]} wrote no PID file {pidfile}\n{self.logs_tail()}")

    def start(self, timeout_s: float = 60.0) -> "SlurmCluster":
        self._write()
        b = self.base
        self._daemon([_sbin("munged"), "--force", f"--socket={self.munge_socket}",
                      f"--key-file={b}/munge/munge.key", f"--pid-file={b}/run/munged.pid",
                      f"--log-file={b}/log/munged.log", f"--seed-file={b}/munge/munge.seed"],
                     b / "run" / "munged.pid")
        self._daemon([_sbin("slurmctld"), "-i"], b / "run" / "slurmctld.pid")
        for n in NODES:
            self.start_node(n)
        if self.wait_idle(timeout_s):
            return self
        tail = self.logs_tail()
        self.stop()
        raise RuntimeError(f"the nodes did not become idle in {timeout_s:g} s\n{tail}")

    def wait_idle(self, timeout_s: float = 60.0) -> bool:
        """Whether every node is up (idle, mixed or allocated) within timeout_s."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.idle_nodes() >= set(NODES):
                return True
            time.sleep(0.5)
        return False

    def start_node(self, node: str) -> None:
        self._daemon([_sbin("slurmd"), "-N", node], self.base / "run" / f"slurmd.{node}.pid")

    def node_pid(self, node: str) -> int | None:
        p = self.base / "run" / f"slurmd.{node}.pid"
        try:
            return int(p.read_text().strip())
        except (OSError, ValueError):
            return None

    def stop_node(self, node: str) -> None:
        """Stop one slurmd (by its PID file), as when a node's daemon dies."""
        self._kill(self.base / "run" / f"slurmd.{node}.pid")

    def idle_nodes(self) -> set[str]:
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env, capture_output=True, text=True,
                           timeout=15)
        out = set()
        for line in r.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1] in ("idle", "mix", "alloc"):
                out.add(parts[0])
        return out

    def node_state(self, node: str) -> str:
        r = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%t"], env=self.env, capture_output=True, text=True,
                           timeout=15)
        return r.stdout.strip()

    @staticmethod
    def _kill(pidfile: Path, wait_s: float = 10.0) -> None:
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        # Jobs first (their steps end with them), then the daemons, newest first.
        subprocess.run(["scancel", "--full", "-u", "root"], env=self.env, capture_output=True, timeout=15)
        for pidfile in reversed(self.started):
            self._kill(pidfile)
        self.started.clear()
        self._kill_leftovers()

    def _kill_leftovers(self) -> None:
        """A step whose slurmd was stopped outlives it (slurmstepd and its tasks): end every process
        that runs under this cluster's own SLURM_CONF, which only this cluster's jobs carry."""
        mark = f"SLURM_CONF={self.conf}".encode()
        me = os.getpid()
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == me:
                continue
            try:
                with open(f"/proc/{name}/environ", "rb") as fh:
                    if mark not in fh.read().split(b"\0"):
                        continue
                os.kill(int(name), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                continue

    def logs_tail(self, n: int = 15) -> str:
        out = []
        for f in sorted((self.base / "log").glob("*.log")):
            lines = f.read_text(errors="replace").splitlines()[-n:]
            out.append(f"== {f.name}\n" + "\n".join(lines))
        return "\n".join(out)


if __name__ == "__main__":
    c = SlurmCluster(sys.argv[1] if len(sys.argv) > 1 else "/tmp/trainprobe-slurm").start()
    print(f"export SLURM_CONF={c.conf}", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        c.stop()


# A two-node torchrun/gloo job, one rank per node, rank 1's input pipeline starved (sbatch script;
# {port} and {py} filled in by the caller).
JOB = """#!/bin/bash
#SBATCH -N2 --ntasks-per-node=1 --cpus-per-task=1
export MASTER_ADDR=127.0.0.1 MASTER_PORT={port} PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore OMP_NUM_THREADS=1
srun --kill-on-bad-exit=1 bash -c 'exec {py} -m torch.distributed.run --nnodes=2 --node_rank=$SLURM_NODEID \\
  --nproc_per_node=1 --master_addr=$MASTER_ADDR --master_port=$MASTER_PORT \\
  -m trainprobe.agent.workloads.train_cpu --seconds 0 --ddp --starved-rank 1 --width 256 --depth 1 --sample-work 1500'
"""
