#!/usr/bin/env bash
# Runs one scenario of the Sluice macro benchmark and writes JSON, Markdown and SVG plots to
# perf/results/<scenario>/ (perf/results/<scenario>-smoke/ with --smoke).
#
#   perf/run.sh gateway [--smoke]  Kubernetes API over TLS: direct, HAProxy, nginx, Pingora, Sluice gateway,
#                                  Sluice gateway through an agent's tunnel (sluice-gateway-tunnel)
#   perf/run.sh tunnel [--smoke]   unary gRPC: direct, HAProxy, nginx, Pingora, Sluice one node, two nodes
#   perf/run.sh idle [--smoke]     10,000 idle agent tunnels on one node: RSS and CPU
#   perf/run.sh policy [--smoke]   criterion benches of sluice-benches, lifted into a summary
#   perf/run.sh controlplane [--smoke]  1,000 watchers + steady writes: embedded store and etcd
#   perf/run.sh ebpf [--smoke]     veth packet rate with and without the eBPF counters (root)
#   perf/run.sh scaling [--smoke]  the gateway with one worker against two (thread-per-core)
#   perf/run.sh access-log [--smoke]  the gateway's CPU per request, access log off, on, sampled
#   perf/run.sh scale [--smoke]    the seeds' scale questions (issue 36): so far 5,000 VMs on one
#                                  control plane (simulated agents, real watch clients) and
#                                  10,000 clients through one gateway, 10,000 watchers of one
#                                  control plane, idle tunnel agents across nodes over Redis
#                                  (--only vms|gateway|fanout|agents)
#   perf/run.sh soak [--smoke] [--minutes N]  mixed tunnel + gateway load at half capacity for N
#                                  minutes (default 30; 1 with --smoke), agents and clients churning
#
# Installs the peers (haproxy, nginx-light, nghttp2-client, wrk, redis-server; etcd-server for
# controlplane; only netsniff-ng, for trafgen, for ebpf) when missing and
# builds the release binaries once (ebpf: only the harness). SLUICE_PERF_PROFILE=dev builds the
# dev profile instead (the test suite's smoke run reuses its own build that way; its numbers are
# not measurements). SLUICE_PERF_BIN_DIR=DIR skips the build and runs the sluice, sluice-perf and
# sluice-apiserver-sim binaries already in DIR: scripts/test.sh points it at the binaries its test
# build made, because a `cargo build` unifies dependency features differently from `cargo test`
# and would compile half the workspace again (minutes of CI).
# Full gateway and tunnel runs (not --smoke, so never CI) also build the Pingora peer,
# perf/peers/pingora/ (its own workspace, lock file and target directory; Debian's libssl through
# OPENSSL_NO_VENDOR=1, so cmake, pkg-config and libssl-dev are installed for them), and run
# without the Pingora case, saying so, when cargo cannot build it.
# Extra arguments go to the harness (see `sluice-perf --help`: --client-cpu, --proxy-cpu, ...).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
scenario=${1:-}
case "$scenario" in
  gateway | tunnel | idle | policy | controlplane | ebpf | scaling | access-log | scale | soak) shift ;;
  *)
    echo "usage: perf/run.sh gateway|tunnel|idle|policy|controlplane|ebpf|scaling|access-log|scale|soak [--smoke] [harness options]" >&2
    exit 2
    ;;
esac
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/sluice/target-$(printf %s "$root" | sha1sum | cut -c1-12)}
profile=${SLUICE_PERF_PROFILE:-release}

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

smoke=false
for argument in "$@"; do
  if [ "$argument" = --smoke ]; then smoke=true; fi
done
with_pingora=false
if { [ "$scenario" = gateway ] || [ "$scenario" = tunnel ]; } && [ "$smoke" = false ]; then
  with_pingora=true
fi

packages=(haproxy nginx-light nghttp2-client wrk redis-server)
if [ "$with_pingora" = true ]; then packages+=(cmake pkg-config libssl-dev); fi
if [ "$scenario" = controlplane ] || [ "$scenario" = scale ]; then packages+=(etcd-server); fi
# The ebpf scenario runs no Sluice process and no peer: trafgen and the harness only.
build=(--features sluice/etcd -p sluice -p sluice-perf -p sluice-apiserver-sim)
if [ "$scenario" = ebpf ]; then
  packages=(netsniff-ng)
  build=(-p sluice-perf)
fi
missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$package")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "perf: installing ${missing[*]}" >&2
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

out_name=$scenario
if [ "$smoke" = true ]; then out_name=$scenario-smoke; fi

if [ -n "${SLUICE_PERF_BIN_DIR:-}" ]; then
  bin=$SLUICE_PERF_BIN_DIR
  for program in sluice sluice-perf sluice-apiserver-sim; do
    if [ ! -x "$bin/$program" ]; then
      echo "perf: SLUICE_PERF_BIN_DIR=$bin has no executable $program" >&2
      exit 2
    fi
  done
elif [ "$profile" = release ]; then
  cargo build --release --locked "${build[@]}"
  bin=$CARGO_TARGET_DIR/release
else
  cargo build --locked "${build[@]}"
  bin=$CARGO_TARGET_DIR/debug
fi
pingora=()
if [ "$with_pingora" = true ]; then
  pingora_target=$HOME/.cache/sluice/target-pingora-peer
  mkdir -p "$pingora_target"
  pingora_log=$pingora_target/build.log
  echo "perf: building the Pingora peer (perf/peers/pingora/, log: $pingora_log)" >&2
  if OPENSSL_NO_VENDOR=1 CARGO_TARGET_DIR=$pingora_target cargo build --release --locked \
    --manifest-path "$root/perf/peers/pingora/Cargo.toml" >"$pingora_log" 2>&1; then
    pingora=(--pingora "$pingora_target/release/sluice-perf-pingora")
  else
    echo "perf: Pingora peer skipped: cargo could not build perf/peers/pingora/ (see $pingora_log)" >&2
  fi
fi
exec "$bin/sluice-perf" "$scenario" --sluice "$bin/sluice" --workspace "$root" \
  --out "$root/perf/results/$out_name" "${pingora[@]}" "$@"
