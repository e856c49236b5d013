#!/bin/bash
# Splits the tunnel's two-node CPU per call between the routing node (node-a) and the node
# holding the agent (node-b), which `sluice-perf tunnel` reports summed: runs the harness's
# sluice-2-nodes case at 10 x 10 in the background, reads both nodes' utime+stime from /proc
# over a 5 s window in its steady state, and divides by the calls node-a routed in that window.
#
#   perf/two-node-cpu.sh SLUICE_BIN OUT_DIR [SLUICE_PERF_BIN]
#
# Interleave runs of two builds to compare them; timings on a shared machine are noisy.
set -euo pipefail
bin=$1
out=$2
perf_bin=${3:-sluice-perf}
workspace=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$out"
mkdir -p "$out"
# Its own process group, so the harness and every process it started end together.
setsid "$perf_bin" tunnel --sluice "$bin" --workspace "$workspace" --only sluice-2-nodes \
  --levels 10x10 --requests 400000 --out "$out" >"$out.log" 2>&1 &
harness=$!
trap 'kill -- -$harness 2>/dev/null || true; sleep 1' EXIT
addresses=$out/work/sluice-2-nodes/node-a.addresses.json
for _ in $(seq 1 60); do
  sleep 1
  [ -s "$addresses" ] && break
done
sleep 4 # past the warm-up
admin=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['admin'])" "$addresses")
node_a=$(pgrep -f "$out/work/sluice-2-nodes/node-a.yaml" | head -1)
node_b=$(pgrep -f "$out/work/sluice-2-nodes/node-b.yaml" | head -1)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
routed() { curl -s "http://$admin/metrics" | awk '/^sluice_tunnel_routes_total\{decision="remote"\}/ {print $2}'; }
a0=$(ticks "$node_a"); b0=$(ticks "$node_b"); c0=$(routed)
sleep 5
a1=$(ticks "$node_a"); b1=$(ticks "$node_b"); c1=$(routed)
hz=$(getconf CLK_TCK)
python3 - "$a0" "$a1" "$b0" "$b1" "$c0" "$c1" "$hz" <<'PY'
import sys
a0, a1, b0, b1, c0, c1, hz = map(float, sys.argv[1:])
calls = c1 - c0
us = lambda t0, t1: (t1 - t0) / hz * 1e6 / calls
print(f"calls/s {calls / 5:.0f}  node-a {us(a0, a1):.2f} us/call  node-b {us(b0, b1):.2f} us/call  both {us(a0, a1) + us(b0, b1):.2f}")
PY
