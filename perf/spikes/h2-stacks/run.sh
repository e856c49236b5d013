#!/usr/bin/env bash
# Builds the spike and measures each HTTP/2 server stack: server CPU per request, requests/s and
# TCP segments per request, in interleaved rounds, server on CPU 0 and h2load on CPU 1.
# usage: perf/spikes/h2-stacks/run.sh [ROUNDS] [REQUESTS] [LEVELS] [BODY]
#        (defaults: 3 200000 "64x1 64x10" 267)
set -euo pipefail
rounds=${1:-3}; requests=${2:-200000}; levels=${3:-64x1 64x10}; body=${4:-267}
here=$(cd "$(dirname "$0")" && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/sluice/target-spike}
cargo build --release --manifest-path "$here/Cargo.toml" >&2
bin=$CARGO_TARGET_DIR/release/h2-stacks-spike
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=localhost \
  -addext subjectAltName=IP:127.0.0.1 -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }

cat "$work/cert.pem" "$work/key.pem" >"$work/combined.pem"
answer=$(head -c "$body" /dev/zero | tr '\0' x)

# HAProxy answering by itself (`http-request return`): the peer's HTTP/2 and TLS stack with
# the same answer, for scale.
start_haproxy() { # mode -> prints the address
  local port; port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  local bind="bind 127.0.0.1:$port proto h2"
  [ "$1" = tls ] && bind="bind 127.0.0.1:$port ssl crt $work/combined.pem alpn h2"
  printf '%s\n' global '    nbthread 1' defaults '    mode http' '    timeout client 60s' \
    frontend' answer' "    $bind" \
    "    http-request return status 200 content-type application/json string \"$answer\"" >"$work/haproxy.cfg"
  echo "127.0.0.1:$port"
}

one() { # stack mode clients streams
  local args=(--body "$body") scheme=http pid
  if [ "$2" = tls ]; then args+=(--tls "$work/cert.pem" "$work/key.pem"); scheme=https; fi
  if [ "$1" = haproxy ]; then
    start_haproxy "$2" >"$work/addr"
    taskset -c 0 haproxy -f "$work/haproxy.cfg" -db >"$work/err" 2>&1 & pid=$!
    sleep 0.3
  else
    taskset -c 0 "$bin" "$1" "${args[@]}" >"$work/addr" 2>"$work/err" & pid=$!
    for _ in $(seq 100); do [ -s "$work/addr" ] && break; sleep 0.05; done
  fi
  local url="$scheme://$(head -1 "$work/addr")/x"
  taskset -c 1 h2load -n 20000 -c "$3" -m "$4" -t 1 "$url" >/dev/null 2>&1
  nstat -n; local c0; c0=$(cpu $pid)
  local out; out=$(taskset -c 1 h2load -n "$requests" -c "$3" -m "$4" -t 1 "$url" 2>&1)
  local c1; c1=$(cpu $pid); local segs; segs=$(nstat TcpOutSegs | awk '/TcpOutSegs/{print $2}')
  kill $pid; wait $pid 2>/dev/null || true; : >"$work/addr"
  local rps; rps=$(grep -oP 'finished in .*?, \K[0-9.]+' <<<"$out")
  local ok; ok=$(grep -oP '\d+(?= succeeded)' <<<"$out")
  [ "$ok" = "$requests" ] || { echo "$1 $2 $3x$4: only $ok of $requests succeeded" >&2; exit 1; }
  echo "$1 $2 $3x$4 $(( (c1 - c0) * 1000000 / ticks )) $rps ${segs:-0}"
}

for round in $(seq "$rounds"); do
  for level in $levels; do
    for stack in h2 hyper fork $(command -v haproxy >/dev/null && echo haproxy); do
      for mode in plain tls; do one $stack $mode "${level%x*}" "${level#*x}"; done
    done
  done
  echo "round $round of $rounds done" >&2
done | python3 -c '
import sys, statistics, collections
requests = int(sys.argv[1]); rows = collections.defaultdict(list)
for line in sys.stdin:
    stack, mode, level, cpu_us, rps, segs = line.split()
    rows[(level, mode, stack)].append((int(cpu_us) / requests, float(rps), int(segs) / requests))
print("| level | TLS | stack | server CPU us/req, each round | median | req/s, median | TCP segments/req (both ways) |")
print("|---|---|---|---|--:|--:|--:|")
for (level, mode, stack), runs in sorted(rows.items()):
    cpu = [r[0] for r in runs]
    each = ", ".join("%.1f" % c for c in cpu)
    print(f"| {level} | {mode} | {stack} | {each} | {statistics.median(cpu):.1f} "
          f"| {statistics.median(r[1] for r in runs):,.0f} | {statistics.median(r[2] for r in runs):.1f} |")
' "$requests"
