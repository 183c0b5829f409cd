//! `Admission` on a `ManualClock` with the deadline timer off (fully deterministic): arbitrary sequences
//! of try_admit / admit (polled by hand with a no-op waker, cancelled at random) / drop / complete /
//! resize / rate changes / close / clock moves (forwards and backwards) / expire_waiters.
//!
//! Checked after every step: usage never grows above a limit (shrinking revokes nothing, so usage may sit
//! above a freshly shrunk limit but never rises while there), live permits account for the snapshot
//! (a granted-but-unpolled waiter may hold capacity too, so `permits <= in_flight <= permits + waiters`,
//! and the same for KV), queues never exceed their capacity, rejections hold nothing and carry a positive
//! retry hint exactly when retrying can help. At a `Settle` step and at the end every waiter is polled,
//! after which the snapshot equals the sum over live permits exactly; when everything is dropped the
//! snapshot is back to zero.
#![no_main]

use futures::FutureExt;
use kvgate::clock::{Clock, ManualClock};
use kvgate::{Admission, Admit, Permit, Priority, Rejection, Request};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

#[derive(Debug, Arbitrary)]
struct Req {
    prompt: u16,
    max_new: u16,
    class: u8,
    max_wait_ms: Option<u8>,
    /// Use the extreme token counts (0 or u32::MAX) instead.
    extreme: Option<bool>,
}

impl Req {
    fn build(&self) -> Request {
        let (p, n) = match self.extreme {
            Some(true) => (u32::MAX, u32::MAX),
            Some(false) => (0, 0),
            None => (u32::from(self.prompt % 200), u32::from(self.max_new % 200)),
        };
        let class = [Priority::Batch, Priority::Normal, Priority::Interactive][usize::from(self.class % 3)];
        let mut r = Request::new(p, n).priority(class);
        if let Some(ms) = self.max_wait_ms {
            r = r.max_wait(Duration::from_millis(u64::from(ms % 50)));
        }
        r
    }
}

#[derive(Debug, Arbitrary)]
enum Op {
    TryAdmit(Req),
    Admit(Req),
    Poll(u8),
    Cancel(u8),
    DropPermit(u8),
    Complete(u8, u16),
    AdvanceMs(u8),
    /// Clock steps backwards by this many ms (saturating at 0).
    BackMs(u8),
    Expire,
    SetMaxInFlight(u8),
    SetKv(u16),
    SetRequestRate(u32, u8),
    SetTokenRate(u32, u16),
    Close,
    Settle,
}

#[derive(Debug, Arbitrary)]
struct Input {
    max_in_flight: Option<u8>,
    kv_capacity: Option<u16>,
    queue_capacity: u8,
    request_rate: Option<(u8, u8)>,
    token_rate: Option<(u16, u16)>,
    max_queue_wait_ms: Option<u8>,
    ops: Vec<Op>,
}

struct Live {
    permits: Vec<Permit>,
    waiters: Vec<(Admit, u64)>,
}

impl Live {
    fn permit_kv(&self) -> u64 {
        self.permits.iter().map(Permit::kv_reserved).sum()
    }
    fn waiter_kv(&self) -> u64 {
        self.waiters.iter().map(|w| w.1).sum()
    }
}

fn check_rejection(r: &Rejection) {
    match r {
        Rejection::NoCapacity { retry_after }
        | Rejection::RateLimited { retry_after }
        | Rejection::QueueFull { retry_after } => {
            assert!(*retry_after > Duration::ZERO, "zero retry hint in {r:?}")
        }
        Rejection::TooLarge { requested, capacity, .. } => {
            assert!(requested > capacity);
            assert_eq!(r.retry_after(), None)
        }
        _ => assert_eq!(r.retry_after(), None),
    }
}

/// Polls every waiter once; resolved ones become permits or are dropped.
fn settle(live: &mut Live) {
    let mut i = 0;
    while i < live.waiters.len() {
        match (&mut live.waiters[i].0).now_or_never() {
            None => i += 1,
            Some(result) => {
                drop(live.waiters.swap_remove(i));
                match result {
                    Ok(p) => live.permits.push(p),
                    Err(r) => check_rejection(&r),
                }
            }
        }
    }
}

fn exact(admission: &Admission<ManualClock>, live: &Live) {
    let s = admission.snapshot();
    assert_eq!(s.in_flight, live.permits.len(), "in_flight vs live permits after settling");
    assert_eq!(s.kv_used, live.permit_kv(), "kv_used vs live permits after settling");
}

fuzz_target!(|input: Input| {
    let clock = ManualClock::starting_at(1_000_000_000_000);
    let mut builder = Admission::builder()
        .queue_capacity(usize::from(input.queue_capacity % 6))
        .deadline_timer(false)
        .clock(clock.clone());
    if let Some(n) = input.max_in_flight {
        builder = builder.max_in_flight(usize::from(n % 8).max(1));
    }
    if let Some(kv) = input.kv_capacity {
        builder = builder.kv_capacity_tokens(u64::from(kv % 1000).max(1));
    }
    if let Some((rate, burst)) = input.request_rate {
        builder = builder.request_rate(f64::from(rate.max(1)) * 10.0, u32::from(burst.max(1)));
    }
    if let Some((rate, burst)) = input.token_rate {
        builder = builder.token_rate(f64::from(rate.max(1)) * 100.0, u64::from(burst.max(1)));
    }
    if let Some(ms) = input.max_queue_wait_ms {
        builder = builder.max_queue_wait(Duration::from_millis(u64::from(ms)));
    }
    let admission = builder.build().expect("valid configuration refused");
    let queue_capacity = usize::from(input.queue_capacity % 6);
    let mut live = Live { permits: Vec::new(), waiters: Vec::new() };
    let mut before = admission.snapshot();

    for op in input.ops.iter().take(300) {
        match op {
            Op::TryAdmit(req) => {
                let request = req.build();
                match admission.try_admit(&request) {
                    Ok(p) => {
                        assert_eq!(p.kv_reserved(), admission.kv_cost(&request));
                        live.permits.push(p);
                    }
                    Err(r) => {
                        check_rejection(&r);
                        // All or nothing: a refusal holds nothing.
                        let s = admission.snapshot();
                        assert_eq!((s.in_flight, s.kv_used), (before.in_flight, before.kv_used));
                    }
                }
            }
            Op::Admit(req) => {
                let request = req.build();
                let kv = admission.kv_cost(&request);
                let mut fut = admission.admit(&request);
                match (&mut fut).now_or_never() {
                    None => live.waiters.push((fut, kv)),
                    Some(Ok(p)) => live.permits.push(p),
                    Some(Err(r)) => check_rejection(&r),
                }
            }
            Op::Poll(i) if !live.waiters.is_empty() => {
                let i = usize::from(*i) % live.waiters.len();
                if let Some(result) = (&mut live.waiters[i].0).now_or_never() {
                    drop(live.waiters.swap_remove(i));
                    match result {
                        Ok(p) => live.permits.push(p),
                        Err(r) => check_rejection(&r),
                    }
                }
            }
            Op::Cancel(i) if !live.waiters.is_empty() => {
                let i = usize::from(*i) % live.waiters.len();
                drop(live.waiters.swap_remove(i));
            }
            Op::DropPermit(i) if !live.permits.is_empty() => {
                let i = usize::from(*i) % live.permits.len();
                drop(live.permits.swap_remove(i));
            }
            Op::Complete(i, out) if !live.permits.is_empty() => {
                let i = usize::from(*i) % live.permits.len();
                live.permits.swap_remove(i).complete(u32::from(*out));
            }
            Op::AdvanceMs(ms) => clock.advance(Duration::from_millis(u64::from(*ms))),
            Op::BackMs(ms) => clock.set_nanos(clock.now_nanos().saturating_sub(u64::from(*ms) * 1_000_000)),
            Op::Expire => {
                admission.expire_waiters();
            }
            Op::SetMaxInFlight(n) => {
                let n = usize::from(n % 8);
                assert_eq!(admission.set_max_in_flight(n).is_ok(), n != 0);
            }
            Op::SetKv(kv) => {
                let kv = u64::from(kv % 1000);
                assert_eq!(admission.set_kv_capacity(kv).is_ok(), kv != 0);
            }
            Op::SetRequestRate(rate, burst) => {
                let rate = f64::from(*rate) / 16.0;
                let ok = admission.set_request_rate(rate, u32::from(*burst)).is_ok();
                let valid = input.request_rate.is_some() && (0.001..=1e9).contains(&rate) && *burst != 0;
                assert_eq!(ok, valid, "set_request_rate({rate}, {burst})");
            }
            Op::SetTokenRate(rate, burst) => {
                let rate = f64::from(*rate) / 16.0;
                let ok = admission.set_token_rate(rate, u64::from(*burst)).is_ok();
                let valid = input.token_rate.is_some() && (0.001..=1e9).contains(&rate) && *burst != 0;
                assert_eq!(ok, valid, "set_token_rate({rate}, {burst})");
            }
            Op::Close => admission.close(),
            Op::Settle => {
                settle(&mut live);
                exact(&admission, &live);
            }
            Op::Poll(_) | Op::Cancel(_) | Op::DropPermit(_) | Op::Complete(..) => {}
        }
        let s = admission.snapshot();
        // Conservation: permits hold their reservations; a granted-but-unpolled waiter may hold its own.
        assert!(s.in_flight >= live.permits.len() && s.in_flight <= live.permits.len() + live.waiters.len());
        assert!(s.kv_used >= live.permit_kv() && s.kv_used <= live.permit_kv() + live.waiter_kv());
        // Limits: usage never rises while at or above a limit.
        if s.in_flight > before.in_flight {
            assert!(s.in_flight <= s.max_in_flight, "in_flight {} above limit {}", s.in_flight, s.max_in_flight);
        }
        if s.kv_used > before.kv_used {
            assert!(s.kv_used <= s.kv_capacity, "kv_used {} above budget {}", s.kv_used, s.kv_capacity);
        }
        // Bounded: each class holds at most queue_capacity waiters; every queued waiter is a live future.
        for class in [Priority::Batch, Priority::Normal, Priority::Interactive] {
            assert!(admission.queued_in(class) <= queue_capacity);
        }
        assert!(s.queued <= live.waiters.len());
        assert_eq!(s.queue_capacity, queue_capacity);
        if s.closed {
            assert!(admission.try_admit(&Request::new(1, 1)).is_err_and(|r| r == Rejection::Closed));
        }
        before = admission.snapshot();
    }

    settle(&mut live);
    exact(&admission, &live);
    drop(live.waiters);
    drop(live.permits);
    let s = admission.snapshot();
    assert_eq!((s.in_flight, s.kv_used, s.queued), (0, 0, 0), "capacity left after everything was dropped");
});
