//! [`Gate`]: the gateway's admission, as the tower layer drives it ([`AdmissionControl`]).
//!
//! ```text
//! request ─► front admission ──────────────► dispatcher ──────────────► one upstream's admission
//!            global rates, tenants (caps,    waits in one line while     its in-flight cap and KV
//!            shares, rates, fair queueing),  no upstream has room        budget (exact, per engine)
//!            priorities; capacity = the sum
//!            of the in-service upstreams'
//! ```
//!
//! The front admission is where requests wait, fairly between tenants: its capacity is the sum of the
//! upstreams' (in-service ones), so a request it grants almost always fits some upstream at once. The
//! upstreams' admissions keep each engine within its own limits, whatever the front believes. A
//! [`GatePermit`] holds both grants; its upstream part is returned first, so that a waiter the front
//! grants next finds the room.
//!
//! On reload the front admission is replaced by one built from the new limits; requests already granted
//! or waiting keep the old one until they end (nothing is dropped), and the upstreams' admissions —
//! resized in place — keep protecting the engines meanwhile. Until the old front's permits are back, the
//! new one does not count them: requests it grants meanwhile may wait in the dispatcher's line, first come
//! first served, which a start deadline still bounds (what is left of it is the longest wait there).

use crate::dispatch::{Dispatcher, UpstreamPermit};
use crate::limiter::{Limiter, LimiterPermit};
use crate::upstream::Upstream;
use arc_swap::ArcSwap;
use kvgate::clock::{Clock, MonotonicClock};
use kvgate::stream::Complete;
use kvgate::tower::AdmissionControl;
use kvgate::{RateLimitStatus, Rejection, Request, TenantId};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// The gateway's admission: front admission, then an upstream. Cheap to clone.
#[derive(Clone)]
pub struct Gate {
    front: Arc<ArcSwap<Limiter>>,
    dispatcher: Arc<Dispatcher>,
    clock: MonotonicClock,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").field("front", &self.front.load()).field("dispatcher", &self.dispatcher).finish()
    }
}

/// What a granted request holds: its upstream's grant and the front admission's.
#[derive(Debug)]
pub struct GatePermit {
    // Field order matters: the upstream's capacity comes back before the front grants the next waiter.
    upstream: UpstreamPermit,
    front: LimiterPermit,
    waited: Duration,
}

impl Complete for GatePermit {
    fn complete(self, output_tokens: u32) {
        let GatePermit { upstream, front, .. } = self;
        upstream.complete(output_tokens);
        front.complete(output_tokens);
    }
}

/// What the handler learns about a grant (in the request's extensions).
#[derive(Debug, Clone)]
pub struct Grant {
    /// The upstream the request runs on.
    pub upstream: Arc<Upstream>,
    /// How long it waited for admission (front and line).
    pub waited: Duration,
}

/// A boxed admission future.
pub type Admitting = Pin<Box<dyn Future<Output = Result<GatePermit, Rejection>> + Send>>;

impl Gate {
    /// A gate with `front` in front of `dispatcher`.
    pub fn new(front: Limiter, dispatcher: Arc<Dispatcher>) -> Self {
        Self { front: Arc::new(ArcSwap::from_pointee(front)), dispatcher, clock: MonotonicClock::new() }
    }

    /// The front admission now.
    pub fn front(&self) -> Arc<Limiter> {
        self.front.load_full()
    }

    /// Replaces the front admission (a reload); returns the old one.
    pub fn replace_front(&self, front: Limiter) -> Arc<Limiter> {
        self.front.swap(Arc::new(front))
    }

    /// The dispatcher.
    pub fn dispatcher(&self) -> &Arc<Dispatcher> {
        &self.dispatcher
    }

    /// Stops admitting: the front admission and the line refuse everyone with `Closed`.
    pub fn close(&self) {
        self.front.load().close();
        self.dispatcher.close();
    }

    fn run(&self, request: Request, wait: bool) -> Admitting {
        let front = self.front.load_full();
        let dispatcher = Arc::clone(&self.dispatcher);
        let clock = self.clock.clone();
        Box::pin(async move {
            let started = clock.now_nanos();
            let front_permit = if wait { front.admit(&request).await? } else { front.try_admit(&request).await? };
            let upstream = if wait {
                // A start deadline covers the line too: what is left of it bounds the wait there.
                let mut request = request;
                if let Some(deadline) = request.ttft_deadline {
                    let spent = Duration::from_nanos(clock.now_nanos().saturating_sub(started));
                    let Some(left) = deadline.checked_sub(spent).filter(|left| !left.is_zero()) else {
                        return Err(Rejection::NoCapacity { retry_after: front.local().capacity_retry_after() });
                    };
                    request.max_wait = Some(request.max_wait.map_or(left, |own| own.min(left)));
                }
                dispatcher.dispatch(&request).await?
            } else {
                dispatcher.try_dispatch(&request, front.local().capacity_retry_after()).await?
            };
            let waited = Duration::from_nanos(clock.now_nanos().saturating_sub(started));
            Ok(GatePermit { upstream, front: front_permit, waited })
        })
    }
}

impl AdmissionControl for Gate {
    type Permit = GatePermit;
    type TryAdmit = Admitting;
    type Admit = Admitting;

    fn try_admit(&self, request: &Request) -> Admitting {
        self.run(*request, false)
    }

    fn admit(&self, request: &Request) -> Admitting {
        self.run(*request, true)
    }

    fn capacity_retry_after(&self) -> Duration {
        self.front.load().local().capacity_retry_after()
    }

    fn rate_status(&self, tenant: Option<TenantId>) -> RateLimitStatus {
        self.front.load().local().rate_status(tenant)
    }

    fn on_grant(&self, permit: &GatePermit, extensions: &mut http::Extensions) {
        extensions.insert(Grant { upstream: Arc::clone(permit.upstream.upstream()), waited: permit.waited });
    }
}
