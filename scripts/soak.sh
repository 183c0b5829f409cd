#!/usr/bin/env bash
# Soak test: the gateway (kvgate-gateway) with its simulated backend under sustained ~3x overload for MINUTES
# (default 10), sampling resident memory and /metrics into target/soak/soak.csv, then checking that
# memory stayed flat, the counters drained to 0, and every answer was 200, 429 or 503.
#
#   scripts/soak.sh [minutes]
#
# Limits: 16 running, queue 16 (max wait 2 s), 25 requests/s; 96 clients (3x running + queue) that
# retry after Retry-After. Loopback only; the run ends by itself (minutes + at most ~1 min of drain).
# Exits non-zero when a check fails. CARGO_TARGET_DIR is honoured.
set -euo pipefail

minutes="${1:-10}"
case "$minutes" in '' | *[!0-9]*) echo "usage: $0 [minutes]" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
out="target/soak"
mkdir -p "$out"

cargo build --release -p kvgate-gateway --bin kvgate-gateway --example loadgen

. scripts/lib/gateway.sh
start_gateway "$out/gateway.log" "$target/release/kvgate-gateway" \
    --max-in-flight 16 --queue 16 --max-queue-wait 2s --rate 25 --kv-tokens 6000 --sim-tokens-per-sec 100
echo "soak: gateway pid $gateway_pid at $url, $minutes min, samples -> $out/soak.csv" >&2

status=0
"$target/release/examples/loadgen" --url "$url" --pid "$gateway_pid" --clients 96 \
    --seconds $((minutes * 60)) --sample-secs 5 --warmup-secs 60 --csv "$out/soak.csv" \
    | tee "$out/summary.txt" || status=$?
if ! kill -0 "$gateway_pid" 2>/dev/null; then
    echo "soak: the gateway exited during the run" >&2
    status=1
fi
exit "$status"
