//! The dispatcher: sends each admitted request to an upstream where it fits now, and holds it in one
//! line shared by all upstreams while none has room.
//!
//! # Where a request goes
//!
//! Every in-service upstream is a candidate (every upstream, when none is in service); each has an admission of its own capacity (in-flight cap,
//! KV budget) that never queues. Candidates are tried best first — most free KV, then fewest requests
//! waiting inside the engine (engine feedback), then fewest running — and the first whose admission
//! grants the request gets it. With more than [`P2C_ABOVE`] candidates, two are drawn at random and the
//! better of the two is tried first, then the other, then the rest in turn from a random start (power
//! of two choices: the load spreads without every request sorting every server). A request that fits no
//! upstream's configured budget at all is refused at once (`413 too_large`).
//!
//! # The line, and its fairness
//!
//! A request that fits nowhere now joins the line: higher priority classes first, arrival order within
//! a class. Whenever capacity comes back — a permit of any upstream is dropped, an upstream comes back
//! in, a reload grows a budget — one *pass* runs: it tries the head of the line against every upstream;
//! if the head is granted it leaves the line and the next becomes head; if not, the pass stops. So
//! nobody in the line is overtaken by a request behind it (a large request at the head waits until some
//! upstream has room for it, within its wait limit), and a request that finds the line non-empty joins
//! its end instead of trying. One pass runs at a time; a release during a pass makes the pass run again.
//! With upstreams whose capacity is shared with other replicas (`--redis`), capacity freed by another
//! replica is not announced here: waiters re-run a pass every [`SHARED_POLL`].
//!
//! Fairness between tenants is not decided here: requests come to the dispatcher from the gateway's
//! front admission, whose tenant-fair queue already ordered them, and whose capacity is the sum of the
//! in-service upstreams', so the line stays short (it holds what fits the sum but no single upstream,
//! while a permit is on its way back). The line keeps the order they came in.

use crate::limiter::LimiterPermit;
use crate::upstream::Upstream;
use futures::FutureExt;
use kvgate::stream::Complete;
use kvgate::{Priority, Rejection, Request};
use parking_lot::Mutex;
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::oneshot;

/// Above this many in-service upstreams, the dispatcher draws two at random first (power of two choices).
pub const P2C_ABOVE: usize = 4;

/// How often a waiter re-runs a pass when some upstream's capacity is shared through Redis.
pub const SHARED_POLL: Duration = Duration::from_millis(50);

type Reply = oneshot::Sender<Result<UpstreamPermit, Rejection>>;

struct Waiter {
    request: Request,
    reply: Reply,
}

/// Waiters by (class, highest first; arrival).
#[derive(Default)]
struct Line {
    waiters: BTreeMap<(Reverse<Priority>, u64), Waiter>,
    next: u64,
}

/// Sends requests to upstreams; see the [module docs](self).
pub struct Dispatcher {
    upstreams: Vec<Arc<Upstream>>,
    line: Mutex<Line>,
    waiting: AtomicUsize,
    running: AtomicBool,
    pending: AtomicBool,
    closed: AtomicBool,
    /// Waiters poll when some upstream's capacity is shared.
    poll: Option<Duration>,
    max_wait_nanos: AtomicU64,
    draws: AtomicU64,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("upstreams", &self.upstreams.len())
            .field("waiting", &self.waiting())
            .finish_non_exhaustive()
    }
}

/// A request's grant on one upstream. Dropping it returns the upstream's capacity and lets the line move.
pub struct UpstreamPermit {
    permit: Option<LimiterPermit>,
    upstream: Arc<Upstream>,
    dispatcher: Arc<Dispatcher>,
}

impl std::fmt::Debug for UpstreamPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamPermit").field("upstream", &self.upstream.name).finish_non_exhaustive()
    }
}

impl UpstreamPermit {
    /// The upstream it was granted on.
    pub fn upstream(&self) -> &Arc<Upstream> {
        &self.upstream
    }
}

impl Complete for UpstreamPermit {
    fn complete(mut self, output_tokens: u32) {
        if let Some(permit) = self.permit.take() {
            silenced(|| permit.complete(output_tokens));
        }
    }
}

impl Drop for UpstreamPermit {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            silenced(|| drop(permit));
        }
        self.dispatcher.kick();
    }
}

/// Runs `f` with the `metrics` recorder off: the upstreams' admissions are bookkeeping under the
/// gateway's front admission, whose `kvgate_*` metrics already count each request once.
fn silenced<T>(f: impl FnOnce() -> T) -> T {
    metrics::with_local_recorder(&metrics::NoopRecorder, f)
}

/// A future polled with the `metrics` recorder off (see [`silenced`]).
struct Silenced<F>(Pin<Box<F>>);

impl<F: Future> Future for Silenced<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let future = self.0.as_mut();
        silenced(|| future.poll(cx))
    }
}

/// What trying every upstream gave.
enum Attempt {
    Granted(UpstreamPermit),
    /// No upstream has room now.
    NoRoom,
    Refused(Rejection),
}

/// Leaves the line when the waiting request is dropped (its client went away) or gives up.
struct Place<'a> {
    dispatcher: &'a Dispatcher,
    key: (Reverse<Priority>, u64),
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut line = self.dispatcher.line.lock();
        if line.waiters.remove(&self.key).is_some() {
            self.dispatcher.waiting.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Dispatcher {
    /// A dispatcher over `upstreams`; a request waits in the line at most `max_wait`.
    pub fn new(upstreams: Vec<Arc<Upstream>>, max_wait: Duration) -> Arc<Self> {
        let poll = upstreams.iter().any(|u| u.limiter.is_shared()).then_some(SHARED_POLL);
        let seed = std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), 0u8);
        Arc::new(Self {
            upstreams,
            line: Mutex::new(Line::default()),
            waiting: AtomicUsize::new(0),
            running: AtomicBool::new(false),
            pending: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            poll,
            max_wait_nanos: AtomicU64::new(u64::try_from(max_wait.as_nanos()).unwrap_or(u64::MAX)),
            draws: AtomicU64::new(seed),
        })
    }

    /// The upstreams, in configuration order.
    pub fn upstreams(&self) -> &[Arc<Upstream>] {
        &self.upstreams
    }

    /// Requests in the line.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// Changes the longest wait in the line (a reload).
    pub fn set_max_wait(&self, max_wait: Duration) {
        self.max_wait_nanos.store(u64::try_from(max_wait.as_nanos()).unwrap_or(u64::MAX), Ordering::Release);
    }

    /// Refuses every waiter and every later request with [`Rejection::Closed`].
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let waiters = std::mem::take(&mut self.line.lock().waiters);
        self.waiting.fetch_sub(waiters.len(), Ordering::AcqRel);
        for (_, waiter) in waiters {
            let _ = waiter.reply.send(Err(Rejection::Closed));
        }
    }

    /// Sends `request` to an upstream where it fits, waiting in the line while none has room (at most
    /// the line's wait limit, or the request's `max_wait` if shorter).
    ///
    /// # Errors
    ///
    /// [`Rejection::TooLarge`] when it fits no upstream's budget, `TimedOut` after the wait limit,
    /// `Closed` after [`close`](Self::close), and the upstream admission's own refusal when it can
    /// never be granted (`Invalid`).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the line; a permit granted to it meanwhile is dropped, which gives the
    /// capacity back.
    pub async fn dispatch(self: &Arc<Self>, request: &Request) -> Result<UpstreamPermit, Rejection> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Rejection::Closed);
        }
        if self.waiting() == 0 {
            match self.try_all(request).await {
                Attempt::Granted(permit) => return Ok(permit),
                Attempt::Refused(rejection) => return Err(rejection),
                Attempt::NoRoom => {}
            }
        }
        if let Some(too_large) = self.fits_nowhere(request) {
            return Err(too_large);
        }
        self.wait(request).await
    }

    /// Tries every upstream once, never waiting.
    ///
    /// # Errors
    ///
    /// As [`dispatch`](Self::dispatch), and [`Rejection::NoCapacity`] when no upstream has room now or
    /// others wait.
    pub async fn try_dispatch(
        self: &Arc<Self>,
        request: &Request,
        retry_after: Duration,
    ) -> Result<UpstreamPermit, Rejection> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Rejection::Closed);
        }
        let tried = if self.waiting() > 0 { Attempt::NoRoom } else { self.try_all(request).await };
        match tried {
            Attempt::Granted(permit) => Ok(permit),
            Attempt::Refused(rejection) => Err(rejection),
            Attempt::NoRoom => Err(self.fits_nowhere(request).unwrap_or(Rejection::NoCapacity { retry_after })),
        }
    }

    async fn wait(self: &Arc<Self>, request: &Request) -> Result<UpstreamPermit, Rejection> {
        let (reply, mut answer) = oneshot::channel();
        let key = {
            let mut line = self.line.lock();
            let key = (Reverse(request.priority), line.next);
            line.next += 1;
            line.waiters.insert(key, Waiter { request: *request, reply });
            self.waiting.fetch_add(1, Ordering::AcqRel);
            key
        };
        let _place = Place { dispatcher: self, key };
        // A close between the check above and joining the line must not leave this waiter behind.
        if self.closed.load(Ordering::Acquire) {
            return Err(Rejection::Closed);
        }
        self.kick();
        let mut limit = Duration::from_nanos(self.max_wait_nanos.load(Ordering::Acquire));
        if let Some(own) = request.max_wait {
            limit = limit.min(own);
        }
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let pause = self.poll.unwrap_or(limit);
            tokio::select! {
                answer = &mut answer => return answer.unwrap_or(Err(Rejection::Closed)),
                () = tokio::time::sleep_until(deadline) => {
                    // A grant may have landed just now: take it rather than drop it.
                    return match answer.try_recv() {
                        Ok(answer) => answer,
                        Err(_) => Err(Rejection::TimedOut),
                    };
                }
                () = tokio::time::sleep(pause) => self.kick(),
            }
        }
    }

    /// `TooLarge` when `request` exceeds every upstream's KV budget.
    fn fits_nowhere(&self, request: &Request) -> Option<Rejection> {
        let mut largest = 0;
        let mut requested = 0;
        for upstream in &self.upstreams {
            let admission = upstream.limiter.local();
            let capacity = admission.snapshot().kv_capacity;
            requested = admission.kv_cost(request);
            if requested <= capacity {
                return None;
            }
            largest = largest.max(capacity);
        }
        Some(Rejection::TooLarge { requested, capacity: largest, limit: kvgate::Limit::KvBudget })
    }

    /// The in-service upstreams in the order to try them (see the module docs).
    fn candidates(&self) -> Vec<&Arc<Upstream>> {
        let mut healthy: Vec<&Arc<Upstream>> = self.upstreams.iter().filter(|u| u.is_healthy()).collect();
        if healthy.is_empty() {
            // None in service: try them all rather than hold every request back (a failing server answers
            // a quick 502 or 504; one that recovered answers), until a health check brings one back.
            healthy = self.upstreams.iter().collect();
        }
        if healthy.len() == 1 {
            return healthy;
        }
        if healthy.len() <= P2C_ABOVE {
            let mut ranked: Vec<_> = healthy.into_iter().map(|u| (u.load().key(), u)).collect();
            ranked.sort_by_key(|(key, _)| *key);
            return ranked.into_iter().map(|(_, u)| u).collect();
        }
        let n = healthy.len();
        let draw =
            kvgate::retry::SplitMix64::new(self.draws.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)).next_u64();
        let first = (draw % n as u64) as usize;
        let second = (first + 1 + ((draw >> 32) % (n as u64 - 1)) as usize) % n;
        let (a, b) =
            if healthy[second].load().key() < healthy[first].load().key() { (second, first) } else { (first, second) };
        let mut order = vec![healthy[a], healthy[b]];
        order.extend((0..n).map(|i| (first + i) % n).filter(|&i| i != a && i != b).map(|i| healthy[i]));
        order
    }

    async fn try_all(self: &Arc<Self>, request: &Request) -> Attempt {
        let mut refused = None;
        for upstream in self.candidates() {
            let tried = Silenced(Box::pin(upstream.limiter.try_admit(request))).await;
            match tried {
                Ok(permit) => {
                    return Attempt::Granted(UpstreamPermit {
                        permit: Some(permit),
                        upstream: Arc::clone(upstream),
                        dispatcher: Arc::clone(self),
                    });
                }
                Err(Rejection::Invalid { reason }) => refused = Some(Rejection::Invalid { reason }),
                Err(_) => {}
            }
        }
        refused.map_or(Attempt::NoRoom, Attempt::Refused)
    }

    /// Runs passes (in a task of their own) when someone waits; see the module docs.
    pub fn kick(self: &Arc<Self>) {
        if self.waiting() == 0 {
            return;
        }
        self.pending.store(true, Ordering::Release);
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = Arc::clone(self);
        let passes = async move {
            loop {
                this.pending.store(false, Ordering::Release);
                this.pass().await;
                this.running.store(false, Ordering::Release);
                if !this.pending.load(Ordering::Acquire) || this.running.swap(true, Ordering::AcqRel) {
                    break;
                }
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(passes)),
            // Outside a runtime (a permit dropped on a plain thread): run it here; local upstreams never wait.
            Err(_) => drop(passes.now_or_never()),
        }
    }

    /// Grants waiters from the head of the line until the head fits nowhere.
    async fn pass(self: &Arc<Self>) {
        loop {
            let head = {
                let mut line = self.line.lock();
                loop {
                    let Some((&key, waiter)) = line.waiters.iter().next() else { return };
                    if waiter.reply.is_closed() {
                        line.waiters.remove(&key);
                        self.waiting.fetch_sub(1, Ordering::AcqRel);
                        continue;
                    }
                    break (key, waiter.request);
                }
            };
            let granted = match self.try_all(&head.1).await {
                Attempt::NoRoom => return,
                Attempt::Granted(permit) => Ok(permit),
                Attempt::Refused(rejection) => Err(rejection),
            };
            let waiter = self.line.lock().waiters.remove(&head.0);
            if let Some(waiter) = waiter {
                self.waiting.fetch_sub(1, Ordering::AcqRel);
                // A waiter gone meanwhile drops the permit, which gives the capacity back.
                let _ = waiter.reply.send(granted);
            }
        }
    }
}
