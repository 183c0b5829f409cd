//! What a caller asks for: prompt and output token counts, a priority class, an optional wait limit.

use super::prefix::{Prefix, PrefixId};
use super::tenant::TenantId;
use std::time::Duration;

/// Priority class of a request. Waiting requests of a higher class are always served before any request
/// of a lower class (strict priority); within a class, in arrival order (FIFO).
///
/// # Examples
///
/// ```
/// use kvgate::{Priority, Request};
///
/// let chat = Request::new(512, 256).priority(Priority::Interactive);
/// let nightly_eval = Request::new(4096, 1024).priority(Priority::Batch);
/// assert!(chat.priority > nightly_eval.priority);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    /// Background work (evaluations, batch jobs): served only when nobody of a higher class waits.
    Batch = 0,
    /// The default class.
    #[default]
    Normal = 1,
    /// Latency-sensitive traffic (a person waiting on a chat reply): served first.
    Interactive = 2,
}

impl Priority {
    /// Number of priority classes.
    pub const COUNT: usize = 3;

    /// All classes, highest first (the order in which waiters are served).
    pub const HIGHEST_FIRST: [Priority; Priority::COUNT] = [Priority::Interactive, Priority::Normal, Priority::Batch];

    /// Dense index of this class (`Batch` = 0 … `Interactive` = 2).
    #[inline]
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Lower-case name, as used in metrics labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            Priority::Batch => "batch",
            Priority::Normal => "normal",
            Priority::Interactive => "interactive",
        }
    }
}

/// One generation request as admission sees it: how many tokens it brings and may produce, its priority
/// class, how long it may wait and which tenant it counts against.
///
/// A request reserves `prompt_tokens + max_new_tokens` of the KV budget and of the token rate. Building a
/// request is free (no allocation); it is `Copy`. Its settings are public fields, read as
/// `request.priority`; the builder methods of the same names set them (`request.priority(...)`).
///
/// # Examples
///
/// ```
/// use kvgate::{Priority, Request, TenantId};
/// use std::time::Duration;
///
/// let req = Request::new(1200, 800).max_wait(Duration::from_secs(2)).tenant("alice").priority(Priority::Batch);
/// assert_eq!(req.total_tokens(), 2000);
/// assert_eq!((req.prompt_tokens, req.max_new_tokens), (1200, 800));
/// assert_eq!(req.max_wait, Some(Duration::from_secs(2)));
/// assert_eq!(req.tenant, Some(TenantId::from("alice")));
/// assert_eq!(req.priority, Priority::Batch);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Request {
    /// Input tokens.
    pub prompt_tokens: u32,
    /// Upper bound on generated tokens.
    pub max_new_tokens: u32,
    /// Priority class (default [`Priority::Normal`]).
    pub priority: Priority,
    /// The request's own wait limit; the effective limit is the shorter of this and the admission's
    /// [`max_queue_wait`](crate::AdmissionBuilder::max_queue_wait).
    pub max_wait: Option<Duration>,
    /// The tenant (user, team or API key) the request counts against, if any.
    pub tenant: Option<TenantId>,
    /// The cacheable prompt prefix it starts with, if it named one (see
    /// [`prefix_sharing`](crate::AdmissionBuilder::prefix_sharing)).
    pub prefix: Option<Prefix>,
    /// How soon after it arrives it must start (see [`ttft_deadline`](Request::ttft_deadline)).
    pub ttft_deadline: Option<Duration>,
}

impl Request {
    /// A request with `prompt_tokens` of input that may generate up to `max_new_tokens`.
    #[inline]
    pub const fn new(prompt_tokens: u32, max_new_tokens: u32) -> Self {
        Self {
            prompt_tokens,
            max_new_tokens,
            priority: Priority::Normal,
            max_wait: None,
            tenant: None,
            prefix: None,
            ttft_deadline: None,
        }
    }

    /// Sets the priority class (default [`Priority::Normal`]).
    #[inline]
    #[must_use]
    pub const fn priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// Limits how long this request may wait in the queue. The effective limit is the shorter of this and
    /// the admission's [`max_queue_wait`](crate::AdmissionBuilder::max_queue_wait): a request can only
    /// shorten its wait, never extend it.
    #[inline]
    #[must_use]
    pub const fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = Some(max_wait);
        self
    }

    /// Names the tenant (user, team or API key) the request counts against: its per-tenant limits
    /// apply, and when requests wait, capacity is shared fairly between tenants. Without a tenant, a
    /// request only meets the global limits (and waits in one shared flow of its own).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::{Request, TenantId};
    ///
    /// let req = Request::new(100, 100).tenant("alice@example.com");
    /// assert_eq!(req.tenant, Some(TenantId::from("alice@example.com")));
    /// ```
    #[inline]
    #[must_use]
    pub fn tenant(mut self, tenant: impl Into<TenantId>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// Names the cacheable prefix the prompt starts with — an id (a hash of the system prompt, say) and its
    /// length in tokens. With [`prefix_sharing`](crate::AdmissionBuilder::prefix_sharing) on, the prefix's
    /// KV is charged once for every request holding a permit with the same prefix; without, it is ignored.
    ///
    /// At most `prompt_tokens − 1` tokens of it count (an engine computes the prompt's last token itself:
    /// vLLM never takes the whole prompt from its cache), in whole blocks of every cache group when the
    /// cost is in engine bytes ([`KvLayout::cache_hit_tokens`](crate::kv::KvLayout::cache_hit_tokens)).
    /// Requests share an id's prefix only when they take the same cache hit at the same price; a request
    /// naming the id with another length, or with a prompt too short for the whole prefix, shares nothing
    /// while the other pricing is held or waited for, and is charged what it costs without a prefix. So is
    /// one whose prefix is shorter than a block, one that would hold as much beyond the prefix as without
    /// it (every layer sliding past the prefix), and one whose shared pricing (prefix and suffix counted
    /// apart) does not fit the budget. A waiter that shares a prefix ends `TooLarge` when a resize leaves
    /// the budget below its prefix and suffix, even where its cost without a prefix would fit. Its tenant's
    /// KV share counts it at its units beyond the prefix, and refuses it `TooLarge` only when its cost
    /// without a prefix exceeds the share.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::{Admission, Request};
    ///
    /// let admission = Admission::builder().kv_capacity_tokens(6_000).prefix_sharing(100).build()?;
    /// let system = "You are the company's assistant. Answer in the user's language.";
    /// let chat = |question: u32| Request::new(4_000 + question, 100).prefix(system, 4_000);
    /// // The 4,000-token system prompt is charged once: ten chats fit where one would without sharing.
    /// let permits: Vec<_> = (0..10).map(|_| admission.try_admit(&chat(10)).unwrap()).collect();
    /// assert_eq!(admission.snapshot().kv_used, 4_000 + 10 * 110);
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    #[inline]
    #[must_use]
    pub fn prefix(mut self, id: impl Into<PrefixId>, tokens: u32) -> Self {
        self.prefix = Some(Prefix { id: id.into(), tokens });
        self
    }

    /// Sets a deadline for the request's start — its time to first token, less the engine's own prefill
    /// time if you know it. kvgate predicts when a request that cannot start now would start, from the
    /// work queued ahead of it and the rate at which permits are returned; a request predicted to miss its
    /// deadline is refused at once ([`Rejection::NoCapacity`](crate::Rejection::NoCapacity), with a
    /// `retry_after` of how much sooner the queue must drain) instead of waiting and failing. One that
    /// waits never waits past its deadline ([`Rejection::TimedOut`](crate::Rejection::TimedOut)), and
    /// leaves earlier when the admission sees it can no longer start in time (on
    /// [`expire_waiters`](crate::Admission::expire_waiters) and the deadline timer's rounds).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::{Admission, Rejection, Request};
    /// use std::time::Duration;
    ///
    /// let admission = Admission::builder().max_in_flight(1).expected_hold_time(Duration::from_secs(10)).build()?;
    /// let _busy = admission.try_admit(&Request::new(100, 100)).unwrap();
    /// // The only slot is held for about 10 s: a request that must start within 2 s is refused at once.
    /// let mut impatient = admission.admit(&Request::new(100, 100).ttft_deadline(Duration::from_secs(2)));
    /// let refused = futures::FutureExt::now_or_never(&mut impatient).unwrap();
    /// assert!(matches!(refused, Err(Rejection::NoCapacity { .. })));
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    #[inline]
    #[must_use]
    pub const fn ttft_deadline(mut self, deadline: Duration) -> Self {
        self.ttft_deadline = Some(deadline);
        self
    }

    /// `prompt_tokens + max_new_tokens`, computed without overflow.
    #[inline]
    pub const fn total_tokens(&self) -> u64 {
        self.prompt_tokens as u64 + self.max_new_tokens as u64
    }
}
