//! [`RetryBudget`]: the public API — deposit a first try, withdraw a retry, read the balance.

use super::terms::Terms;
use super::window::Window;
use crate::ConfigError;
use crate::clock::{Clock, MonotonicClock};
use crate::sync::{Mutex, lock};
use std::fmt;
use std::time::Duration;

/// The window over which first tries pay for retries unless told otherwise: 10 s.
///
/// # Examples
///
/// ```
/// use kvgate::retry::{RetryBudget, DEFAULT_BUDGET_TTL};
///
/// assert_eq!(RetryBudget::default().ttl(), DEFAULT_BUDGET_TTL);
/// ```
pub const DEFAULT_BUDGET_TTL: Duration = Duration::from_secs(10);

/// The floor of retries a budget allows per second of its window whatever the traffic, unless told
/// otherwise: 10 (so 100 retries in the default 10 s window).
///
/// # Examples
///
/// ```
/// use kvgate::retry::{RetryBudget, DEFAULT_MIN_RETRIES_PER_SEC};
///
/// assert_eq!(RetryBudget::default().balance(), u64::from(DEFAULT_MIN_RETRIES_PER_SEC) * 10);
/// ```
pub const DEFAULT_MIN_RETRIES_PER_SEC: u32 = 10;

/// The share of first tries that may be retried unless told otherwise: 0.2, that is 20 %.
///
/// # Examples
///
/// ```
/// use kvgate::retry::{RetryBudget, DEFAULT_BUDGET_TTL, DEFAULT_PERCENT_CAN_RETRY};
///
/// // Without the floor: five first tries pay for one retry.
/// let budget = RetryBudget::new(DEFAULT_BUDGET_TTL, 0, DEFAULT_PERCENT_CAN_RETRY)?;
/// (0..5).for_each(|_| budget.deposit());
/// assert_eq!(budget.balance(), 1);
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
pub const DEFAULT_PERCENT_CAN_RETRY: f64 = 0.2;

/// A budget that limits a client's retries to a share of its first tries over a sliding window, plus a
/// floor: shared by all the operations a client sends to one service, through `&self`.
///
/// Call [`deposit`](Self::deposit) for every first try and [`try_withdraw`](Self::try_withdraw) before
/// every retry (or let [`RetryPolicy::backoff_with_budget`](super::super::RetryPolicy::backoff_with_budget)
/// and [`retry_with_budget`](super::super::retry_with_budget) do both). The [module
/// docs](super::super#the-retry-budget) give the exact rule and guarantee; in short, whenever a retry is
/// granted, the retries of the last nine tenths of `ttl` are at most
/// `min_retries_per_sec · ttl + percent_can_retry · (first tries of the last ttl)`.
///
/// The clock is a type parameter, [`MonotonicClock`] unless given ([`with_clock`](Self::with_clock)), so
/// that tests and simulations move time by hand with a [`ManualClock`](crate::clock::ManualClock).
///
/// Memory is fixed (two windows of ten counters and a lock); `deposit` is one compare-and-swap on one
/// atomic word; `try_withdraw` and `balance` take a short lock during which no user code runs. No input
/// and no clock reading makes a method panic.
///
/// # Examples
///
/// ```
/// use kvgate::retry::RetryBudget;
/// use kvgate::clock::ManualClock;
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// // A floor of 1 retry a second over a 10 s window (10 in all), and 20 % of first tries.
/// let budget = RetryBudget::with_clock(Duration::from_secs(10), 1, 0.2, clock.clone())?;
/// for _ in 0..50 {
///     budget.deposit(); // 50 first tries pay for 10 retries
/// }
/// assert_eq!(budget.balance(), 20);
/// assert_eq!((0..100).filter(|_| budget.try_withdraw()).count(), 20);
/// clock.advance(Duration::from_secs(10)); // first tries and retries have all expired
/// assert_eq!(budget.balance(), 10);
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
pub struct RetryBudget<C: Clock = MonotonicClock> {
    terms: Terms,
    /// First tries per slice.
    first_tries: Window,
    /// Retries per slice: read and recorded only while holding `withdrawals`.
    retries: Window,
    /// Serializes withdrawals, and holds the latest slice a withdrawal was stamped with, so that stamps
    /// never go back even when the clock does.
    withdrawals: Mutex<u64>,
    clock: C,
}

impl RetryBudget<MonotonicClock> {
    /// A budget over a window of `ttl`, allowing retries up to `percent_can_retry` of the first tries in
    /// the window (0.2 is 20 %) plus a floor of `min_retries_per_sec` for every second of it.
    ///
    /// `RetryBudget::new(Duration::from_secs(10), 0, 0.0)` allows no retry at all; Finagle's and the
    /// [`Default`] terms are `(10 s, 10, 0.2)`.
    ///
    /// # Errors
    ///
    /// [`ConfigError::OutOfRange`] when `ttl` is outside 1 s..=60 s, or `percent_can_retry` is NaN,
    /// negative, or above 10.0 (1000 %).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::retry::RetryBudget;
    /// use kvgate::ConfigError;
    /// use std::time::Duration;
    ///
    /// let budget = RetryBudget::new(Duration::from_secs(10), 10, 0.2)?;
    /// assert_eq!(budget.balance(), 100); // the floor: 10 a second over 10 s
    /// assert!(matches!(RetryBudget::new(Duration::from_secs(10), 10, 20.0), Err(ConfigError::OutOfRange { .. })));
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn new(ttl: Duration, min_retries_per_sec: u32, percent_can_retry: f64) -> Result<Self, ConfigError> {
        Self::with_clock(ttl, min_retries_per_sec, percent_can_retry, MonotonicClock::new())
    }
}

/// [`DEFAULT_BUDGET_TTL`], [`DEFAULT_MIN_RETRIES_PER_SEC`] and [`DEFAULT_PERCENT_CAN_RETRY`]: 20 % of the
/// first tries of the last 10 s, plus 100 retries.
///
/// # Examples
///
/// ```
/// use kvgate::retry::RetryBudget;
///
/// assert_eq!(RetryBudget::default().balance(), 100);
/// ```
impl Default for RetryBudget<MonotonicClock> {
    fn default() -> Self {
        let terms = Terms::from_valid(DEFAULT_BUDGET_TTL, DEFAULT_MIN_RETRIES_PER_SEC, DEFAULT_PERCENT_CAN_RETRY);
        Self::from_terms(terms, MonotonicClock::new())
    }
}

impl<C: Clock> RetryBudget<C> {
    /// [`RetryBudget::new`] reading time from `clock`.
    ///
    /// # Errors
    ///
    /// As [`RetryBudget::new`].
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::retry::RetryBudget;
    /// use kvgate::clock::ManualClock;
    /// use std::time::Duration;
    ///
    /// let budget = RetryBudget::with_clock(Duration::from_secs(1), 3, 0.1, ManualClock::new())?;
    /// assert_eq!(budget.balance(), 3);
    /// assert!(RetryBudget::with_clock(Duration::from_millis(999), 3, 0.1, ManualClock::new()).is_err());
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn with_clock(
        ttl: Duration,
        min_retries_per_sec: u32,
        percent_can_retry: f64,
        clock: C,
    ) -> Result<Self, ConfigError> {
        Ok(Self::from_terms(Terms::new(ttl, min_retries_per_sec, percent_can_retry)?, clock))
    }

    fn from_terms(terms: Terms, clock: C) -> Self {
        Self { terms, first_tries: Window::new(), retries: Window::new(), withdrawals: Mutex::new(0), clock }
    }

    /// Records one first try: call it once for every operation sent, whether it will succeed or not.
    /// Never blocks (one compare-and-swap).
    ///
    /// A first try stamped so late that its slice has been reused (its thread stalled for about `ttl`
    /// between reading the clock and recording, or the clock stepped back) may be lost, or make the
    /// first tries of a newer slice be lost: the budget can only become stricter for it. A slice counts at
    /// most `u32::MAX` first tries; more are not counted.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::retry::RetryBudget;
    /// use std::time::Duration;
    ///
    /// let budget = RetryBudget::new(Duration::from_secs(10), 0, 0.5)?;
    /// budget.deposit();
    /// budget.deposit();
    /// assert_eq!(budget.balance(), 1);
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn deposit(&self) {
        let slice = self.terms.slice(self.clock.now_nanos());
        // A first try that does not fit its slice's counter is not counted: the budget only gets stricter.
        let _ = self.first_tries.record(slice);
    }

    /// Asks for one retry: records it and returns `true` if the budget holds at least one whole retry
    /// ([`balance`](Self::balance) `>= 1`), returns `false` and records nothing otherwise.
    ///
    /// Withdrawals are serialized by a short lock (the clock is read before it, and no user code runs
    /// under it), so concurrent callers never take more than the balance between them. Each withdrawal is
    /// stamped with the clock's reading, or with the latest earlier withdrawal's stamp if the clock reads
    /// earlier than that.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::retry::RetryBudget;
    /// use std::time::Duration;
    ///
    /// let budget = RetryBudget::new(Duration::from_secs(60), 0, 1.0)?; // a retry per first try, no floor
    /// budget.deposit();
    /// budget.deposit();
    /// assert!(budget.try_withdraw());
    /// assert!(budget.try_withdraw());
    /// assert!(!budget.try_withdraw()); // the two first tries of the last minute are spent
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn try_withdraw(&self) -> bool {
        let now = self.terms.slice(self.clock.now_nanos());
        let mut latest = lock(&self.withdrawals);
        let slice = now.max(*latest);
        *latest = slice;
        let first_tries = self.first_tries.total(slice);
        let retries = self.retries.total(slice);
        // One more retry must keep the balance at or above zero, and fit its slice's counter.
        self.terms.balance_units(first_tries, retries.saturating_add(1)) >= 0 && self.retries.record(slice)
    }

    /// The whole retries the budget would grant now: `R + p·F − W` over the current window (see the
    /// [module docs](super::super#the-retry-budget)) rounded down, or 0 when that is negative (first
    /// tries that paid for retries have expired before those retries).
    ///
    /// With no concurrent calls, [`try_withdraw`](Self::try_withdraw) succeeds exactly when this is at
    /// least 1. Takes the withdrawal lock for a consistent reading.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::retry::RetryBudget;
    /// use std::time::Duration;
    ///
    /// let budget = RetryBudget::new(Duration::from_secs(10), 1, 0.25)?;
    /// for _ in 0..6 {
    ///     budget.deposit();
    /// }
    /// assert_eq!(budget.balance(), 11); // 10 from the floor + 1.5 from first tries, rounded down
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn balance(&self) -> u64 {
        let now = self.terms.slice(self.clock.now_nanos());
        let latest = lock(&self.withdrawals);
        let slice = now.max(*latest);
        let balance = self.terms.whole_retries(self.first_tries.total(slice), self.retries.total(slice));
        drop(latest);
        balance
    }

    /// The window, as configured.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::retry::RetryBudget;
    /// use std::time::Duration;
    ///
    /// assert_eq!(RetryBudget::default().ttl(), Duration::from_secs(10));
    /// ```
    pub fn ttl(&self) -> Duration {
        self.terms.ttl
    }

    /// The floor of retries per second of the window, as configured.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::retry::RetryBudget;
    ///
    /// assert_eq!(RetryBudget::default().min_retries_per_sec(), 10);
    /// ```
    pub fn min_retries_per_sec(&self) -> u32 {
        self.terms.min_retries_per_sec
    }

    /// The share of first tries that may be retried, as applied: the configured value rounded to the
    /// nearest millionth.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::retry::RetryBudget;
    /// use std::time::Duration;
    ///
    /// assert_eq!(RetryBudget::default().percent_can_retry(), 0.2);
    /// assert_eq!(RetryBudget::new(Duration::from_secs(1), 0, 0.123_456_7)?.percent_can_retry(), 0.123_457);
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn percent_can_retry(&self) -> f64 {
        self.terms.deposit_units as f64 / super::terms::UNITS_PER_RETRY as f64
    }

    /// The clock the budget reads.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::retry::RetryBudget;
    /// use kvgate::clock::{Clock, ManualClock};
    /// use std::time::Duration;
    ///
    /// let budget = RetryBudget::with_clock(Duration::from_secs(1), 1, 0.1, ManualClock::starting_at(7))?;
    /// assert_eq!(budget.clock().now_nanos(), 7);
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn clock(&self) -> &C {
        &self.clock
    }
}

impl<C: Clock> fmt::Debug for RetryBudget<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudget")
            .field("ttl", &self.terms.ttl)
            .field("min_retries_per_sec", &self.terms.min_retries_per_sec)
            .field("percent_can_retry", &self.percent_can_retry())
            .finish_non_exhaustive()
    }
}
