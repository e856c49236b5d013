#!/bin/bash
# Splits the tunnel's CPU per call between Sluice's processes, which `sluice-perf tunnel`
# reports summed: runs the harness's one-node case (node, agent) or two-node case (node-a
# routes, node-b holds the agent's tunnels; agent) at 10 x 10 in the background, reads each
# process's utime+stime from /proc over a 5 s window in its steady state, and divides by the
# calls the entry node answered in that window. h2load's CPU per call is printed too, and each
# process's CPU in units of it ("/client"): h2load does the same work per call in every run, so
# the quotient cancels most of a shared machine's drift in speed between runs.
#
#   perf/tunnel-cpu.sh SLUICE_BIN OUT_DIR [SLUICE_PERF_BIN] [sluice-1-node|sluice-2-nodes]
#
# The case defaults to sluice-2-nodes. Interleave runs of two builds to compare them;
# timings on a shared machine are noisy.
set -euo pipefail
bin=$1
out=$2
perf_bin=${3:-sluice-perf}
case=${4:-sluice-2-nodes}
workspace=$(cd "$(dirname "$0")/.." && pwd)
# One measured h2load run outlasts the window (about 30 s at 65,000 calls/s), so the client's
# CPU is one process's.
requests=2000000
case $case in
sluice-1-node) processes=(node agent) ;;
sluice-2-nodes) processes=(node-a node-b agent) ;;
*) echo "unknown case $case: sluice-1-node or sluice-2-nodes" >&2; exit 2 ;;
esac
rm -rf "$out"
mkdir -p "$out"
# Its own process group, so the harness and every process it started end together.
setsid "$perf_bin" tunnel --sluice "$bin" --workspace "$workspace" --only "$case" \
  --levels 10x10 --requests "$requests" --out "$out" >"$out.log" 2>&1 &
harness=$!
trap 'kill -- -$harness 2>/dev/null || true; sleep 1' EXIT
work=$out/work/$case
addresses=$work/${processes[0]}.addresses.json
client=
for _ in $(seq 1 120); do
  sleep 1
  client=$(pgrep -f "h2load -n $requests .*$out/work/" | head -1 || true)
  [ -n "$client" ] && break
done
[ -n "$client" ] || { echo "no measured h2load run started; see $out.log" >&2; exit 1; }
sleep 2 # into its steady state
admin=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['admin'])" "$addresses")
pids=()
for name in "${processes[@]}"; do
  pids+=("$(pgrep -f "$work/$name.yaml" | head -1)")
done
names=("${processes[@]}" h2load)
pids+=("$client")
ticks() { for pid in "${pids[@]}"; do awk '{printf "%s ", $14 + $15}' "/proc/$pid/stat"; done; }
# Every call the entry node answered, whatever its code.
answered() { curl -s "http://$admin/metrics" | awk '/^sluice_tunnel_requests_total\{/ {sum += $2} END {print sum}'; }
t0=$(ticks); c0=$(answered)
sleep 5
t1=$(ticks); c1=$(answered)
python3 - "$(getconf CLK_TCK)" "$c0" "$c1" "${names[*]}" "$t0" "$t1" <<'PY'
import sys
hz, c0, c1 = map(float, sys.argv[1:4])
names = sys.argv[4].split()
t0 = [float(t) for t in sys.argv[5].split()]
t1 = [float(t) for t in sys.argv[6].split()]
calls = c1 - c0
us = [(b - a) / hz * 1e6 / calls for a, b in zip(t0, t1)]
sluice, client = us[:-1], us[-1]
parts = "  ".join(f"{name} {u:.2f}" for name, u in zip(names, sluice))
per_client = "  ".join(f"{name} {u / client:.3f}" for name, u in zip(names, sluice))
print(f"calls/s {calls / 5:.0f}  us/call: {parts}  all {sum(sluice):.2f}  h2load {client:.2f}"
      f"  /client: {per_client}  all {sum(sluice) / client:.3f}")
PY
