//! The admission decision: one path for every request — with or without a tenant, allowed to wait or not —
//! that takes every limit all or nothing.
//!
//! # Order of checks
//! 1. What waiting cannot change (nothing is taken): a request for zero tokens (`Invalid`), a closed
//!    admission (`Closed`), a request larger than the KV budget, its tenant's share of the budget, or a
//!    token-rate burst (`TooLarge`).
//! 2. The global in-flight slot and KV budget. Refused while a waiter of the same or a higher class is held
//!    back by them (a new request never overtakes it) or when they are full: `NoCapacity` — or, when the
//!    request may wait, it queues.
//! 3. The tenant's own in-flight cap and KV share. Refused while one of the tenant's own waiters of the
//!    same or a higher class is parked, or when they are full: `RateLimited` with a hint from the tenant's
//!    own hold times (the client, not the server, is too busy) — or, when the request may wait, it queues
//!    in its tenant's flow, parked until the tenant frees room.
//! 4. The request rate and token rate, global then the tenant's, only once capacity was found, so that a
//!    request refused for capacity spends no rate token. A rate refusal (`RateLimited`) carries the time
//!    at which *every* rate the request is subject to would pass. A request that queues is charged its
//!    rates before it queues (rates never wait) and refunded exactly that if it never runs.
//!
//! A refusal at any step gives back what the earlier steps took before it returns.

use super::capacity::{Credit, Shortage};
use super::core::Core;
use super::cost::KvCost;
use super::dispatcher::{Enqueued, Held, NewWaiter};
use super::fairness::Fairness;
use super::owner::{Attempt, Owner, Ticket, WaitSpec};
use super::permit::Permit;
use super::prefix::Split;
use super::rates::{Charge, Charges, RateRefusal, Rates};
use super::rejection::{Limit, Rejection};
use super::request::Request;
use super::reservation::ReservationState;
use super::stats::{MAX_HINT, MIN_HINT};
use super::tenant::{TenantHandle, TenantRegistry, TenantState};
use crate::clock::Clock;
use std::sync::Arc;
use std::time::Duration;

/// Whose capacity held a request back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeldBy {
    /// The global in-flight slots or KV budget (or waiters they hold back).
    Server,
    /// The request's tenant's in-flight cap or KV share (or its parked waiters).
    Tenant,
}

/// What a request that finds no capacity does, chosen by type: [`NoWait`] is refused (`try_admit`), a
/// [`WaitSpec`] tries to queue (and may still be refused: see `Shared::queue`). Each has its own result
/// type, so that `try_admit` builds its `Result<Permit, Rejection>` in place, with no variant for a wait it
/// never makes.
pub(crate) trait Waiting {
    type Output;
    fn granted(permit: Permit) -> Self::Output;
    /// A refusal of `request` (holding nothing); `try_admit`'s is counted here, a waiting request's
    /// where its future resolves.
    fn refused(core: &Core, request: &Request, rejection: Rejection) -> Self::Output;
    /// Capacity (the server's or the tenant's, as `held_by` says) held the request back; it holds nothing
    /// when this is called.
    fn held_back<C: Clock>(
        self,
        shared: &Shared<C>,
        this: &impl Fn() -> Arc<dyn Owner>,
        request: &Request,
        cost: (u64, Option<Split>),
        tenant: Option<Arc<TenantState<C>>>,
        held_by: HeldBy,
    ) -> Self::Output;
}

/// A request that may not wait.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NoWait;

impl Waiting for NoWait {
    type Output = Result<Permit, Rejection>;

    #[inline(always)]
    fn granted(permit: Permit) -> Self::Output {
        Ok(permit)
    }

    #[inline(always)]
    fn refused(core: &Core, request: &Request, rejection: Rejection) -> Self::Output {
        core.count_rejection(&rejection, request.tenant.is_some());
        Err(rejection)
    }

    fn held_back<C: Clock>(
        self,
        shared: &Shared<C>,
        _: &impl Fn() -> Arc<dyn Owner>,
        request: &Request,
        _: (u64, Option<Split>),
        tenant: Option<Arc<TenantState<C>>>,
        held_by: HeldBy,
    ) -> Self::Output {
        Self::refused(&shared.core, request, shared.refusal(held_by, request, tenant.as_deref()))
    }
}

impl Waiting for WaitSpec {
    type Output = Attempt;

    #[inline(always)]
    fn granted(permit: Permit) -> Self::Output {
        Attempt::Granted(permit)
    }

    #[inline(always)]
    fn refused(_: &Core, _: &Request, rejection: Rejection) -> Self::Output {
        Attempt::Refused(rejection)
    }

    fn held_back<C: Clock>(
        self,
        shared: &Shared<C>,
        this: &impl Fn() -> Arc<dyn Owner>,
        request: &Request,
        cost: (u64, Option<Split>),
        tenant: Option<Arc<TenantState<C>>>,
        held_by: HeldBy,
    ) -> Self::Output {
        shared.queue(this, request, cost, tenant, self, held_by)
    }
}

/// Everything one admission owns.
#[derive(Debug)]
pub(crate) struct Shared<C: Clock> {
    pub(crate) core: Core,
    pub(crate) clock: C,
    pub(crate) kv_cost: KvCost,
    pub(crate) reservation: ReservationState,
    pub(crate) rates: Rates<C>,
    /// Default longest queue wait in clock nanoseconds.
    pub(crate) max_queue_wait: Option<u64>,
    /// Whether requests naming a prefix share its KV (`prefix_sharing`).
    pub(crate) prefix_sharing: bool,
    /// How waiting tenants share the server.
    pub(crate) fairness: Fairness,
    pub(crate) tenants: Option<TenantRegistry<C>>,
}

impl<C: Clock> Shared<C> {
    /// The KV units `request` reserves.
    #[inline]
    pub(crate) fn kv_cost(&self, request: &Request) -> u64 {
        self.kv_cost.units(self.reservation.tokens(request))
    }

    /// The request's cost split around its shared prefix, when prefix sharing is on and it named one.
    #[inline]
    fn split(&self, request: &Request) -> Option<Split> {
        let prefix = request.prefix.filter(|_| self.prefix_sharing)?;
        // An engine computes at least the prompt's last token itself (vLLM caps a cache hit at the
        // prompt less one token), so at most `prompt − 1` tokens can come from the shared prefix.
        let tokens = prefix.tokens.min(request.prompt_tokens.saturating_sub(1));
        let split = self.kv_cost.split(prefix.id, self.reservation.tokens(request), u64::from(tokens));
        // A prefix worth nothing (shorter than a cache hit), or one whose sharers would each hold as much
        // as alone (every layer sliding past it), shares nothing and takes no table entry.
        (split.prefix > 0 && split.suffix < split.alone).then_some(split)
    }

    /// Step 1, global part: what no amount of waiting changes. Returns the request's KV units (its whole
    /// cost, prefix included) and its split around a shared prefix.
    #[inline(always)]
    fn validate(&self, request: &Request) -> Result<(u64, Option<Split>), Rejection> {
        let total = request.total_tokens();
        if total == 0 {
            return Err(Rejection::Invalid { reason: "the request asks for zero tokens (prompt and output both 0)" });
        }
        if self.core.is_closed() {
            return Err(Rejection::Closed);
        }
        let split = self.split(request);
        let alone = split.map_or_else(|| self.kv_cost(request), |s| s.alone);
        let budget = self.core.kv_limit();
        if alone > budget {
            return Err(Rejection::TooLarge { limit: Limit::KvBudget, requested: alone, capacity: budget });
        }
        // Shared, a request that brings the prefix in holds the prefix and its suffix counted apart; when
        // that cannot fit, it shares nothing.
        let split = split.filter(|s| s.whole() <= budget);
        let kv = split.map_or(alone, |s| s.whole());
        if let Some(burst) = self.rates.token_burst() {
            if total > burst {
                return Err(Rejection::TooLarge { limit: Limit::TokenRate, requested: total, capacity: burst });
            }
        }
        Ok((kv, split))
    }

    /// The one decision (see the module docs).
    ///
    /// `this` hands out the owner a permit keeps (called only when one is granted); `wait` says what a
    /// request held back by capacity does (see [`Waiting`]).
    #[inline]
    pub(crate) fn decide<W: Waiting>(
        &self,
        this: &impl Fn() -> Arc<dyn Owner>,
        request: &Request,
        wait: W,
    ) -> W::Output {
        let (kv, split) = match self.validate(request) {
            Ok(valid) => valid,
            Err(rejection) => return W::refused(&self.core, request, rejection),
        };
        let class = request.priority.index();
        let mut now = None;
        let tenant = match (&self.tenants, request.tenant) {
            (Some(registry), Some(id)) => {
                let t = registry.get(id, *now.get_or_insert_with(|| self.clock.now_nanos()));
                // What the tenant is charged: its cost without a prefix at most (its suffix when shared).
                let own = split.map_or(kv, |s| s.alone);
                if let Err(rejection) = t.core().fits_share(own, self.core.kv_limit()) {
                    return W::refused(&self.core, request, rejection);
                }
                if let Err(rejection) = t.fits_burst(request.total_tokens()) {
                    return W::refused(&self.core, request, rejection);
                }
                Some(t)
            }
            _ => None,
        };
        let core = &self.core;
        // Step 2: global capacity (a request sharing a prefix takes the waiting room's lock, where the
        // prefix table lives).
        let taken = match &split {
            Some(split) => core.dispatcher.take_shared(core.resources(), split, class),
            None => core.try_take(kv, class).map(|()| Held { kv, prefix: None, saved: 0 }),
        };
        let held = match taken {
            Ok(held) => held,
            Err(shortage) => {
                return match shortage {
                    Shortage::Closed => W::refused(&self.core, request, Rejection::Closed),
                    _ => wait.held_back(self, this, request, (kv, split), tenant, HeldBy::Server),
                };
            }
        };
        // Step 3: the tenant's own capacity (its own units: a shared prefix is counted once, globally).
        if let Some(t) = &tenant {
            let tc = t.core();
            let own = held.kv;
            if let Err(refused) = tc.capacity.try_take(tc.kv_units(own), tc.kv_limit(core.kv_limit()), class) {
                core.release_held(held, None);
                if refused.dispatch {
                    core.dispatcher.dispatch(
                        core.resources(),
                        Some(t.as_ref() as &dyn TenantHandle),
                        Credit::default(),
                    );
                }
                return wait.held_back(self, this, request, (kv, split), tenant, HeldBy::Tenant);
            }
        }
        // Step 4: rates.
        let now = now.unwrap_or_else(|| self.clock.now_nanos());
        match self.charge(request.total_tokens(), tenant.as_deref(), now) {
            Ok((charges, _)) if charges != Charges::default() && core.capacity().is_closed_ordered() => {
                // Closed while this request charged its rates: a grant now would follow `close()` (a
                // request without rates needs no check: its take of capacity is ordered against it).
                let handle = tenant.as_deref().map(|t| t as &dyn TenantHandle);
                self.refund(charges, handle);
                core.release_held(held, handle);
                W::refused(&self.core, request, Rejection::Closed)
            }
            Ok((charges, now)) => {
                if tenant.as_ref().is_some_and(|t| t.core().has_waiters()) {
                    // The tenant has less room now: its waiting heads that no longer fit its own limits
                    // are parked, so that they hold back nobody behind them.
                    core.dispatcher.dispatch(core.resources(), None, Credit::default());
                }
                core.stats.count_prefix_saved(held.saved);
                if let (Some(t), Fairness::Tokens { .. }) = (&tenant, self.fairness) {
                    let cost = self.fairness.cost(request.prompt_tokens, request.max_new_tokens);
                    let served_at = t.core().charge_virtual_tokens(Fairness::counter_units(cost, t.core().weight));
                    core.levels.served(class, served_at);
                }
                let tenant = tenant.map(|t| t as Arc<dyn TenantHandle>);
                W::granted(Permit::granted(this(), request, held, charges, tenant, now))
            }
            Err(rejection) => {
                core.release_held(held, tenant.as_deref().map(|t| t as &dyn TenantHandle));
                W::refused(&self.core, request, rejection)
            }
        }
    }

    /// Charges the global rates, then the tenant's, all or nothing. Returns the charges and the time they
    /// were made at. A refusal's hint is the time at which every rate involved would pass.
    #[inline(always)]
    fn charge(&self, total: u64, tenant: Option<&TenantState<C>>, now: u64) -> Result<(Charges, u64), Rejection> {
        let (global, now) = self.charge_global(total, now, tenant)?;
        let Some(tenant) = tenant.filter(|t| t.has_rates()) else {
            return Ok((Charges { global, tenant: Charge::default() }, now));
        };
        match tenant.charge(total, now) {
            Ok(charge) => Ok((Charges { global, tenant: charge }, now)),
            Err(refusal) => {
                self.rates.refund(global, now);
                Err(match refusal {
                    RateRefusal::NotYet { wait, spacing } => {
                        // The tenant's rate refused it: its hint is promised there (told the moment after
                        // those already promised to the tenant's refused requests).
                        let promised = tenant.promise_rate(now, wait, spacing);
                        Rejection::RateLimited { retry_after: promised.max(self.rates.wait(total, now)) }
                    }
                    RateRefusal::NeverFits { requested, burst } => {
                        Rejection::TooLarge { limit: Limit::TenantTokenRate, requested, capacity: burst }
                    }
                })
            }
        }
    }

    /// Charges the global rates at `now`, looking at the clock again once if refused: a thread preempted
    /// between reading the clock and charging arrives with a stale time and would be refused for tokens
    /// that have accrued since.
    #[inline(always)]
    fn charge_global(&self, total: u64, now: u64, tenant: Option<&TenantState<C>>) -> Result<(Charge, u64), Rejection> {
        if self.rates.is_empty() {
            return Ok((Charge::default(), now));
        }
        let refusal = match self.rates.charge(total, now) {
            Ok(charge) => return Ok((charge, now)),
            Err(RateRefusal::NotYet { .. }) => {
                let now = self.clock.now_nanos();
                match self.rates.charge(total, now) {
                    Ok(charge) => return Ok((charge, now)),
                    Err(refusal) => (refusal, now),
                }
            }
            Err(refusal) => (refusal, now),
        };
        Err(match refusal {
            (RateRefusal::NotYet { wait, spacing }, now) => {
                // Promised once, for the refusal this request gets (not for the first look above).
                let promised = self.rates.promise.promise(now, wait, spacing);
                let tenant_wait = tenant.map_or(Duration::ZERO, |t| t.rate_wait(total, now));
                Rejection::RateLimited { retry_after: promised.max(tenant_wait) }
            }
            (RateRefusal::NeverFits { requested, burst }, _) => {
                Rejection::TooLarge { limit: Limit::TokenRate, requested, capacity: burst }
            }
        })
    }

    /// The waiting path: charge the rates (they never wait), then take a place in the waiting room.
    fn queue(
        &self,
        this: &impl Fn() -> Arc<dyn Owner>,
        request: &Request,
        (kv, split): (u64, Option<Split>),
        tenant: Option<Arc<TenantState<C>>>,
        wait: WaitSpec,
        held_by: HeldBy,
    ) -> Attempt {
        if self.core.dispatcher.queue_capacity() == 0 {
            return Attempt::Refused(self.refusal(held_by, request, tenant.as_deref()));
        }
        if let Some(deadline) = request.ttft_deadline {
            // Refuse now what would miss its start deadline, rather than let it wait and fail.
            let class = request.priority.index();
            let dispatcher = &self.core.dispatcher;
            // Who it would queue behind: its class and the higher ones, or only the higher ones when its
            // class's queue stands (controlled delay serves the newest first).
            let standing = dispatcher.controlled_delay() && dispatcher.stands(class, self.clock.now_nanos());
            let behind = if standing { class + 1 } else { class };
            let load = self
                .core
                .resources()
                .load(dispatcher.queued_at_or_above(behind) as u64, dispatcher.queued_kv_at_or_above(behind));
            // Priced as admission would charge it: a shared prefix that is resident costs nothing more.
            let need = split.as_ref().map_or(kv, |split| dispatcher.shared_need(split));
            let predicted = load.predicted_wait(need);
            if predicted > deadline {
                self.core.stats.count_shed(1);
                // Never earlier than the request's rates would pass it either (as every refusal's hint).
                let retry_after = (predicted - deadline).clamp(MIN_HINT, MAX_HINT);
                let rejection = Rejection::NoCapacity { retry_after };
                return Attempt::Refused(rejection.at_least(self.rate_wait(request.total_tokens(), tenant.as_deref())));
            }
        }
        let total = request.total_tokens();
        let limit = [
            request.max_wait.map(crate::clock::duration_to_nanos),
            self.max_queue_wait,
            request.ttft_deadline.map(crate::clock::duration_to_nanos),
        ]
        .into_iter()
        .flatten()
        .min();
        let limit = match (limit, wait.timeout.map(crate::clock::duration_to_nanos)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // The clock is read only when something needs the time: a rate, a deadline, or queue-time metrics.
        let needs_time = limit.is_some()
            || !self.rates.is_empty()
            || tenant.as_ref().is_some_and(|t| t.has_rates())
            || crate::telemetry::QUEUE_TIMES;
        let now = if needs_time { self.clock.now_nanos() } else { 0 };
        let (charges, now) = match self.charge(total, tenant.as_deref(), now) {
            Ok(charged) => charged,
            Err(rejection) => return Attempt::Refused(rejection),
        };
        let deadline = limit.map_or(u64::MAX, |w| now.saturating_add(w));
        let tenant: Option<Arc<dyn TenantHandle>> = tenant.map(|t| t as Arc<dyn TenantHandle>);
        // Only a wait limit can have run out already (a clock at its end reads `u64::MAX`: a waiter without
        // a limit still waits, whether or not the clock was read for metrics).
        if limit.is_some() && deadline <= now {
            self.refund(charges, tenant.as_deref());
            return Attempt::Refused(Rejection::TimedOut);
        }
        let new = NewWaiter {
            cost: self.fairness.cost(request.prompt_tokens, request.max_new_tokens),
            class: request.priority.index(),
            kv,
            split,
            start_deadline: request.ttft_deadline.is_some(),
            deadline,
            tenant: tenant.clone(),
            notify: wait.notify,
        };
        match self.core.dispatcher.enqueue(self.core.resources(), new) {
            Ok(Enqueued::Granted(held)) => {
                let now = self.clock.now_nanos();
                Attempt::Granted(Permit::granted(this(), request, held, charges, tenant, now))
            }
            Ok(Enqueued::Waiting { key, deadline_added, held, deadline }) => Attempt::Queued(Ticket {
                key,
                held,
                charges,
                tenant,
                deadline,
                earliest_deadline: deadline_added.unwrap_or(false),
                queued_at: now,
            }),
            Err(rejection) => {
                self.refund(charges, tenant.as_deref());
                Attempt::Refused(rejection)
            }
        }
    }

    /// The refusal of a request held back that does not wait (`try_admit`, or an admission without a
    /// waiting room): `NoCapacity` when the server's capacity held it back, `RateLimited` with the tenant's
    /// own hint when its tenant's did. The hint is never earlier than the request's rates would pass it.
    fn refusal(&self, held_by: HeldBy, request: &Request, tenant: Option<&TenantState<C>>) -> Rejection {
        let rejection = match (held_by, tenant) {
            (HeldBy::Tenant, Some(t)) => Rejection::RateLimited { retry_after: t.core().hint() },
            _ => self.core.no_capacity(request.priority.index()),
        };
        rejection.at_least(self.rate_wait(request.total_tokens(), tenant))
    }

    /// How long until every rate `total` tokens are subject to would pass them (zero without rates; the
    /// clock is read only when there are some).
    fn rate_wait(&self, total: u64, tenant: Option<&TenantState<C>>) -> Duration {
        let tenant = tenant.filter(|t| t.has_rates());
        if self.rates.is_empty() && tenant.is_none() {
            return Duration::ZERO;
        }
        let now = self.clock.now_nanos();
        let global = if self.rates.is_empty() { Duration::ZERO } else { self.rates.wait(total, now) };
        global.max(tenant.map_or(Duration::ZERO, |t| t.rate_wait(total, now)))
    }

    /// Gives back exactly `charges`.
    pub(crate) fn refund(&self, charges: Charges, tenant: Option<&dyn TenantHandle>) {
        if charges == Charges::default() {
            return;
        }
        let now = self.clock.now_nanos();
        self.rates.refund(charges.global, now);
        if let Some(tenant) = tenant {
            tenant.refund(charges.tenant, now);
        }
    }
}

impl<C: Clock> Owner for Shared<C> {
    #[inline]
    fn core(&self) -> &Core {
        &self.core
    }

    #[inline]
    fn now_nanos(&self) -> u64 {
        self.clock.now_nanos()
    }

    fn real_time_until(&self, deadline: u64) -> Duration {
        self.clock.real_time_until(deadline.saturating_sub(self.clock.now_nanos()))
    }

    fn refund(&self, charges: Charges, tenant: Option<&dyn TenantHandle>) {
        Shared::refund(self, charges, tenant);
    }

    fn refund_output(&self, unused_output: u64, tenant: Option<&dyn TenantHandle>) {
        if let (Some(tenant), Fairness::Tokens { .. }) = (tenant, self.fairness) {
            let core = tenant.core();
            core.refund_virtual_tokens(Fairness::counter_units(self.fairness.output_cost(unused_output), core.weight));
        }
    }

    #[inline]
    fn attempt(&self, this: &Arc<dyn Owner>, request: &Request, wait: WaitSpec) -> Attempt {
        self.decide(&|| Arc::clone(this), request, wait)
    }

    fn observe_output(&self, output_tokens: u32, max_new_tokens: u32) {
        self.reservation.observe(output_tokens, max_new_tokens);
    }
}

impl<C: Clock> Drop for Shared<C> {
    fn drop(&mut self) {
        self.core.timer.shutdown();
    }
}
