#!/bin/sh
# Slurm HealthCheckProgram for trainprobe preflight. Slurm does not act on a health check's exit
# code, so this script drains the node itself when a check is critical, with the one-line reason
# preflight prints ("trainprobe: gpu.ecc[gpu3]: ..."), and resumes the node only when the node's
# current drain reason carries that same prefix: a node an administrator drained stays drained.
#
#   slurm.conf:  HealthCheckProgram=/path/to/slurm-healthcheck.sh
#                HealthCheckInterval=300   HealthCheckNodeState=IDLE,CYCLE
#   env:         TRAINPROBE (default: trainprobe), TRAINPROBE_PREFLIGHT_ARGS (e.g. "--profile h200-8gpu")
TRAINPROBE=${TRAINPROBE:-trainprobe}
PREFIX="trainprobe:"
NODE=${SLURMD_NODENAME:-$(hostname -s)}

# Slurm kills a health check after 60 s: preflight's own deadline is well inside that.
reason=$($TRAINPROBE preflight --slurm --timeout 45 ${TRAINPROBE_PREFLIGHT_ARGS:-} 2>/dev/null)
rc=$?
current=$(sinfo -h -N -n "$NODE" -o "%E" 2>/dev/null | head -n 1)

case $rc in
  0)
    case "$current" in
      "$PREFIX"*) scontrol update NodeName="$NODE" State=RESUME ;;
    esac ;;
  2)
    [ "$current" = "$reason" ] || scontrol update NodeName="$NODE" State=DRAIN Reason="$reason" ;;
  *)
    # Bad input or an internal error: say so in slurmd's log, leave the node as it is.
    logger -t trainprobe "preflight exited $rc: $reason" 2>/dev/null ;;
esac
exit 0
