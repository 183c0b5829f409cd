#!/usr/bin/env bash
# Runs every property test of the kvgate crate (its unit tests and tests/*.rs) from fresh random seeds,
# with more cases than CI gives them where a test honours PROPTEST_CASES.
# CI runs the same tests from one fixed seed (PROPTEST_RNG_SEED in .ci/run), so that a CI run is
# reproducible; this script is where new cases are found.
#
#   scripts/proptest.sh            # 5,000 cases per property, one fresh seed
#   scripts/proptest.sh 50000 3    # 50,000 cases, three seeds one after the other
#
# A failure prints the minimal input and its seed line, which proptest also appends to the test's
# `tests/<name>.proptest-regressions` (`proptest-regressions/<module>.txt` for a unit test): commit that
# file with the fix, so that every later run (CI's too) tries the case first.
set -euo pipefail
cd "$(dirname "$0")/.."
cases="${1:-5000}"
rounds="${2:-1}"
unset PROPTEST_RNG_SEED
tests=()
for file in tests/*.rs; do
  if grep -q 'proptest!' "$file"; then tests+=(--test "$(basename "$file" .rs)"); fi
done
for round in $(seq 1 "$rounds"); do
  echo "=== round $round of $rounds: $cases cases per property ==="
  PROPTEST_CASES="$cases" cargo test --release -p kvgate --all-features --lib "${tests[@]}"
done
