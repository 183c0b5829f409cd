//! Waiting for admission: the [`Admit`] future and the blocking variant, on any runtime.
//!
//! A request that cannot be admitted at once takes a place in its priority class's bounded queue as a
//! [`Waiter`]. Released capacity is handed to waiters by the dispatcher in `core`, which reserves the
//! capacity *for* the head waiter, flips it to `GRANTED` and wakes exactly that one task or thread (O(1)
//! wake-ups per grant: no thundering herd). The waiter then only has to pick its permit up.

use super::permit::{Owner, Permit};
use super::tenant::TenantHandle;
use super::waiter::{CANCELLED, CLOSED, GRANTED, Notify, TIMED_OUT, WAITING, Waiter};
use super::{Rejection, Request};
use futures::task::AtomicWaker;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// What a request that is about to wait has already been given: its KV units, the tokens charged to the
/// token rate (one request was charged to the request rate too), and its deadline.
#[derive(Debug, Clone)]
pub(crate) struct Ticket {
    pub(crate) kv: u64,
    pub(crate) tokens_charged: u64,
    /// The tenant whose rates were charged too, and whose limits the grant respects.
    pub(crate) tenant: Option<Arc<dyn TenantHandle>>,
    /// Clock reading at which the wait ends (`u64::MAX`: never).
    pub(crate) deadline: u64,
    /// Clock reading when the ticket was issued.
    pub(crate) now: u64,
}

enum State {
    /// Not polled yet.
    Start,
    /// Queued; the ticket's rate charges are held until the wait ends.
    Waiting { waiter: Arc<Waiter>, ticket: Ticket },
    /// Resolved; nothing held.
    Done,
}

/// Future returned by [`Admission::admit`](crate::Admission::admit); resolves to a [`Permit`] or a
/// [`Rejection`].
///
/// It is `Send + 'static` (it owns a handle to the admission and a copy of the request), so it can be
/// spawned, and it needs no particular runtime: it is woken through the standard `Waker`, and deadlines
/// are enforced by a small timer thread of the admission's own.
///
/// # Cancel safety
///
/// Dropping an `Admit` at any point loses nothing and takes nothing:
/// - before its first poll: nothing was taken;
/// - while queued: its place is given up at once (the waiting count drops, the next waiter moves up),
///   and its rate-limit charges are refunded;
/// - after capacity was granted to it but before it was polled again: the granted slot and KV
///   reservation are released and handed to the next waiter, and the rate charges are refunded.
///
/// A cancelled waiter no longer counts against `queue_capacity`; its entry in the queue's ring is
/// discarded when it reaches the head, or sooner when the ring fills up (the dispatcher then moves the
/// live waiters out of the ring in order and drops the cancelled ones).
///
/// # Panics
///
/// Polling again after it returned `Poll::Ready` panics, as for most futures.
///
/// # Examples
///
/// ```
/// use kvgate::{Admission, Request, Rejection};
/// use futures::FutureExt;
///
/// let admission = Admission::builder().max_in_flight(1).queue_capacity(8).build().unwrap();
/// let held = admission.try_admit(&Request::new(1, 1)).unwrap();
/// let mut waiting = admission.admit(&Request::new(1, 1));
/// assert!((&mut waiting).now_or_never().is_none()); // queued
/// assert_eq!(admission.snapshot().queued, 1);
/// drop(waiting);                                     // client went away
/// assert_eq!(admission.snapshot().queued, 0);
/// drop(held);
/// assert_eq!(admission.snapshot().in_flight, 0);
/// ```
#[must_use = "futures do nothing unless polled"]
pub struct Admit {
    owner: Arc<dyn Owner>,
    request: Request,
    state: State,
}

impl Admit {
    pub(crate) fn new(owner: Arc<dyn Owner>, request: Request) -> Self {
        Self { owner, request, state: State::Start }
    }

    /// The request this future admits.
    pub fn request(&self) -> &Request {
        &self.request
    }

    /// Whether the request is queued (polled at least once and not yet resolved).
    pub fn is_queued(&self) -> bool {
        matches!(self.state, State::Waiting { .. })
    }

    /// First poll: admit at once, or reject, or take a place in the queue.
    fn start(&mut self, cx: &mut Context<'_>) -> Poll<Result<Permit, Rejection>> {
        let slot = AtomicWaker::new();
        slot.register(cx.waker());
        match admit_or_queue(&self.owner, &self.request, None, Notify::Task(slot)) {
            Ok(Admitted::Now(permit)) => Poll::Ready(Ok(permit)),
            Ok(Admitted::Queued(waiter, ticket)) => {
                if ticket.deadline != u64::MAX {
                    self.owner.core().watch_deadline(&self.owner, &waiter);
                }
                self.state = State::Waiting { waiter, ticket };
                Poll::Pending
            }
            Err(rejection) => self.reject(rejection),
        }
    }

    fn reject(&mut self, rejection: Rejection) -> Poll<Result<Permit, Rejection>> {
        self.state = State::Done;
        self.owner.core().count_rejection(&rejection, self.request.tenant.is_some());
        Poll::Ready(Err(rejection))
    }
}

/// The outcome of a request's first attempt.
enum Admitted {
    /// Capacity was free: here is the permit.
    Now(Permit),
    /// Queued: the waiter, and what was charged for it.
    Queued(Arc<Waiter>, Ticket),
}

/// Admits `request` at once, or queues it with `notify` as its wake-up, or says why neither is possible.
/// A rejection has already given back everything (it is not counted yet); a queued request holds its
/// rate charges, recorded in the ticket. `timeout` further limits the wait.
fn admit_or_queue(
    owner: &Arc<dyn Owner>,
    request: &Request,
    timeout: Option<std::time::Duration>,
    notify: Notify,
) -> Result<Admitted, Rejection> {
    let core = owner.core();
    match owner.admit_now(owner, request) {
        Ok(permit) => return Ok(Admitted::Now(permit)),
        Err(Rejection::NoCapacity { .. }) if core.queue_capacity() > 0 => {}
        Err(rejection) => return Err(rejection),
    }
    let mut ticket = owner.prepare_wait(request)?;
    if let Some(timeout) = timeout {
        let limit = ticket.now.saturating_add(crate::clock::duration_to_nanos(timeout));
        ticket.deadline = ticket.deadline.min(limit);
    }
    let rejection = if ticket.deadline <= ticket.now {
        Rejection::TimedOut
    } else {
        let waiter =
            Arc::new(Waiter::new(ticket.kv, request.priority.index(), ticket.deadline, ticket.tenant.clone(), notify));
        if core.enqueue(&waiter) {
            return Ok(Admitted::Queued(waiter, ticket));
        }
        if core.is_closed() {
            Rejection::Closed
        } else {
            Rejection::QueueFull { retry_after: core.capacity_hint(core.queued()) }
        }
    };
    owner.refund_rates(true, ticket.tokens_charged, ticket.tenant.as_deref());
    Err(rejection)
}

/// Resolves a waiter whose state has left `WAITING`, or `None` while it still waits (after ending it if
/// its deadline has passed at `now`).
fn resolve(
    owner: &Arc<dyn Owner>,
    request: &Request,
    waiter: &Waiter,
    ticket: &Ticket,
    now: u64,
) -> Option<Result<Permit, Rejection>> {
    loop {
        let rejection = match waiter.state() {
            GRANTED => {
                crate::telemetry::queue_wait(now.saturating_sub(ticket.now));
                return Some(Ok(owner.permit_for(owner, request, ticket)));
            }
            WAITING => {
                if now >= waiter.deadline && owner.core().abandon(waiter, TIMED_OUT) {
                    Rejection::TimedOut
                } else if waiter.state() == WAITING {
                    return None;
                } else {
                    continue;
                }
            }
            TIMED_OUT => Rejection::TimedOut,
            CLOSED => Rejection::Closed,
            _ => Rejection::Closed,
        };
        owner.refund_rates(true, ticket.tokens_charged, ticket.tenant.as_deref());
        owner.core().count_rejection(&rejection, ticket.tenant.is_some());
        return Some(Err(rejection));
    }
}

/// Gives back whatever a waiter holds when its owner stops waiting for it.
fn abandon_wait(owner: &dyn Owner, waiter: &Waiter, ticket: &Ticket) {
    let core = owner.core();
    if !core.abandon(waiter, CANCELLED) && waiter.state() == GRANTED {
        // Granted but never picked up: the reservation goes to the next waiter.
        if let Some(tenant) = &ticket.tenant {
            tenant.release(ticket.kv);
        }
        core.release(ticket.kv);
    }
    owner.refund_rates(true, ticket.tokens_charged, ticket.tenant.as_deref());
}

impl Future for Admit {
    type Output = Result<Permit, Rejection>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match &this.state {
            State::Start => this.start(cx),
            State::Done => panic!("`Admit` polled after it completed"),
            State::Waiting { waiter, ticket } => {
                let now = this.owner.now_nanos();
                if let Some(result) = resolve(&this.owner, &this.request, waiter, ticket, now) {
                    this.state = State::Done;
                    return Poll::Ready(result);
                }
                waiter.register(cx.waker());
                // A grant between the check and the registration must not be missed.
                if waiter.state() != WAITING {
                    if let Some(result) = resolve(&this.owner, &this.request, waiter, ticket, now) {
                        this.state = State::Done;
                        return Poll::Ready(result);
                    }
                }
                Poll::Pending
            }
        }
    }
}

impl Drop for Admit {
    fn drop(&mut self) {
        if let State::Waiting { waiter, ticket } = &self.state {
            abandon_wait(&*self.owner, waiter, ticket);
        }
    }
}

impl fmt::Debug for Admit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Start => "start",
            State::Waiting { .. } => "waiting",
            State::Done => "done",
        };
        f.debug_struct("Admit").field("request", &self.request).field("state", &state).finish()
    }
}

/// Blocking admission for thread-per-request servers (see `Admission::admit_blocking`).
#[cfg(not(loom))]
pub(crate) fn admit_blocking(
    owner: Arc<dyn Owner>,
    request: Request,
    timeout: Option<std::time::Duration>,
) -> Result<Permit, Rejection> {
    let (waiter, ticket) = match admit_or_queue(&owner, &request, timeout, Notify::Thread(std::thread::current())) {
        Ok(Admitted::Now(permit)) => return Ok(permit),
        Ok(Admitted::Queued(waiter, ticket)) => (waiter, ticket),
        Err(rejection) => {
            owner.core().count_rejection(&rejection, request.tenant.is_some());
            return Err(rejection);
        }
    };
    // Give the waiter back if this thread unwinds while parked (a panicking waker, say).
    struct Guard<'a> {
        owner: &'a dyn Owner,
        waiter: &'a Waiter,
        ticket: &'a Ticket,
        armed: bool,
    }
    impl Drop for Guard<'_> {
        fn drop(&mut self) {
            if self.armed {
                abandon_wait(self.owner, self.waiter, self.ticket);
            }
        }
    }
    let mut guard = Guard { owner: &*owner, waiter: &waiter, ticket: &ticket, armed: true };
    loop {
        let now = owner.now_nanos();
        if let Some(result) = resolve(&owner, &request, &waiter, &ticket, now) {
            guard.armed = false;
            return result;
        }
        if waiter.deadline == u64::MAX {
            std::thread::park();
        } else {
            std::thread::park_timeout(owner.real_time_until(waiter.deadline));
        }
    }
}
