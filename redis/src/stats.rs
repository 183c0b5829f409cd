//! Counters of the shared admission, and their metrics.
//!
//! | counter ([`SharedStats`] field) | metric (feature `metrics`) | counts |
//! |---|---|---|
//! | `redis_admissions` | `kvgate_redis_admissions_total{path="redis"}` | permits decided by a script call |
//! | `allowance_admissions` | `kvgate_redis_admissions_total{path="allowance"}` | permits decided from the local allowance |
//! | `fallback_admissions` | `kvgate_redis_fallbacks_total{policy="open"}` | permits granted by the fail-open limits |
//! | `fail_closed_rejections` | `kvgate_redis_fallbacks_total{policy="closed"}` | requests refused because Redis did not answer |
//! | `redis_timeouts`, `redis_errors` | `kvgate_redis_errors_total{kind="timeout"\|"error"}` | failed calls |
//! | `leases_lost` | `kvgate_redis_leases_lost_total` | leases found gone at renewal and not registered again |
//! | `leases_registered` | `kvgate_redis_leases_registered_total` | leases registered by the renewal (lost, or taken while Redis was down) |
//! | `state_losses` | `kvgate_redis_state_losses_total` | times Redis was found to have lost its state (new generation) |
//! | — | `kvgate_redis_up` (gauge) | 1 while Redis answers, 0 while the fail policy decides |

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($field:ident: $doc:literal,)*) => {
        /// Counters of one shared admission since it was set up ([`SharedAdmission::stats`](crate::SharedAdmission::stats)).
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct SharedStats {
            $(#[doc = $doc] pub $field: u64,)*
        }

        #[derive(Debug, Default)]
        pub(crate) struct Stats {
            $(pub(crate) $field: AtomicU64,)*
        }

        impl Stats {
            pub(crate) fn snapshot(&self) -> SharedStats {
                SharedStats { $($field: self.$field.load(Ordering::Relaxed),)* }
            }
        }
    };
}

counters! {
    redis_admissions: "Permits whose shared limits were decided by a script call.",
    allowance_admissions: "Permits whose shared rates came from the local allowance (no call).",
    fallback_admissions: "Permits granted by the fail-open local limits while Redis did not answer.",
    fail_closed_rejections: "Requests refused by the fail-closed policy while Redis did not answer.",
    redis_timeouts: "Calls to Redis that timed out.",
    redis_errors: "Calls to Redis that failed otherwise (connection refused, an error reply).",
    leases_lost: "Leases found gone at renewal that did not fit the budget again (their permits report it).",
    leases_registered: "Leases registered by the renewal: lost ones that fit again, or taken while Redis was down.",
    state_losses: "Times Redis was found to have lost its state (a new generation).",
}

/// Which path decided a permit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    Redis,
    Allowance,
    Fallback,
}

impl Stats {
    pub(crate) fn admitted(&self, path: Path) {
        let (counter, _label) = match path {
            Path::Redis => (&self.redis_admissions, "redis"),
            Path::Allowance => (&self.allowance_admissions, "allowance"),
            Path::Fallback => (&self.fallback_admissions, "open"),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        match path {
            Path::Redis => metrics::counter!("kvgate_redis_admissions_total", "path" => "redis").increment(1),
            Path::Allowance => metrics::counter!("kvgate_redis_admissions_total", "path" => "allowance").increment(1),
            Path::Fallback => metrics::counter!("kvgate_redis_fallbacks_total", "policy" => "open").increment(1),
        }
    }

    pub(crate) fn failed_closed(&self) {
        self.fail_closed_rejections.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        metrics::counter!("kvgate_redis_fallbacks_total", "policy" => "closed").increment(1);
    }

    pub(crate) fn call_failed(&self, timeout: bool) {
        if timeout {
            self.redis_timeouts.fetch_add(1, Ordering::Relaxed);
            #[cfg(feature = "metrics")]
            metrics::counter!("kvgate_redis_errors_total", "kind" => "timeout").increment(1);
        } else {
            self.redis_errors.fetch_add(1, Ordering::Relaxed);
            #[cfg(feature = "metrics")]
            metrics::counter!("kvgate_redis_errors_total", "kind" => "error").increment(1);
        }
    }

    pub(crate) fn lease_lost(&self) {
        self.leases_lost.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        metrics::counter!("kvgate_redis_leases_lost_total").increment(1);
    }

    pub(crate) fn lease_registered(&self) {
        self.leases_registered.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        metrics::counter!("kvgate_redis_leases_registered_total").increment(1);
    }

    pub(crate) fn state_lost(&self) {
        self.state_losses.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        metrics::counter!("kvgate_redis_state_losses_total").increment(1);
    }

    pub(crate) fn redis_up(&self, up: bool) {
        #[cfg(feature = "metrics")]
        metrics::gauge!("kvgate_redis_up").set(if up { 1.0 } else { 0.0 });
        let _ = up;
    }
}
