//! What the replicas share: [`SharedLimits`], checked once when the shared admission is set up.

use crate::policy::FailPolicy;
use crate::rate::RateSpec;
use kvgate::clock::{Clock, ManualClock};
use kvgate::{ConfigError, TenantId};
use std::collections::HashMap;
use std::time::Duration;

/// Default lease time: a replica that dies gives its capacity back at most this long after its last renewal.
pub const DEFAULT_LEASE_TIME: Duration = Duration::from_secs(10);
/// Default per-call timeout for Redis.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_millis(100);

/// Where the scripts read the time: Redis' clock, or the caller's for tests and simulations.
#[derive(Debug, Clone, Default)]
pub enum TimeSource {
    /// Redis' own clock (`TIME`), read inside each script: the replicas' clocks never matter. The
    /// default, and the only right choice in production.
    #[default]
    Redis,
    /// A [`ManualClock`]'s reading (whole microseconds), sent with each call: every replica of a test
    /// must share the same clock. Lease and recovery deadlines follow it; the idle expiry of keys still
    /// runs on Redis' clock, so every key the scripts write then lives an hour at least (a test's manual
    /// time may run far slower than Redis' clock, and a key expiring early would refill a bucket, drop a
    /// lease or end a recovery window before the manual clock said so).
    Manual(ManualClock),
}

impl TimeSource {
    /// The argument the scripts take: empty for Redis' clock, else microseconds.
    pub(crate) fn arg(&self) -> String {
        match self {
            TimeSource::Redis => String::new(),
            TimeSource::Manual(clock) => (clock.now_nanos() / 1000).to_string(),
        }
    }
}

/// A local allowance: shared rate tokens a replica takes from Redis in advance, so that most admissions
/// are decided without waiting for Redis.
///
/// The replica takes a batch of each global rate (up to what the shared bucket holds) and spends it
/// locally; the background task takes the next batch when half is spent, and gives back what was not
/// spent after [`idle`](Allowance::idle). The tokens are charged in Redis when taken, so the global
/// rate still holds over time; what the allowance changes is *when* they are spent: in any window, the
/// replicas together may admit up to `replicas x batch` more than the bucket would have admitted in that
/// window (tokens taken before it, spent in it). That is the worst-case overshoot; `BENCHMARKS.md`
/// measures it. Requests of a tenant with a shared tenant rate still ask Redis (their tenant's bucket
/// has no allowance). Shared capacity never uses an allowance: it is leased per permit (see
/// [`SharedLimits::max_in_flight`]).
///
/// # Examples
///
/// ```
/// use kvgate_redis::{Allowance, SharedLimits};
///
/// let limits = SharedLimits::new("engine-a")
///     .request_rate(300.0, 30)
///     .token_rate(100_000.0, 200_000)
///     .allowance(Allowance::new().requests(10).tokens(20_000));
/// # let _ = limits;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Allowance {
    pub(crate) requests: u64,
    pub(crate) tokens: u64,
    pub(crate) idle: Duration,
}

impl Default for Allowance {
    fn default() -> Self {
        Self::new()
    }
}

impl Allowance {
    /// No allowance yet (set `requests` and/or `tokens`); unspent tokens go back after one second idle.
    pub const fn new() -> Self {
        Self { requests: 0, tokens: 0, idle: Duration::from_secs(1) }
    }

    /// Requests of the global request rate taken per batch.
    pub const fn requests(mut self, batch: u64) -> Self {
        self.requests = batch;
        self
    }

    /// Tokens of the global token rate taken per batch.
    pub const fn tokens(mut self, batch: u64) -> Self {
        self.tokens = batch;
        self
    }

    /// How long an allowance may sit unspent before it is given back to Redis.
    pub const fn idle(mut self, idle: Duration) -> Self {
        self.idle = idle;
        self
    }
}

/// A tenant's shared rates: the same for a tenant on every replica.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[must_use]
pub struct TenantRates {
    pub(crate) request_rate: Option<(f64, u32)>,
    pub(crate) token_rate: Option<(f64, u64)>,
}

impl TenantRates {
    /// No shared rate.
    pub const fn new() -> Self {
        Self { request_rate: None, token_rate: None }
    }

    /// The tenant's request rate (requests/s, burst), across every replica.
    pub const fn request_rate(mut self, per_second: f64, burst: u32) -> Self {
        self.request_rate = Some((per_second, burst));
        self
    }

    /// The tenant's token rate (LLM tokens/s, burst), across every replica.
    pub const fn token_rate(mut self, per_second: f64, burst: u64) -> Self {
        self.token_rate = Some((per_second, burst));
        self
    }
}

/// The limits every replica shares through Redis, and how the sharing behaves.
///
/// Every limit is optional; an unset limit is not shared (the local [`kvgate::Admission`] may still
/// have its own). Mistakes are reported by
/// [`SharedAdmission::connect`](crate::SharedAdmission::connect).
///
/// # Examples
///
/// ```
/// use kvgate_redis::{FailPolicy, SharedLimits, TenantRates};
/// use std::time::Duration;
///
/// let limits = SharedLimits::new("llama-8b-on-gpu-0")  // one name per engine the replicas front
///     .max_in_flight(64)                             // the engine's batch
///     .kv_capacity(400_000)                          // its KV budget, in the local admission's KV unit
///     .request_rate(50.0, 100)
///     .token_rate(20_000.0, 200_000)
///     .tenant_defaults(TenantRates::new().request_rate(2.0, 5))
///     .lease_time(Duration::from_secs(10))
///     .call_timeout(Duration::from_millis(50))
///     .fail_policy(FailPolicy::Open { replicas: 3 });
/// # let _ = limits;
/// ```
#[derive(Debug, Clone)]
#[must_use = "limits do nothing until passed to SharedAdmission::connect"]
pub struct SharedLimits {
    pub(crate) name: String,
    pub(crate) max_in_flight: Option<u64>,
    pub(crate) kv_capacity: Option<u64>,
    pub(crate) request_rate: Option<(f64, u32)>,
    pub(crate) token_rate: Option<(f64, u64)>,
    pub(crate) tenant_defaults: TenantRates,
    pub(crate) tenant_overrides: HashMap<TenantId, TenantRates>,
    pub(crate) lease_time: Duration,
    pub(crate) renew_interval: Option<Duration>,
    pub(crate) recovery_window: Option<Duration>,
    pub(crate) call_timeout: Duration,
    pub(crate) retry_interval: Duration,
    pub(crate) poll_interval: Duration,
    pub(crate) max_queue_wait: Option<Duration>,
    pub(crate) fail_policy: FailPolicy,
    pub(crate) allowance: Option<Allowance>,
    pub(crate) time: TimeSource,
}

impl SharedLimits {
    /// Limits shared under `name`: replicas that use the same name (and the same Redis) share them. Use
    /// one name per engine; it becomes part of every key (`kvgate:{name}:...`, one Redis Cluster slot).
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            max_in_flight: None,
            kv_capacity: None,
            request_rate: None,
            token_rate: None,
            tenant_defaults: TenantRates::new(),
            tenant_overrides: HashMap::new(),
            lease_time: DEFAULT_LEASE_TIME,
            renew_interval: None,
            recovery_window: None,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            retry_interval: Duration::from_millis(500),
            poll_interval: Duration::from_millis(200),
            max_queue_wait: None,
            fail_policy: FailPolicy::default(),
            allowance: None,
            time: TimeSource::Redis,
        }
    }

    /// In-flight requests across every replica (leased per permit). At least 1.
    pub fn max_in_flight(mut self, max_in_flight: u64) -> Self {
        self.max_in_flight = Some(max_in_flight);
        self
    }

    /// The engine's KV budget across every replica, in the local admission's KV unit (tokens, or bytes
    /// with a KV model: a request costs [`Admission::kv_cost`](kvgate::Admission::kv_cost)). At least 1.
    pub fn kv_capacity(mut self, capacity: u64) -> Self {
        self.kv_capacity = Some(capacity);
        self
    }

    /// The global request rate across every replica (requests/s, burst).
    pub fn request_rate(mut self, per_second: f64, burst: u32) -> Self {
        self.request_rate = Some((per_second, burst));
        self
    }

    /// The global LLM-token rate across every replica (tokens/s, burst). A request costs
    /// `prompt_tokens + max_new_tokens`; [`SharedPermit::complete`](crate::SharedPermit::complete)
    /// refunds what it did not generate.
    pub fn token_rate(mut self, per_second: f64, burst: u64) -> Self {
        self.token_rate = Some((per_second, burst));
        self
    }

    /// Shared rates of every tenant without an override. A tenant's buckets live in Redis only while
    /// they are not full, so invented tenant ids cannot grow Redis' memory for longer than a refill.
    pub fn tenant_defaults(mut self, rates: TenantRates) -> Self {
        self.tenant_defaults = rates;
        self
    }

    /// Shared rates of one tenant, instead of the defaults.
    pub fn tenant_rates(mut self, tenant: impl Into<TenantId>, rates: TenantRates) -> Self {
        self.tenant_overrides.insert(tenant.into(), rates);
        self
    }

    /// How long a lease lives without renewal (default [`DEFAULT_LEASE_TIME`]): the longest a killed
    /// replica's capacity stays taken. Renewed every third of it unless
    /// [`renew_interval`](Self::renew_interval) says otherwise.
    pub fn lease_time(mut self, lease: Duration) -> Self {
        self.lease_time = lease;
        self
    }

    /// How often held leases are renewed (default a third of the lease time; must be shorter than the lease time).
    pub fn renew_interval(mut self, interval: Duration) -> Self {
        self.renew_interval = Some(interval);
        self
    }

    /// After Redis lost its state (a restart without persistence), how long new leases wait so that
    /// every live replica can register the leases it holds first (default: the renewal interval plus
    /// the call timeout; zero turns it off).
    pub fn recovery_window(mut self, window: Duration) -> Self {
        self.recovery_window = Some(window);
        self
    }

    /// How long one call to Redis may take before the fail policy decides (default
    /// [`DEFAULT_CALL_TIMEOUT`]).
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// After a failed call, how long requests go straight to the fail policy before Redis is tried again
    /// (default 500 ms; a background probe also tries it this often).
    pub fn retry_interval(mut self, interval: Duration) -> Self {
        self.retry_interval = interval;
        self
    }

    /// Longest pause of a waiting request between two tries for shared capacity when no release was
    /// announced (default 200 ms). Releases are announced through Redis pub/sub, so this only bounds
    /// the delay after a missed announcement or an expired lease.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Longest wait for shared capacity in [`SharedAdmission::admit`](crate::SharedAdmission::admit)
    /// (default none; [`Request::max_wait`](kvgate::Request::max_wait) can shorten it).
    pub fn max_queue_wait(mut self, wait: Duration) -> Self {
        self.max_queue_wait = Some(wait);
        self
    }

    /// What to do when Redis does not answer (default [`FailPolicy::Closed`], one-second hint).
    pub fn fail_policy(mut self, policy: FailPolicy) -> Self {
        self.fail_policy = policy;
        self
    }

    /// Takes global rate tokens in advance (see [`Allowance`]).
    pub fn allowance(mut self, allowance: Allowance) -> Self {
        self.allowance = Some(allowance);
        self
    }

    /// Where the scripts read the time (default [`TimeSource::Redis`]).
    pub fn time_source(mut self, time: TimeSource) -> Self {
        self.time = time;
        self
    }

    /// Checks everything and converts the rates.
    pub(crate) fn validate(&self) -> Result<Limits, ConfigError> {
        if self.name.is_empty() || self.name.contains(['{', '}']) {
            return Err(ConfigError::OutOfRange {
                what: "shared limits name",
                reason: format!("{:?}; use a non-empty name without braces, one per engine", self.name),
            });
        }
        if self.max_in_flight == Some(0) {
            return Err(ConfigError::Zero { what: "shared max_in_flight" });
        }
        if self.kv_capacity == Some(0) {
            return Err(ConfigError::Zero { what: "shared KV capacity" });
        }
        let positive =
            |d: Duration, what: &'static str| if d.is_zero() { Err(ConfigError::Zero { what }) } else { Ok(d) };
        let lease_time = positive(self.lease_time, "lease_time")?;
        let call_timeout = positive(self.call_timeout, "call_timeout")?;
        positive(self.retry_interval, "retry_interval")?;
        positive(self.poll_interval, "poll_interval")?;
        let renew_interval = positive(self.renew_interval.unwrap_or(lease_time / 3), "renew_interval")?;
        if renew_interval + call_timeout >= lease_time {
            return Err(ConfigError::Conflict(format!(
                "renewing every {renew_interval:?} with a {call_timeout:?} call timeout lets leases of {lease_time:?} \
                 expire while their replica is alive; renew more often or lengthen the lease time"
            )));
        }
        if let FailPolicy::Open { replicas: 0 } = self.fail_policy {
            return Err(ConfigError::Zero { what: "fail-open replica count" });
        }
        let rate = |r: Option<(f64, u64)>, what| r.map(|(rate, burst)| RateSpec::new(rate, burst, what)).transpose();
        let tenant = |t: &TenantRates| -> Result<TenantSpecs, ConfigError> {
            Ok(TenantSpecs {
                requests: rate(t.request_rate.map(|(r, b)| (r, u64::from(b))), "tenant request rate")?,
                tokens: rate(t.token_rate, "tenant token rate")?,
            })
        };
        let mut overrides = HashMap::with_capacity(self.tenant_overrides.len());
        for (id, rates) in &self.tenant_overrides {
            overrides.insert(*id, tenant(rates)?);
        }
        Ok(Limits {
            max_in_flight: self.max_in_flight,
            kv_capacity: self.kv_capacity,
            requests: rate(self.request_rate.map(|(r, b)| (r, u64::from(b))), "shared request rate")?,
            tokens: rate(self.token_rate, "shared token rate")?,
            tenant_defaults: tenant(&self.tenant_defaults)?,
            tenant_overrides: overrides,
            lease_time,
            renew_interval,
            recovery_window: self.recovery_window.unwrap_or(renew_interval + call_timeout),
            call_timeout,
        })
    }
}

/// A tenant's converted rates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TenantSpecs {
    pub(crate) requests: Option<RateSpec>,
    pub(crate) tokens: Option<RateSpec>,
}

/// The checked limits.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    pub(crate) max_in_flight: Option<u64>,
    pub(crate) kv_capacity: Option<u64>,
    pub(crate) requests: Option<RateSpec>,
    pub(crate) tokens: Option<RateSpec>,
    pub(crate) tenant_defaults: TenantSpecs,
    pub(crate) tenant_overrides: HashMap<TenantId, TenantSpecs>,
    pub(crate) lease_time: Duration,
    pub(crate) renew_interval: Duration,
    pub(crate) recovery_window: Duration,
    pub(crate) call_timeout: Duration,
}

impl Limits {
    /// Whether requests lease shared capacity.
    pub(crate) fn has_capacity(&self) -> bool {
        self.max_in_flight.is_some() || self.kv_capacity.is_some()
    }

    /// A tenant's shared rates.
    pub(crate) fn tenant(&self, id: TenantId) -> TenantSpecs {
        self.tenant_overrides.get(&id).copied().unwrap_or(self.tenant_defaults)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mistakes_are_found_when_checked() {
        assert!(SharedLimits::new("a").validate().is_ok());
        assert!(matches!(SharedLimits::new("").validate(), Err(ConfigError::OutOfRange { .. })));
        assert!(matches!(SharedLimits::new("a{b}").validate(), Err(ConfigError::OutOfRange { .. })));
        assert!(matches!(SharedLimits::new("a").max_in_flight(0).validate(), Err(ConfigError::Zero { .. })));
        assert!(matches!(SharedLimits::new("a").kv_capacity(0).validate(), Err(ConfigError::Zero { .. })));
        assert!(matches!(
            SharedLimits::new("a").lease_time(Duration::from_secs(1)).renew_interval(Duration::from_secs(1)).validate(),
            Err(ConfigError::Conflict(_))
        ));
        assert!(matches!(
            SharedLimits::new("a").fail_policy(FailPolicy::Open { replicas: 0 }).validate(),
            Err(ConfigError::Zero { .. })
        ));
        assert!(matches!(
            SharedLimits::new("a").tenant_defaults(TenantRates::new().request_rate(-1.0, 1)).validate(),
            Err(ConfigError::InvalidRate { what: "tenant request rate", .. })
        ));
    }

    #[test]
    fn renewal_defaults_to_a_third_of_the_lease() {
        let limits = SharedLimits::new("a").lease_time(Duration::from_secs(9)).validate().unwrap();
        assert_eq!(limits.renew_interval, Duration::from_secs(3));
        assert_eq!(limits.recovery_window, Duration::from_secs(3) + DEFAULT_CALL_TIMEOUT);
    }
}
