#!/bin/sh
# `trainprobe preflight` on a GPU node: the passive and active GPU tiers, their raw reads kept as a
# fixture, and the measured figures printed as ratios (achieved / data-sheet peak, achieved / link).
#
#   OUT=/some/dir sh benchmarks/preflight_gpu.sh [PROFILE]      (from the repository root)
#
# Writes into $OUT: h200-raw.json (every read, for --replay and for tests/data/preflight/gpu),
# h200-report.json, h200-table.txt, h200.prom, h200-slurm.txt, passive-seconds.txt, tree/ (the host
# files preflight reads). PROFILE defaults to h200-1gpu (one H200, Gen5 x16).
set -u
OUT=${OUT:-/tmp/preflight-gpu}
PROFILE=${1:-h200-1gpu}
PY=${PYTHON:-python3}
mkdir -p "$OUT"

$PY -m agent preflight --profile "$PROFILE" --active --json --save-raw "$OUT/h200-raw.json" \
    --prometheus "$OUT/h200.prom" > "$OUT/h200-report.json"
echo "preflight --active exit code: $?" | tee "$OUT/exit-code.txt"
$PY -m agent preflight --profile "$PROFILE" --replay "$OUT/h200-raw.json" --verbose > "$OUT/h200-table.txt"
$PY -m agent preflight --profile "$PROFILE" --slurm > "$OUT/h200-slurm.txt"; echo "slurm exit code: $?" >> "$OUT/h200-slurm.txt"

# How long the passive tiers take (what a Slurm prolog pays), five runs.
for i in 1 2 3 4 5; do
  $PY -m agent preflight --profile "$PROFILE" --json | $PY -c 'import json,sys; print(json.load(sys.stdin)["duration_s"])'
done > "$OUT/passive-seconds.txt"

$PY tests/data/preflight/capture_tree.py "$OUT/tree" >/dev/null

$PY - "$OUT/h200-report.json" "$OUT/passive-seconds.txt" <<'PYEOF'
import json, sys
rep = json.load(open(sys.argv[1]))
secs = [float(x) for x in open(sys.argv[2]).read().split()]
print(f"node status {rep['status']} (exit {rep['exit_code']}), active run {rep['duration_s']:.1f} s; "
      f"passive runs {min(secs):.3f}-{max(secs):.3f} s")
for c in rep["checks"]:
    if c["status"] != "ok" and not c["informational"]:
        print(f"  {c['status']:8} {c['check']} {c['target'] or ''}: {c['observed']}")
for c in rep["checks"]:
    d = c.get("details") or {}
    if c["check"] == "active.gemm" and c["value"]:
        peak = d.get("peak_tflops")
        print(f"{c['target']}: bf16 GEMM n={d.get('n')} {c['value']:.0f} TFLOPS"
              + (f" = {c['value'] / peak:.2f} of the {peak:g} TFLOPS peak" if peak else ""))
    if c["check"] in ("active.h2d_bandwidth", "active.d2h_bandwidth") and c["value"]:
        link = d.get("link_gbps")
        print(f"{c['target']}: pinned {c['check'].split('.')[1][:3].upper()} {c['value']:.1f} GB/s"
              + (f" = {c['value'] / link:.2f} of {d.get('link')} ({link:.1f} GB/s)" if link else ""))
    if c["check"] == "active.matmul" and c["value"] is not None:
        print(f"{c['target']}: fp32 matmul max relative error vs float64 CPU {c['value']:.2e}")
PYEOF
