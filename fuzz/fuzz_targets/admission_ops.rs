//! `Admission` on a `ManualClock` with the deadline timer off (fully deterministic), driven by arbitrary
//! operation sequences — try_admit / admit (polled by hand, cancelled at random) / poll / drop / complete /
//! clock moves with and without expiry / resize / close, with tenants (caps, KV shares, tenant-only token
//! rates, weights from 1 to the maximum), request or token fairness, TTFT deadlines and shared prefixes
//! (a few common ids and invented ones, a small table) — and compared after every step with the exact
//! sequential model and specification shared with `tests/admission_model.rs`: every outcome, gauge and
//! bucket, globally and per tenant; rejection counts by reason; hint soundness; the rate bound; the
//! fairness bound. At the end every waiter is polled until none resolves, everything is dropped, and all is
//! back to zero.
#![no_main]

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use support::admission::{Config, Harness, Op, Req, TENANTS};

#[derive(Debug, Arbitrary)]
struct ArbReq {
    prompt: u8,
    max_new: u8,
    class: u8,
    tenant: Option<u8>,
    max_wait_ms: Option<u8>,
    /// (prefix id: a few shared ones, or any id when the high bit is set; prefix tokens)
    prefix: Option<(u8, u8)>,
    ttft_ms: Option<u8>,
}

impl ArbReq {
    fn req(&self) -> Req {
        Req {
            prompt: u32::from(self.prompt % 50),
            max_new: u32::from(self.max_new % 50),
            class: usize::from(self.class % 3),
            tenant: self.tenant.map(|t| t % TENANTS),
            max_wait_ms: self.max_wait_ms.map(|ms| u64::from(ms % 40)),
            prefix: self.prefix.map(|(id, tokens)| (if id & 0x80 != 0 { id } else { id % 4 }, u32::from(tokens % 60))),
            ttft_ms: self.ttft_ms.map(|ms| u64::from(ms % 40)),
        }
    }
}

#[derive(Debug, Arbitrary)]
enum ArbOp {
    TryAdmit(ArbReq),
    Admit(ArbReq),
    Poll(u8),
    Cancel(u8),
    DropPermit(u8),
    Complete(u8, u8),
    Advance(u8, bool),
    SetMaxInFlight(u8),
    SetKv(u8),
    Close,
}

impl ArbOp {
    fn op(&self) -> Op {
        match self {
            ArbOp::TryAdmit(r) => Op::TryAdmit(r.req()),
            ArbOp::Admit(r) => Op::Admit(r.req()),
            ArbOp::Poll(i) => Op::Poll(usize::from(*i)),
            ArbOp::Cancel(i) => Op::Cancel(usize::from(*i)),
            ArbOp::DropPermit(i) => Op::DropPermit(usize::from(*i)),
            ArbOp::Complete(i, out) => Op::Complete(usize::from(*i), u32::from(*out % 60)),
            ArbOp::Advance(ms, expire) => Op::Advance { ms: u64::from(ms % 20), expire: *expire },
            ArbOp::SetMaxInFlight(n) => Op::SetMaxInFlight(usize::from(n % 7).max(1)),
            ArbOp::SetKv(n) => Op::SetKv(u64::from(*n).max(1)),
            ArbOp::Close => Op::Close,
        }
    }
}

#[derive(Debug, Arbitrary)]
struct Input {
    max_in_flight: u8,
    kv_capacity: u8,
    queue_capacity: u8,
    request_rate: Option<(u8, u8)>,
    token_rate: Option<(u8, u8)>,
    tenant_cap: Option<u8>,
    tenant_share_pct: Option<u8>,
    tenant_token_rate: Option<(u8, u8)>,
    max_queue_wait_ms: Option<u8>,
    prefix_sharing: Option<u8>,
    /// Bit 0: token fairness; the three weights from the next bits.
    fairness: u8,
    weights: [u8; 3],
    ops: Vec<ArbOp>,
}

impl Input {
    fn config(&self) -> Config {
        let rate = |r: Option<(u8, u8)>, min_burst: u64| {
            r.map(|(per_ms, burst)| (u64::from(per_ms % 40).max(1), u64::from(burst).max(min_burst)))
        };
        Config {
            max_in_flight: usize::from(self.max_in_flight % 7).max(1),
            kv_capacity: u64::from(self.kv_capacity).max(1),
            queue_capacity: usize::from(self.queue_capacity % 8),
            request_rate: rate(self.request_rate, 1).map(|(per_ms, burst)| (per_ms % 3 + 1, burst % 8 + 1)),
            token_rate: rate(self.token_rate, 1),
            tenant_cap: self.tenant_cap.map(|n| usize::from(n % 4).max(1)),
            tenant_share_pct: self.tenant_share_pct.map(|p| p % 100 + 1),
            tenant_token_rate: rate(self.tenant_token_rate, 1),
            max_queue_wait_ms: self.max_queue_wait_ms.map(|ms| u64::from(ms % 50)),
            prefix_sharing: self.prefix_sharing.map(|n| usize::from(n % 6) + 1),
            fairness_tokens: self.fairness & 1 != 0,
            // Powers of two from 1 to the maximum weight (2^16), so that the model's counters are exact.
            weights: self.weights.map(|w| 1 << (w % 17)),
        }
    }
}

fuzz_target!(|input: Input| {
    let cfg = input.config();
    let mut harness = Harness::new(&cfg);
    for (step, op) in input.ops.iter().take(300).enumerate() {
        let op = op.op();
        if let Err(diff) = harness.apply(&op) {
            panic!("step {step} {op:?}: {diff}\nconfig {cfg:?}");
        }
    }
    if let Err(diff) = harness.finish() {
        panic!("finish: {diff}\nconfig {cfg:?}");
    }
});
