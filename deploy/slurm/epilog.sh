#!/bin/sh
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/trainprobe/epilog.sh): stop trainprobe watch when
# the ending job was the node's last. SLURM_JOB_ID is the job that ends; squeue lists what runs.
# Must exit 0 or Slurm drains the node.
others=$(squeue -h -w "$(hostname -s)" -t RUNNING,COMPLETING -o %A 2>/dev/null | grep -v "^${SLURM_JOB_ID}\$" | head -1)
[ -n "$others" ] && exit 0
if command -v systemctl >/dev/null 2>&1 && systemctl list-unit-files trainprobe-watch.service >/dev/null 2>&1; then
    systemctl stop trainprobe-watch.service || true
elif [ -f /run/trainprobe-watch.pid ]; then
    kill "$(cat /run/trainprobe-watch.pid)" 2>/dev/null || true
    rm -f /run/trainprobe-watch.pid
fi
exit 0
