//! `--redis URL`: the gateway's limits shared by every replica through Redis ([`kvgate_redis`]).
//!
//! | limit | shared as | Redis name |
//! |---|---|---|
//! | each upstream's in-flight cap and KV budget | leases (a crashed replica's come back within the lease time) | `kvgate:{<prefix>-upstream-<name>}:*` |
//! | the global request and token rates, each tenant's rates | GCRA buckets | `kvgate:{<prefix>-front}:*` |
//!
//! Each replica keeps its own front admission for what Redis does not share: the waiting room and its
//! tenant-fair order, priorities, tenants' in-flight caps and KV shares (per replica). While Redis does
//! not answer, the fail policy is fail-closed: requests that need a shared limit get `503` with a one-second
//! `Retry-After` (the engines are never overcommitted).

use crate::config::{Config, ConfigError};
use crate::limiter::Limiter;
use crate::plan::{self, UpstreamSpec};
use kvgate_redis::{SharedAdmission, SharedLimits, TenantRates};

fn setup(e: kvgate_redis::SetupError) -> ConfigError {
    ConfigError::Conflict(format!("--redis: {e}"))
}

/// One upstream's capacity, shared.
///
/// # Errors
///
/// A [`ConfigError`] for invalid limits or a Redis URL that cannot be used.
pub async fn upstream(url: &str, config: &Config, spec: &UpstreamSpec) -> Result<Limiter, ConfigError> {
    let local = plan::upstream_admission(config, spec)?;
    let mut limits = SharedLimits::new(format!("{}-upstream-{}", config.redis_prefix, spec.name))
        .max_in_flight(spec.slots as u64)
        .max_queue_wait(config.max_queue_wait);
    if let Some(kv) = spec.kv.units() {
        limits = limits.kv_capacity(kv);
    }
    let shared = SharedAdmission::connect(url, local, limits).await.map_err(setup)?;
    Ok(Limiter::Shared(shared))
}

/// The front admission with the global and tenant rates shared.
///
/// # Errors
///
/// As [`upstream`].
pub async fn front(url: &str, config: &Config, specs: &[UpstreamSpec]) -> Result<Limiter, ConfigError> {
    let local = plan::front_admission(config, specs, true)?;
    let mut limits = SharedLimits::new(format!("{}-front", config.redis_prefix)).max_queue_wait(config.max_queue_wait);
    if let Some((rate, burst)) = config.rate {
        limits = limits.request_rate(rate, burst);
    }
    if let Some((rate, burst)) = config.token_rate {
        limits = limits.token_rate(rate, burst);
    }
    let rates = |l: &crate::tenants::TenantLimitsConfig| {
        let mut rates = TenantRates::new();
        if let Some((rate, burst)) = l.request_rate_and_burst() {
            rates = rates.request_rate(rate, burst);
        }
        if let Some((rate, burst)) = l.token_rate_and_burst() {
            rates = rates.token_rate(rate, burst);
        }
        rates
    };
    if let Some(defaults) = &config.tenant_defaults {
        limits = limits.tenant_defaults(rates(defaults));
    }
    for tenant in &config.tenants {
        limits = limits.tenant_rates(tenant.name.as_str(), rates(&tenant.limits.or(config.tenant_defaults.as_ref())));
    }
    let shared = SharedAdmission::connect(url, local, limits).await.map_err(setup)?;
    Ok(Limiter::Shared(shared))
}
