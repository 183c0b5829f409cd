#!/usr/bin/env bash
# Runs the threaded stress tests under ThreadSanitizer and AddressSanitizer (nightly, -Zbuild-std so that
# std itself is instrumented; needs `rustup component add rust-src --toolchain nightly`).
#
#   scripts/sanitize.sh            # thread, then address
#   scripts/sanitize.sh thread     # one sanitizer
#   TESTS="--test queue_stress" scripts/sanitize.sh address
#
# Each sanitizer builds into its own target directory ($CARGO_TARGET_DIR/sanitize-<name>), since std is
# rebuilt with the sanitizer's flags. TSan suppressions, if any are ever needed, go in
# scripts/tsan.supp with a comment explaining each (none are needed today: see RELIABILITY.md).
set -euo pipefail
cd "$(dirname "$0")/.."
base="${CARGO_TARGET_DIR:-$PWD/target}"
target=x86_64-unknown-linux-gnu
sanitizers=("${@:-thread address}")
read -r -a sanitizers <<<"${sanitizers[*]}"
# The threaded stress tests, and the waiting stress (10,000 tokio tasks) in waiting.rs; the fault
# injection tests race close() against admits and drop runtimes under waiters.
read -r -a tests <<<"${TESTS:---test queue_stress --test bucket_stress --test admission_stress --test waiting --test fault_injection}"

status=0
for san in "${sanitizers[@]}"; do
  export CARGO_TARGET_DIR="$base/sanitize-$san"
  flags="-Zsanitizer=$san -Cdebuginfo=1"
  case "$san" in
    thread)
      # halt_on_error: the first race fails the run; second_deadlock_stack: full reports for lock cycles.
      export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
      if [ -f scripts/tsan.supp ]; then export TSAN_OPTIONS="$TSAN_OPTIONS suppressions=$PWD/scripts/tsan.supp"; fi
      ;;
    address)
      # detect_leaks: LeakSanitizer runs at exit (a leaked Arc of a waiter or permit is a bug).
      export ASAN_OPTIONS="detect_leaks=1 ${ASAN_OPTIONS:-}"
      ;;
    *) echo "unknown sanitizer $san (thread or address)"; exit 2 ;;
  esac
  echo "=== $san sanitizer: ${tests[*]} ==="
  start=$(date +%s)
  if RUSTFLAGS="$flags" RUSTDOCFLAGS="$flags" cargo +nightly test -Zbuild-std --target "$target" "${tests[@]}"; then
    echo "=== $san: clean in $(( $(date +%s) - start )) s ==="
  else
    echo "=== $san: FAILED after $(( $(date +%s) - start )) s ==="
    status=1
  fi
done
exit "$status"
