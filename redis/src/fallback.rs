//! The fail-open limits: every shared limit divided by the replica count, kept in-process while Redis
//! does not answer.
//!
//! Slots and rates (global and the tenants' shared rates) go to a [`kvgate::Admission`] built for it on
//! the local admission's clock; the KV share is a gauge here, priced like the shared budget (the local
//! admission's [`kv_cost`](kvgate::Admission::kv_cost), tokens or bytes).

use crate::limits::SharedLimits;
use kvgate::clock::Clock;
use kvgate::{Admission, ConfigError, Permit, Rejection, Request, TenantLimits};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The fail-open admission.
#[derive(Debug)]
pub(crate) struct Fallback<C: Clock> {
    admission: Admission<C>,
    kv: Arc<KvShare>,
}

/// The KV share: units in use against the limit.
#[derive(Debug)]
pub(crate) struct KvShare {
    used: AtomicU64,
    limit: u64,
}

/// What a fail-open grant holds.
#[derive(Debug)]
pub(crate) struct FallbackPermit {
    permit: Option<Permit>,
    kv: u64,
    share: Arc<KvShare>,
}

impl FallbackPermit {
    /// Completes the fail-open admission's permit (its buckets refund the unused tokens); the KV share
    /// is returned when this is dropped.
    pub(crate) fn complete(&mut self, output_tokens: u32) {
        if let Some(permit) = self.permit.take() {
            permit.complete(output_tokens);
        }
    }

    /// The fail-open admission's permit, until completed.
    pub(crate) fn permit(&self) -> Option<&Permit> {
        self.permit.as_ref()
    }
}

impl Drop for FallbackPermit {
    fn drop(&mut self) {
        self.share.used.fetch_sub(self.kv, Ordering::AcqRel);
    }
}

fn divide(n: u64, by: u64) -> u64 {
    (n / by).max(1)
}

impl<C: Clock> Fallback<C> {
    /// Builds the divided limits.
    pub(crate) fn new(limits: &SharedLimits, replicas: u32, clock: C) -> Result<Self, ConfigError> {
        let n = u64::from(replicas);
        let mut builder = Admission::builder().clock(clock).queue_capacity(0).deadline_timer(false);
        if let Some(slots) = limits.max_in_flight {
            builder = builder.max_in_flight(usize::try_from(divide(slots, n)).unwrap_or(usize::MAX));
        }
        if let Some((rate, burst)) = limits.request_rate {
            builder = builder.request_rate(rate / n as f64, u32::try_from(divide(u64::from(burst), n)).unwrap_or(1));
        }
        if let Some((rate, burst)) = limits.token_rate {
            builder = builder.token_rate(rate / n as f64, divide(burst, n));
        }
        let tenant = |rates: &crate::limits::TenantRates| {
            let mut t = TenantLimits::new();
            if let Some((rate, burst)) = rates.request_rate {
                t = t.request_rate(rate / n as f64, u32::try_from(divide(u64::from(burst), n)).unwrap_or(1));
            }
            if let Some((rate, burst)) = rates.token_rate {
                t = t.token_rate(rate / n as f64, divide(burst, n));
            }
            t
        };
        if limits.tenant_defaults != crate::limits::TenantRates::new() || !limits.tenant_overrides.is_empty() {
            builder = builder.tenant_defaults(tenant(&limits.tenant_defaults));
            for (id, rates) in &limits.tenant_overrides {
                builder = builder.tenant_limits(*id, tenant(rates));
            }
        }
        let kv = Arc::new(KvShare {
            used: AtomicU64::new(0),
            limit: limits.kv_capacity.map_or(u64::MAX, |kv| divide(kv, n)),
        });
        Ok(Self { admission: builder.build()?, kv })
    }

    /// Admits `request` (costing `kv` units) on the divided limits, or says why not.
    pub(crate) fn try_admit(&self, request: &Request, kv: u64) -> Result<FallbackPermit, Rejection> {
        let permit = self.admission.try_admit(request)?;
        let share = &self.kv;
        let mut used = share.used.load(Ordering::Acquire);
        loop {
            if kv > share.limit.saturating_sub(used) {
                return Err(Rejection::NoCapacity { retry_after: self.admission.capacity_retry_after() });
            }
            match share.used.compare_exchange_weak(used, used + kv, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(FallbackPermit { permit: Some(permit), kv, share: Arc::clone(share) }),
                Err(now) => used = now,
            }
        }
    }

    /// Units held by fail-open permits now: (slots, KV).
    pub(crate) fn held(&self) -> (u64, u64) {
        (self.admission.snapshot().in_flight as u64, self.kv.used.load(Ordering::Acquire))
    }
}
