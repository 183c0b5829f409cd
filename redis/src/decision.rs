//! One try at the shared limits: the local allowance, else one script call; the fail policy when Redis
//! does not answer.
//!
//! # Order
//! 1. What no waiting changes: a request larger than the shared KV budget or a token burst
//!    (`TooLarge`, nothing taken).
//! 2. The local admission (the caller): in-process limits and the local waiting room.
//! 3. Shared capacity and rates in one atomic script: the lease first, then every rate (global, then
//!    the tenant's), all or nothing, so a request refused for capacity spends no rate token, and a rate
//!    refusal's hint is the time at which *every* rate would pass.
//!    Without shared capacity, the rates may come from the local allowance instead (no call).
//! 4. If Redis does not answer in time: the fail policy.

use crate::admission::{Inner, OnFailure};
use crate::fallback::FallbackPermit;
use crate::leases::LeaseState;
use crate::permit::{HeldLease, TokenCharges};
use crate::stats::Path;
use crate::store::{Charge, Decision, LeaseAsk};
use kvgate::clock::Clock;
use kvgate::{Limit, Rejection, Request};
use std::time::Duration;

/// What the shared limits granted.
#[derive(Debug, Default)]
pub(crate) struct Grant {
    pub(crate) lease: Option<HeldLease>,
    pub(crate) tokens: TokenCharges,
    pub(crate) fallback: Option<FallbackPermit>,
}

/// The outcome of one try.
#[derive(Debug)]
pub(crate) enum Try {
    Granted(Grant),
    /// The shared capacity is full (or Redis is recovering its state): waiting may help, after about this.
    Full(Duration),
    Refused(Rejection),
}

/// Undoes a take whose outcome is unknown (timeout, error, cancellation): the lease leaves the table and
/// its id is given back (a no-op in Redis if the take never happened).
struct Undo<'a, C: Clock> {
    inner: &'a Inner<C>,
    seq: Option<u64>,
}

impl<C: Clock> Undo<'_, C> {
    /// The take's outcome is known: nothing to give back in Redis, only the table entry (if refused).
    fn settle(mut self, taken: bool) {
        if let Some(seq) = self.seq.take() {
            if taken {
                self.inner.core.leases.set_held(seq);
            } else {
                self.inner.core.leases.remove(seq);
            }
        }
    }
}

impl<C: Clock> Drop for Undo<'_, C> {
    fn drop(&mut self) {
        if let Some(seq) = self.seq.take() {
            if self.inner.core.leases.remove(seq) {
                let id = self.inner.core.leases.id(seq);
                let _ = self.inner.work.send(crate::core::Work::Release { lease: Some(id), refunds: Vec::new() });
            }
        }
    }
}

impl<C: Clock> Inner<C> {
    /// Step 1: what waiting cannot change. Returns the request's KV units.
    pub(crate) fn validate(&self, request: &Request) -> Result<u64, Rejection> {
        let kv = self.local.kv_cost(request);
        let limits = &self.core.limits;
        if let Some(budget) = limits.kv_capacity.filter(|&b| kv > b) {
            return Err(Rejection::TooLarge { limit: Limit::KvBudget, requested: kv, capacity: budget });
        }
        let total = request.total_tokens();
        if let Some(spec) = limits.tokens.filter(|s| total > s.burst) {
            return Err(Rejection::TooLarge { limit: Limit::TokenRate, requested: total, capacity: spec.burst });
        }
        if let Some(id) = request.tenant {
            if let Some(spec) = limits.tenant(id).tokens.filter(|s| total > s.burst) {
                return Err(Rejection::TooLarge {
                    limit: Limit::TenantTokenRate,
                    requested: total,
                    capacity: spec.burst,
                });
            }
        }
        Ok(kv)
    }

    /// The shared rate charges of `request`: global request and token rates, then its tenant's.
    fn charges(&self, request: &Request) -> Vec<Charge> {
        let limits = &self.core.limits;
        let keys = &self.core.store.keys;
        let total = request.total_tokens();
        let mut charges = Vec::with_capacity(4);
        if let Some(spec) = limits.requests {
            charges.push(Charge { key: keys.requests(None), spec, n: 1, refundable: false });
        }
        if let Some(spec) = limits.tokens {
            charges.push(Charge { key: keys.tokens(None), spec, n: total, refundable: true });
        }
        if let Some(id) = request.tenant {
            let tenant = limits.tenant(id);
            if let Some(spec) = tenant.requests {
                charges.push(Charge { key: keys.requests(Some(id)), spec, n: 1, refundable: false });
            }
            if let Some(spec) = tenant.tokens {
                charges.push(Charge { key: keys.tokens(Some(id)), spec, n: total, refundable: true });
            }
        }
        charges
    }

    /// Step 3 (and 4): one try at the shared limits for `request`, costing `kv` units.
    pub(crate) async fn try_shared(&self, request: &Request, kv: u64) -> Try {
        let core = &self.core;
        let limits = &core.limits;
        let charges = self.charges(request);
        let capacity = limits.has_capacity();
        if !capacity && charges.is_empty() {
            return Try::Granted(Grant::default());
        }
        if !capacity {
            if let Some(pool) = &core.allowance {
                let tenant_rates = request.tenant.is_some_and(|id| limits.tenant(id) != Default::default());
                if !tenant_rates
                    && pool.covers(limits.requests.is_some(), limits.tokens.is_some())
                    && pool.take(request.total_tokens(), self.local.clock().now_nanos())
                {
                    core.stats.admitted(Path::Allowance);
                    let allowance = if limits.tokens.is_some() { request.total_tokens() } else { 0 };
                    return Try::Granted(Grant {
                        tokens: TokenCharges { redis: Vec::new(), allowance },
                        ..Grant::default()
                    });
                }
            }
        }
        if !core.store.available() {
            return self.fail(request, kv);
        }
        let lease = capacity.then(|| core.leases.insert(1, kv, LeaseState::Acquiring));
        let undo = Undo { inner: self, seq: lease.as_ref().map(|(seq, _)| *seq) };
        let id = lease.as_ref().map(|(seq, _)| core.leases.id(*seq));
        let ask = id.as_deref().map(|id| LeaseAsk { id, slots: 1, kv });
        match core.store.decide(ask, &charges, false, core.generation()).await {
            Ok(Decision::Granted { generation, .. }) => {
                undo.settle(true);
                core.saw_generation(generation);
                core.stats.admitted(Path::Redis);
                let tokens =
                    TokenCharges { redis: charges.into_iter().filter(|c| c.refundable).collect(), allowance: 0 };
                let lease = lease.map(|(seq, signal)| HeldLease { seq, signal });
                Try::Granted(Grant { lease, tokens, fallback: None })
            }
            Ok(Decision::NoCapacity) => {
                undo.settle(false);
                Try::Full(self.local.capacity_retry_after())
            }
            Ok(Decision::Recovering(wait)) => {
                undo.settle(false);
                Try::Full(wait)
            }
            Ok(Decision::RateLimited(retry_after)) => {
                undo.settle(false);
                Try::Refused(Rejection::RateLimited { retry_after })
            }
            // The undo gives the lease id back: the call may have taken it before failing.
            Err(_) => {
                drop(undo);
                self.fail(request, kv)
            }
        }
    }

    /// Step 4: Redis did not answer; the fail policy decides.
    fn fail(&self, request: &Request, kv: u64) -> Try {
        match &self.on_failure {
            OnFailure::Closed(retry_after) => {
                self.core.stats.failed_closed();
                Try::Refused(Rejection::NoCapacity { retry_after: *retry_after })
            }
            OnFailure::Open(fallback) => match fallback.try_admit(request, kv) {
                Ok(permit) => {
                    self.core.stats.admitted(Path::Fallback);
                    let lease = self.core.limits.has_capacity().then(|| {
                        let (seq, signal) = self.core.leases.insert(1, kv, LeaseState::Unleased);
                        HeldLease { seq, signal }
                    });
                    Try::Granted(Grant { lease, tokens: TokenCharges::default(), fallback: Some(permit) })
                }
                Err(Rejection::NoCapacity { retry_after }) => Try::Full(retry_after),
                Err(rejection) => Try::Refused(rejection),
            },
        }
    }
}
