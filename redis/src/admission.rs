//! The public handle: [`SharedAdmission`].

use crate::allowance::AllowancePool;
use crate::core::{Core, Work};
use crate::decision::{Grant, Try};
use crate::error::SetupError;
use crate::error::StoreError;
use crate::fallback::Fallback;
use crate::leases::LeaseTable;
use crate::limits::SharedLimits;
use crate::permit::SharedPermit;
use crate::policy::FailPolicy;
use crate::stats::{SharedStats, Stats};
use crate::store::{SharedUsage, Store};
use kvgate::clock::{Clock, MonotonicClock};
use kvgate::{Admission, Permit, Rejection, Request};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::{self, UnboundedSender};

/// Shortest pause between two tries of a waiting request.
const MIN_BACKOFF: Duration = Duration::from_millis(2);

/// What the fail policy uses.
#[derive(Debug)]
pub(crate) enum OnFailure<C: Clock> {
    Closed(Duration),
    Open(Fallback<C>),
}

/// Everything one shared admission owns.
#[derive(Debug)]
pub(crate) struct Inner<C: Clock> {
    pub(crate) local: Admission<C>,
    pub(crate) core: Arc<Core>,
    pub(crate) work: UnboundedSender<Work>,
    pub(crate) on_failure: OnFailure<C>,
    max_queue_wait: Option<Duration>,
    poll_interval: Duration,
    /// Ends the pub/sub listener when the last handle goes.
    _shutdown: tokio::sync::watch::Sender<()>,
}

/// An admission whose limits are shared by every replica through Redis: a local [`kvgate::Admission`]
/// (in-process limits and the waiting room, unchanged) plus shared rates and shared capacity.
///
/// Clones share one state. See the [crate documentation](crate) for the design, the guarantees and
/// what each failure does.
///
/// # Examples
///
/// ```no_run
/// use kvgate::{Admission, Request};
/// use kvgate_redis::{SharedAdmission, SharedLimits};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let local = Admission::builder().queue_capacity(1000).build()?;
/// let limits = SharedLimits::new("gpu-0").max_in_flight(64).kv_capacity(400_000).request_rate(50.0, 100);
/// let admission = SharedAdmission::connect("redis://127.0.0.1:6379", local, limits).await?;
/// match admission.admit(&Request::new(1_200, 800)).await {
///     Ok(permit) => permit.complete(312),
///     Err(rejection) => println!("{} {:?}", rejection.http_status(), rejection.retry_after()),
/// }
/// # Ok(()) }
/// ```
pub struct SharedAdmission<C: Clock = MonotonicClock> {
    inner: Arc<Inner<C>>,
}

impl<C: Clock> Clone for SharedAdmission<C> {
    fn clone(&self) -> Self {
        Self { inner: Arc::clone(&self.inner) }
    }
}

impl<C: Clock> fmt::Debug for SharedAdmission<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedAdmission")
            .field("replica", &self.replica_id())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// A replica id: random, 16 hex digits.
fn replica_id() -> String {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    format!("{:016x}", hasher.finish())
}

impl<C: Clock> SharedAdmission<C> {
    /// Sets up a shared admission on the Redis (or Valkey) at `url`, around `local`.
    ///
    /// Starts two background tasks on the current Tokio runtime (lease renewal and releases; the
    /// pub/sub listener for freed capacity), which end when the admission and all its permits are
    /// dropped. Does not wait for Redis: if it is unreachable now, the fail policy applies until it
    /// answers (so a fleet can start while Redis is down).
    ///
    /// `local` keeps its own limits (set none there that should be shared) and its waiting room; shared
    /// KV units are priced with `local`'s [`kv_cost`](Admission::kv_cost).
    ///
    /// # Errors
    ///
    /// [`SetupError::Config`] for invalid limits, [`SetupError::InvalidUrl`], [`SetupError::NoRuntime`]
    /// outside a Tokio runtime.
    pub async fn connect(url: &str, local: Admission<C>, limits: SharedLimits) -> Result<Self, SetupError> {
        let checked = limits.validate()?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| SetupError::NoRuntime)?;
        let invalid = |e: redis::RedisError| SetupError::InvalidUrl { url: url.to_owned(), reason: e.to_string() };
        let client = redis::Client::open(url).map_err(invalid)?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(checked.call_timeout))
            .set_connection_timeout(Some(checked.call_timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(limits.retry_interval);
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), config).map_err(invalid)?;
        let stats = Arc::new(Stats::default());
        let on_failure = match limits.fail_policy {
            FailPolicy::Closed { retry_after } => OnFailure::Closed(retry_after),
            FailPolicy::Open { replicas } => OnFailure::Open(Fallback::new(&limits, replicas, local.clock().clone())?),
        };
        let allowance =
            limits.allowance.map(|a| AllowancePool::new(a, checked.requests.is_some(), checked.tokens.is_some()));
        let store =
            Store::new(conn, &limits.name, &checked, limits.time.clone(), limits.retry_interval, Arc::clone(&stats));
        let channel = store.keys.freed();
        let core = Arc::new(Core::new(store, checked, LeaseTable::new(replica_id()), stats, allowance));
        let (work, receiver) = mpsc::unbounded_channel();
        let (shutdown, shutdown_rx) = tokio::sync::watch::channel(());
        runtime.spawn(crate::worker::run(Arc::clone(&core), receiver, limits.retry_interval));
        runtime.spawn(crate::notify::listen(
            Arc::downgrade(&core),
            client,
            channel,
            shutdown_rx,
            limits.retry_interval,
        ));
        if let Some(pool) = &core.allowance {
            pool.wanted.notify_one();
        }
        Ok(Self {
            inner: Arc::new(Inner {
                local,
                core,
                work,
                on_failure,
                max_queue_wait: limits.max_queue_wait,
                poll_interval: limits.poll_interval,
                _shutdown: shutdown,
            }),
        })
    }

    /// Admits `request` now, or says why not: never waits for capacity, only for Redis' answer (at most
    /// the call timeout; not at all when the local allowance decides).
    ///
    /// The local admission decides first ([`Admission::try_admit`]); then the shared limits, in one
    /// script call. A request does not pass this replica's requests waiting for shared capacity in
    /// [`admit`](Self::admit) of the same or a higher priority.
    ///
    /// # Errors
    ///
    /// The [`Rejection`]s of the local admission, and for the shared limits: `TooLarge` (never fits the
    /// shared budget or a shared burst), `NoCapacity` (the shared capacity is in use, or Redis is
    /// recovering its state, or — fail-closed — Redis does not answer), `RateLimited` (a shared rate, with
    /// the exact time every rate involved would pass). The request holds nothing afterwards.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives back what it took; a lease whose take was in flight is given back by id
    /// in the background (and expires otherwise). Shared rate tokens charged by a call whose answer was
    /// never read are spent.
    pub async fn try_admit(&self, request: &Request) -> Result<SharedPermit, Rejection> {
        let inner = &self.inner;
        let kv = inner.validate(request)?;
        let local = inner.local.try_admit(request)?;
        if inner.core.limits.has_capacity() && inner.core.line.holds_back(request.priority) {
            return Err(Rejection::NoCapacity { retry_after: inner.local.capacity_retry_after() });
        }
        match inner.try_shared(request, kv).await {
            Try::Granted(grant) => Ok(self.permit(local, grant, request, kv)),
            Try::Full(retry_after) => Err(Rejection::NoCapacity { retry_after }),
            Try::Refused(rejection) => Err(rejection),
        }
    }

    /// Waits for admission: first in the local waiting room ([`Admission::admit`]), then for shared
    /// capacity in this replica's line (priority, then arrival), whose head asks Redis again when a
    /// release is announced (pub/sub) or after a backoff up to the poll interval. The local permit is
    /// held while the request waits for shared capacity; the line holds at most the local admission's
    /// `queue_capacity` requests (one more is refused with `QueueFull`).
    ///
    /// Rates never wait (a request over a shared rate resolves to `RateLimited` at once). The wait for
    /// shared capacity ends with [`Rejection::TimedOut`] after the request's `max_wait` or this
    /// admission's [`max_queue_wait`](SharedLimits::max_queue_wait), counted from the call; with
    /// [`Rejection::Closed`] after [`close`](Self::close).
    ///
    /// # Errors
    ///
    /// As [`try_admit`](Self::try_admit), plus `TimedOut`, `QueueFull` (local) and `Closed`.
    ///
    /// # Cancel safety
    ///
    /// As [`try_admit`](Self::try_admit); a dropped waiter leaves the line at once and the next one
    /// becomes head.
    pub async fn admit(&self, request: &Request) -> Result<SharedPermit, Rejection> {
        let inner = &self.inner;
        let clock = inner.local.clock();
        let started = clock.now_nanos();
        let kv = inner.validate(request)?;
        let limit = match (request.max_wait, inner.max_queue_wait) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let deadline = limit.map(|l| started.saturating_add(u64::try_from(l.as_nanos()).unwrap_or(u64::MAX)));
        let local = inner.local.admit(request).await?;
        if !inner.core.limits.has_capacity() {
            return match inner.try_shared(request, kv).await {
                Try::Granted(grant) => Ok(self.permit(local, grant, request, kv)),
                Try::Full(retry_after) => Err(Rejection::NoCapacity { retry_after }),
                Try::Refused(rejection) => Err(rejection),
            };
        }
        // The line is bounded like the local waiting room it continues.
        let room = inner.local.snapshot().queue_capacity;
        if inner.core.line.len() >= room {
            return Err(Rejection::QueueFull { retry_after: inner.local.capacity_retry_after() });
        }
        let place = inner.core.line.join(request.priority);
        let mut backoff = MIN_BACKOFF;
        loop {
            if inner.local.is_closed() {
                return Err(Rejection::Closed);
            }
            let mut pause = inner.poll_interval;
            if place.is_head() {
                match inner.try_shared(request, kv).await {
                    Try::Granted(grant) => return Ok(self.permit(local, grant, request, kv)),
                    Try::Refused(rejection) => return Err(rejection),
                    Try::Full(hint) => {
                        pause = backoff.min(hint.max(MIN_BACKOFF)).min(inner.poll_interval);
                        backoff = (backoff * 2).min(inner.poll_interval);
                    }
                }
            }
            let left = match deadline {
                Some(deadline) => {
                    let now = clock.now_nanos();
                    if now >= deadline {
                        return Err(Rejection::TimedOut);
                    }
                    clock.real_time_until(deadline - now)
                }
                None => Duration::MAX,
            };
            tokio::select! {
                _ = place.woken() => backoff = MIN_BACKOFF,
                _ = tokio::time::sleep(pause.min(left)) => {}
            }
        }
    }

    fn permit(&self, local: Permit, grant: Grant, request: &Request, kv: u64) -> SharedPermit {
        let Grant { lease, tokens, fallback } = grant;
        SharedPermit {
            local: Some(local),
            fallback,
            lease,
            tokens,
            max_new_tokens: request.max_new_tokens,
            kv,
            refunds: Vec::new(),
            core: Arc::clone(&self.inner.core),
            work: self.inner.work.clone(),
        }
    }

    /// Stops admitting (the local admission is closed: waiters and later requests get
    /// [`Rejection::Closed`]). Permits already granted stay valid until dropped.
    pub fn close(&self) {
        self.inner.local.close();
        self.inner.core.line.wake_all();
    }

    /// The local admission.
    pub fn local(&self) -> &Admission<C> {
        &self.inner.local
    }

    /// This replica's id: the owner part of its lease ids (`<replica>:<n>` in Redis).
    pub fn replica_id(&self) -> &str {
        self.inner.core.leases.replica()
    }

    /// Counters since setup. See [`SharedStats`].
    pub fn stats(&self) -> SharedStats {
        self.inner.core.stats.snapshot()
    }

    /// Whether Redis answered the last call.
    pub fn redis_up(&self) -> bool {
        self.inner.core.store.is_up()
    }

    /// Shared capacity this replica holds leased in Redis now (slots, KV units), as this replica knows it.
    pub fn held(&self) -> (u64, u64) {
        self.inner.core.leases.held_units()
    }

    /// Capacity held by this replica's fail-open permits now (slots, KV units); `(0, 0)` when fail-closed.
    pub fn held_fallback(&self) -> (u64, u64) {
        match &self.inner.on_failure {
            OnFailure::Open(fallback) => fallback.held(),
            OnFailure::Closed(_) => (0, 0),
        }
    }

    /// Global rate tokens this replica holds in its local allowance now: (requests, tokens).
    pub fn allowance_held(&self) -> (u64, u64) {
        self.inner.core.allowance.as_ref().map_or((0, 0), |pool| {
            let held = pool.held();
            (held.requests, held.tokens)
        })
    }

    /// This replica's requests waiting for shared capacity.
    pub fn waiting(&self) -> usize {
        self.inner.core.line.len()
    }

    /// Reads the shared capacity in use across every replica from Redis (expired leases are removed
    /// first), for health endpoints and tests.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when Redis does not answer within the call timeout.
    pub async fn usage(&self) -> Result<SharedUsage, StoreError> {
        self.inner.core.store.usage().await
    }

    /// Waits until every lease and refund given back before this call has reached Redis (or Redis did
    /// not answer; then they stay queued). For a graceful shutdown: drop the permits, then `flush`.
    pub async fn flush(&self) {
        let (done, answered) = tokio::sync::oneshot::channel();
        if self.inner.work.send(Work::Flush(done)).is_ok() {
            let _ = answered.await;
        }
    }

    /// Renews this replica's leases now (the background task does it every renewal interval), and
    /// registers those Redis does not hold if they fit.
    ///
    /// Runs on the background task, after every release queued before it (so a renewal never brings
    /// back a lease whose permit was dropped); returns when it is done.
    pub async fn renew_now(&self) {
        let (done, answered) = tokio::sync::oneshot::channel();
        if self.inner.work.send(Work::Renew(done)).is_ok() {
            let _ = answered.await;
        }
    }

    /// Sets the gauges of the local admission ([`Admission::publish_metrics`]) and of the sharing:
    /// `kvgate_redis_up`, `kvgate_redis_leases_held`, `kvgate_redis_requests_waiting`.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn publish_metrics(&self) {
        self.inner.local.publish_metrics();
        let core = &self.inner.core;
        core.stats.redis_up(core.store.is_up());
        metrics::gauge!("kvgate_redis_leases_held").set(core.leases.len() as f64);
        metrics::gauge!("kvgate_redis_requests_waiting").set(core.line.len() as f64);
    }
}
