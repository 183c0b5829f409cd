//! What a tenant may use, and the tenant configuration an admission is built with.

use crate::admission::fairness::MAX_WEIGHT;
use crate::error::ConfigError;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::TenantId;

/// Limits for one tenant (or the defaults for all). Every limit is optional.
///
/// # Examples
///
/// ```
/// use kvgate::{Admission, TenantLimits};
///
/// let admission = Admission::builder()
///     .max_in_flight(64)
///     .kv_capacity_tokens(1_000_000)
///     .tenant_defaults(TenantLimits::new().max_in_flight(4).kv_share(0.25).request_rate(2.0, 5))
///     .tenant_limits("batch-jobs", TenantLimits::new().max_in_flight(2).weight(1))
///     .tenant_limits("on-call", TenantLimits::new().max_in_flight(16).weight(4))
///     .build()?;
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub struct TenantLimits {
    pub(crate) max_in_flight: Option<usize>,
    pub(crate) kv_share: Option<f64>,
    pub(crate) request_rate: Option<(f64, u32)>,
    pub(crate) token_rate: Option<(f64, u64)>,
    pub(crate) weight: u32,
}

impl Default for TenantLimits {
    fn default() -> Self {
        Self::new()
    }
}

impl TenantLimits {
    /// The largest weight a tenant may have (65,536): under token fairness a grant charges its tenant's
    /// counter its cost over its weight, in fixed point with 16 fractional bits, so a weight up to this
    /// charges at least one unit per token and never rounds a charge to zero.
    pub const MAX_WEIGHT: u32 = MAX_WEIGHT;

    /// No per-tenant limit, weight 1.
    pub const fn new() -> Self {
        Self { max_in_flight: None, kv_share: None, request_rate: None, token_rate: None, weight: 1 }
    }

    /// At most this many of the tenant's requests in flight at once.
    pub fn max_in_flight(mut self, max_in_flight: usize) -> Self {
        self.max_in_flight = Some(max_in_flight);
        self
    }

    /// At most this fraction (0, 1] of the KV budget held by the tenant's requests at once.
    ///
    /// With [`prefix_sharing`](crate::AdmissionBuilder::prefix_sharing) on, the share counts what the
    /// tenant's requests hold beyond shared prefixes; a prefix is counted once, globally, against no
    /// tenant. So a tenant whose requests each name a prefix of their own is held to its share only for
    /// their suffixes: where prefix ids come from untrusted clients and shares matter, leave prefix
    /// sharing off.
    pub fn kv_share(mut self, share: f64) -> Self {
        self.kv_share = Some(share);
        self
    }

    /// The tenant's own request rate (requests/s, burst).
    pub fn request_rate(mut self, per_second: f64, burst: u32) -> Self {
        self.request_rate = Some((per_second, burst));
        self
    }

    /// The tenant's own LLM-token rate (tokens/s, burst).
    pub fn token_rate(mut self, per_second: f64, burst: u64) -> Self {
        self.token_rate = Some((per_second, burst));
        self
    }

    /// The tenant's weight in fair queueing: how many of its waiting requests are granted per turn
    /// (default 1). A tenant with weight 4 gets four times the grants of a tenant with weight 1 while
    /// both have requests waiting (with [`Fairness::Tokens`](crate::Fairness::Tokens), four times the
    /// tokens).
    ///
    /// Weights are `1..=`[`MAX_WEIGHT`](Self::MAX_WEIGHT) (65,536); the admission's `build()` refuses
    /// others with a [`ConfigError`].
    pub fn weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// Checks the values (used by the admission builder).
    pub(crate) fn validate(&self, who: &str) -> Result<(), ConfigError> {
        if self.max_in_flight == Some(0) {
            return Err(ConfigError::Zero { what: "tenant max_in_flight" });
        }
        if let Some(share) = self.kv_share {
            if !(share > 0.0 && share <= 1.0) {
                return Err(ConfigError::OutOfRange {
                    what: "tenant kv_share",
                    reason: format!("{share} for {who}; use a fraction of the KV budget in (0, 1]"),
                });
            }
        }
        if self.weight == 0 {
            return Err(ConfigError::Zero { what: "tenant weight" });
        }
        if self.weight > MAX_WEIGHT {
            return Err(ConfigError::OutOfRange {
                what: "tenant weight",
                reason: format!("{} for {who}; use a weight from 1 to {MAX_WEIGHT}", self.weight),
            });
        }
        if matches!(self.request_rate, Some((_, 0))) {
            return Err(ConfigError::Zero { what: "tenant request rate burst" });
        }
        if matches!(self.token_rate, Some((_, 0))) {
            return Err(ConfigError::Zero { what: "tenant token rate burst" });
        }
        Ok(())
    }
}

/// Default number of tenants tracked at once.
pub const DEFAULT_MAX_TENANTS: usize = 10_000;
/// Default idle time after which a tenant may be evicted.
pub const DEFAULT_TENANT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Tenant configuration as built: the defaults, the named overrides (with the names, for metrics labels),
/// and the registry's bounds.
#[derive(Debug, Clone)]
pub(crate) struct TenantConfig {
    pub(crate) defaults: TenantLimits,
    pub(crate) overrides: HashMap<TenantId, (Arc<str>, TenantLimits)>,
    pub(crate) max_tenants: usize,
    pub(crate) idle_timeout: Duration,
}

impl TenantConfig {
    pub(crate) fn new() -> Self {
        Self {
            defaults: TenantLimits::new(),
            overrides: HashMap::new(),
            max_tenants: DEFAULT_MAX_TENANTS,
            idle_timeout: DEFAULT_TENANT_IDLE_TIMEOUT,
        }
    }

    /// The limits of `id` and its configured name, if it has an override.
    pub(crate) fn limits_of(&self, id: TenantId) -> (&TenantLimits, Option<&Arc<str>>) {
        match self.overrides.get(&id) {
            Some((name, limits)) => (limits, Some(name)),
            None => (&self.defaults, None),
        }
    }

    /// Who has a KV share ("the tenant defaults" or "tenant NAME"), if anyone does.
    pub(crate) fn kv_share_holder(&self) -> Option<String> {
        if self.defaults.kv_share.is_some() {
            return Some("the tenant defaults".into());
        }
        let mut named: Vec<&str> =
            self.overrides.values().filter(|(_, l)| l.kv_share.is_some()).map(|(name, _)| &**name).collect();
        named.sort_unstable();
        named.first().map(|name| format!("tenant {name}"))
    }

    /// Checks every value.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        self.defaults.validate("the tenant defaults")?;
        for (name, limits) in self.overrides.values() {
            limits.validate(&format!("tenant {name}"))?;
        }
        if self.max_tenants == 0 {
            return Err(ConfigError::Zero { what: "max_tenants" });
        }
        Ok(())
    }
}
