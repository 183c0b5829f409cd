//! Loom models of `RetryBudget`: every interleaving (up to `LOOM_MAX_PREEMPTIONS`) of small races.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom cargo test --release -p kvgate --test retry_budget_loom`
//!
//! Each model races one operation on a spawned thread against one on the main thread. The clock is a
//! `ManualClock` that moves only between the model's phases, or `TwoClocks`, which gives the spawned
//! thread a reading a whole lap stale; so every outcome is decided by the order of the budget's own
//! operations: the CAS loops on the windows' words and the withdrawal lock. Checked by mutation:
//! withdrawals that drop the lock before recording fail `two_threads_race_for_the_last_retry`, and a
//! `fetch_add` in place of the word's CAS fails `a_stale_deposit_is_never_counted_in_a_newer_slice`.
#![cfg(loom)]

use kvgate::clock::{Clock, ManualClock};
use kvgate::retry::RetryBudget;
use loom::sync::Arc;
use loom::thread::{self, ThreadId};
use std::time::Duration;

/// A budget over 1 s (slices of 0.1 s) on a clock standing at `nanos`.
fn budget(min_retries_per_sec: u32, percent: f64, nanos: u64) -> (Arc<RetryBudget<ManualClock>>, ManualClock) {
    let clock = ManualClock::starting_at(nanos);
    let budget = RetryBudget::with_clock(Duration::from_secs(1), min_retries_per_sec, percent, clock.clone());
    (Arc::new(budget.expect("valid settings")), clock)
}

/// Two threads race for the last retry: exactly one gets it, and the balance is spent.
#[test]
fn two_threads_race_for_the_last_retry() {
    loom::model(|| {
        let (b, _clock) = budget(2, 0.0, 1_000);
        assert!(b.try_withdraw());
        let other = Arc::clone(&b);
        let t = thread::spawn(move || other.try_withdraw());
        let mine = b.try_withdraw();
        let theirs = t.join().unwrap();
        assert!(mine != theirs, "granted: mine {mine}, theirs {theirs}");
        assert_eq!(b.balance(), 0);
    });
}

/// A deposit racing a withdrawal that only it can pay for: the withdrawal either saw it or not, and the
/// balance left agrees.
#[test]
fn a_deposit_races_the_withdrawal_it_pays_for() {
    loom::model(|| {
        let (b, _clock) = budget(0, 1.0, 1_000);
        let other = Arc::clone(&b);
        let t = thread::spawn(move || other.try_withdraw());
        b.deposit();
        let granted = t.join().unwrap();
        assert_eq!(b.balance(), if granted { 0 } else { 1 });
    });
}

/// Two deposits race into a word that still holds a slice of the previous lap: one restarts the word
/// for the new slice, the other counts on top of it, and the old slice's count is gone.
#[test]
fn racing_deposits_restart_a_slice_once_and_both_count() {
    loom::model(|| {
        let (b, clock) = budget(0, 1.0, 0);
        b.deposit(); // slice 0
        clock.set_nanos(1_000_000_000); // slice 10: the same word, one lap later
        let other = Arc::clone(&b);
        let t = thread::spawn(move || {
            other.deposit();
            other.balance()
        });
        b.deposit();
        let seen = t.join().unwrap();
        assert!((1..=2).contains(&seen), "saw {seen}");
        assert_eq!(b.balance(), 2);
    });
}

/// A clock that reads `main_nanos` on the thread that made it and `other_nanos` on every other: a
/// spawned thread whose reading is stale by a whole lap, whatever the interleaving.
#[derive(Debug, Clone)]
struct TwoClocks {
    main: ThreadId,
    main_nanos: u64,
    other_nanos: u64,
}

impl Clock for TwoClocks {
    fn now_nanos(&self) -> u64 {
        if thread::current().id() == self.main { self.main_nanos } else { self.other_nanos }
    }
}

/// A deposit stamped in slice 0 races one stamped in slice 10, which uses the same word: the stale one
/// may erase the new one (the budget only gets stricter) but is never counted in slice 10.
#[test]
fn a_stale_deposit_is_never_counted_in_a_newer_slice() {
    loom::model(|| {
        let clock = TwoClocks { main: thread::current().id(), main_nanos: 1_000_000_000, other_nanos: 0 };
        let b = Arc::new(RetryBudget::with_clock(Duration::from_secs(1), 0, 1.0, clock).expect("valid settings"));
        let other = Arc::clone(&b);
        let t = thread::spawn(move || other.deposit());
        b.deposit();
        t.join().unwrap();
        let balance = b.balance();
        assert!(balance <= 1, "slice 10 counts {balance} first tries; one was stamped in slice 0");
    });
}
