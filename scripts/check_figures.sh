#!/usr/bin/env bash
# Checks that the lab's figures are what the lab produces today: runs the overload and policies examples
# (release, the README's commands) into a temporary directory, then compares
#   - every SVG they write with the file of the same name in docs/, byte for byte;
#   - every table they print that README.md or POLICIES.md quotes with the lines between its markers,
#     `<!-- figures:overload:1 -->` ... `<!-- /figures -->` (scripts/figures.py says which table is which).
# Lists every difference and exits 1 when anything differs. With --write (or WRITE=1) it refreshes the SVGs
# in docs/ and the marked tables in place instead: after changing the core, one command updates every figure.
#
#   scripts/check_figures.sh            # check (CI)
#   scripts/check_figures.sh --write    # refresh docs/*.svg and the marked tables
#
# The simulations are deterministic (same seed, same output, byte for byte); the two examples run side by
# side, about 30 s on 2 cores after the build.
set -euo pipefail
cd "$(dirname "$0")/.."

write=()
case "${1:-}" in
  "") [[ "${WRITE:-0}" == 1 ]] && write=(--write) ;;
  --write) write=(--write) ;;
  -h | --help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "check_figures: unknown option $1 (see --help)" >&2; exit 2 ;;
esac

run=$(mktemp -d "${TMPDIR:-/tmp}/kvgate-figures.XXXXXX")
trap 'rm -rf "$run"' EXIT
mkdir "$run/svg"

# Build both examples as the README runs them (`cargo run --release --example ...`: the default members'
# features), and take the executables' paths from cargo rather than guessing the target directory.
cargo build --release --example overload --example policies --message-format=json-render-diagnostics \
  >"$run/build.json"
exe() {
  python3 - "$run/build.json" "$1" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == sys.argv[2] and m.get("executable"):
        print(m["executable"])
EOF
}

pids=()
for example in overload policies; do
  binary=$(exe "$example")
  [[ -n "$binary" ]] || { echo "check_figures: cargo built no $example executable" >&2; exit 2; }
  "$binary" --out "$run/svg" >"$run/$example.txt" 2>"$run/$example.err" &
  pids+=($!)
done
failed=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    example=$([[ $i == 0 ]] && echo overload || echo policies)
    echo "check_figures: the $example example failed:" >&2
    cat "$run/$example.err" >&2
    failed=1
  fi
done
[[ $failed == 0 ]] || exit 2

python3 scripts/figures.py "${write[@]}" "$run"
