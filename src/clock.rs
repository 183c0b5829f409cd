//! Where time comes from.
//!
//! Every limit in kvgate that depends on time (token buckets, queue deadlines, hold-time estimates) reads
//! it through the [`Clock`] trait, as nanoseconds on a monotonic axis that starts at the clock's origin.
//! Production code uses [`MonotonicClock`]; tests and simulations use [`ManualClock`], whose time moves only
//! when told to, so that no test sleeps to wait for a refill. Nothing else in the crate calls
//! `Instant::now()`.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;
#[cfg(not(feature = "quanta"))]
use std::time::Instant;

use crate::sync::{AtomicU64, Ordering};

/// A source of monotonic time in nanoseconds.
///
/// Implementations must be cheap to clone; clones must read the same time. Readings should never decrease;
/// kvgate tolerates a clock that stalls or steps backwards (it treats the reading as "no time passed"), but
/// never panics or grants extra capacity because of it.
///
/// # Examples
///
/// ```
/// use kvgate::clock::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let start = clock.now_nanos();
/// clock.advance(Duration::from_millis(5));
/// assert_eq!(clock.now_nanos() - start, 5_000_000);
/// ```
pub trait Clock: Clone + Debug + Send + Sync + 'static {
    /// Nanoseconds elapsed since this clock's origin.
    fn now_nanos(&self) -> u64;

    /// How long a thread should sleep, in real time, for `clock_nanos` of this clock's time to pass.
    /// Timers use it to wait for deadlines. The default is the identity, right for clocks that follow
    /// real time; a clock that moves only when told to returns a short poll interval instead.
    fn real_time_until(&self, clock_nanos: u64) -> Duration {
        Duration::from_nanos(clock_nanos)
    }
}

/// The default clock: monotonic real time, measured from the moment the clock was created.
///
/// With the `quanta` feature (on by default) it reads the CPU's time-stamp counter through
/// [`quanta`](https://docs.rs/quanta), calibrated against the OS clock: about 12 ns a reading on the
/// reference machines, against about 30 ns for `std::time::Instant::now()` (measured by
/// `cargo bench --bench bucket`, which runs the token bucket on both). Where no stable TSC exists,
/// quanta falls back to the OS monotonic clock. Without the feature it reads `std::time::Instant`.
///
/// Copies share the same origin.
///
/// # Examples
///
/// ```
/// use kvgate::clock::{Clock, MonotonicClock};
///
/// let clock = MonotonicClock::new();
/// let a = clock.now_nanos();
/// let b = clock.now_nanos();
/// assert!(b >= a);
/// ```
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    #[cfg(feature = "quanta")]
    clock: quanta::Clock,
    #[cfg(feature = "quanta")]
    origin: u64,
    #[cfg(not(feature = "quanta"))]
    origin: Instant,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        #[cfg(feature = "quanta")]
        {
            let clock = quanta::Clock::new();
            let origin = clock.raw();
            Self { clock, origin }
        }
        #[cfg(not(feature = "quanta"))]
        {
            Self { origin: Instant::now() }
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now_nanos(&self) -> u64 {
        #[cfg(feature = "quanta")]
        {
            // Saturates at 0 if the counter reads below the origin (another core's TSC lagging).
            self.clock.delta_as_nanos(self.origin, self.clock.raw())
        }
        #[cfg(not(feature = "quanta"))]
        {
            // 2^64 ns is 584 years: the saturation never happens in practice but keeps the cast honest.
            u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
        }
    }
}

/// A clock that moves only when told to: for tests, simulations and replaying traces.
///
/// Clones share the same time, so a test can keep one handle and give another to the limiter. The time is
/// one atomic from the crate's `sync` shim, so that under `--cfg loom` the models see a clock moved by one
/// thread and read by another like any other shared state (a `ManualClock` is then created inside the
/// model, as every loom value is).
///
/// # Examples
///
/// ```
/// use kvgate::clock::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let shared = clock.clone();
/// clock.advance(Duration::from_secs(1));
/// assert_eq!(shared.now_nanos(), 1_000_000_000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// A clock standing at `nanos`.
    pub fn starting_at(nanos: u64) -> Self {
        Self { nanos: Arc::new(AtomicU64::new(nanos)) }
    }

    /// Moves time forward by `by` (saturating at `u64::MAX` nanoseconds).
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let _ = self.nanos.fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| Some(now.saturating_add(by)));
    }

    /// Sets the time to `nanos`, which may be earlier than now: for fault-injection tests of a clock that
    /// steps backwards.
    pub fn set_nanos(&self, nanos: u64) {
        self.nanos.store(nanos, Ordering::Release);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now_nanos(&self) -> u64 {
        self.nanos.load(Ordering::Acquire)
    }

    /// Manual time can jump at any moment: re-read it every millisecond.
    fn real_time_until(&self, clock_nanos: u64) -> Duration {
        Duration::from_nanos(clock_nanos).min(Duration::from_millis(1))
    }
}

/// Converts a `Duration` to nanoseconds, saturating at `u64::MAX`.
#[inline]
pub(crate) fn duration_to_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}
