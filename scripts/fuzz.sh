#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for SECONDS each (default 60), one after the other, and prints a
# summary: executions, corpus size, clean or crashed. Needs a nightly toolchain and `cargo install cargo-fuzz`.
#
#   scripts/fuzz.sh            # 60 s per target
#   scripts/fuzz.sh 300        # 5 min per target
#   TARGETS="bucket_ops" scripts/fuzz.sh 10
#
# The checked-in seeds in fuzz/corpus/<target>/ are read, never written: new inputs go to a scratch corpus
# under $FUZZ_WORK (default /tmp/kvgate-fuzz), so the repository stays small. Crashes land in
# fuzz/artifacts/<target>/ (git-ignored); reproduce one with `cargo +nightly fuzz run <target> <file>`.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
toolchain="${FUZZ_TOOLCHAIN:-+nightly}"
work="${FUZZ_WORK:-/tmp/kvgate-fuzz}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/fuzz/target}"
targets="${TARGETS:-$(cargo "$toolchain" fuzz list)}"

# -rss_limit_mb: a target that allocates more than this is a bug (a hostile input must not blow memory).
# -max_len: admission/bucket inputs are operation lists; 4 KiB is plenty and keeps runs fast.
common=(-max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1)

cargo "$toolchain" fuzz build -O >/dev/null
summary=()
status=0
for target in $targets; do
  mkdir -p "$work/$target" "fuzz/corpus/$target"
  log="$work/$target.log"
  echo "=== $target (${seconds}s) ==="
  if cargo "$toolchain" fuzz run -O "$target" "$work/$target" "fuzz/corpus/$target" -- "${common[@]}" >"$log" 2>&1; then
    result=clean
  else
    result="FAILED (see $log and fuzz/artifacts/$target/)"
    status=1
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo '?')
  corpus=$(find "$work/$target" -type f | wc -l)
  tail -n 3 "$log"
  summary+=("$(printf '%-16s %-8s %12s execs %8s/s  cov %6s  corpus %5s' "$target" "$result" "$execs" "$rate" "$cov" "$corpus")")
done

echo
echo "=== summary: ${seconds}s per target, $(date -u +%Y-%m-%dT%H:%MZ) ==="
printf '%s\n' "${summary[@]}"
exit "$status"
