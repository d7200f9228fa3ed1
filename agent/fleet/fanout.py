"""The coordinator side of `diagnose --slurm-job`: Slurm itself carries the agent to every node.

One `srun --overlap --jobid JOB -N<n> --ntasks-per-node=1 -w <nodes> --label` step runs the node
agent (`diagnose --slurm-local JOB --json`) beside the job's own tasks, so every node watches the
same window. No ssh, no daemon of our own. Each task prints one JSON line, labelled by srun with
its task number. A node that prints none within the window plus a grace period is reported with
what srun and Slurm said about it; the others stand.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from trainprobe.agent.target import EXIT_BAD_INPUT, UserError
from trainprobe.probes.parsers import redact, safejson

LAUNCH_GRACE_S = 45.0        # srun start-up, the agent's imports and probe set-up and teardown
FRAME_BEGIN, FRAME_END = "<trainprobe-node>", "</trainprobe-node>"
_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")


def agent_command() -> list[str]:
    """How a node runs trainprobe: TRAINPROBE_NODE_COMMAND (shell words) or this interpreter."""
    cmd = os.environ.get("TRAINPROBE_NODE_COMMAND")
    return shlex.split(cmd) if cmd else [sys.executable, "-m", "trainprobe.agent"]


def _run(argv: list[str], timeout: float = 20.0) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise UserError(f"{argv[0]} not found: --slurm-job needs Slurm's commands on this host's PATH",
                        EXIT_BAD_INPUT) from None
    except subprocess.TimeoutExpired:
        raise UserError(f"{' '.join(argv[:3])} did not answer within {timeout:g} s: is slurmctld up?",
                        EXIT_BAD_INPUT) from None


def expand_hostlist(expr: str) -> list[str]:
    r = _run(["scontrol", "show", "hostnames", expr])
    return [x for x in r.stdout.split() if x]


def job_nodes(job_id: str) -> list[str]:
    """The nodes of a running job, or UserError (exit 2) with Slurm's word for why not."""
    if not re.fullmatch(r"\d+(_\d+)?", job_id):
        raise UserError(f"{job_id!r} is not a Slurm job id", EXIT_BAD_INPUT)
    r = _run(["squeue", "-h", "-j", job_id, "-o", "%T|%N"])
    line = r.stdout.strip().splitlines()[0] if r.stdout.strip() else ""
    if r.returncode != 0 or not line:
        why = " ".join(r.stderr.split()) or "not in the queue"
        raise UserError(f"Slurm job {job_id}: {why}", EXIT_BAD_INPUT)
    state, _, nodelist = line.partition("|")
    if state != "RUNNING":
        raise UserError(f"Slurm job {job_id} is {state}, not RUNNING: nothing to watch yet", EXIT_BAD_INPUT)
    return expand_hostlist(nodelist)


def node_states(nodes: list[str]) -> dict[str, str]:
    """Slurm's view of each node (`sinfo` short state; a trailing * means slurmd is not responding)."""
    if not nodes:
        return {}
    try:
        r = _run(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N|%t|%E"])
    except UserError:
        return {}
    out = {}
    for line in r.stdout.splitlines():
        parts = line.split("|")
        if len(parts) == 3:
            out[parts[0]] = parts[1] + (f" ({parts[2]})" if parts[2] and parts[2] != "none" else "")
    return out


@dataclass
class FanOut:
    payloads: list[dict[str, Any]]
    nodes: list[str]
    seconds: float
    srun_rc: int | None
    notes: list[str] = field(default_factory=list)


def fan_out(job_id: str, nodes: list[str], node_args: list[str], timeout_s: float,
            progress: Callable[[str], None]) -> FanOut:
    argv = ["srun", "--overlap", "--jobid", job_id, f"-N{len(nodes)}", "--ntasks-per-node=1",
            "-w", ",".join(nodes), "--label", "--kill-on-bad-exit=0", "--input=none",
            *agent_command(), "diagnose", "--slurm-local", job_id, *node_args,
            # The operator's own --redact patterns apply on every node, not only here.
            *(a for p in redact.extra_patterns() for a in ("--redact", p))]
    if not shutil.which("srun"):
        raise UserError("srun not found: --slurm-job needs Slurm's commands on this host's PATH", EXIT_BAD_INPUT)
    progress(f"fanning out to {len(nodes)} node(s) of job {job_id} with srun: {', '.join(nodes)}")
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    out_lines: list[str] = []
    err_lines: list[str] = []

    def pump(stream, sink):
        kept = 0
        for line in stream:       # drained to the end, kept up to what one payload may hold
            kept += len(line)
            if kept <= safejson.MAX_BYTES:
                sink.append(line.rstrip("\n"))

    readers = [threading.Thread(target=pump, args=(proc.stdout, out_lines), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, err_lines), daemon=True)]
    for th in readers:
        th.start()
    notes: list[str] = []
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        notes.append(f"srun did not finish within {timeout_s:g} s: stopped it; nodes without a report timed out")
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    for th in readers:
        th.join(timeout=5)
    seconds = time.monotonic() - t0

    payloads: dict[str, dict[str, Any]] = {}
    task_err: dict[int, list[str]] = {}
    for line in err_lines:
        m = _LABEL.match(line)
        if m:
            task_err.setdefault(int(m.group(1)), []).append(m.group(2))
    # srun --label cuts long lines into 1 KiB pieces, each with its label: join a task's pieces and
    # read the one framed JSON object the node agent printed.
    chunks: dict[int, list[str]] = {}
    for line in out_lines:
        m = _LABEL.match(line)
        if m:
            chunks.setdefault(int(m.group(1)), []).append(m.group(2))
    for task, parts in chunks.items():
        text = "".join(parts)
        a, b = text.find(FRAME_BEGIN), text.rfind(FRAME_END)
        if a < 0 or b < a:
            continue
        try:      # a node's payload is another machine's word: bounded size and depth (safejson)
            p = safejson.loads(text[a + len(FRAME_BEGIN):b], f"node task {task}")
        except ValueError:
            continue
        if isinstance(p, dict) and p.get("node"):
            p["task"] = task
            payloads[p["node"]] = p
    states = node_states(nodes)
    srun_err = [ln for ln in err_lines if not _LABEL.match(ln)]
    result = []
    for i, n in enumerate(nodes):
        if n in payloads:
            p = payloads[n]
        else:
            said = [ln for ln in srun_err if n in ln] + task_err.get(i, [])[-2:]
            why = ("timed out: no report within the window and its grace period" if timed_out
                   else "no report came back")
            if said:
                why += "; srun said: " + " | ".join(s.strip() for s in said[-3:])
            p = {"node": n, "status": "timeout" if timed_out else "no_report", "reason": why,
                 "exit_code": 3, "targets": []}
        p["slurm_state"] = states.get(n)
        if p.get("status") == "ok" and states.get(n, "").endswith("*") and not p.get("slurmd_note"):
            p["slurmd_note"] = f"Slurm marks node {n} as not responding ({states[n]}) after the window"
        result.append(p)
    if proc.returncode not in (0, None) and not timed_out and srun_err:
        notes.append("srun exited with " + str(proc.returncode) + ": " + " | ".join(srun_err[-3:]))
    return FanOut(result, nodes, seconds, proc.returncode, notes)
