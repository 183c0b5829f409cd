#!/usr/bin/env bash
# Runs the tests that exercise unsafe code and the concurrent structures under miri (nightly): the Vyukov
# queue's raw slots (src/queue.rs), the waiting room's slab of never-moving chunks and its lock-free grant
# check (src/admission/dispatcher/waiter.rs), the wake list's uninitialised slots
# (src/admission/dispatcher/wake_list.rs), and what is built on them — the admission model, defect,
# prefix, waiting, bucket and stress tests — with sizes scaled down by `cfg!(miri)`.
#
#   scripts/miri.sh                   # the default set below
#   scripts/miri.sh --test queue_stress   # any cargo test arguments instead
#
# Needs: rustup component add miri rust-src --toolchain nightly
# Left out: tests that need tokio or smol (waiting.rs, fault_injection.rs: runtimes use syscalls and
# epoll that miri does not model), the HF fixture tests (read ../shared), bad_inputs.rs (10 MB inputs),
# loom models (they have their own runner), and the allocation-counting test (global allocator).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target/miri}"
# -Zmiri-disable-isolation: proptest reads the clock and its regression files; the stress tests read
#   Instant::now. Without it these tests fail on isolation, not on a bug.
# -Zmiri-many-seeds is not used: one seed per run keeps the run within minutes on 2 cores; rerun with
#   MIRIFLAGS="... -Zmiri-seed=N" to explore other schedules.
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-disable-isolation}"
# quanta reads the TSC with inline assembly, which miri cannot run: use the std clock.
features=(-p kvgate --no-default-features --features hf-config,openai)
if [ "$#" -gt 0 ]; then
  args=("$@")
else
  args=(--lib --test queue_stress --test queue_proptest --test bucket_stress --test admission_stress
        --test admission_proptest --test waiting_proptest --test admission --test admission_model
        --test admission_defects --test admission_prefix --test admission_deadline)
fi
# The bucket's no-drift unit tests step a clock through a simulated year (tens of thousands of steps of
# pure integer arithmetic, no unsafe, no threads): minutes under miri for nothing miri can check.
skip=(--skip no_drift_)
start=$(date +%s)
cargo +nightly miri test "${features[@]}" "${args[@]}" -- "${skip[@]}"
echo "miri: passed in $(( $(date +%s) - start )) s (MIRIFLAGS=$MIRIFLAGS)"
