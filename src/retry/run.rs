//! [`retry`] and [`retry_with_budget`]: the retry loop, runtime-neutral (the caller brings the sleep).

use super::backoff::Backoff;
use super::budget::RetryBudget;
use super::hint::RetryHint;
use super::policy::RetryPolicy;
use crate::clock::Clock;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

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
pub async fn retry<T, E, Fut, Op, Sleep, SleepFut>(policy: &RetryPolicy, op: Op, sleep: Sleep) -> Result<T, E>
where
    Op: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: RetryHint,
    Sleep: FnMut(Duration) -> SleepFut,
    SleepFut: Future<Output = ()>,
{
    run(policy.backoff(), op, sleep).await
}

/// [`retry`] whose retries also spend a shared [`RetryBudget`]: the first try is deposited in it, and each
/// retry is withdrawn from it; when the budget refuses, the loop gives up and returns the last error. See
/// [`RetryPolicy::backoff_with_budget`] and the [module docs](super#the-retry-budget).
///
/// Share one budget (in an `Arc`) among all the operations a client sends to one service.
///
/// # Errors
///
/// The last error of `op`: the first non-retryable one, or the one after which the policy or the budget
/// gave up.
///
/// # Cancel safety
///
/// Dropping the future drops the try or the sleep in progress; nothing else is held. The first try's
/// deposit and the retries already withdrawn stay in the budget (they were sent).
///
/// # Examples
///
/// ```
/// use kvgate::retry::{retry_with_budget, RetryBudget, RetryPolicy};
/// use kvgate::Rejection;
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// // No floor and 0 %: this budget pays for no retry at all.
/// let budget = Arc::new(RetryBudget::new(Duration::from_secs(10), 0, 0.0)?);
/// let mut calls = 0;
/// let result: Result<(), Rejection> = futures::executor::block_on(retry_with_budget(
///     &RetryPolicy::new().max_tries(3).seed(1),
///     &budget,
///     || { calls += 1; async { Err(Rejection::RateLimited { retry_after: Duration::from_millis(1) }) } },
///     |_delay| async {},
/// ));
/// assert!(result.is_err());
/// assert_eq!(calls, 1); // the budget refused the first retry
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
pub async fn retry_with_budget<C, T, E, Fut, Op, Sleep, SleepFut>(
    policy: &RetryPolicy,
    budget: &Arc<RetryBudget<C>>,
    op: Op,
    sleep: Sleep,
) -> Result<T, E>
where
    C: Clock,
    Op: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: RetryHint,
    Sleep: FnMut(Duration) -> SleepFut,
    SleepFut: Future<Output = ()>,
{
    run(policy.backoff_with_budget(budget), op, sleep).await
}

/// The loop of [`retry`] and [`retry_with_budget`], given the operation's backoff.
async fn run<T, E, Fut, Op, Sleep, SleepFut>(mut backoff: Backoff, mut op: Op, mut sleep: Sleep) -> Result<T, E>
where
    Op: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: RetryHint,
    Sleep: FnMut(Duration) -> SleepFut,
    SleepFut: Future<Output = ()>,
{
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

#[cfg(test)]
mod tests {
    use super::super::policy::tests::policy;
    use super::*;
    use crate::clock::ManualClock;
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

    fn drive(
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
            drive(&p, vec![Err(TestError::Retry(None)), Err(TestError::Retry(Some(Duration::from_secs(2)))), Ok(5)]);
        assert_eq!(result, Ok(5));
        assert_eq!(calls, 3);
        assert_eq!(slept.len(), 2);
        assert!(slept[0] <= 100 * MS);
        assert!(slept[1] >= Duration::from_secs(2) && slept[1] <= Duration::from_secs(2) + 200 * MS);
        // Same seed, same sleeps.
        let again =
            drive(&p, vec![Err(TestError::Retry(None)), Err(TestError::Retry(Some(Duration::from_secs(2)))), Ok(5)]);
        assert_eq!(again.1, slept);
    }

    #[test]
    fn retry_stops_at_once_on_a_fatal_error() {
        let (result, slept, calls) = drive(&policy(), vec![Err(TestError::Retry(None)), Err(TestError::Fatal)]);
        assert_eq!(result, Err(TestError::Fatal));
        assert_eq!((slept.len(), calls), (1, 2));
    }

    #[test]
    fn retry_gives_up_after_max_tries() {
        let p = policy().max_tries(3).seed(1);
        let (result, slept, calls) = drive(&p, (0..3).map(|_| Err(TestError::Retry(Some(MS)))).collect());
        assert_eq!(result, Err(TestError::Retry(Some(MS))));
        assert_eq!((slept.len(), calls), (2, 3));
    }

    /// Runs `outcomes` through `retry_with_budget` on `budget`; returns the result and the number of calls.
    fn run_with_budget(
        policy: &RetryPolicy,
        budget: &Arc<RetryBudget<ManualClock>>,
        outcomes: Vec<Result<u32, TestError>>,
    ) -> (Result<u32, TestError>, usize) {
        let outcomes = RefCell::new(outcomes.into_iter());
        let calls = RefCell::new(0);
        let result = futures::executor::block_on(retry_with_budget(
            policy,
            budget,
            || {
                *calls.borrow_mut() += 1;
                let next = outcomes.borrow_mut().next().expect("called too often");
                async move { next }
            },
            |_| async {},
        ));
        (result, calls.into_inner())
    }

    #[test]
    fn retry_with_budget_deposits_the_first_try_and_stops_when_the_budget_is_spent() {
        // A floor of 2 retries in the window, 50 % of first tries.
        let budget = Arc::new(RetryBudget::with_clock(Duration::from_secs(1), 2, 0.5, ManualClock::new()).unwrap());
        let p = policy().seed(2);
        // A success deposits its first try: 2 + 0.5 = 2.5 retries, 2 whole.
        assert_eq!(run_with_budget(&p, &budget, vec![Ok(1)]), (Ok(1), 1));
        assert_eq!(budget.balance(), 2);
        // Failing forever: the second operation's first try adds half a retry (3 in all), all three
        // retries are granted, the fourth is refused.
        let failing = (0..10).map(|_| Err(TestError::Retry(None))).collect();
        let (result, calls) = run_with_budget(&p, &budget, failing);
        assert_eq!((result, calls), (Err(TestError::Retry(None)), 4));
        assert_eq!(budget.balance(), 0);
        // A fatal error stops at once and spends nothing.
        assert_eq!(run_with_budget(&p, &budget, vec![Err(TestError::Fatal)]), (Err(TestError::Fatal), 1));
    }
}
