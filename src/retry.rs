//! Client-side retries: exponential backoff with full jitter that honours a server's `Retry-After`.
//!
//! # The schedule
//!
//! After the try numbered `attempt` (0 for the first) fails with a retryable error, the client waits
//!
//! - without a hint: `uniform(0, window(attempt))`, where `window(n) = min(cap, base · 2^n)` — *full
//!   jitter*;
//! - with a server hint `h` (a [`Rejection`]'s `retry_after`, an HTTP `Retry-After` header):
//!   `h + uniform(0, window(attempt))`. The retry never comes earlier than the hint, and clients given the
//!   same hint still spread out over the same window they would have used without one. A hint longer
//!   than [`max_retry_after`](RetryPolicy::max_retry_after) (five minutes unless set) makes the client
//!   give up instead: a hostile or broken server cannot park a client for longer than that.
//!
//! and gives up once [`max_tries`](RetryPolicy::max_tries) tries were made, or at once on an error that
//! is not [retryable](RetryHint::is_retryable).
//!
//! # Why full jitter
//!
//! When a server is saturated it rejects many clients at (nearly) the same instant. With plain
//! exponential backoff they all wait `base · 2^n` and come back together, in synchronised waves that hit
//! the server exactly when it is still busy — the thundering herd — and each wave is rejected together
//! again. Full jitter draws each client's delay uniformly from the whole window, so clients rejected
//! together return spread evenly over it: the server sees a steady trickle it can admit instead of a
//! spike. (Marc Brooker, "Exponential Backoff And Jitter", AWS Architecture Blog, 2015, measured full
//! jitter to need the fewest calls and the least total time among the common variants.) For the same
//! reason a server hint is not used as an exact deadline: everyone told "1 s" would return at 1 s sharp.
//!
//! # Runtime neutrality and determinism
//!
//! Nothing here sleeps on its own: [`retry`] takes the caller's sleep function (`tokio::time::sleep`,
//! `smol::Timer::after`, a fake that records delays in tests). Randomness comes from a small
//! [`SplitMix64`] generator; a policy with a [`seed`](RetryPolicy::seed) produces the same schedule every
//! time, one without draws a fresh seed for every [`Backoff`].
//!
//! # Examples
//!
//! ```
//! use kvgate::retry::{retry, RetryPolicy};
//! use kvgate::{Admission, Request};
//! use std::time::Duration;
//!
//! let admission = Admission::builder().max_in_flight(1).queue_capacity(0).build().unwrap();
//! let policy = RetryPolicy::new().base(Duration::from_millis(50)).cap(Duration::from_secs(2)).max_tries(4);
//! let permit = futures::executor::block_on(retry(
//!     &policy,
//!     || async { admission.try_admit(&Request::new(100, 100)) },
//!     |delay| async move { let _ = delay; /* tokio::time::sleep(delay).await */ },
//! ));
//! assert!(permit.is_ok());
//! ```

use crate::Rejection;
use std::fmt;
use std::future::Future;
use std::time::Duration;

/// A tiny, fast, seedable pseudo-random generator (SplitMix64, Steele, Lea and Flood 2014).
///
/// Good enough to spread retries; not for cryptography.
///
/// # Examples
///
/// ```
/// use kvgate::retry::SplitMix64;
///
/// let mut a = SplitMix64::new(7);
/// let mut b = SplitMix64::new(7);
/// assert_eq!(a.next_u64(), b.next_u64());
/// ```
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator that starts from `seed`: the same seed gives the same sequence.
    pub const fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A generator seeded from the process's hash randomness and a counter, so that two generators made
    /// one after the other (or in two processes) differ.
    pub fn from_entropy() -> Self {
        use std::collections::hash_map::RandomState;
        use std::hash::{BuildHasher, Hasher};
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        Self::new(hasher.finish())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A duration drawn uniformly from `0..=max` (nanosecond resolution).
    pub fn duration_up_to(&mut self, max: Duration) -> Duration {
        let max = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
        // Lemire's multiply-shift: maps 64 random bits onto 0..=max without a division.
        let nanos = ((u128::from(self.next_u64()) * (u128::from(max) + 1)) >> 64) as u64;
        Duration::from_nanos(nanos)
    }
}

/// What a retry loop needs to know about an error: may it be retried, and did the server say when.
///
/// # Examples
///
/// ```
/// use kvgate::retry::RetryHint;
/// use std::time::Duration;
///
/// enum ApiError { Overloaded(Duration), BadInput }
///
/// impl RetryHint for ApiError {
///     fn is_retryable(&self) -> bool {
///         matches!(self, ApiError::Overloaded(_))
///     }
///     fn retry_after(&self) -> Option<Duration> {
///         match self {
///             ApiError::Overloaded(after) => Some(*after),
///             ApiError::BadInput => None,
///         }
///     }
/// }
/// assert!(!ApiError::BadInput.is_retryable());
/// ```
pub trait RetryHint {
    /// Whether trying the same operation again can succeed. A loop stops at once on `false`.
    fn is_retryable(&self) -> bool;

    /// The earliest time a retry can succeed, if the error says (a server's `Retry-After`). A retryable
    /// error without a hint is retried on the plain backoff schedule.
    fn retry_after(&self) -> Option<Duration> {
        None
    }
}

/// `NoCapacity`, `RateLimited` and `QueueFull` are retryable with their hint; `TimedOut` is retryable
/// without one (the wait limit passed, the capacity may free up later); `TooLarge`, `Closed` and
/// `Invalid` are not retryable.
impl RetryHint for Rejection {
    fn is_retryable(&self) -> bool {
        self.retry_after().is_some() || matches!(self, Rejection::TimedOut)
    }

    fn retry_after(&self) -> Option<Duration> {
        Rejection::retry_after(self)
    }
}

impl<T: RetryHint + ?Sized> RetryHint for &T {
    fn is_retryable(&self) -> bool {
        (**self).is_retryable()
    }

    fn retry_after(&self) -> Option<Duration> {
        (**self).retry_after()
    }
}

/// How a client retries: base delay, cap, maximum number of tries, and optionally a fixed seed.
///
/// Defaults: base 100 ms, cap 10 s, 5 tries, give up on server hints over [`DEFAULT_MAX_RETRY_AFTER`],
/// fresh randomness per [`Backoff`].
/// See the [module docs](self) for the schedule.
///
/// # Examples
///
/// ```
/// use kvgate::retry::RetryPolicy;
/// use std::time::Duration;
///
/// let policy = RetryPolicy::new().base(Duration::from_millis(100)).cap(Duration::from_secs(5)).max_tries(3).seed(1);
/// let mut backoff = policy.backoff();
/// let first = backoff.next_delay(None).unwrap();
/// assert!(first <= Duration::from_millis(100));
/// let second = backoff.next_delay(Some(Duration::from_secs(1))).unwrap();
/// assert!(second >= Duration::from_secs(1));
/// assert_eq!(backoff.next_delay(None), None); // three tries made: give up
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    base: Duration,
    cap: Duration,
    max_tries: u32,
    max_retry_after: Duration,
    seed: Option<u64>,
}

/// The longest server hint a [`RetryPolicy`] waits for unless told otherwise
/// ([`max_retry_after`](RetryPolicy::max_retry_after)): five minutes.
pub const DEFAULT_MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryPolicy {
    /// The default policy: base 100 ms, cap 10 s, 5 tries, hints up to [`DEFAULT_MAX_RETRY_AFTER`].
    pub const fn new() -> Self {
        Self {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(10),
            max_tries: 5,
            max_retry_after: DEFAULT_MAX_RETRY_AFTER,
            seed: None,
        }
    }

    /// The window of the first retry; each later retry doubles it (up to the cap).
    #[must_use]
    pub const fn base(mut self, base: Duration) -> Self {
        self.base = base;
        self
    }

    /// The largest backoff window. A server hint may still ask for a longer wait; see
    /// [`max_retry_after`](RetryPolicy::max_retry_after).
    #[must_use]
    pub const fn cap(mut self, cap: Duration) -> Self {
        self.cap = cap;
        self
    }

    /// Total tries, the first included (`1`: never retry; `0` behaves as `1`).
    #[must_use]
    pub const fn max_tries(mut self, max_tries: u32) -> Self {
        self.max_tries = max_tries;
        self
    }

    /// Gives up instead of waiting when a server asks to wait longer than `limit` (default
    /// [`DEFAULT_MAX_RETRY_AFTER`]; `Duration::MAX` waits for any hint).
    #[must_use]
    pub const fn max_retry_after(mut self, limit: Duration) -> Self {
        self.max_retry_after = limit;
        self
    }

    /// Fixes the random seed, so every [`Backoff`] of this policy draws the same delays (for tests and
    /// simulations; in production leave it unset, or clients seeded alike would move in lockstep).
    #[must_use]
    pub const fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// The configured number of tries (at least 1).
    pub const fn tries(&self) -> u32 {
        if self.max_tries == 0 { 1 } else { self.max_tries }
    }

    /// The jitter window of retry number `attempt` (0 for the first retry): `min(cap, base · 2^attempt)`.
    pub fn window(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt).unwrap_or(0);
        if factor == 0 {
            return self.cap;
        }
        self.base.checked_mul(factor).map_or(self.cap, |w| w.min(self.cap))
    }

    /// The delay before retrying after try number `attempt` (0-based) failed, drawing randomness from
    /// `rng`; `None` when the client should give up (`attempt + 1` tries were already made and that
    /// reaches [`max_tries`](RetryPolicy::max_tries), or the hint exceeds
    /// [`max_retry_after`](RetryPolicy::max_retry_after)).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::retry::{RetryPolicy, SplitMix64};
    /// use std::time::Duration;
    ///
    /// let policy = RetryPolicy::new().base(Duration::from_millis(10)).max_tries(2);
    /// let mut rng = SplitMix64::new(3);
    /// assert!(policy.delay(0, None, &mut rng).unwrap() <= Duration::from_millis(10));
    /// assert_eq!(policy.delay(1, None, &mut rng), None);
    /// ```
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>, rng: &mut SplitMix64) -> Option<Duration> {
        if attempt.saturating_add(1) >= self.tries() {
            return None;
        }
        if retry_after.is_some_and(|hint| hint > self.max_retry_after) {
            return None;
        }
        let jitter = rng.duration_up_to(self.window(attempt));
        Some(retry_after.map_or(jitter, |hint| hint.saturating_add(jitter)))
    }

    /// A fresh backoff state for one operation.
    pub fn backoff(&self) -> Backoff {
        let rng = self.seed.map_or_else(SplitMix64::from_entropy, SplitMix64::new);
        Backoff { policy: *self, rng, attempt: 0 }
    }
}

/// The retry state of one operation: which retry comes next, and its random generator.
///
/// As an [`Iterator`] it yields the hint-less delays until the policy gives up.
///
/// # Examples
///
/// ```
/// use kvgate::retry::RetryPolicy;
/// use std::time::Duration;
///
/// let delays: Vec<Duration> = RetryPolicy::new().max_tries(4).seed(9).backoff().collect();
/// assert_eq!(delays.len(), 3); // 4 tries: 3 waits between them
/// ```
#[derive(Debug, Clone)]
pub struct Backoff {
    policy: RetryPolicy,
    rng: SplitMix64,
    attempt: u32,
}

impl Backoff {
    /// The delay before the next retry, given the server's hint; `None`: give up.
    pub fn next_delay(&mut self, retry_after: Option<Duration>) -> Option<Duration> {
        let delay = self.policy.delay(self.attempt, retry_after, &mut self.rng)?;
        self.attempt += 1;
        Some(delay)
    }

    /// Retries handed out so far.
    pub fn retries(&self) -> u32 {
        self.attempt
    }
}

impl Iterator for Backoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.next_delay(None)
    }
}

/// Runs `op` until it succeeds, fails with an error that is not retryable, or the policy gives up,
/// sleeping with the caller's `sleep` between tries. Returns the last result.
///
/// `sleep` is the runtime's timer (`tokio::time::sleep`, `|d| smol::Timer::after(d).map(|_| ())`, ...),
/// which keeps this function runtime-neutral.
///
/// # Errors
///
/// The last error of `op`: the first non-retryable one, or the one after which the policy gave up.
///
/// # Cancel safety
///
/// Dropping the future drops the try or the sleep in progress; nothing else is held.
///
/// # Examples
///
/// ```
/// use kvgate::retry::{retry, RetryPolicy};
/// use kvgate::Rejection;
/// use std::time::Duration;
///
/// let mut calls = 0;
/// let result: Result<(), Rejection> = futures::executor::block_on(retry(
///     &RetryPolicy::new().max_tries(3).seed(1),
///     || { calls += 1; async { Err(Rejection::RateLimited { retry_after: Duration::from_millis(1) }) } },
///     |_delay| async {},
/// ));
/// assert!(result.is_err());
/// assert_eq!(calls, 3);
/// ```
pub async fn retry<T, E, Fut, Op, Sleep, SleepFut>(policy: &RetryPolicy, mut op: Op, mut sleep: Sleep) -> Result<T, E>
where
    Op: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: RetryHint,
    Sleep: FnMut(Duration) -> SleepFut,
    SleepFut: Future<Output = ()>,
{
    let mut backoff = policy.backoff();
    loop {
        let err = match op().await {
            Ok(value) => return Ok(value),
            Err(err) => err,
        };
        if !err.is_retryable() {
            return Err(err);
        }
        match backoff.next_delay(err.retry_after()) {
            Some(delay) => sleep(delay).await,
            None => return Err(err),
        }
    }
}

/// Why a `Retry-After` or `retry-after-ms` header value could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseRetryAfterError {
    /// Neither a non-negative number of (milli)seconds nor an HTTP-date.
    Invalid,
}

impl fmt::Display for ParseRetryAfterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ParseRetryAfterError::Invalid => {
                "not a non-negative number of seconds nor an HTTP-date (like `Wed, 21 Oct 2015 07:28:00 GMT`)"
            }
        })
    }
}

impl std::error::Error for ParseRetryAfterError {}

/// Parses a `Retry-After` header value: delta-seconds (`"120"`; a fractional `"1.5"`, which some servers
/// send, is rounded up to the next millisecond) or an HTTP-date in any of the three formats of RFC 9110
/// §5.6.7, read against the wall clock (a date in the past is a delay of zero). Surrounding whitespace is
/// allowed; numbers too large saturate.
///
/// # Errors
///
/// [`ParseRetryAfterError::Invalid`] for anything else.
///
/// # Examples
///
/// ```
/// use kvgate::retry::parse_retry_after;
/// use std::time::Duration;
///
/// assert_eq!(parse_retry_after(" 3 "), Ok(Duration::from_secs(3)));
/// assert_eq!(parse_retry_after("0.25"), Ok(Duration::from_millis(250)));
/// assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), Ok(Duration::ZERO)); // long past
/// ```
pub fn parse_retry_after(value: &str) -> Result<Duration, ParseRetryAfterError> {
    parse_retry_after_at(value, std::time::SystemTime::now())
}

/// [`parse_retry_after`] with the wall clock's reading given, for HTTP-dates.
///
/// # Errors
///
/// As [`parse_retry_after`].
///
/// # Examples
///
/// ```
/// use kvgate::retry::parse_retry_after_at;
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
///
/// let now = UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
/// for date in ["Sun, 06 Nov 1994 09:49:37 GMT", "Sunday, 06-Nov-94 09:49:37 GMT", "Sun Nov  6 09:49:37 1994"] {
///     assert_eq!(parse_retry_after_at(date, now), Ok(Duration::from_secs(3600)));
/// }
/// ```
pub fn parse_retry_after_at(value: &str, now: std::time::SystemTime) -> Result<Duration, ParseRetryAfterError> {
    let value = value.trim();
    if value.bytes().any(|b| b.is_ascii_alphabetic()) {
        let date = httpdate::parse_http_date(value).map_err(|_| ParseRetryAfterError::Invalid)?;
        return Ok(date.duration_since(now).unwrap_or(Duration::ZERO));
    }
    decimal_millis(value, 1000).map(Duration::from_millis)
}

/// Parses a `retry-after-ms` header value (milliseconds, as sent by OpenAI-compatible servers). A
/// fractional value (`"1500.5"`) is accepted and rounded up to the next millisecond.
///
/// # Errors
///
/// [`ParseRetryAfterError::Invalid`] for anything that is not a non-negative number.
///
/// # Examples
///
/// ```
/// use kvgate::retry::parse_retry_after_ms;
/// use std::time::Duration;
///
/// assert_eq!(parse_retry_after_ms("250"), Ok(Duration::from_millis(250)));
/// assert!(parse_retry_after_ms("-1").is_err());
/// ```
pub fn parse_retry_after_ms(value: &str) -> Result<Duration, ParseRetryAfterError> {
    decimal_millis(value.trim(), 1).map(Duration::from_millis)
}

/// The server's hint from the two headers' values, preferring the more precise `retry-after-ms`; a value
/// that does not parse is ignored.
///
/// # Examples
///
/// ```
/// use kvgate::retry::retry_after_from_headers;
/// use std::time::Duration;
///
/// assert_eq!(retry_after_from_headers(Some("2"), Some("1500")), Some(Duration::from_millis(1500)));
/// assert_eq!(retry_after_from_headers(Some("2"), None), Some(Duration::from_secs(2)));
/// assert_eq!(retry_after_from_headers(None, Some("soon")), None);
/// ```
pub fn retry_after_from_headers(retry_after: Option<&str>, retry_after_ms: Option<&str>) -> Option<Duration> {
    retry_after_ms
        .and_then(|v| parse_retry_after_ms(v).ok())
        .or_else(|| retry_after.and_then(|v| parse_retry_after(v).ok()))
}

/// `value` — digits, optionally a `.` and more digits — in units of `unit_millis` (1000 for seconds, 1 for
/// milliseconds), as whole milliseconds rounded up; saturating.
fn decimal_millis(value: &str, unit_millis: u64) -> Result<u64, ParseRetryAfterError> {
    let (whole, fraction) = match value.split_once('.') {
        None => (value, None),
        Some((whole, fraction)) => (whole, Some(fraction)),
    };
    let mut millis = parse_digits(whole)?.saturating_mul(unit_millis);
    if let Some(fraction) = fraction {
        if fraction.is_empty() || !fraction.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ParseRetryAfterError::Invalid);
        }
        // The fraction digits that are whole milliseconds (three for seconds, none for milliseconds); any
        // non-zero digit after them rounds up.
        let exact = if unit_millis == 1000 { 3 } else { 0 };
        let digits = fraction.as_bytes();
        let head = digits.iter().chain(b"000").take(exact).fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
        let round_up = digits.iter().skip(exact).any(|&d| d != b'0');
        millis = millis.saturating_add(head).saturating_add(u64::from(round_up));
    }
    Ok(millis)
}

fn parse_digits(value: &str) -> Result<u64, ParseRetryAfterError> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ParseRetryAfterError::Invalid);
    }
    // All digits: the only failure left is overflow, which saturates (a hint of "forever").
    Ok(value.parse().unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    const MS: Duration = Duration::from_millis(1);

    #[derive(Debug, PartialEq)]
    enum TestError {
        Retry(Option<Duration>),
        Fatal,
    }

    impl RetryHint for TestError {
        fn is_retryable(&self) -> bool {
            matches!(self, TestError::Retry(_))
        }
        fn retry_after(&self) -> Option<Duration> {
            match self {
                TestError::Retry(hint) => *hint,
                TestError::Fatal => None,
            }
        }
    }

    fn policy() -> RetryPolicy {
        RetryPolicy::new().base(100 * MS).cap(3_000 * MS).max_tries(10)
    }

    #[test]
    fn window_doubles_up_to_the_cap() {
        let p = policy();
        let windows: Vec<_> = (0..8).map(|n| p.window(n).as_millis()).collect();
        assert_eq!(windows, [100, 200, 400, 800, 1600, 3000, 3000, 3000]);
        assert_eq!(p.window(40), 3_000 * MS);
        assert_eq!(p.window(u32::MAX), 3_000 * MS);
        assert_eq!(RetryPolicy::new().base(Duration::MAX).cap(Duration::MAX).window(3), Duration::MAX);
    }

    #[test]
    fn every_delay_is_within_its_window_over_many_seeds() {
        let p = policy();
        for seed in 0..2_000 {
            let mut rng = SplitMix64::new(seed);
            for attempt in 0..9 {
                let d = p.delay(attempt, None, &mut rng).unwrap();
                let window = (p.base * 2u32.pow(attempt)).min(p.cap);
                assert!(d <= window, "seed {seed} attempt {attempt}: {d:?} > {window:?}");
                assert!(d <= p.cap);
            }
        }
    }

    #[test]
    fn delays_use_the_whole_window() {
        let p = policy();
        let mut rng = SplitMix64::new(1);
        let draws: Vec<_> = (0..10_000).map(|_| p.delay(2, None, &mut rng).unwrap()).collect();
        assert!(draws.iter().any(|d| *d < 20 * MS));
        assert!(draws.iter().any(|d| *d > 380 * MS));
    }

    #[test]
    fn a_hint_is_never_undercut() {
        let p = policy();
        for seed in 0..1_000 {
            let mut rng = SplitMix64::new(seed);
            for attempt in 0..9 {
                let hint = Duration::from_millis(seed % 7 * 500);
                let d = p.delay(attempt, Some(hint), &mut rng).unwrap();
                assert!(d >= hint, "seed {seed}: {d:?} < hint {hint:?}");
                assert!(d <= hint + p.window(attempt));
            }
        }
        // A hint beyond the cap is still honoured: the cap bounds only the jitter.
        let d = p.delay(0, Some(Duration::from_secs(60)), &mut SplitMix64::new(0)).unwrap();
        assert!(d >= Duration::from_secs(60));
    }

    #[test]
    fn hints_over_the_limit_give_up() {
        let p = policy().max_retry_after(Duration::from_secs(5));
        let mut rng = SplitMix64::new(0);
        assert!(p.delay(0, Some(Duration::from_secs(5)), &mut rng).is_some());
        assert_eq!(p.delay(0, Some(Duration::from_secs(6)), &mut rng), None);
    }

    #[test]
    fn a_hostile_hint_does_not_park_a_client_by_default() {
        let hostile = parse_retry_after("99999999999999").unwrap();
        let mut rng = SplitMix64::new(0);
        assert_eq!(RetryPolicy::new().delay(0, Some(hostile), &mut rng), None);
        assert!(RetryPolicy::new().delay(0, Some(DEFAULT_MAX_RETRY_AFTER), &mut rng).is_some());
        let patient = RetryPolicy::new().max_retry_after(Duration::MAX);
        assert!(patient.delay(0, Some(hostile), &mut rng).unwrap() >= hostile);
    }

    #[test]
    fn gives_up_after_max_tries() {
        for tries in 0..6 {
            let delays = RetryPolicy::new().max_tries(tries).seed(4).backoff().count();
            assert_eq!(delays as u32, tries.max(1) - 1);
        }
        let mut b = RetryPolicy::new().max_tries(2).seed(4).backoff();
        assert!(b.next_delay(Some(MS)).is_some());
        assert_eq!(b.retries(), 1);
        assert_eq!(b.next_delay(Some(MS)), None);
        assert_eq!(b.next_delay(None), None);
    }

    #[test]
    fn a_fixed_seed_is_deterministic() {
        let p = policy().seed(42);
        let a: Vec<_> = p.backoff().collect();
        let b: Vec<_> = p.backoff().collect();
        assert_eq!(a, b);
        let c: Vec<_> = policy().seed(43).backoff().collect();
        assert_ne!(a, c);
        // Unseeded backoffs differ from one another.
        let d: Vec<_> = policy().backoff().collect();
        let e: Vec<_> = policy().backoff().collect();
        assert_ne!(d, e);
    }

    /// 1,000 clients rejected at the same instant, each with its own seed: their first retries cover the
    /// window evenly, no 10% slice of it taking more than 20% of them. Fixed seeds: cannot flake.
    #[test]
    fn a_herd_rejected_together_spreads_out() {
        let p = policy();
        for hint in [None, Some(Duration::from_secs(1))] {
            let mut buckets = [0u32; 10];
            for client in 0..1_000u64 {
                let mut rng = SplitMix64::new(client.wrapping_mul(0x2545_F491_4F6C_DD1D));
                let d = p.delay(3, hint, &mut rng).unwrap() - hint.unwrap_or_default();
                let slot = (d.as_nanos() * 10 / (p.window(3).as_nanos() + 1)) as usize;
                buckets[slot] += 1;
            }
            assert!(buckets.iter().all(|&n| n <= 200), "{hint:?}: {buckets:?}");
            assert!(buckets.iter().all(|&n| n >= 50), "{hint:?}: {buckets:?}");
        }
    }

    fn run(
        policy: &RetryPolicy,
        outcomes: Vec<Result<u32, TestError>>,
    ) -> (Result<u32, TestError>, Vec<Duration>, usize) {
        let outcomes = RefCell::new(outcomes.into_iter());
        let calls = RefCell::new(0);
        let slept = RefCell::new(Vec::new());
        let result = futures::executor::block_on(retry(
            policy,
            || {
                *calls.borrow_mut() += 1;
                let next = outcomes.borrow_mut().next().expect("called too often");
                async move { next }
            },
            |d| {
                slept.borrow_mut().push(d);
                async {}
            },
        ));
        (result, slept.into_inner(), calls.into_inner())
    }

    #[test]
    fn retry_succeeds_after_transient_errors_and_honours_hints() {
        let p = policy().seed(7);
        let (result, slept, calls) =
            run(&p, vec![Err(TestError::Retry(None)), Err(TestError::Retry(Some(Duration::from_secs(2)))), Ok(5)]);
        assert_eq!(result, Ok(5));
        assert_eq!(calls, 3);
        assert_eq!(slept.len(), 2);
        assert!(slept[0] <= 100 * MS);
        assert!(slept[1] >= Duration::from_secs(2) && slept[1] <= Duration::from_secs(2) + 200 * MS);
        // Same seed, same sleeps.
        let again =
            run(&p, vec![Err(TestError::Retry(None)), Err(TestError::Retry(Some(Duration::from_secs(2)))), Ok(5)]);
        assert_eq!(again.1, slept);
    }

    #[test]
    fn retry_stops_at_once_on_a_fatal_error() {
        let (result, slept, calls) = run(&policy(), vec![Err(TestError::Retry(None)), Err(TestError::Fatal)]);
        assert_eq!(result, Err(TestError::Fatal));
        assert_eq!((slept.len(), calls), (1, 2));
    }

    #[test]
    fn retry_gives_up_after_max_tries() {
        let p = policy().max_tries(3).seed(1);
        let (result, slept, calls) = run(&p, (0..3).map(|_| Err(TestError::Retry(Some(MS)))).collect());
        assert_eq!(result, Err(TestError::Retry(Some(MS))));
        assert_eq!((slept.len(), calls), (2, 3));
    }

    #[test]
    fn rejections_are_classified() {
        let hinted = Rejection::NoCapacity { retry_after: 20 * MS };
        assert!(hinted.is_retryable());
        assert_eq!(RetryHint::retry_after(&hinted), Some(20 * MS));
        assert!(Rejection::TimedOut.is_retryable());
        assert_eq!(RetryHint::retry_after(&Rejection::TimedOut), None);
        for fatal in [
            Rejection::Closed,
            Rejection::Invalid { reason: "x" },
            Rejection::TooLarge { limit: crate::Limit::KvBudget, requested: 2, capacity: 1 },
        ] {
            assert!(!fatal.is_retryable(), "{fatal:?}");
        }
    }

    #[test]
    fn header_values_parse() {
        assert_eq!(parse_retry_after("0"), Ok(Duration::ZERO));
        assert_eq!(parse_retry_after("120"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_retry_after("99999999999999999999999"), Ok(Duration::from_millis(u64::MAX)));
        assert_eq!(parse_retry_after("1.5"), Ok(1500 * MS));
        assert_eq!(parse_retry_after("0.0001"), Ok(MS));
        assert_eq!(parse_retry_after("2.000"), Ok(2000 * MS));
        // A date an hour from now, in all three HTTP-date formats, is an hour.
        let now = std::time::UNIX_EPOCH + Duration::from_secs(946_681_199); // Fri, 31 Dec 1999 22:59:59 GMT
        for date in ["Fri, 31 Dec 1999 23:59:59 GMT", "Friday, 31-Dec-99 23:59:59 GMT", "Fri Dec 31 23:59:59 1999"] {
            assert_eq!(parse_retry_after_at(date, now), Ok(Duration::from_secs(3600)), "{date}");
            assert_eq!(retry_after_from_headers(Some(date), None).map(|_| ()), Some(()), "{date}");
        }
        // A date already past is "now".
        assert_eq!(parse_retry_after_at("Fri, 31 Dec 1999 21:00:00 GMT", now), Ok(Duration::ZERO));
        for bad in ["", "-1", "soon", "+3", "1.", ".5", "Fri, 32 Dec 1999 23:59:59 GMT"] {
            assert_eq!(parse_retry_after(bad), Err(ParseRetryAfterError::Invalid), "{bad:?}");
        }
        assert_eq!(parse_retry_after_ms("1500"), Ok(1500 * MS));
        assert_eq!(parse_retry_after_ms("1500.0"), Ok(1500 * MS));
        assert_eq!(parse_retry_after_ms("1500.2"), Ok(1501 * MS));
        for bad in ["", "1.", ".5", "x", "-3", "1e3"] {
            assert_eq!(parse_retry_after_ms(bad), Err(ParseRetryAfterError::Invalid), "{bad:?}");
        }
    }
}
