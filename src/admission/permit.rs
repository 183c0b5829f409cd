//! The RAII grant: while a `Permit` lives, its request holds an in-flight slot and its KV reservation;
//! dropping it gives both back exactly once and hands them to the next waiter.

use super::core::Core;
use super::tenant::TenantHandle;
use crate::Priority;
use std::fmt;
use std::sync::Arc;

/// What a permit or a waiting future needs from the (clock-generic) admission that issued it.
pub(crate) trait Owner: Send + Sync + fmt::Debug + 'static {
    /// The clock-independent state.
    fn core(&self) -> &Core;
    /// The admission clock's reading.
    fn now_nanos(&self) -> u64;
    /// Real time to wait until the admission clock reaches `deadline`.
    #[cfg_attr(loom, allow(dead_code))]
    fn real_time_until(&self, deadline: u64) -> std::time::Duration;
    /// Gives back rate-limit charges: one request (if `request`) and `tokens` LLM tokens, to the global
    /// buckets and to the tenant's.
    fn refund_rates(&self, request: bool, tokens: u64, tenant: Option<&dyn TenantHandle>);
    /// The whole `try_admit` decision, without counting a rejection.
    fn admit_now(&self, this: &Arc<dyn Owner>, request: &crate::Request) -> Result<Permit, crate::Rejection>;
    /// Validates a request that will wait and charges its rates; says how long it may wait.
    fn prepare_wait(&self, request: &crate::Request) -> Result<super::admit::Ticket, crate::Rejection>;
    /// Feeds a completed request's real output length to the reservation policy.
    fn observe_output(&self, output_tokens: u32, max_new_tokens: u32);
    /// Builds the permit for a waiter that was granted.
    fn permit_for(&self, this: &Arc<dyn Owner>, request: &crate::Request, ticket: &super::admit::Ticket) -> Permit;
}

/// Permits whose sequence number is a multiple of this feed the hold-time average (sampling keeps the
/// second clock read off most drops).
const HOLD_SAMPLE_EVERY: u64 = 8;

/// Capacity granted to one request. Dropping it returns the capacity, exactly once.
///
/// A permit owns everything it needs (`Send + Sync + 'static`): move it into a spawned task or into the
/// response stream that generates the tokens, so the capacity is held exactly as long as the generation
/// runs — including when the client disconnects (the stream is dropped) or the task panics (the permit
/// is dropped while unwinding).
///
/// # Examples
///
/// ```
/// use kvgate::{Admission, Request};
///
/// let admission = Admission::builder().max_in_flight(4).kv_capacity_tokens(10_000).build().unwrap();
/// let permit = admission.try_admit(&Request::new(1000, 500)).unwrap();
/// assert_eq!(permit.kv_reserved(), 1500);
/// assert_eq!(admission.snapshot().kv_used, 1500);
/// permit.complete(120); // generation produced 120 tokens; the unused token-rate reservation is refunded
/// assert_eq!(admission.snapshot().kv_used, 0);
/// ```
pub struct Permit {
    owner: Arc<dyn Owner>,
    kv: u64,
    prompt_tokens: u32,
    max_new_tokens: u32,
    /// LLM tokens charged to the token rate (0 when no token rate is configured).
    tokens_charged: u64,
    priority: Priority,
    admitted_at: u64,
    sequence: u64,
    /// The tenant whose in-flight slot and KV share this permit also holds.
    tenant: Option<Arc<dyn TenantHandle>>,
}

impl Permit {
    pub(crate) fn new(
        owner: Arc<dyn Owner>,
        request: &crate::Request,
        kv: u64,
        tokens_charged: u64,
        tenant: Option<Arc<dyn TenantHandle>>,
        admitted_at: u64,
        sequence: u64,
    ) -> Self {
        Self {
            owner,
            kv,
            prompt_tokens: request.prompt_tokens,
            max_new_tokens: request.max_new_tokens,
            tokens_charged,
            priority: request.priority,
            admitted_at,
            sequence,
            tenant,
        }
    }

    /// Ends the generation having produced `output_tokens`, and refunds the part of the token-rate
    /// reservation that was not used (`max_new_tokens - output_tokens`, if positive). Then the permit is
    /// dropped, returning its slot and KV reservation.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::{Admission, Request};
    ///
    /// let admission = Admission::builder().token_rate(1000.0, 1000).build().unwrap();
    /// let permit = admission.try_admit(&Request::new(100, 900)).unwrap(); // charges 1000 tokens
    /// permit.complete(100); // only 200 used: 800 come back
    /// assert!(admission.try_admit(&Request::new(100, 700)).is_ok());
    /// ```
    pub fn complete(self, output_tokens: u32) {
        self.owner.observe_output(output_tokens, self.max_new_tokens);
        if self.tokens_charged != 0 || self.tenant.is_some() {
            // Every token bucket charged this request `prompt + max_new` tokens, so the unused part of
            // `max_new` is within what each of them holds for it.
            let unused = u64::from(self.max_new_tokens.saturating_sub(output_tokens));
            if unused != 0 {
                self.owner.refund_rates(false, unused, self.tenant.as_deref());
            }
        }
    }

    /// KV units this permit holds: tokens (`prompt + max_new`), or bytes when the admission has a KV model.
    pub fn kv_reserved(&self) -> u64 {
        self.kv
    }

    /// The request's prompt tokens.
    pub fn prompt_tokens(&self) -> u32 {
        self.prompt_tokens
    }

    /// The request's maximum new tokens.
    pub fn max_new_tokens(&self) -> u32 {
        self.max_new_tokens
    }

    /// LLM tokens charged to the token rate (0 without a token rate).
    pub fn tokens_charged(&self) -> u64 {
        self.tokens_charged
    }

    /// The request's priority class.
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// Admission clock reading (nanoseconds) when the permit was granted.
    pub fn admitted_at_nanos(&self) -> u64 {
        self.admitted_at
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let core = self.owner.core();
        if crate::telemetry::HOLD_TIMES || self.sequence % HOLD_SAMPLE_EVERY == 0 {
            let held = self.owner.now_nanos().saturating_sub(self.admitted_at);
            crate::telemetry::hold_time(held);
            if self.sequence % HOLD_SAMPLE_EVERY == 0 {
                core.record_hold(held);
            }
        }
        if let Some(tenant) = &self.tenant {
            tenant.release(self.kv);
        }
        core.release(self.kv);
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("kv", &self.kv)
            .field("prompt_tokens", &self.prompt_tokens)
            .field("max_new_tokens", &self.max_new_tokens)
            .field("tokens_charged", &self.tokens_charged)
            .field("priority", &self.priority)
            .finish_non_exhaustive()
    }
}
