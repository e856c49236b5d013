#!/usr/bin/env bash
# Installs what Sluice's tests need (only what is missing), then runs the tests.
#
#   scripts/test.sh            every tier: lint, then all unit + integration + end-to-end tests
#   scripts/test.sh lint       cargo fmt --check and clippy -D warnings
#   scripts/test.sh unit       unit tests only (beside the code, no sockets to real services)
#   scripts/test.sh integration  integration and end-to-end tests (crates' tests/ folders)
#   scripts/test.sh fuzz       fuzz smoke: every fuzz target (fuzz/) for $SLUICE_FUZZ_SECONDS (5) s
#
# Data-plane suites run each case on both monoio drivers (io_uring and legacy epoll) themselves;
# README.md lists the system-level suites that run on the default driver only.
# Builds go to $CARGO_TARGET_DIR, by default a directory outside the checkout keyed by the
# checkout's path: repeated runs of one checkout reuse artifacts, and two checkouts never share
# (cargo would take one's fresh-looking artifacts for the other's).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
tier=${1:-all}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/sluice/target-$(printf %s "$root" | sha1sum | cut -c1-12)}
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
# A CI run builds once: incremental state would only add ~2 GB of disk to a cold build.
if [ -n "${CI:-}" ]; then export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}; fi

started=$(date +%s)
# Each phase's line carries the minutes:seconds since the start, so a slow CI run shows where the
# time went.
log() {
  local elapsed=$(($(date +%s) - started))
  printf '\n== [%d:%02d] %s\n' $((elapsed / 60)) $((elapsed % 60)) "$*"
}

# The tests cover the etcd store too (an optional feature: its client's build needs protoc,
# installed below).
FEATURES="sluice/etcd sluice-store/etcd"

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

install_apt_packages() {
  local wanted=(redis-server openvswitch-switch clang llvm libbpf-dev bpftool iproute2
    nghttp2-client curl python3-venv openssl iputils-ping netcat-openbsd ethtool etcd-server
    protobuf-compiler libprotobuf-dev systemd prometheus man-db groff-base lintian dpkg-dev file)
  local missing=()
  for package in "${wanted[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then
      missing+=("$package")
    fi
  done
  # kubectl for the gateway tests: Debian's kubernetes-client, unless some kubectl is already
  # installed (images with Google's kubectl package would conflict with it).
  if ! command -v kubectl >/dev/null 2>&1; then
    missing+=(kubernetes-client)
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

install_python_venv() {
  local venv="$root/.venv"
  local modules="import grpc, jwt, kubernetes, prometheus_client"
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$modules" 2>/dev/null; then
    return
  fi
  log "creating the test venv in $venv (grpcio, PyJWT, kubernetes, prometheus-client)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check grpcio PyJWT kubernetes prometheus-client
  "$venv/bin/python" -c "$modules"
}

run_lint() {
  log "cargo fmt --check"
  cargo fmt --all -- --check
  # Linted on the path a machine without clang takes (ebpf/build.rs then compiles nothing and
  # the crate embeds the checked-in object), so that path is shown to build; the test build
  # compiles the C source as its check. A `cargo check -p sluice-ebpf` of its own unified
  # features differently and checked its dependencies again (54 s of CI).
  log "cargo clippy (sluice-ebpf without its C build, as on a machine without clang)"
  SLUICE_EBPF_SKIP_BUILD=1 cargo clippy --workspace --all-targets --locked --features "$FEATURES" -- -D warnings
}

# The fuzz targets' instrumented build (its own workspace and target directory) takes minutes
# cold. `all` starts it at the start, at idle CPU priority (SCHED_IDLE: it runs only on a core
# nothing else wants), so it fills the cores the lint, build and wait-bound tests leave idle
# without taking CPU from them.
fuzz_build_pid=
start_fuzz_build_in_background() {
  fuzz_build_log=$CARGO_TARGET_DIR/fuzz-build.log
  log "building the fuzz targets in the background at idle priority (log: $fuzz_build_log)"
  chrt --idle 0 nice -n 19 scripts/fuzz.sh build >"$fuzz_build_log" 2>&1 &
  fuzz_build_pid=$!
  trap 'if [ -n "$fuzz_build_pid" ]; then kill "$fuzz_build_pid" 2>/dev/null || true; fi' EXIT
}

run_fuzz_smoke() {
  if [ -n "$fuzz_build_pid" ]; then
    log "waiting for the background fuzz build"
    local status=0
    wait "$fuzz_build_pid" || status=$?
    fuzz_build_pid=
    # A failed background build is not the verdict: the foreground build below repeats it and
    # shows its errors.
    tail -3 "$fuzz_build_log"
    if [ "$status" -ne 0 ]; then echo "background fuzz build exited $status; building again" >&2; fi
  fi
  log "fuzz smoke (scripts/fuzz.sh all ${SLUICE_FUZZ_SECONDS:-5})"
  scripts/fuzz.sh all "${SLUICE_FUZZ_SECONDS:-5}"
}

run_perf_smoke() {
  log "perf harness smoke runs (perf/run.sh tunnel|gateway|controlplane|ebpf|scaling|access-log|scale|soak --smoke; numbers are not measurements)"
  # A smoke run passes only if every case left its results and no call failed (perf/check-smoke),
  # not merely because the harness exited 0.
  # The smokes run the binaries the test build made: cargo builds a package's binaries for its
  # integration tests, so `--no-run --test '*'` builds nothing after either tier. A plain
  # `cargo build` would unify dependency features differently and compile half the workspace
  # again.
  cargo test --workspace --locked --features "$FEATURES" --no-run --test '*'
  export SLUICE_PERF_BIN_DIR=$CARGO_TARGET_DIR/debug
  SLUICE_PERF_PROFILE=dev perf/run.sh tunnel --smoke
  perf/check-smoke tunnel direct haproxy nginx sluice-1-node sluice-2-nodes
  SLUICE_PERF_PROFILE=dev perf/run.sh gateway --smoke
  perf/check-smoke gateway direct haproxy nginx sluice-gateway sluice-gateway-tunnel
  SLUICE_PERF_PROFILE=dev perf/run.sh controlplane --smoke
  perf/check-smoke controlplane embedded etcd
  SLUICE_PERF_PROFILE=dev perf/run.sh ebpf --smoke
  perf/check-smoke ebpf
  SLUICE_PERF_PROFILE=dev perf/run.sh scaling --smoke
  perf/check-smoke scaling
  # The access-log scenario checks itself: nothing logged while off, every request logged or
  # counted as dropped while on, no failed request.
  SLUICE_PERF_PROFILE=dev perf/run.sh access-log --smoke
  # The seeds' scale questions with small counts (20 VMs; 200 idle and 200 watching clients
  # through one gateway; 100 watchers of one control plane, embedded and etcd): fails if any
  # simulated peer saw an error or missed a delivery.
  SLUICE_PERF_PROFILE=dev perf/run.sh scale --smoke
  perf/check-smoke scale
  # One minute of the soak (scripts/soak.sh runs 30): samples exist, errors are explained by an
  # agent restart, fds stay bounded. Growth figures are reported, never asserted.
  SLUICE_PERF_PROFILE=dev perf/run.sh soak --smoke
  perf/check-smoke soak
}

case "$tier" in
  all | lint | unit | integration | fuzz) ;;
  *)
    echo "usage: scripts/test.sh [all|lint|unit|integration|fuzz]" >&2
    exit 2
    ;;
esac

# Every tier builds etcd-client, whose build needs protoc: the packages come first for all.
install_apt_packages
if [ "$tier" != lint ] && [ "$tier" != fuzz ]; then
  install_python_venv
  export SLUICE_PYTHON="$root/.venv/bin/python"
fi

mkdir -p "$CARGO_TARGET_DIR"
log "disk free where builds go: $(df -h --output=avail "$CARGO_TARGET_DIR" | tail -1)"
if [ "$tier" = all ]; then start_fuzz_build_in_background; fi
case "$tier" in
  lint) run_lint ;;
  unit)
    log "unit tests"
    cargo test --workspace --locked --features "$FEATURES" --lib --bins
    ;;
  integration)
    log "integration and end-to-end tests"
    cargo test --workspace --locked --features "$FEATURES" --test '*'
    ;;
  all)
    run_lint
    log "all tests"
    cargo test --workspace --locked --features "$FEATURES" --no-fail-fast
    ;;
esac
if [ "$tier" = all ] || [ "$tier" = integration ]; then run_perf_smoke; fi
if [ "$tier" = all ] || [ "$tier" = fuzz ]; then run_fuzz_smoke; fi
log "scripts/test.sh $tier: passed"
