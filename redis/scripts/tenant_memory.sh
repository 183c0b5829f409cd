#!/usr/bin/env bash
# The full-size memory test of kvgate-redis: 1,000,000 invented tenant ids through shared tenant rates,
# then Redis' key count and memory back to their baseline after the idle time (CI runs 100,000).
set -euo pipefail
cd "$(dirname "$0")/../.."
KVGATE_REDIS_TENANTS="${1:-1000000}" cargo test --release -p kvgate-redis --all-features --test tenant_memory -- --nocapture
