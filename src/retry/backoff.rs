//! [`Backoff`]: the retry state of one operation, and the [`RetryPolicy`] methods that start one — with
//! or without a shared [`RetryBudget`].
//!
//! The budget is held as a trait object (`Arc<dyn Withdraw>`, in a `SharedBudget`), so that `Backoff`
//! stays one concrete type whatever clock the budget reads, with the auto traits it always had (`Send`,
//! `Sync`, `UnwindSafe`, `RefUnwindSafe`), and the budget's files never need to know about backoffs.

use super::budget::RetryBudget;
use super::policy::RetryPolicy;
use super::rng::SplitMix64;
use crate::clock::Clock;
use std::fmt::Debug;
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::sync::Arc;
use std::time::Duration;

/// What a [`Backoff`] needs from a shared budget: permission for one retry.
trait Withdraw: Debug + Send + Sync {
    /// Records one retry and returns `true` if the budget allows it; `false` (recording nothing) if not.
    fn try_withdraw(&self) -> bool;
}

impl<C: Clock> Withdraw for RetryBudget<C> {
    fn try_withdraw(&self) -> bool {
        RetryBudget::try_withdraw(self)
    }
}

/// The budget a [`Backoff`] spends.
#[derive(Debug, Clone)]
struct SharedBudget(Arc<dyn Withdraw>);

/// A panic cannot leave a budget in a state that breaks its invariants: every change is one CAS on one
/// word, the clock (the only code not ours that it calls) is read before anything changes, and the
/// withdrawal lock ignores poisoning and guards nothing a panic could interrupt. So a `Backoff` stays
/// unwind-safe, as it was before it could hold a budget, whatever the budget's clock type says.
impl UnwindSafe for SharedBudget {}
impl RefUnwindSafe for SharedBudget {}

impl RetryPolicy {
    /// A fresh backoff state for one operation.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::retry::RetryPolicy;
    ///
    /// let mut backoff = RetryPolicy::new().max_tries(2).backoff();
    /// assert!(backoff.next_delay(None).is_some());
    /// assert_eq!(backoff.next_delay(None), None);
    /// ```
    pub fn backoff(&self) -> Backoff {
        Backoff { policy: *self, rng: self.rng(), attempt: 0, budget: None }
    }

    /// A fresh backoff state for one operation whose retries also spend `budget`, shared with every other
    /// operation of this client.
    ///
    /// It [deposits](RetryBudget::deposit) this operation's first try in the budget at once, so call it
    /// once per operation, when the first try is sent (as [`retry_with_budget`](super::retry_with_budget)
    /// does). Then each [`next_delay`](Backoff::next_delay) first asks the policy, and only when the
    /// policy would retry asks the budget ([`try_withdraw`](RetryBudget::try_withdraw)); a refusal is
    /// `None`, "give up", like any other reason to stop, and spends nothing. A retry that the policy
    /// refuses (tries used up, a hint too long) takes nothing from the budget.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::retry::{RetryBudget, RetryPolicy};
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// // 10 % of first tries, no floor: ten first tries pay for one retry.
    /// let budget = Arc::new(RetryBudget::new(Duration::from_secs(10), 0, 0.1)?);
    /// let policy = RetryPolicy::new().max_tries(5).seed(1);
    /// let mut backoffs: Vec<_> = (0..10).map(|_| policy.backoff_with_budget(&budget)).collect();
    /// assert_eq!(budget.balance(), 1);
    /// assert!(backoffs[0].next_delay(None).is_some()); // the one retry the budget pays for
    /// assert_eq!(backoffs[1].next_delay(None), None); // the budget is spent: give up
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn backoff_with_budget<C: Clock>(&self, budget: &Arc<RetryBudget<C>>) -> Backoff {
        budget.deposit();
        let budget = SharedBudget(Arc::clone(budget) as Arc<dyn Withdraw>);
        Backoff { policy: *self, rng: self.rng(), attempt: 0, budget: Some(budget) }
    }
}

/// The retry state of one operation: which retry comes next, its random generator, and the shared
/// [`RetryBudget`] it spends, if any.
///
/// As an [`Iterator`] it yields the hint-less delays until the policy (or the budget) gives up. A clone
/// continues from the same state and spends the same budget; it does not deposit again.
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
    budget: Option<SharedBudget>,
}

impl Backoff {
    /// The delay before the next retry, given the server's hint; `None`: give up.
    ///
    /// With a budget ([`RetryPolicy::backoff_with_budget`]), a retry the policy allows is also withdrawn
    /// from the budget, and `None` when the budget refuses. A refusal does not count as a retry: a
    /// caller that asks again later (it should not; `None` means give up) is asked about the same retry.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::retry::RetryPolicy;
    /// use std::time::Duration;
    ///
    /// let mut backoff = RetryPolicy::new().max_tries(2).seed(3).backoff();
    /// assert!(backoff.next_delay(Some(Duration::from_millis(20))).unwrap() >= Duration::from_millis(20));
    /// assert_eq!(backoff.next_delay(None), None); // two tries made
    /// ```
    pub fn next_delay(&mut self, retry_after: Option<Duration>) -> Option<Duration> {
        let delay = self.policy.delay(self.attempt, retry_after, &mut self.rng)?;
        if self.budget.as_ref().is_some_and(|budget| !budget.0.try_withdraw()) {
            return None;
        }
        self.attempt += 1;
        Some(delay)
    }

    /// Retries handed out so far.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::retry::RetryPolicy;
    ///
    /// let mut backoff = RetryPolicy::new().seed(3).backoff();
    /// backoff.next_delay(None);
    /// assert_eq!(backoff.retries(), 1);
    /// ```
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

#[cfg(test)]
mod tests {
    use super::super::policy::tests::policy;
    use super::*;
    use crate::clock::ManualClock;

    const MS: Duration = Duration::from_millis(1);

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

    /// A budget that allows everything changes nothing: the same seed gives the same delays.
    #[test]
    fn an_ample_budget_leaves_the_schedule_alone() {
        let budget =
            Arc::new(RetryBudget::with_clock(Duration::from_secs(10), 1_000, 0.0, ManualClock::new()).unwrap());
        let p = policy().seed(5);
        let plain: Vec<_> = p.backoff().collect();
        let budgeted: Vec<_> = p.backoff_with_budget(&budget).collect();
        assert_eq!(plain, budgeted);
        assert_eq!(budget.balance(), 10_000 - 9);
    }

    /// The policy is asked first: a retry it refuses spends nothing from the budget.
    #[test]
    fn a_retry_the_policy_refuses_takes_nothing_from_the_budget() {
        let budget = Arc::new(RetryBudget::with_clock(Duration::from_secs(1), 3, 0.0, ManualClock::new()).unwrap());
        let mut b = RetryPolicy::new().max_tries(1).backoff_with_budget(&budget);
        assert_eq!(b.next_delay(None), None);
        let mut b = RetryPolicy::new().max_retry_after(MS).backoff_with_budget(&budget);
        assert_eq!(b.next_delay(Some(2 * MS)), None);
        assert_eq!(budget.balance(), 3);
    }
}
