"""The commands and code numa.remote proposes (not a rule): numactl lines, a LOCAL_RANK wrapper
script for torchrun, the launcher's own command with the wrapper in front of each rank, and a CPU set
written as short Python for a DataLoader's worker_init_fn. Pure functions of what the rule judged.
"""
from __future__ import annotations

import shlex

WRAPPER = "numa_bind.sh"


def py_list(cpus: list[int]) -> str:
    """A CPU set as short Python: range(8, 16), or [*range(0, 8), *range(16, 24)]."""
    runs: list[tuple[int, int]] = []
    for c in sorted(set(cpus)):
        if runs and c == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], c)
        else:
            runs.append((c, c))
    if len(runs) == 1:
        return f"range({runs[0][0]}, {runs[0][1] + 1})"
    if len(runs) <= 4:
        return "[" + ", ".join(f"*range({a}, {b + 1})" for a, b in runs) + "]"
    return "{" + ", ".join(str(c) for c in sorted(set(cpus))) + "}"


def numactl_line(node: int, argv: list[str], mem_flag: str = "--membind") -> str:
    cmd = shlex.join(argv) if argv else "<your training command>"
    return f"numactl --cpunodebind={node} {mem_flag}={node} {cmd}"


def wrapper_script(rank_nodes: dict[int, int], mem_flag: str) -> str:
    by_node: dict[int, list[int]] = {}
    for lr, n in sorted(rank_nodes.items()):
        by_node.setdefault(n, []).append(lr)
    cases = "\n".join(f"  {'|'.join(str(x) for x in lrs)}) node={n} ;;" for n, lrs in sorted(by_node.items()))
    return ("#!/bin/sh\n"
            f"# {WRAPPER}: run each torchrun rank on the NUMA node of its GPU (from this host's topology)\n"
            'case "$LOCAL_RANK" in\n'
            f"{cases}\n"
            '  *) exec "$@" ;;\n'
            "esac\n"
            f'exec numactl --cpunodebind="$node" {mem_flag}="$node" "$@"\n')


def torchrun_command(launcher_argv: list[str] | None, rank_argv: list[str]) -> str:
    """The launcher's own command with the wrapper put in front of each rank's command."""
    tail = list(rank_argv)
    generic = f"torchrun <your options> --no-python ./{WRAPPER} {shlex.join(tail) if tail else 'python train.py ...'}"
    if not launcher_argv or not tail:
        return generic
    # torchrun runs `python -u SCRIPT ARGS` (or `python -u -m MODULE ARGS`): find SCRIPT ARGS at the
    # end of the launcher's argv; what precedes them is the launcher and its options.
    python = tail[0].rsplit("/", 1)[-1].startswith("python")
    user = tail[1:] if python else list(tail)
    while python and user and user[0] == "-u":
        user = user[1:]
    module = python and bool(user) and user[0] == "-m"
    script_args = user[1:] if module else user
    n = len(script_args)
    if n == 0 or launcher_argv[-n:] != script_args:
        return generic
    prefix = launcher_argv[:-n]
    entry = next((i for i, a in enumerate(prefix) if a.rsplit("/", 1)[-1] == "torchrun"
                  or a in ("torch.distributed.run", "torch.distributed.launch")), None)
    if entry is None:
        return generic
    head, opts = prefix[:entry + 1], prefix[entry + 1:]
    if module:
        opts = [a for a in opts if a not in ("-m", "--module")]
    if not any(a in ("--no-python", "--no_python") for a in opts):
        opts = opts + ["--no-python"]
    return shlex.join(head + opts + [f"./{WRAPPER}"] + tail)
