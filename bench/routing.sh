#!/usr/bin/env bash
# Routing policies against each other: round robin, least-outstanding and
# gpuscale's prefix affinity with bounded loads, each behind 1 and 3
# gateway processes, in front of 8 simulated replicas with prefix caches,
# on a prefix-heavy and a no-shared-prefix workload (sizes from the Azure
# conversation trace), plus one run where one of 3 gateways is killed at
# the midpoint. Every configuration starts from fresh replicas and sends
# the same requests. About 20 minutes.
#
# Usage: bench/routing.sh [extra routing-bench flags, e.g. --seconds 30]
# Ends with three lines:
#   p99 TTFT ratio (gpuscale/least-outstanding, prefix-heavy): X.XX
#   hit-rate gap (1 vs 3 gateways): X.X points
#   worst ratio on no-prefix (gpuscale/least-outstanding): X.XX
# GPUSCALE_BIN / ROUTING_BENCH_BIN: release binaries built already.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${GPUSCALE_BIN:-}" ]; then
  cargo build --release --quiet --bin gpuscale
  GPUSCALE_BIN=$PWD/target/release/gpuscale
fi
if [ -z "${ROUTING_BENCH_BIN:-}" ]; then
  cargo build --release --quiet -p gpuscale-bench --bin routing-bench
  ROUTING_BENCH_BIN=$PWD/target/release/routing-bench
fi
exec "$ROUTING_BENCH_BIN" --gpuscale "$GPUSCALE_BIN" "$@"
