#!/usr/bin/env bash
# Coverage-guided fuzzing of Sluice's decoders (the targets are in fuzz/fuzz_targets/).
#
#   scripts/fuzz.sh                  every target, 600 s each
#   scripts/fuzz.sh all 5            smoke: every target for 5 s (what CI runs)
#   scripts/fuzz.sh openflow 3600    one target for an hour
#   scripts/fuzz.sh openflow 0       one target until it crashes (libFuzzer: 0 = no time limit)
#   scripts/fuzz.sh list             the target names
#   scripts/fuzz.sh build            only build every target (scripts/test.sh starts this at idle
#                                    CPU priority while the tests run, so the smoke waits on no build)
#
# Targets run $SLUICE_FUZZ_JOBS at a time (default: the number of CPUs): libFuzzer is
# single-threaded, so a smoke of every target on a 2-core machine takes half as long.
#
# Prints, per target, the executions, coverage and corpus size at the end, and any crash; exits
# non-zero if a target crashed (or failed to run). Crash inputs are kept under fuzz/artifacts/
# (gitignored); the corpus a run grows is kept outside the checkout, in
# $FUZZ_TARGET_DIR/corpus/<target>, with the seeds of fuzz/corpus/<target> read alongside it.
# Reproduce a crash with: $FUZZ_TARGET_DIR/<triple>/release/<target> fuzz/artifacts/<target>/crash-...
#
# Why libFuzzer through `libfuzzer-sys`, built by plain cargo on stable Rust:
# - cargo-fuzz's own recipe needs nightly only for `-Z sanitizer=address`; the coverage
#   instrumentation itself is LLVM's SanitizerCoverage pass, which stable rustc runs with
#   `-C passes=sancov-module` and `-C llvm-args=-sanitizer-coverage-*` (all stable flags). No
#   RUSTC_BOOTSTRAP, no nightly, no cargo-fuzz binary: one `cargo build` with RUSTFLAGS. Rust code
#   is memory safe outside `unsafe`, so what we look for is panics, aborts, hangs and huge
#   allocations, all of which libFuzzer reports without ASan.
# - libfuzzer-sys (crates.io) ships libFuzzer's C++ source and builds it with the system C++
#   compiler: nothing downloaded but crates. In-process, so ~10^5-10^6 execs/s on small inputs,
#   with value profiling (-sanitizer-coverage-trace-compares) to get past magic numbers.
# - cargo-afl (afl.rs) also works on stable but builds AFL++ from source at install (minutes),
#   forks per input unless persistent mode, and needs AFL's system tuning (core_pattern, CPU
#   governor) or AFL_SKIP_CPUFREQ/AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES: more moving parts for CI.
#   bolero would wrap libFuzzer or AFL the same way, plus its own cargo subcommand.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
which=${1:-all}
seconds=${2:-600}
# Outside the checkout, keyed by its path like scripts/test.sh's target directory (two checkouts
# never share artifacts); the instrumented build is separate from the normal one anyway.
export FUZZ_TARGET_DIR=${FUZZ_TARGET_DIR:-$HOME/.cache/sluice/target-fuzz-$(printf %s "$root" | sha1sum | cut -c1-12)}
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

mapfile -t all_targets < <(ls fuzz/fuzz_targets | sed -n 's/\.rs$//p' | sort)

if [ "$which" = list ]; then
  printf '%s\n' "${all_targets[@]}"
  exit 0
fi
build_only=false
if [ "$which" = build ]; then
  build_only=true
  which=all
fi
if [ "$which" = all ]; then
  targets=("${all_targets[@]}")
else
  if [ ! -f "fuzz/fuzz_targets/$which.rs" ]; then
    echo "unknown target $which; targets: ${all_targets[*]}" >&2
    exit 2
  fi
  targets=("$which")
fi
case $seconds in
  '' | *[!0-9]*) echo "SECONDS must be a whole number, not $seconds" >&2; exit 2 ;;
esac

# libfuzzer-sys compiles libFuzzer (C++) in its build script.
if ! command -v c++ >/dev/null 2>&1 && ! command -v clang++ >/dev/null 2>&1; then
  echo "== installing a C++ compiler for libFuzzer" >&2
  if [ "$(id -u)" -eq 0 ]; then apt-get update -qq && apt-get install -y -qq g++; else sudo apt-get update -qq && sudo apt-get install -y -qq g++; fi
fi

triple=$(rustc -vV | sed -n 's/^host: //p')
# cargo-fuzz's flags for `--sanitizer none`: SanitizerCoverage with 8-bit counters, the PC table
# (for -print_final_stats / coverage), compare tracing; `--cfg fuzzing` as cargo-fuzz sets it.
# `--target` keeps these flags off build scripts and proc macros (they must not be instrumented).
export RUSTFLAGS="-C passes=sancov-module \
 -C llvm-args=-sanitizer-coverage-level=4 \
 -C llvm-args=-sanitizer-coverage-inline-8bit-counters \
 -C llvm-args=-sanitizer-coverage-pc-table \
 -C llvm-args=-sanitizer-coverage-trace-compares \
 --cfg fuzzing"
build_start=$(date +%s)
echo "== building fuzz targets (instrumented, release + debug assertions) into $FUZZ_TARGET_DIR" >&2
bin_args=()
for target in "${targets[@]}"; do bin_args+=(--bin "$target"); done
CARGO_TARGET_DIR=$FUZZ_TARGET_DIR cargo build --manifest-path fuzz/Cargo.toml --locked --release \
  --target "$triple" "${bin_args[@]}"
echo "== build took $(($(date +%s) - build_start)) s" >&2

if $build_only; then exit 0; fi

bin_dir=$FUZZ_TARGET_DIR/$triple/release
results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT

# One target's run; its one-line summary goes to $results/<target>.ok or .failed.
run_target() {
  local target=$1
  local corpus=$FUZZ_TARGET_DIR/corpus/$target
  local artifacts=$root/fuzz/artifacts/$target
  local log=$FUZZ_TARGET_DIR/logs/$target.log
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  echo "== fuzzing $target for ${seconds} s" >&2
  local status=0
  # -timeout: an input slower than 10 s is a hang; -rss_limit_mb: a decoder that allocates
  # gigabytes on a small input is a finding too; -max_len: the decoders' inputs are small.
  "$bin_dir/$target" "$corpus" "fuzz/corpus/$target" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
    -artifact_prefix="$artifacts/" -print_final_stats=1 >"$log" 2>&1 || status=$?
  local execs cov units crash
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1 || true)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2 || true)
  units=$(find "$corpus" -type f | wc -l)
  crash=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1 || true)
  if [ "$status" -ne 0 ]; then
    printf '%-14s FAILED (exit %s) execs=%s cov=%s crash=%s\n' "$target" "$status" "${execs:-?}" "${cov:-?}" "${crash:-none}" >"$results/$target.failed"
    {
      echo "-- $target failed; the end of its log ($log):"
      grep -v '^#[0-9]' "$log" | tail -40
    } >&2
  else
    printf '%-14s ok execs=%s cov=%s corpus=%s\n' "$target" "${execs:-?}" "${cov:-?}" "$units" >"$results/$target.ok"
  fi
}

jobs_wanted=${SLUICE_FUZZ_JOBS:-$(nproc)}
for target in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_wanted" ]; do wait -n || true; done
  run_target "$target" &
done
wait

summary=()
failed=()
for target in "${targets[@]}"; do
  if [ -f "$results/$target.ok" ]; then
    summary+=("$(cat "$results/$target.ok")")
  elif [ -f "$results/$target.failed" ]; then
    summary+=("$(cat "$results/$target.failed")")
    failed+=("$target")
  else
    summary+=("$(printf '%-14s FAILED (left no result)' "$target")")
    failed+=("$target")
  fi
done

echo
echo "== fuzz summary (${seconds} s per target)"
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "== crashes or failures in: ${failed[*]} (inputs under fuzz/artifacts/)"
  exit 1
fi
