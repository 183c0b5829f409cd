//! Every refusal, for every reason and on every path (`try_admit`, `admit`, `admit_blocking`), is counted
//! exactly once under its reason in the snapshot, and leaves nothing held or charged; waiters that end in
//! the queue (timed out, budget shrunk, closed) are counted once, when they resolve.
#![cfg(not(loom))]

use futures::FutureExt;
use kvgate::clock::{Clock, ManualClock};
use kvgate::{Admission, Permit, Rejection, RejectionCounts, Request, TenantLimits};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Hook = Box<dyn FnOnce() + Send>;

/// A manual clock that runs a hook (once) on its next reading.
#[derive(Clone)]
struct HookClock {
    time: ManualClock,
    hook: Arc<Mutex<Option<Hook>>>,
}

impl std::fmt::Debug for HookClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HookClock")
    }
}

impl Clock for HookClock {
    fn now_nanos(&self) -> u64 {
        let hook = self.hook.lock().unwrap().take();
        if let Some(hook) = hook {
            hook();
        }
        self.time.now_nanos()
    }
    fn real_time_until(&self, _: u64) -> Duration {
        Duration::from_millis(1)
    }
}

type A = Admission<HookClock>;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Try,
    Admit,
    Blocking,
}

struct Case {
    admission: Arc<A>,
    request: Request,
    _held: Vec<Permit>,
    _waiting: Vec<kvgate::Admit>,
}

fn clock() -> HookClock {
    HookClock { time: ManualClock::starting_at(1_000_000_000), hook: Arc::new(Mutex::new(None)) }
}

fn base() -> kvgate::AdmissionBuilder<HookClock> {
    Admission::builder().clock(clock()).deadline_timer(false)
}

/// Builds case `name`; `field` is the reason it must be counted under in `mode`.
fn case(name: &str, mode: Mode) -> (Case, fn(&RejectionCounts) -> u64) {
    let r = Request::new(10, 10);
    let t = Request::new(10, 10).tenant("t");
    let mut held = Vec::new();
    let mut waiting = Vec::new();
    let (admission, request, field): (A, Request, fn(&RejectionCounts) -> u64) = match name {
        "invalid" => (base().build().unwrap(), Request::new(0, 0), |c| c.invalid),
        "closed" => {
            let a = base().build().unwrap();
            a.close();
            (a, r, |c| c.closed)
        }
        "too_large_kv" => (base().kv_capacity_tokens(10).build().unwrap(), r, |c| c.too_large),
        "too_large_burst" => (base().token_rate(1.0, 5).build().unwrap(), r, |c| c.too_large),
        "tenant_share" => (
            base().kv_capacity_tokens(100).tenant_defaults(TenantLimits::new().kv_share(0.1)).build().unwrap(),
            t,
            |c| c.too_large,
        ),
        "tenant_burst" => {
            (base().tenant_defaults(TenantLimits::new().token_rate(1.0, 5)).build().unwrap(), t, |c| c.too_large)
        }
        "no_capacity" => {
            let a = base().max_in_flight(1).queue_capacity(0).build().unwrap();
            held.push(a.try_admit(&r).unwrap());
            (a, r, |c| c.no_capacity)
        }
        "no_capacity_kv" => {
            let a = base().kv_capacity_tokens(30).queue_capacity(0).build().unwrap();
            held.push(a.try_admit(&r).unwrap());
            (a, r, |c| c.no_capacity)
        }
        "tenant_cap" => {
            let a = base().queue_capacity(0).tenant_defaults(TenantLimits::new().max_in_flight(1)).build().unwrap();
            held.push(a.try_admit(&t).unwrap());
            (a, t, |c| c.rate_limited)
        }
        "global_rate" => {
            let a = base().request_rate(1.0, 1).build().unwrap();
            drop(a.try_admit(&r).unwrap());
            (a, r, |c| c.rate_limited)
        }
        "global_token_rate" => {
            let a = base().token_rate(1.0, 30).build().unwrap();
            drop(a.try_admit(&r).unwrap());
            (a, r, |c| c.rate_limited)
        }
        "tenant_rate" => {
            let a = base().tenant_defaults(TenantLimits::new().request_rate(1.0, 1)).build().unwrap();
            drop(a.try_admit(&t).unwrap());
            (a, t, |c| c.rate_limited)
        }
        "closed_after_charging" | "closed_at_take_tenant" => {
            let a = base().request_rate(1000.0, 10).tenant_defaults(TenantLimits::new()).build().unwrap();
            let req = if name.ends_with("tenant") { t } else { r };
            (a, req, |c| c.closed)
        }
        "no_capacity_prefix" => {
            let a = base().max_in_flight(1).queue_capacity(0).prefix_sharing(8).build().unwrap();
            let p = Request::new(10, 10).prefix(7u64, 5);
            held.push(a.try_admit(&p).unwrap());
            (a, p, |c| c.no_capacity)
        }
        "global_rate_prefix" => {
            let a = base().request_rate(1.0, 1).prefix_sharing(8).build().unwrap();
            let p = Request::new(10, 10).prefix(7u64, 5);
            drop(a.try_admit(&p).unwrap());
            (a, p, |c| c.rate_limited)
        }
        "tenant_rate_prefix" => {
            let a = base().prefix_sharing(8).tenant_defaults(TenantLimits::new().token_rate(1.0, 30)).build().unwrap();
            let p = Request::new(10, 10).prefix(7u64, 5).tenant("t");
            held.push(a.try_admit(&p.tenant("u")).unwrap());
            drop(a.try_admit(&p).unwrap());
            (a, p, |c| c.rate_limited)
        }
        "queue_full" => {
            let a = base().max_in_flight(1).queue_capacity(1).build().unwrap();
            held.push(a.try_admit(&r).unwrap());
            let mut w = a.admit(&r);
            assert!((&mut w).now_or_never().is_none());
            waiting.push(w);
            (a, r, if mode == Mode::Try { |c: &RejectionCounts| c.no_capacity } else { |c| c.queue_full })
        }
        "shed" => {
            let a =
                base().max_in_flight(1).queue_capacity(4).expected_hold_time(Duration::from_secs(10)).build().unwrap();
            held.push(a.try_admit(&r).unwrap());
            let mut req = r;
            req.ttft_deadline = Some(Duration::from_millis(1));
            (a, req, |c| c.no_capacity)
        }
        "timed_out_now" => {
            let a = base().max_in_flight(1).queue_capacity(4).build().unwrap();
            held.push(a.try_admit(&r).unwrap());
            let mut req = r;
            req.max_wait = Some(Duration::ZERO);
            (a, req, if mode == Mode::Try { |c: &RejectionCounts| c.no_capacity } else { |c| c.timed_out })
        }
        other => panic!("unknown case {other}"),
    };
    let admission = Arc::new(admission);
    if name.starts_with("closed_") {
        // Without a tenant the decision first reads the clock once capacity is taken, just before charging
        // the rates: closing then takes the closed-after-charging path (charged, refunded, released). With
        // a tenant the first reading is the tenant lookup, before the take: the take sees `CLOSED`.
        let weak = Arc::downgrade(&admission);
        *admission.clock().hook.lock().unwrap() = Some(Box::new(move || weak.upgrade().unwrap().close()));
    }
    (Case { admission, request, _held: held, _waiting: waiting }, field)
}

const CASES: &[&str] = &[
    "invalid",
    "closed",
    "too_large_kv",
    "too_large_burst",
    "tenant_share",
    "tenant_burst",
    "no_capacity",
    "no_capacity_kv",
    "tenant_cap",
    "global_rate",
    "global_token_rate",
    "tenant_rate",
    "closed_after_charging",
    "closed_at_take_tenant",
    "no_capacity_prefix",
    "global_rate_prefix",
    "tenant_rate_prefix",
    "queue_full",
    "shed",
    "timed_out_now",
];

fn run(case: &Case, mode: Mode) -> Result<Permit, Rejection> {
    match mode {
        Mode::Try => case.admission.try_admit(&case.request),
        Mode::Admit => case.admission.admit(&case.request).now_or_never().expect("resolves at once"),
        Mode::Blocking => case.admission.admit_blocking(&case.request, None),
    }
}

#[test]
fn every_refusal_is_counted_once_under_its_reason_and_holds_nothing() {
    let mut failures = Vec::new();
    for &name in CASES {
        for mode in [Mode::Try, Mode::Admit, Mode::Blocking] {
            let (case, field) = case(name, mode);
            let before = case.admission.snapshot();
            let rates_before = case.admission.rate_status(case.request.tenant);
            let result = run(&case, mode);
            let after = case.admission.snapshot();
            let Err(rejection) = result else {
                failures.push(format!("{name} {mode:?}: admitted"));
                continue;
            };
            let total = after.rejected.total() - before.rejected.total();
            let own = field(&after.rejected) - field(&before.rejected);
            if total != 1 || own != 1 {
                failures.push(format!("{name} {mode:?}: {rejection:?} counted {total} times ({own} under its reason)"));
            }
            if (after.in_flight, after.kv_used, after.admitted) != (before.in_flight, before.kv_used, before.admitted) {
                failures.push(format!("{name} {mode:?}: holds something: {before:?} -> {after:?}"));
            }
            let rates_after = case.admission.rate_status(case.request.tenant);
            let remaining =
                |s: &kvgate::RateLimitStatus| (s.requests.map(|r| r.remaining), s.tokens.map(|r| r.remaining));
            if remaining(&rates_before) != remaining(&rates_after) {
                failures.push(format!("{name} {mode:?}: rates not refunded: {rates_before:?} -> {rates_after:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Waiters that end after queueing (timed out, budget shrunk, closed) are counted once, when they resolve.
#[test]
fn waiters_ending_in_the_queue_are_counted_once() {
    let clock = clock();
    let a = Admission::builder()
        .clock(clock.clone())
        .deadline_timer(false)
        .max_in_flight(1)
        .kv_capacity_tokens(100)
        .queue_capacity(8)
        .request_rate(1.0, 100)
        .build()
        .unwrap();
    let r = Request::new(10, 10);
    let held = a.try_admit(&r).unwrap();
    let mut timed = r;
    timed.max_wait = Some(Duration::from_millis(5));
    let mut w1 = a.admit(&timed);
    let mut w2 = a.admit(&Request::new(40, 40));
    let mut w3 = a.admit(&r);
    for w in [&mut w1, &mut w2, &mut w3] {
        assert!(w.now_or_never().is_none());
    }
    let rejected = |a: &A| a.snapshot().rejected;
    clock.time.advance(Duration::from_millis(10));
    assert_eq!(a.expire_waiters(), 1);
    assert!(matches!((&mut w1).now_or_never(), Some(Err(Rejection::TimedOut))));
    assert_eq!((rejected(&a).timed_out, rejected(&a).total()), (1, 1));
    a.set_kv_capacity(60).unwrap();
    assert!(matches!((&mut w2).now_or_never(), Some(Err(Rejection::TooLarge { .. }))));
    assert_eq!((rejected(&a).too_large, rejected(&a).total()), (1, 2));
    a.close();
    assert!(matches!((&mut w3).now_or_never(), Some(Err(Rejection::Closed))));
    assert_eq!((rejected(&a).closed, rejected(&a).total()), (1, 3));
    drop(held);
    assert_eq!(rejected(&a).total(), 3);
    let s = a.snapshot();
    assert_eq!((s.in_flight, s.kv_used, s.queued), (0, 0, 0));
    assert_eq!(a.rate_status(None).requests.unwrap().remaining, 99);
}
