#!/usr/bin/env bash
# The soak test: `scripts/soak.sh [minutes]` (default 30) drives mixed tunnel and gateway load at
# half of the capacity measured at its start through one Sluice process (node + gateway), with
# an agent restarted every 30 s and the load generators' connections opened and closed every
# window, and samples RSS, open fds, p99 and errors of every window. Writes
# perf/results/soak/{summary.md,summary.json,soak-over-time.svg,raw/samples.json}.
#
# Release build by default; SLUICE_PERF_PROFILE=dev for a quick look (not a measurement).
# Extra arguments go to the harness (`--client-cpu`, `--proxy-cpu`, ...); see perf/README.md.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
minutes=${1:-30}
if [ $# -gt 0 ]; then shift; fi
case "$minutes" in
  '' | *[!0-9.]* | *.*.*)
    echo "usage: scripts/soak.sh [minutes] [harness options]" >&2
    exit 2
    ;;
esac
exec perf/run.sh soak --minutes "$minutes" "$@"
