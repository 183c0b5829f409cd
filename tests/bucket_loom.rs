//! Loom models of `TokenBucket`: every interleaving (up to `LOOM_MAX_PREEMPTIONS`) of small races.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release --test bucket_loom`
//!
//! The clock is a `ManualClock` that does not move during a model, so every outcome is determined by the
//! order of the atomic operations alone. The operation whose result is checked runs on the spawned thread:
//! loom then explores it against every point of the main thread's operation (checked by mutation: a CAS
//! replaced by a store, a seqlock without its version re-check, and a rate change that converts `tat`
//! without flipping its generation bit, each fail these models). Every `set_rate` here changes the unit
//! (units per token), so `tat` is converted while the other thread works.
#![cfg(loom)]

use kvgate::bucket::{AcquireError, TokenBucket};
use kvgate::clock::ManualClock;
use loom::sync::Arc;
use loom::thread;

fn bucket(rate: f64, burst: u64) -> Arc<TokenBucket<ManualClock>> {
    Arc::new(TokenBucket::with_clock(rate, burst, ManualClock::starting_at(1_000)).unwrap())
}

/// Two threads race for the last two tokens, two requests each: exactly two are granted.
#[test]
fn two_threads_race_for_the_last_tokens() {
    loom::model(|| {
        let b = bucket(0.001, 2);
        let other = Arc::clone(&b);
        let t = thread::spawn(move || (0..2).filter(|_| other.try_acquire(1).is_ok()).count());
        let mine = (0..2).filter(|_| b.try_acquire(1).is_ok()).count();
        let theirs = t.join().unwrap();
        assert_eq!(mine + theirs, 2, "granted {mine} + {theirs} of 2 tokens");
        assert_eq!(b.available(), 0);
    });
}

/// A refund racing an acquire of the last token: either the acquire saw the refund or it did not, and the
/// final state is consistent with that order.
#[test]
fn refund_races_acquire() {
    loom::model(|| {
        let b = bucket(0.001, 2);
        b.try_acquire(2).unwrap();
        let other = Arc::clone(&b);
        let t = thread::spawn(move || other.try_acquire(1));
        b.refund(1);
        let got = t.join().unwrap();
        match got {
            Ok(()) => assert_eq!(b.available(), 0, "acquire after refund"),
            Err(AcquireError::NotYet { .. }) => {
                assert_eq!(b.available(), 1, "acquire before refund")
            }
            Err(e) => panic!("{e:?}"),
        }
    });
}

/// `set_rate` racing an acquire: the acquire is ordered entirely before or after the change, and reads a
/// consistent configuration.
#[test]
fn set_rate_races_acquire() {
    loom::model(|| {
        let b = bucket(1.0, 4);
        b.try_acquire(1).unwrap(); // 3 available
        let other = Arc::clone(&b);
        let t = thread::spawn(move || other.try_acquire(3));
        b.set_rate(2.0, 2).unwrap();
        let got = t.join().unwrap();
        assert_eq!((b.rate(), b.burst()), (2.0, 2));
        match got {
            // Before the change: 3 of 3 taken, then capped to min(0, 2).
            Ok(()) => assert_eq!(b.available(), 0),
            // After the change: min(3, 2) = 2 available, and 3 > 2 never fits.
            Err(AcquireError::NeverFits { requested: 3, burst: 2 }) => assert_eq!(b.available(), 2),
            Err(e) => panic!("torn or inconsistent configuration: {e:?}"),
        }
    });
}

/// `set_rate` racing a peek after time has passed, so that every configuration field changes: a torn
/// read (say, the new `level0` with the old base time) would report a count no order can produce.
#[test]
fn set_rate_races_available() {
    loom::model(|| {
        let clock = ManualClock::new();
        let b = Arc::new(TokenBucket::with_clock(1e6, 4, clock.clone()).unwrap()); // 1 token per µs
        b.try_acquire(4).unwrap();
        clock.set_nanos(3_000); // 3 tokens accrued
        let other = Arc::clone(&b);
        let t = thread::spawn(move || other.available());
        b.set_rate(2e6, 2).unwrap();
        let seen = t.join().unwrap();
        assert!(seen == 3 || seen == 2, "available {seen}: neither before (3) nor after (2) the change");
        assert_eq!(b.available(), 2);
    });
}

/// A refund racing a rate change that halves the unit, from an empty bucket: whether the refund commits
/// before the conversion (2 tokens in the old unit, converted) or after it (2 tokens in the new unit), the
/// bucket holds 2 tokens. A stale refund committed after the conversion, in the old unit, would give
/// back 4 (the conversion maps an empty bucket's `tat` to the same value: only the generation bit tells
/// the two apart).
#[test]
fn refund_races_set_rate() {
    loom::model(|| {
        let b = bucket(1.0, 4);
        b.try_acquire(4).unwrap();
        let other = Arc::clone(&b);
        let t = thread::spawn(move || other.refund(2));
        b.set_rate(2.0, 4).unwrap();
        t.join().unwrap();
        assert_eq!((b.rate(), b.available()), (2.0, 2));
    });
}

/// Two rate changes at once: they serialize, and the bucket ends with one of them whole (rate and burst
/// together) and the tokens of either order (3, capped at 2, then kept).
#[test]
fn set_rates_serialize() {
    loom::model(|| {
        let b = bucket(1.0, 4);
        b.try_acquire(1).unwrap(); // 3 available
        let other = Arc::clone(&b);
        let t = thread::spawn(move || other.set_rate(2.0, 8).unwrap());
        b.set_rate(4.0, 2).unwrap();
        t.join().unwrap();
        let config = (b.rate(), b.burst());
        assert!(config == (2.0, 8) || config == (4.0, 2), "torn configuration {config:?}");
        assert_eq!(b.available(), 2);
    });
}
