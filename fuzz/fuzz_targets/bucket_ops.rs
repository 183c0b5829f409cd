//! `TokenBucket` on a `ManualClock` against the exact sequential model shared with `tests/bucket_proptest.rs`
//! (`support::bucket`: whole units — the documented unit, recomputed and checked — plus an exact 2^-96
//! fraction of a unit, capped at the capacity; lifetime allowance tracked as `level`): every decision, every
//! `available()`, and every `retry_after` (exactly minimal) is compared, and every grant is checked against
//! the GCRA bound at the rate as given, in every window since the last rate change. Invalid configurations
//! and `set_rate` arguments must be refused and change nothing; a peek at an earlier time never shows more.
#![no_main]

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use support::bucket::{EDGE_RATES, Harness};

/// A rate in the accepted range, log-uniform from 32 bits, or one of the edge values.
#[derive(Debug, Arbitrary)]
enum Rate {
    LogUniform(u32),
    Integer(u32),
    Edge(u8),
    /// Any `f64` bit pattern: usually invalid, must then be refused.
    Raw(u64),
}

impl Rate {
    fn value(&self) -> f64 {
        match *self {
            Rate::LogUniform(x) => 10f64.powf(-3.0 + 12.0 * f64::from(x) / f64::from(u32::MAX)).clamp(0.001, 1e9),
            Rate::Integer(x) => f64::from(x.clamp(1, 1_000_000_000)),
            Rate::Edge(i) => EDGE_RATES[usize::from(i) % EDGE_RATES.len()],
            Rate::Raw(bits) => f64::from_bits(bits),
        }
    }
}

#[derive(Debug, Arbitrary)]
enum Op {
    Advance(u64),
    AdvanceSmall(u16),
    Acquire {
        n: u64,
        follow_hint: bool,
    },
    AcquireSmall {
        n: u8,
        follow_hint: bool,
    },
    Refund(u64),
    RefundSmall(u8),
    SetRate(Rate, u64),
    /// A peek at an earlier time never shows more than a peek now.
    PeekPast(u64),
}

#[derive(Debug, Arbitrary)]
struct Input {
    rate: Rate,
    burst: u64,
    start: u64,
    ops: Vec<Op>,
}

/// Fails the run with the harness's description of the difference.
fn check(result: Result<(), String>) {
    if let Err(mismatch) = result {
        panic!("{mismatch}");
    }
}

fuzz_target!(|input: Input| {
    let harness = Harness::new(input.rate.value(), input.burst, input.start);
    let Some(mut h) = harness.unwrap_or_else(|mismatch| panic!("{mismatch}")) else { return };
    for op in input.ops.iter().take(256) {
        match *op {
            Op::Advance(d) => h.advance(d),
            Op::AdvanceSmall(d) => h.advance(u64::from(d) * 1000),
            Op::Acquire { n, follow_hint } => check(h.acquire(n, follow_hint)),
            Op::AcquireSmall { n, follow_hint } => check(h.acquire(u64::from(n), follow_hint)),
            Op::Refund(n) => h.refund(n),
            Op::RefundSmall(n) => h.refund(u64::from(n)),
            Op::SetRate(ref r, new_burst) => check(h.set_rate(r.value(), new_burst)),
            Op::PeekPast(d) => check(h.peek_past(d)),
        }
        check(h.check_available());
    }
});
