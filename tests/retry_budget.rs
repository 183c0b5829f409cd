//! `RetryBudget`: the documented rule against a sequential model, the guarantee in real time, expiry, the
//! floor, clocks that step back, threads, bad configurations, and the budget inside `Backoff` and `retry`.
//!
//! The model (`Model`) keeps a log of every first try and every granted retry, with its time, and applies
//! the rule of the `retry` module docs from scratch at each call: slices of `q = ttl / 10` ns, the window
//! at a stamp is its slice and the nine before, balance `R + p·F - W` in millionths of a retry with
//! `R = min_retries_per_sec · ttl` (ttl in whole microseconds) and `p` rounded to a millionth. The budget
//! must agree with it on every `try_withdraw` and every `balance()`. Independently, every grant is checked
//! against the guarantee in real time (retries of the last `9q` against first tries of the last `10q`),
//! and each run against the multi-window bound (`ceil(n / 10) · R + p · F` over any `n` slices).
//!
//! Case count: 256 by default, `PROPTEST_CASES` overrides.

use kvgate::clock::{Clock, ManualClock};
use kvgate::retry::{
    Backoff, DEFAULT_BUDGET_TTL, DEFAULT_MIN_RETRIES_PER_SEC, DEFAULT_PERCENT_CAN_RETRY, RetryBudget, RetryHint,
    RetryPolicy, retry_after_for_status, retry_with_budget,
};
use kvgate::{Admission, ConfigError, Limit, Rejection};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const SLICES: u64 = 10;
const UNIT: i128 = 1_000_000;
const SEC: Duration = Duration::from_secs(1);

fn budget(ttl: Duration, min: u32, percent: f64, clock: &ManualClock) -> RetryBudget<ManualClock> {
    RetryBudget::with_clock(ttl, min, percent, clock.clone()).expect("valid settings")
}

/// The documented rule over a log of every event.
#[derive(Debug)]
struct Model {
    /// Slice length, ns.
    q: u64,
    /// `R`, in millionths of a retry.
    reserve: i128,
    /// `p`, in millionths of a retry per first try.
    deposit: i128,
    /// Times (ns) of every first try, in the order deposited.
    first_tries: Vec<u64>,
    /// Stamps (ns) of every granted retry, in the order granted.
    retries: Vec<u64>,
    /// First tries and retries per slice.
    per_slice: BTreeMap<u64, (i128, i128)>,
    /// The latest withdrawal stamp, ns.
    latest: u64,
}

impl Model {
    fn new(ttl: Duration, min: u32, percent: f64) -> Self {
        let ttl_nanos = ttl.as_nanos() as u64;
        Self {
            q: ttl_nanos / SLICES,
            reserve: i128::from(min) * i128::from(ttl_nanos / 1_000),
            deposit: (percent * 1e6).round() as i128,
            first_tries: Vec::new(),
            retries: Vec::new(),
            per_slice: BTreeMap::new(),
            latest: 0,
        }
    }

    /// First tries and retries in slices `first..=last`.
    fn counts(&self, first: u64, last: u64) -> (i128, i128) {
        self.per_slice.range(first..=last).fold((0, 0), |(f, w), (_, (df, dw))| (f + df, w + dw))
    }

    /// The balance in the window of a stamp at `at` (its slice and the nine before), with `extra_retries`
    /// more retries.
    fn units(&self, at: u64, extra_retries: i128) -> i128 {
        let slice = at / self.q;
        let (f, w) = self.counts(slice.saturating_sub(SLICES - 1), slice);
        self.reserve + self.deposit * f - UNIT * (w + extra_retries)
    }

    fn deposit(&mut self, now: u64) {
        self.first_tries.push(now);
        self.per_slice.entry(now / self.q).or_default().0 += 1;
    }

    fn grant(&mut self, at: u64) {
        self.retries.push(at);
        self.per_slice.entry(at / self.q).or_default().1 += 1;
    }

    /// The stamp a withdrawal at `now` gets: `now`, or the latest stamp if that is in a later slice.
    fn stamp(&mut self, now: u64) -> u64 {
        if now / self.q >= self.latest / self.q {
            self.latest = now;
        }
        self.latest
    }

    fn try_withdraw(&mut self, now: u64) -> bool {
        let at = self.stamp(now);
        let granted = self.units(at, 1) >= 0;
        if granted {
            self.grant(at);
        }
        granted
    }

    fn balance(&self, now: u64) -> u64 {
        let at = if now / self.q >= self.latest / self.q { now } else { self.latest };
        (self.units(at, 0).max(0) / UNIT) as u64
    }

    /// The guarantee in real time at a grant stamped `t`: the retries of `(t - 9q, t]` are at most `R`
    /// plus `p` times the first tries of `(t - 10q, t]`. For runs whose clock never goes back (the logs
    /// are then sorted).
    fn check_real_time_guarantee(&self, t: u64) -> Result<(), String> {
        let since = |log: &[u64], span: u64| {
            let from = log.partition_point(|&time| time.saturating_add(span) <= t);
            log[from..].iter().filter(|&&time| time <= t).count() as i128
        };
        let w = since(&self.retries, 9 * self.q);
        let f = since(&self.first_tries, 10 * self.q);
        if UNIT * w > self.reserve + self.deposit * f {
            return Err(format!("at {t}: {w} retries in the last 9q against {f} first tries in the last 10q"));
        }
        Ok(())
    }

    /// Over any `n` consecutive slices `a..=b`, the retries are at most `ceil(n / 10) · R + p ·` the first
    /// tries of `a - 9 ..= b`. The tightest ranges start and end at slices with retries.
    fn check_multi_window_bound(&self) -> Result<(), String> {
        let slices: Vec<u64> = self.per_slice.iter().filter(|(_, (_, w))| *w > 0).map(|(s, _)| *s).collect();
        for (i, &a) in slices.iter().enumerate() {
            for &b in &slices[i..] {
                let (_, w) = self.counts(a, b);
                let (f, _) = self.counts(a.saturating_sub(SLICES - 1), b);
                let windows = i128::from((b - a + 1).div_ceil(SLICES));
                if UNIT * w > windows * self.reserve + self.deposit * f {
                    return Err(format!("slices {a}..={b}: {w} retries against {f} first tries"));
                }
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
enum Op {
    Deposit(u16),
    Withdraw(u16),
    Advance(u64),
    Balance,
}

fn ttl() -> impl Strategy<Value = Duration> {
    prop_oneof![
        3 => (1_000u64..=60_000).prop_map(Duration::from_millis),
        1 => (1_000_000_000u64..=60_000_000_000).prop_map(Duration::from_nanos),
        1 => prop::sample::select(vec![SEC, DEFAULT_BUDGET_TTL, 60 * SEC]),
    ]
}

fn min_retries() -> impl Strategy<Value = u32> {
    prop_oneof![4 => 0u32..=3, 3 => 0u32..=50, 1 => Just(u32::MAX)]
}

fn percent() -> impl Strategy<Value = f64> {
    prop_oneof![
        2 => prop::sample::select(vec![0.0, 0.1, 0.2, 0.25, 1.0, 10.0]),
        3 => 0.0f64..=1.0,
        1 => 0.0f64..=10.0,
    ]
}

fn advance() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0u64..=300_000_000,
        3 => 0u64..=3_000_000_000,
        2 => 0u64..=70_000_000_000,
        1 => (1u64..=30).prop_map(|n| n * 100_000_000),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u16..=40).prop_map(Op::Deposit),
        4 => (0u16..=20).prop_map(Op::Withdraw),
        4 => advance().prop_map(Op::Advance),
        1 => Just(Op::Balance),
    ]
}

fn start() -> impl Strategy<Value = u64> {
    prop_oneof![4 => 0u64..=1_000_000_000_000, 1 => prop::sample::select(vec![u64::MAX / 2, u64::MAX - 100_000_000_000])]
}

proptest! {
    #![proptest_config(support::proptest_config(256))]

    /// Every decision and every balance as the model's; every grant within the guarantee in real time;
    /// every run within the multi-window bound.
    #[test]
    fn budget_matches_the_model_and_keeps_its_guarantee(
        ttl in ttl(),
        min in min_retries(),
        percent in percent(),
        start in start(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let clock = ManualClock::starting_at(start);
        let budget = budget(ttl, min, percent, &clock);
        let mut model = Model::new(ttl, min, percent);
        prop_assert_eq!(budget.balance(), model.balance(clock.now_nanos()));
        for op in ops {
            let now = clock.now_nanos();
            match op {
                Op::Deposit(n) => {
                    for _ in 0..n {
                        budget.deposit();
                        model.deposit(now);
                    }
                }
                Op::Withdraw(n) => {
                    for i in 0..n {
                        let granted = budget.try_withdraw();
                        prop_assert_eq!(granted, model.try_withdraw(now), "withdrawal {} at {}", i, now);
                        if granted {
                            model.check_real_time_guarantee(now).map_err(TestCaseError::fail)?;
                        }
                    }
                }
                Op::Advance(by) => clock.advance(Duration::from_nanos(by)),
                Op::Balance => {}
            }
            let balance = budget.balance();
            prop_assert_eq!(balance, model.balance(clock.now_nanos()));
            // Sequentially, a withdrawal succeeds exactly when the balance is at least 1.
            prop_assert_eq!(balance >= 1, model.units(clock.now_nanos().max(model.latest), 1) >= 0);
        }
        model.check_multi_window_bound().map_err(TestCaseError::fail)?;
    }

    /// With a clock that jumps back and forth, every grant still satisfies the rule against every first
    /// try ever deposited (the budget may lose some, never invent any), withdrawal stamps never go back,
    /// and nothing panics.
    #[test]
    fn a_clock_that_steps_back_never_loosens_the_budget(
        ttl in ttl(),
        min in 0u32..=5,
        percent in percent(),
        steps in prop::collection::vec((prop_oneof![0u64..=5_000_000_000, 0u64..=200_000_000_000], 0u16..=20, 0u16..=10), 1..60),
    ) {
        let clock = ManualClock::starting_at(100_000_000_000);
        let budget = budget(ttl, min, percent, &clock);
        let mut model = Model::new(ttl, min, percent);
        for (time, deposits, withdrawals) in steps {
            clock.set_nanos(time);
            for _ in 0..deposits {
                budget.deposit();
                model.deposit(time);
            }
            for _ in 0..withdrawals {
                let at = model.stamp(time);
                if budget.try_withdraw() {
                    prop_assert!(model.units(at, 1) >= 0, "granted at {} (stamp {}) beyond the rule", time, at);
                    model.grant(at);
                }
            }
            prop_assert!(budget.balance() <= model.balance(time));
        }
    }
}

#[test]
fn the_defaults_are_finagles() {
    assert_eq!((DEFAULT_BUDGET_TTL, DEFAULT_MIN_RETRIES_PER_SEC, DEFAULT_PERCENT_CAN_RETRY), (10 * SEC, 10, 0.2));
    let b = RetryBudget::default();
    assert_eq!((b.ttl(), b.min_retries_per_sec(), b.percent_can_retry(), b.balance()), (10 * SEC, 10, 0.2, 100));
    assert!(format!("{b:?}").contains("percent_can_retry: 0.2"));
}

#[test]
fn first_tries_pay_for_a_share_of_retries() {
    let clock = ManualClock::new();
    let b = budget(10 * SEC, 0, 0.2, &clock);
    assert!(!b.try_withdraw());
    for expected in [0, 0, 0, 0, 1, 1, 1, 1, 1, 2] {
        b.deposit();
        assert_eq!(b.balance(), expected);
    }
    assert!(b.try_withdraw() && b.try_withdraw() && !b.try_withdraw());
    // 1000 %: each first try pays for ten retries.
    let b = budget(SEC, 0, 10.0, &clock);
    b.deposit();
    assert_eq!((0..20).filter(|_| b.try_withdraw()).count(), 10);
}

#[test]
fn first_tries_and_retries_expire_slice_by_slice() {
    let clock = ManualClock::new();
    let b = budget(10 * SEC, 0, 1.0, &clock); // slices of 1 s
    for _ in 0..4 {
        b.deposit();
    }
    clock.advance(3 * SEC);
    b.deposit();
    assert_eq!(b.balance(), 5);
    clock.set_nanos(9_999_999_999); // slice 9: all five still count
    assert_eq!(b.balance(), 5);
    clock.set_nanos(10_000_000_000); // slice 10: the four of slice 0 have expired
    assert_eq!(b.balance(), 1);
    clock.set_nanos(13_000_000_000); // slice 13: the one of slice 3 too
    assert_eq!(b.balance(), 0);
    // A retry expires the same way: granted in slice 13, it counts until slice 22.
    b.deposit();
    assert!(b.try_withdraw());
    b.deposit();
    clock.set_nanos(22_999_999_999); // slice 22: slice 13's first tries (2) and retry (1) still count
    assert_eq!(b.balance(), 1);
    b.deposit();
    assert_eq!(b.balance(), 2);
    clock.set_nanos(23_000_000_000);
    assert_eq!(b.balance(), 1); // the one deposited at 22.99 s
}

/// A retry paid for by first tries that expire before it does keeps the balance below zero until it
/// expires too: the floor must cover it before anything else is granted.
#[test]
fn a_retry_outlives_the_first_tries_that_paid_for_it() {
    let clock = ManualClock::new();
    let b = budget(10 * SEC, 0, 0.5, &clock);
    for _ in 0..10 {
        b.deposit(); // slice 0: 5 retries
    }
    clock.set_nanos(9_000_000_000);
    assert_eq!((0..9).filter(|_| b.try_withdraw()).count(), 5); // slice 9
    clock.set_nanos(10_000_000_000); // slice 10: the first tries are gone, the retries are not
    for _ in 0..9 {
        b.deposit(); // 4.5 retries' worth, against 5 still counted
    }
    assert_eq!(b.balance(), 0);
    assert!(!b.try_withdraw());
    b.deposit();
    b.deposit(); // 5.5 against 5
    assert_eq!(b.balance(), 0);
    b.deposit(); // 6 against 5
    assert!(b.try_withdraw());
    clock.set_nanos(19_000_000_000); // slice 19: the five retries of slice 9 are gone
    assert_eq!(b.balance(), 5);
}

#[test]
fn the_floor_lets_a_quiet_client_retry_and_renews_each_window() {
    let clock = ManualClock::new();
    let b = budget(5 * SEC, 2, 0.2, &clock); // R = 10, slices of 0.5 s
    assert_eq!((0..25).filter(|_| b.try_withdraw()).count(), 10); // a reserve, spendable at once
    clock.set_nanos(4_999_999_999);
    assert!(!b.try_withdraw());
    clock.set_nanos(5_000_000_000);
    assert_eq!((0..25).filter(|_| b.try_withdraw()).count(), 10);
    // First tries add to the floor.
    clock.set_nanos(10_000_000_000);
    for _ in 0..10 {
        b.deposit();
    }
    assert_eq!(b.balance(), 12);
}

#[test]
fn zero_floor_and_zero_percent_never_retry() {
    let clock = ManualClock::new();
    let b = budget(SEC, 0, 0.0, &clock);
    for _ in 0..1_000 {
        b.deposit();
    }
    assert_eq!(b.balance(), 0);
    assert!(!b.try_withdraw());
}

/// A withdrawal is stamped no earlier than the latest one: moving the clock back cannot open a window
/// that leaves the newest retries out.
#[test]
fn withdrawal_stamps_never_go_back() {
    let clock = ManualClock::starting_at(20_000_000_000);
    let b = budget(SEC, 1, 0.0, &clock);
    assert!(b.try_withdraw());
    clock.set_nanos(0);
    assert_eq!(b.balance(), 0);
    assert!(!b.try_withdraw());
    clock.set_nanos(20_900_000_000); // still slice 209's window
    assert!(!b.try_withdraw());
    clock.set_nanos(21_000_000_000);
    assert!(b.try_withdraw());
}

/// Extreme clock readings and jumps: nothing panics, and the budget stays within its rule.
#[test]
fn any_clock_reading_is_safe() {
    for start in [0, 1, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
        let clock = ManualClock::starting_at(start);
        let b = budget(SEC, 3, 10.0, &clock);
        b.deposit();
        assert_eq!(b.balance(), 13);
        assert_eq!((0..20).filter(|_| b.try_withdraw()).count(), 13);
        clock.advance(Duration::MAX); // saturates at u64::MAX
        b.deposit();
        let _ = (b.try_withdraw(), b.balance());
        clock.set_nanos(0);
        b.deposit();
        let _ = (b.try_withdraw(), b.balance());
    }
}

#[test]
fn bad_configurations_are_refused() {
    let cases: [(Duration, f64, &str); 10] = [
        (Duration::ZERO, 0.2, "ttl"),
        (Duration::from_millis(999), 0.2, "ttl"),
        (Duration::from_nanos(60_000_000_001), 0.2, "ttl"),
        (Duration::MAX, 0.2, "ttl"),
        (10 * SEC, -0.01, "percent_can_retry"),
        (10 * SEC, -0.0 - f64::MIN_POSITIVE, "percent_can_retry"),
        (10 * SEC, 10.000_001, "percent_can_retry"),
        (10 * SEC, f64::NAN, "percent_can_retry"),
        (10 * SEC, f64::INFINITY, "percent_can_retry"),
        (10 * SEC, f64::NEG_INFINITY, "percent_can_retry"),
    ];
    for (ttl, percent, setting) in cases {
        let err = RetryBudget::new(ttl, 10, percent).unwrap_err();
        match &err {
            ConfigError::OutOfRange { what, .. } => assert!(what.ends_with(setting), "{ttl:?} {percent}: {err}"),
            other => panic!("{ttl:?} {percent}: {other:?}"),
        }
        // The message says what is accepted.
        let message = err.to_string();
        assert!(message.contains("from 1 s to 60 s") || message.contains("from 0.0 to 10.0"), "{message}");
    }
}

#[test]
fn the_edges_of_the_ranges_are_accepted() {
    let clock = ManualClock::new();
    for (ttl, percent) in [(SEC, 0.0), (60 * SEC, 10.0), (SEC, -0.0), (Duration::from_nanos(60_000_000_000), 1e-9)] {
        assert!(RetryBudget::with_clock(ttl, 0, percent, clock.clone()).is_ok(), "{ttl:?} {percent}");
    }
    let b = budget(60 * SEC, u32::MAX, 10.0, &clock);
    assert_eq!(b.balance(), u64::from(u32::MAX) * 60);
    b.deposit();
    assert_eq!(b.balance(), u64::from(u32::MAX) * 60 + 10);
    assert_eq!(budget(SEC, 0, 0.123_456_7, &clock).percent_can_retry(), 0.123_457);
}

/// Four threads race for a balance of 1000 while the clock stands still: exactly 1000 are granted.
#[test]
fn threads_racing_for_the_balance_never_overdraw() {
    let rounds = if cfg!(miri) { 2 } else { 20 };
    for _ in 0..rounds {
        let clock = ManualClock::new();
        let b = budget(10 * SEC, 100, 0.0, &clock);
        let granted = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    let mine = (0..600).filter(|_| b.try_withdraw()).count() as u64;
                    granted.fetch_add(mine, Ordering::Relaxed);
                });
            }
        });
        assert_eq!(granted.into_inner(), 1_000);
        assert_eq!(b.balance(), 0);
    }
}

/// Two threads deposit while two withdraw: no grant ever exceeds what was deposited before it, and at
/// the end the grants and the balance add up to exactly what the deposits and the floor pay for.
#[test]
fn deposits_and_withdrawals_from_many_threads_add_up() {
    let (deposits, rounds) = if cfg!(miri) { (50, 1) } else { (5_000, 5) };
    for _ in 0..rounds {
        let clock = ManualClock::new();
        let b = budget(10 * SEC, 1, 0.1, &clock); // R = 10
        let (deposited, granted) = (AtomicU64::new(0), AtomicU64::new(0));
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..deposits {
                        b.deposit();
                        deposited.fetch_add(1, Ordering::SeqCst);
                    }
                });
                s.spawn(|| {
                    for _ in 0..deposits {
                        // Counted before the withdrawal: an upper bound on the deposits it can have seen.
                        if b.try_withdraw() {
                            let now = granted.fetch_add(1, Ordering::SeqCst) + 1;
                            let ceiling = 10 + deposited.load(Ordering::SeqCst) / 10 + 2;
                            assert!(now <= ceiling, "{now} granted against at most {ceiling}");
                        }
                    }
                });
            }
        });
        let (deposited, granted) = (deposited.into_inner(), granted.into_inner());
        assert_eq!(deposited, 2 * deposits);
        assert_eq!(granted + b.balance(), 10 + deposited / 10);
    }
}

#[derive(Debug)]
struct Overloaded;

impl RetryHint for Overloaded {
    fn is_retryable(&self) -> bool {
        true
    }
}

/// 100 operations that always fail, 5 tries each, sharing one budget: 400 retries without it, exactly
/// `R + p · 100` with it.
#[test]
fn a_shared_budget_caps_the_retries_of_many_operations() {
    let clock = ManualClock::new();
    let b = Arc::new(budget(10 * SEC, 1, 0.2, &clock)); // R = 10, 20 retries from the first tries
    let policy = RetryPolicy::new().max_tries(5).seed(1);
    let mut calls = 0;
    for _ in 0..100 {
        let result: Result<(), Overloaded> = futures::executor::block_on(retry_with_budget(
            &policy,
            &b,
            || {
                calls += 1;
                async { Err(Overloaded) }
            },
            |_| async {},
        ));
        assert!(result.is_err());
    }
    assert_eq!(calls, 100 + 30);
    // The same operations through backoffs: every retry the budget grants is one `next_delay` less `None`.
    let b = Arc::new(budget(10 * SEC, 1, 0.2, &clock));
    let retries: usize = (0..100).map(|_| policy.backoff_with_budget(&b).count()).sum();
    assert_eq!(retries, 30);
}

/// A `Backoff` that can hold a budget keeps the auto traits it had before; so does the budget.
#[test]
fn backoffs_and_budgets_stay_send_sync_and_unwind_safe() {
    fn check<T: Send + Sync + UnwindSafe + RefUnwindSafe + Clone>() {}
    check::<Backoff>();
    fn check_budget<T: Send + Sync + UnwindSafe + RefUnwindSafe>() {}
    check_budget::<RetryBudget>();
    check_budget::<RetryBudget<ManualClock>>();
}

#[test]
fn a_first_try_deposits_even_when_it_succeeds() {
    let clock = ManualClock::new();
    let b = Arc::new(budget(SEC, 0, 0.5, &clock));
    for _ in 0..4 {
        let ok: Result<u8, Overloaded> =
            futures::executor::block_on(retry_with_budget(&RetryPolicy::new(), &b, || async { Ok(1) }, |_| async {}));
        assert_eq!(ok.ok(), Some(1));
    }
    assert_eq!(b.balance(), 2);
    // A backoff that is never asked for a delay (the first try succeeded) still counted its first try.
    let _unused = RetryPolicy::new().backoff_with_budget(&b);
    let _unused = RetryPolicy::new().backoff_with_budget(&b);
    assert_eq!(b.balance(), 3);
}

/// The contract between kvgate servers and `retry_after_for_status`: an answer built by
/// `http::rejection_response` is worth retrying exactly when its rejection is retryable.
#[test]
fn kvgate_answers_are_final_exactly_when_they_carry_no_hint() {
    let admission = Admission::builder().build().unwrap();
    let ms = Duration::from_millis(1);
    let rejections = [
        Rejection::NoCapacity { retry_after: 1_200 * ms },
        Rejection::RateLimited { retry_after: 250 * ms },
        Rejection::QueueFull { retry_after: 3 * ms },
        Rejection::TimedOut,
        Rejection::Closed,
        Rejection::Invalid { reason: "bad" },
        Rejection::TooLarge { limit: Limit::KvBudget, requested: 2, capacity: 1 },
    ];
    for rejection in rejections {
        for all_as_429 in [false, true] {
            let response = kvgate::http::rejection_response(&rejection, &admission, all_as_429);
            let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok());
            let hint =
                retry_after_for_status(response.status().as_u16(), header("retry-after"), header("retry-after-ms"));
            assert_eq!(hint.is_some(), rejection.is_retryable(), "{rejection:?} as 429: {all_as_429}");
            if let Some(own) = rejection.retry_after() {
                assert_eq!(hint, Some(own), "{rejection:?}");
            }
        }
    }
}
