//! Model-based test: random sequences of admit / drop / complete / advance / resize against a plain
//! sequential model of every limit. After every step the outcome and the snapshot equal the model's.
//!
//! Rates are whole tokens per millisecond and time advances in whole milliseconds, so the model's bucket
//! levels are exact integers.
#![cfg(not(loom))]

use kvgate::clock::ManualClock;
use kvgate::{Admission, Permit, Rejection, Request};
use proptest::prelude::*;
use std::time::Duration;

#[derive(Debug, Clone)]
enum Op {
    Admit { prompt: u32, max_new: u32 },
    Drop(usize),
    Complete(usize, u32),
    Advance(u64),
    SetMaxInFlight(usize),
    SetKv(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u32..60, 0u32..60).prop_map(|(prompt, max_new)| Op::Admit { prompt, max_new }),
        3 => any::<usize>().prop_map(Op::Drop),
        2 => (any::<usize>(), 0u32..80).prop_map(|(i, o)| Op::Complete(i, o)),
        2 => (0u64..20).prop_map(Op::Advance),
        1 => (1usize..6).prop_map(Op::SetMaxInFlight),
        1 => (50u64..400).prop_map(Op::SetKv),
    ]
}

#[derive(Debug)]
struct Model {
    max_in_flight: usize,
    kv_capacity: u64,
    /// (kv, tokens charged, max_new) per live permit, in the same order as the real permits.
    permits: Vec<(u64, u64, u32)>,
    request_level: u64,
    request_burst: u64,
    request_per_ms: u64,
    token_level: u64,
    token_burst: u64,
    token_per_ms: u64,
    admitted: u64,
    rejected: [u64; 4], // no_capacity, rate_limited, too_large, invalid
}

impl Model {
    fn in_flight(&self) -> usize {
        self.permits.len()
    }
    fn kv_used(&self) -> u64 {
        self.permits.iter().map(|p| p.0).sum()
    }
    fn admit(&mut self, prompt: u32, max_new: u32) -> Result<(), &'static str> {
        let total = u64::from(prompt) + u64::from(max_new);
        let verdict = if total == 0 {
            Err("invalid")
        } else if total > self.kv_capacity || total > self.token_burst {
            Err("too_large")
        } else if self.in_flight() >= self.max_in_flight || self.kv_used() + total > self.kv_capacity {
            Err("no_capacity")
        } else if self.request_level < 1 || self.token_level < total {
            Err("rate_limited")
        } else {
            self.request_level -= 1;
            self.token_level -= total;
            self.permits.push((total, total, max_new));
            self.admitted += 1;
            Ok(())
        };
        match verdict {
            Err("no_capacity") => self.rejected[0] += 1,
            Err("rate_limited") => self.rejected[1] += 1,
            Err("too_large") => self.rejected[2] += 1,
            Err(_) => self.rejected[3] += 1,
            Ok(()) => {}
        }
        verdict
    }
    fn complete(&mut self, i: usize, output: u32) {
        let (_, charged, max_new) = self.permits.remove(i);
        let unused = u64::from(max_new.saturating_sub(output)).min(charged);
        self.token_level = (self.token_level + unused).min(self.token_burst);
    }
    fn advance(&mut self, ms: u64) {
        self.request_level = (self.request_level + ms * self.request_per_ms).min(self.request_burst);
        self.token_level = (self.token_level + ms * self.token_per_ms).min(self.token_burst);
    }
}

fn kind(r: &Rejection) -> &'static str {
    r.reason()
}

proptest! {
    #![proptest_config(support::proptest_config(256))]

    #[test]
    fn admission_matches_sequential_model(
        max_in_flight in 1usize..5,
        kv_capacity in 40u64..300,
        request_burst in 1u64..6,
        request_per_ms in 1u64..3,
        token_burst in 60u64..300,
        token_per_ms in 5u64..40,
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let clock = ManualClock::new();
        let admission = Admission::builder()
            .max_in_flight(max_in_flight)
            .kv_capacity_tokens(kv_capacity)
            .request_rate(request_per_ms as f64 * 1000.0, request_burst as u32)
            .token_rate(token_per_ms as f64 * 1000.0, token_burst)
            .queue_capacity(0)
            .clock(clock.clone())
            .build()
            .unwrap();
        let mut model = Model {
            max_in_flight, kv_capacity, permits: Vec::new(),
            request_level: request_burst, request_burst, request_per_ms,
            token_level: token_burst, token_burst, token_per_ms,
            admitted: 0, rejected: [0; 4],
        };
        let mut permits: Vec<Permit> = Vec::new();
        for op in ops {
            match op {
                Op::Admit { prompt, max_new } => {
                    let real = admission.try_admit(&Request::new(prompt, max_new));
                    let expected = model.admit(prompt, max_new);
                    match (&real, expected) {
                        (Ok(_), Ok(())) => {}
                        (Err(r), Err(e)) => {
                            prop_assert_eq!(kind(r), e);
                            if let Some(d) = r.retry_after() { prop_assert!(d > Duration::ZERO); }
                        }
                        _ => prop_assert!(false, "real {:?} vs model {:?} ({:?})", real, expected, model),
                    }
                    if let Ok(p) = real { permits.push(p); }
                }
                Op::Drop(i) if !permits.is_empty() => {
                    let i = i % permits.len();
                    drop(permits.remove(i));
                    model.permits.remove(i);
                }
                Op::Complete(i, output) if !permits.is_empty() => {
                    let i = i % permits.len();
                    permits.remove(i).complete(output);
                    model.complete(i, output);
                }
                Op::Advance(ms) => {
                    clock.advance(Duration::from_millis(ms));
                    model.advance(ms);
                }
                Op::SetMaxInFlight(n) => {
                    admission.set_max_in_flight(n).unwrap();
                    model.max_in_flight = n;
                }
                Op::SetKv(n) => {
                    admission.set_kv_capacity(n).unwrap();
                    model.kv_capacity = n;
                }
                _ => {}
            }
            let s = admission.snapshot();
            prop_assert_eq!(s.in_flight, model.in_flight());
            prop_assert_eq!(s.kv_used, model.kv_used());
            prop_assert_eq!(s.kv_capacity, model.kv_capacity);
            prop_assert_eq!(s.admitted, model.admitted);
            prop_assert_eq!(
                [s.rejected.no_capacity, s.rejected.rate_limited, s.rejected.too_large, s.rejected.invalid],
                model.rejected
            );
            prop_assert_eq!(s.queued, 0);
        }
        drop(permits);
        let s = admission.snapshot();
        prop_assert_eq!((s.in_flight, s.kv_used), (0, 0));
    }
}
