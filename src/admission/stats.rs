//! Counters and estimates that steer hints and feed snapshots, kept off the hot cache lines.
//!
//! - Admissions are counted in a few cache-padded stripes, one chosen per thread, so that two threads
//!   admitting at once do not bounce one counter line between them; a snapshot adds the stripes up.
//! - Rejections are counted per [`Reason`] (one list, see `rejection.rs`).
//! - [`HoldTime`] estimates how long a permit is held, for capacity retry hints: the exact mean of the
//!   first samples, then an exponentially weighted mean, and a configured prior before any sample.

use super::rejection::Reason;
use crate::sync::{AtomicU64, CachePadded, Ordering};
use std::time::Duration;

/// Stripes of the admission counter.
const STRIPES: usize = 4;

/// Weight of a new sample in the hold-time mean once it has this many samples (1/8); before, every sample
/// has weight `1/n`, so the first estimates are the plain mean of what was seen.
const HOLD_EWMA_SAMPLES: u64 = 8;

/// A mean hold time learned from samples.
#[derive(Debug)]
pub(crate) struct HoldTime {
    mean_nanos: AtomicU64,
    samples: AtomicU64,
    prior_nanos: u64,
}

impl HoldTime {
    pub(crate) fn new(prior: Duration) -> Self {
        let prior_nanos = crate::clock::duration_to_nanos(prior).max(1);
        Self { mean_nanos: AtomicU64::new(prior_nanos), samples: AtomicU64::new(0), prior_nanos }
    }

    /// Whether the estimate still takes every sample (few seen yet).
    #[inline]
    pub(crate) fn warming_up(&self) -> bool {
        self.samples.load(Ordering::Relaxed) < HOLD_EWMA_SAMPLES
    }

    /// Feeds one observed hold time. Racing updates may lose a sample, which only slows learning.
    pub(crate) fn record(&self, nanos: u64) {
        let n = self.samples.fetch_add(1, Ordering::Relaxed) + 1;
        let weight = n.min(HOLD_EWMA_SAMPLES);
        let old = if n == 1 { nanos } else { self.mean_nanos.load(Ordering::Relaxed) };
        // old + (sample - old) / weight, in signed arithmetic without overflow.
        let new = if nanos >= old { old + (nanos - old) / weight } else { old - (old - nanos) / weight };
        self.mean_nanos.store(new.max(1), Ordering::Relaxed);
    }

    /// The estimate: the prior until a sample arrived.
    pub(crate) fn mean(&self) -> Duration {
        if self.samples.load(Ordering::Relaxed) == 0 {
            return Duration::from_nanos(self.prior_nanos);
        }
        Duration::from_nanos(self.mean_nanos.load(Ordering::Relaxed))
    }
}

/// Bounds of every capacity retry hint.
pub(crate) const MIN_HINT: Duration = Duration::from_millis(1);
pub(crate) const MAX_HINT: Duration = Duration::from_secs(600);

/// The time until capacity for one more request frees up with `ahead` requests before it, when
/// `in_flight` permits are held for `mean_hold` each: they are released at about `in_flight / mean_hold`
/// per second, and each of the `ahead` needs one release first. Within `[MIN_HINT, MAX_HINT]`.
pub(crate) fn capacity_hint(mean_hold: Duration, in_flight: u64, ahead: usize) -> Duration {
    let per_release = mean_hold.as_nanos() / u128::from(in_flight.max(1));
    let nanos = per_release.saturating_mul(ahead as u128 + 1);
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX)).clamp(MIN_HINT, MAX_HINT)
}

/// What the waiting room and the capacity words look like, for predicting when a request would start.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Load {
    pub(crate) mean_hold: Duration,
    pub(crate) slots_used: u64,
    pub(crate) slot_limit: u64,
    pub(crate) kv_used: u64,
    pub(crate) kv_limit: u64,
    /// Waiters ahead of it and the KV units they need.
    pub(crate) ahead: u64,
    pub(crate) ahead_kv: u64,
}

impl Load {
    /// The predicted wait of a request of `kv` units behind `ahead` waiters: permits are returned at about
    /// `slots_used / mean_hold` per second and KV at `kv_used / mean_hold` units per second, and the
    /// request starts once the slots and the KV units it and those ahead need have come free. Zero when
    /// they are free now.
    pub(crate) fn predicted_wait(&self, kv: u64) -> Duration {
        let hold = self.mean_hold.as_secs_f64();
        let free_slots = self.slot_limit.saturating_sub(self.slots_used);
        let slots_short = (self.ahead + 1).saturating_sub(free_slots);
        let by_slots = if slots_short == 0 { 0.0 } else { slots_short as f64 * hold / self.slots_used.max(1) as f64 };
        let free_kv = self.kv_limit.saturating_sub(self.kv_used);
        let kv_short = self.ahead_kv.saturating_add(kv).saturating_sub(free_kv);
        let by_kv = if kv_short == 0 { 0.0 } else { kv_short as f64 * hold / self.kv_used.max(1) as f64 };
        Duration::try_from_secs_f64(by_slots.max(by_kv)).unwrap_or(MAX_HINT).min(MAX_HINT)
    }
}

/// Monotonic statistics of one admission.
#[derive(Debug)]
pub(crate) struct Stats {
    admitted: [CachePadded<AtomicU64>; STRIPES],
    rejected: CachePadded<[AtomicU64; Reason::COUNT]>,
    waker_panics: AtomicU64,
    /// KV units requests did not reserve because their shared prefix was held already.
    prefix_saved: AtomicU64,
    /// Requests refused, or ended early, because they were predicted to miss their start deadline, and
    /// waiters shed by controlled delay (over-age in a standing queue, or giving their place in a full one).
    shed: AtomicU64,
    pub(crate) hold: HoldTime,
}

impl Stats {
    pub(crate) fn new(expected_hold: Duration) -> Self {
        Self {
            admitted: std::array::from_fn(|_| CachePadded(AtomicU64::new(0))),
            rejected: CachePadded(std::array::from_fn(|_| AtomicU64::new(0))),
            waker_panics: AtomicU64::new(0),
            prefix_saved: AtomicU64::new(0),
            shed: AtomicU64::new(0),
            hold: HoldTime::new(expected_hold),
        }
    }

    /// Counts one admission; returns this thread's stripe count before it (a sequence for sampling).
    #[inline]
    pub(crate) fn count_admitted(&self) -> u64 {
        self.admitted[stripe()].fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn admitted(&self) -> u64 {
        self.admitted.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    #[inline]
    pub(crate) fn count_rejected(&self, reason: Reason) {
        self.rejected[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn rejected(&self) -> [u64; Reason::COUNT] {
        std::array::from_fn(|i| self.rejected[i].load(Ordering::Relaxed))
    }

    pub(crate) fn count_waker_panic(&self) {
        self.waker_panics.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts KV units a granted request did not reserve thanks to a shared prefix.
    pub(crate) fn count_prefix_saved(&self, units: u64) {
        if units != 0 {
            self.prefix_saved.fetch_add(units, Ordering::Relaxed);
        }
    }

    pub(crate) fn prefix_saved(&self) -> u64 {
        self.prefix_saved.load(Ordering::Relaxed)
    }

    pub(crate) fn count_shed(&self, n: u64) {
        self.shed.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn shed(&self) -> u64 {
        self.shed.load(Ordering::Relaxed)
    }

    pub(crate) fn waker_panics(&self) -> u64 {
        self.waker_panics.load(Ordering::Relaxed)
    }
}

/// This thread's stripe: threads are numbered on first use, round-robin over the stripes.
#[cfg(not(loom))]
#[inline]
fn stripe() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    let i = STRIPE.get();
    if i != usize::MAX {
        return i;
    }
    let i = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % STRIPES;
    STRIPE.set(i);
    i
}

/// Under loom every thread counts in the first stripe (the counter is not what the models check).
#[cfg(loom)]
#[inline]
fn stripe() -> usize {
    0
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn hold_time_is_the_mean_of_the_first_samples_then_an_average() {
        let h = HoldTime::new(Duration::from_secs(5));
        assert_eq!(h.mean(), Duration::from_secs(5));
        h.record(2_000_000_000);
        assert_eq!(h.mean(), Duration::from_secs(2));
        h.record(4_000_000_000);
        assert_eq!(h.mean(), Duration::from_secs(3));
        for _ in 0..100 {
            h.record(1_000_000_000);
        }
        assert!(h.mean() < Duration::from_millis(1_010));
        assert!(!h.warming_up());
    }

    #[test]
    fn capacity_hints_are_bounded_and_grow_with_the_queue() {
        let mean = Duration::from_secs(2);
        assert_eq!(capacity_hint(mean, 4, 0), Duration::from_millis(500));
        assert_eq!(capacity_hint(mean, 4, 3), Duration::from_secs(2));
        assert_eq!(capacity_hint(mean, 0, usize::MAX), MAX_HINT);
        assert_eq!(capacity_hint(Duration::from_nanos(1), 1000, 0), MIN_HINT);
    }
}
