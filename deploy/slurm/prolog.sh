#!/bin/sh
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/trainprobe/prolog.sh): make sure trainprobe watch
# runs on the node before a job's first task starts. It follows every training process of the
# node, so one instance serves all jobs; the epilog stops it when the node has no job left.
# Runs as root on each node of the allocation; must exit 0 or Slurm drains the node.
if command -v systemctl >/dev/null 2>&1 && systemctl list-unit-files trainprobe-watch.service >/dev/null 2>&1; then
    systemctl start trainprobe-watch.service || true
else
    PIDFILE=/run/trainprobe-watch.pid
    if ! { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }; then
        mkdir -p /var/lib/trainprobe/bundles
        nohup /usr/local/bin/trainprobe -q watch --listen 127.0.0.1:9464 \
            --bundle-dir /var/lib/trainprobe/bundles >/var/log/trainprobe-watch.log 2>&1 &
        echo $! > "$PIDFILE"
    fi
fi
exit 0
