#!/bin/sh
# Prepare what the eBPF probes need on a test machine, idempotently. Root only; otherwise a no-op.
#  - tracefs mounted at /sys/kernel/tracing (the sched and raw_syscalls tracepoints live there);
#  - kernel headers where bcc looks (/lib/modules/$(uname -r)/build). On a machine whose distro
#    ships headers for the running kernel, install those. On a CI VM whose kernel has none, the
#    newest installed Debian headers are linked instead: enough for tracepoint-only programs.
[ "$(id -u)" = 0 ] || exit 0
if [ -d /sys/kernel/tracing ] && [ ! -d /sys/kernel/tracing/events ]; then
  mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null && echo "mounted tracefs at /sys/kernel/tracing"
fi
rel=$(uname -r)
if [ ! -e "/lib/modules/$rel/build" ]; then
  hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -1)
  common=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -1)
  if [ -n "$hdr" ]; then
    mkdir -p "/lib/modules/$rel"
    ln -sfn "$hdr" "/lib/modules/$rel/build"
    [ -n "$common" ] && ln -sfn "$common" "/lib/modules/$rel/source"
    echo "linked kernel headers $hdr for $rel (tracepoint programs only)"
  fi
fi
exit 0
