//! The RAII grant: while a `Permit` lives, its request holds an in-flight slot and its KV reservation
//! (globally and in its tenant's limits); dropping it gives them back exactly once and hands them to the
//! next waiter.

use super::dispatcher::Held;
use super::owner::Owner;
use super::prefix::PrefixId;
use super::rates::Charges;
use super::request::Request;
use super::tenant::TenantHandle;
use crate::Priority;
use std::fmt;
use std::sync::Arc;

/// After warm-up, one permit in this many (by admission sequence) feeds the hold-time estimates (sampling
/// keeps the second clock read off most drops).
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
    /// KV units it holds itself (beyond a shared prefix).
    kv: u64,
    /// The shared prefix it holds a share of.
    prefix: Option<PrefixId>,
    prompt_tokens: u32,
    max_new_tokens: u32,
    /// What each rate bucket was charged.
    charges: Charges,
    priority: Priority,
    admitted_at: u64,
    /// Whether dropping it feeds the hold-time estimates. The same permits do with and without the
    /// `metrics` feature (which reads the clock on every drop for its histogram), so that the feature never
    /// changes the estimates, nor the hints and decisions that follow from them.
    sample: bool,
    /// The tenant whose in-flight slot and KV share this permit also holds.
    tenant: Option<Arc<dyn TenantHandle>>,
}

impl Permit {
    /// A permit for capacity already reserved for `request`: counts the admission.
    #[inline(always)]
    pub(crate) fn granted(
        owner: Arc<dyn Owner>,
        request: &Request,
        held: Held,
        charges: Charges,
        tenant: Option<Arc<dyn TenantHandle>>,
        now: u64,
    ) -> Self {
        let core = owner.core();
        let sequence = core.stats.count_admitted();
        let sample = sequence % HOLD_SAMPLE_EVERY == 0
            || core.stats.hold.warming_up()
            || tenant.as_ref().is_some_and(|t| t.core().hold.warming_up());
        crate::telemetry::admitted(request.priority);
        Self {
            owner,
            kv: held.kv,
            prefix: held.prefix,
            prompt_tokens: request.prompt_tokens,
            max_new_tokens: request.max_new_tokens,
            charges,
            priority: request.priority,
            admitted_at: now,
            sample,
            tenant,
        }
    }

    /// Ends the generation having produced `output_tokens`, and refunds the part of the token-rate
    /// reservation that was not used (`max_new_tokens - output_tokens`, if positive), to every token bucket
    /// that was charged (the global one and the tenant's). Then the permit is dropped, returning its slot
    /// and KV reservation.
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
        let unused = u64::from(self.max_new_tokens.saturating_sub(output_tokens));
        if unused != 0 {
            self.owner.refund_output(unused, self.tenant.as_deref());
        }
        if unused != 0 && (self.charges.global.tokens != 0 || self.charges.tenant.tokens != 0) {
            let refund = Charges {
                global: self.charges.global.unused_tokens(unused),
                tenant: self.charges.tenant.unused_tokens(unused),
            };
            self.owner.refund(refund, self.tenant.as_deref());
        }
    }

    /// KV units this permit holds: tokens (`prompt + max_new`), or bytes when the admission has a KV model.
    /// With a shared prefix, the units beyond the prefix (the prefix is held once for all its holders).
    pub fn kv_reserved(&self) -> u64 {
        self.kv
    }

    /// The shared prefix this permit holds a share of: `None` when its request named none, prefix sharing
    /// is off, or the request shares nothing (see [`Request::prefix`](crate::Request::prefix)).
    pub fn prefix(&self) -> Option<PrefixId> {
        self.prefix
    }

    /// The request's prompt tokens.
    pub fn prompt_tokens(&self) -> u32 {
        self.prompt_tokens
    }

    /// The request's maximum new tokens.
    pub fn max_new_tokens(&self) -> u32 {
        self.max_new_tokens
    }

    /// LLM tokens charged to the global token rate (0 without a token rate).
    pub fn tokens_charged(&self) -> u64 {
        self.charges.global.tokens
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
    #[inline]
    fn drop(&mut self) {
        let core = self.owner.core();
        if self.sample || crate::telemetry::HOLD_TIMES {
            let held = self.owner.now_nanos().saturating_sub(self.admitted_at);
            crate::telemetry::hold_time(held);
            if self.sample {
                core.stats.hold.record(held);
                if let Some(tenant) = &self.tenant {
                    tenant.core().hold.record(held);
                }
            }
        }
        core.release_held(Held { kv: self.kv, prefix: self.prefix, saved: 0 }, self.tenant.as_deref());
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("kv", &self.kv)
            .field("prompt_tokens", &self.prompt_tokens)
            .field("max_new_tokens", &self.max_new_tokens)
            .field("tokens_charged", &self.charges.global.tokens)
            .field("priority", &self.priority)
            .finish_non_exhaustive()
    }
}
