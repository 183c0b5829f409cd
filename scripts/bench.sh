#!/usr/bin/env bash
# Runs every criterion bench of kvgate against its competitors in one go, then writes the tables and the
# ratio chart used in BENCHMARKS.md (target/bench-report/summary.md, target/bench-report/ratios.svg).
# `-p kvgate` measures the library with the features its benches ask for: without it, cargo builds the
# default members together and the demo's `metrics` feature is unified into the library (every permit
# drop then reads the clock for the hold-time histogram).
#   scripts/bench.sh                 # default: 2 s warm-up, 5 s measurement per bench
#   WARMUP=1 MEASURE=3 scripts/bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf target/criterion
for bench in queue bucket admission waiting adaptive policies; do
  cargo bench -p kvgate --bench "$bench" -- --warm-up-time "${WARMUP:-2}" --measurement-time "${MEASURE:-5}"
done
# The waiting drain again, its six rows in turns in one process (kvgate under both wait policies, tokio,
# tokio padded, and the fair tokio scheduler; the ratio of criterion's rows drifts
# with the machine): prints medians and ratios.
TURNS=300 cargo bench -p kvgate --bench waiting -- turns
python3 scripts/bench_report.py target/criterion
