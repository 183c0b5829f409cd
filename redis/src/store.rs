//! The connection to Redis: every script call with its timeout, the health that the fail policy reads,
//! and the typed replies.
//!
//! # Health
//! A call that fails or times out marks Redis down for the retry interval: until then requests go
//! straight to the fail policy without waiting for a call that would likely time out too. After it, the
//! next call (a request, or the background probe) tries again; one success marks Redis up. The state is
//! one atomic word, the time until which Redis counts as down (0: up), on the kvgate monotonic clock.

use crate::error::StoreError;
use crate::keys::Keys;
use crate::limits::{Limits, TimeSource};
use crate::rate::RateSpec;
use crate::scripts::Scripts;
use crate::stats::Stats;
use kvgate::clock::{Clock, MonotonicClock};
use redis::aio::ConnectionManager;
use redis::{FromRedisValue, ScriptInvocation};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// One charge to a shared bucket: `n` tokens of the bucket at `key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Charge {
    pub(crate) key: String,
    pub(crate) spec: RateSpec,
    pub(crate) n: u64,
    /// Whether `complete` refunds unused output tokens to it (token buckets, not request buckets).
    pub(crate) refundable: bool,
}

/// A lease to take: its id and units.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseAsk<'a> {
    pub(crate) id: &'a str,
    pub(crate) slots: u64,
    pub(crate) kv: u64,
}

/// The answer to an admission decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Granted (the lease is held, the rates charged); the generation, and what each rate gave (a batch
    /// may give less than asked).
    Granted { generation: u64, taken: Vec<u64> },
    /// The shared capacity is full.
    NoCapacity,
    /// A rate refused; the least wait after which every rate would pass.
    RateLimited(Duration),
    /// Redis lost its state moments ago; new leases wait this long.
    Recovering(Duration),
}

/// What the renewal found for one lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RenewAnswer {
    /// Held and extended.
    Extended,
    /// Was not held; registered now.
    Registered,
    /// Not held and does not fit the budget now.
    DoesNotFit,
}

/// The shared capacity in use, read from Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct SharedUsage {
    /// In-flight slots leased, across every replica.
    pub slots: u64,
    /// KV units leased, across every replica.
    pub kv: u64,
    /// Leases held.
    pub leases: u64,
    /// Whether the totals agree with the sum over the leases (they always should).
    pub consistent: bool,
}

/// The connection, the scripts and the health.
#[derive(Debug)]
pub(crate) struct Store {
    conn: ConnectionManager,
    scripts: Scripts,
    pub(crate) keys: Keys,
    time: TimeSource,
    timeout: Duration,
    retry_nanos: u64,
    slot_limit: i64,
    kv_limit: i64,
    lease_us: u64,
    recovery_us: u64,
    clock: MonotonicClock,
    /// Until when (clock nanoseconds) Redis counts as down; 0 while up.
    down_until: AtomicU64,
    stats: Arc<Stats>,
}

/// A random generation for Redis to adopt if its state is new: nonzero, below 2^52 (exact in Lua).
fn new_generation() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(GENERATIONS.fetch_add(1, Ordering::Relaxed));
    (hasher.finish() >> 12).max(1)
}

/// Makes every generation proposed by this process differ.
static GENERATIONS: AtomicU64 = AtomicU64::new(0);

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn reply<T>(what: &str) -> impl FnOnce() -> StoreError + '_ {
    move || StoreError::Reply(format!("{what} {}", std::any::type_name::<T>()))
}

impl Store {
    pub(crate) fn new(
        conn: ConnectionManager,
        name: &str,
        limits: &Limits,
        time: TimeSource,
        retry_interval: Duration,
        stats: Arc<Stats>,
    ) -> Self {
        let limit = |l: Option<u64>| l.map_or(-1, |v| i64::try_from(v).unwrap_or(i64::MAX));
        Self {
            conn,
            scripts: Scripts::new(),
            keys: Keys::new(name),
            time,
            timeout: limits.call_timeout,
            retry_nanos: u64::try_from(retry_interval.as_nanos()).unwrap_or(u64::MAX),
            slot_limit: limit(limits.max_in_flight),
            kv_limit: limit(limits.kv_capacity),
            lease_us: micros(limits.lease_time),
            recovery_us: if limits.has_capacity() { micros(limits.recovery_window) } else { 0 },
            clock: MonotonicClock::new(),
            down_until: AtomicU64::new(0),
            stats,
        }
    }

    /// Whether a call may be tried now (Redis is up, or its retry interval has passed).
    pub(crate) fn available(&self) -> bool {
        let until = self.down_until.load(Ordering::Relaxed);
        until == 0 || self.clock.now_nanos() >= until
    }

    /// Whether the last call succeeded.
    pub(crate) fn is_up(&self) -> bool {
        self.down_until.load(Ordering::Relaxed) == 0
    }

    /// Runs a script with the timeout, and keeps the health.
    async fn call<T: FromRedisValue>(&self, invocation: &ScriptInvocation<'_>) -> Result<T, StoreError> {
        let mut conn = self.conn.clone();
        let result = match tokio::time::timeout(self.timeout, invocation.invoke_async::<T>(&mut conn)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) if error.is_timeout() => Err(StoreError::Timeout(self.timeout)),
            Ok(Err(error)) => Err(StoreError::from(error)),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        };
        match &result {
            Ok(_) => {
                if self.down_until.swap(0, Ordering::Relaxed) != 0 {
                    self.stats.redis_up(true);
                }
            }
            Err(error) => {
                self.stats.call_failed(matches!(error, StoreError::Timeout(_)));
                let until = self.clock.now_nanos().saturating_add(self.retry_nanos).max(1);
                if self.down_until.swap(until, Ordering::Relaxed) == 0 {
                    self.stats.redis_up(false);
                }
            }
        }
        result
    }

    /// One admission decision: the lease (if any) and every charge, all or nothing; or, with `batch`,
    /// up to each charge of the rates alone.
    pub(crate) async fn decide(
        &self,
        lease: Option<LeaseAsk<'_>>,
        charges: &[Charge],
        batch: bool,
        known_generation: u64,
    ) -> Result<Decision, StoreError> {
        let keys = &self.keys;
        let mut inv = self.scripts.admit.prepare_invoke();
        inv.key(keys.generation()).key(keys.recovery()).key(keys.leases()).key(keys.units()).key(keys.used());
        let (id, slots, kv) = lease.map_or(("", 0, 0), |l| (l.id, l.slots, l.kv));
        inv.arg(self.time.arg())
            .arg(if batch { "batch" } else { "admit" })
            .arg(id)
            .arg(slots)
            .arg(kv)
            .arg(self.slot_limit)
            .arg(self.kv_limit)
            .arg(self.lease_us)
            .arg(self.recovery_us)
            .arg(keys.freed())
            .arg(known_generation)
            .arg(new_generation());
        for charge in charges {
            inv.key(&charge.key).arg(charge.spec.a).arg(charge.spec.b).arg(charge.spec.burst).arg(charge.n);
        }
        let values: Vec<i64> = self.call(&inv).await?;
        let as_u64 = |v: i64| u64::try_from(v).map_err(|_| StoreError::Reply(format!("negative value {v}")));
        match values.as_slice() {
            [0, generation, taken @ ..] if taken.len() == charges.len() => Ok(Decision::Granted {
                generation: as_u64(*generation)?,
                taken: taken.iter().map(|&v| as_u64(v)).collect::<Result<_, _>>()?,
            }),
            [1, _, _] => Ok(Decision::NoCapacity),
            [2, wait] => Ok(Decision::RateLimited(Duration::from_micros(as_u64(*wait)?))),
            [3, wait] => Ok(Decision::Recovering(Duration::from_micros(as_u64(*wait)?))),
            other => Err(StoreError::Reply(format!("admit returned {other:?}"))),
        }
    }

    /// Gives back leases (by id; unknown ids free nothing) and refunds tokens. Returns the leases freed.
    pub(crate) async fn release(&self, ids: &[String], refunds: &[Charge]) -> Result<u64, StoreError> {
        let keys = &self.keys;
        let mut inv = self.scripts.release.prepare_invoke();
        inv.key(keys.leases()).key(keys.units()).key(keys.used());
        inv.arg(self.time.arg()).arg(keys.freed()).arg(ids.len());
        for id in ids {
            inv.arg(id);
        }
        for refund in refunds {
            inv.key(&refund.key).arg(refund.spec.a).arg(refund.spec.b).arg(refund.n);
        }
        self.call(&inv).await
    }

    /// Renews `leases` (id, slots, kv); registers those that are gone if they fit. Returns the generation
    /// and one answer per lease.
    pub(crate) async fn renew(
        &self,
        leases: &[(String, u64, u64)],
        known_generation: u64,
    ) -> Result<(u64, Vec<RenewAnswer>), StoreError> {
        let keys = &self.keys;
        let mut inv = self.scripts.renew.prepare_invoke();
        inv.key(keys.generation()).key(keys.recovery()).key(keys.leases()).key(keys.units()).key(keys.used());
        inv.arg(self.time.arg())
            .arg(self.lease_us)
            .arg(self.recovery_us)
            .arg(self.slot_limit)
            .arg(self.kv_limit)
            .arg(keys.freed())
            .arg(known_generation)
            .arg(new_generation())
            .arg(leases.len());
        for (id, slots, kv) in leases {
            inv.arg(id).arg(*slots).arg(*kv);
        }
        let values: Vec<i64> = self.call(&inv).await?;
        let Some((generation, answers)) = values.split_first() else {
            return Err(reply::<Vec<i64>>("renew returned an empty")());
        };
        if answers.len() != leases.len() {
            return Err(StoreError::Reply(format!("renew returned {values:?} for {} leases", leases.len())));
        }
        let answers = answers
            .iter()
            .map(|a| match a {
                0 => Ok(RenewAnswer::Extended),
                1 => Ok(RenewAnswer::Registered),
                2 => Ok(RenewAnswer::DoesNotFit),
                other => Err(StoreError::Reply(format!("renew answered {other}"))),
            })
            .collect::<Result<_, _>>()?;
        Ok((u64::try_from(*generation).unwrap_or(0), answers))
    }

    /// The shared capacity in use (expired leases removed first).
    pub(crate) async fn usage(&self) -> Result<SharedUsage, StoreError> {
        let keys = &self.keys;
        let mut inv = self.scripts.usage.prepare_invoke();
        inv.key(keys.leases()).key(keys.units()).key(keys.used()).arg(self.time.arg()).arg(keys.freed());
        let values: Vec<i64> = self.call(&inv).await?;
        match values.as_slice() {
            &[slots, kv, leases, sum_slots, sum_kv] => Ok(SharedUsage {
                slots: u64::try_from(slots).unwrap_or(0),
                kv: u64::try_from(kv).unwrap_or(0),
                leases: u64::try_from(leases).unwrap_or(0),
                consistent: slots == sum_slots && kv == sum_kv && slots >= 0 && kv >= 0,
            }),
            other => Err(StoreError::Reply(format!("usage returned {other:?}"))),
        }
    }
}
