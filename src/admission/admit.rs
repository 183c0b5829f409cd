//! Waiting for admission: the [`Admit`] future and the blocking variant, on any runtime.
//!
//! A request that cannot be admitted at once takes a place in the waiting room (`dispatcher`). Released
//! capacity is handed to waiters there, under the room's lock: the dispatcher reserves the capacity *for*
//! the head waiter, marks it granted and, after releasing the lock, wakes exactly that task or thread
//! (O(1) wake-ups per grant: no thundering herd). The waiter then only has to pick its permit up.

use super::dispatcher::{Abandoned, Notify, Outcome};
use super::owner::{Attempt, Owner, Ticket, WaitSpec};
use super::permit::Permit;
use super::rejection::Rejection;
use super::request::Request;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

enum State {
    /// Not polled yet.
    Start,
    /// Queued; the ticket's rate charges are held until the wait ends.
    Waiting(Ticket),
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
///   and its rate-limit charges — global and its tenant's, exactly what was charged — are refunded;
/// - after capacity was granted to it but before it was polled again: the granted slot and KV
///   reservation (global and its tenant's) are released and handed to the next waiter, and the rate
///   charges are refunded.
///
/// A waiter that leaves no longer counts against `queue_capacity` from that moment: `QueueFull` happens
/// only when its class really holds `queue_capacity` waiters.
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
    /// The admission; moved into the permit when the wait ends granted (`None` after that).
    owner: Option<Arc<dyn Owner>>,
    request: Request,
    state: State,
}

impl Admit {
    pub(crate) fn new(owner: Arc<dyn Owner>, request: Request) -> Self {
        Self { owner: Some(owner), request, state: State::Start }
    }

    /// The request this future admits.
    pub fn request(&self) -> &Request {
        &self.request
    }

    /// Whether the request is queued (polled at least once and not yet resolved).
    pub fn is_queued(&self) -> bool {
        matches!(self.state, State::Waiting(_))
    }

    fn owner(&self) -> &Arc<dyn Owner> {
        self.owner.as_ref().expect("`Admit` polled after it completed")
    }
}

/// Starts a wait: admit at once, queue, or refuse. Registers the deadline with the timer thread.
fn start(owner: &Arc<dyn Owner>, request: &Request, wait: WaitSpec) -> Attempt {
    let attempt = owner.attempt(owner, request, wait);
    if let Attempt::Queued(ticket) = &attempt {
        if ticket.deadline != u64::MAX {
            owner.core().timer.deadline_added(owner, ticket.earliest_deadline);
        }
    }
    attempt
}

/// Turns a resolved wait into its result: a permit (the owner handle moves into it: the waiting side
/// needs it no more), or a rejection, counted, with the ticket's rate charges given back.
fn finish(owner: Arc<dyn Owner>, request: &Request, ticket: Ticket, outcome: Outcome) -> Result<Permit, Rejection> {
    match outcome {
        Outcome::Granted => {
            let now = owner.now_nanos();
            if crate::telemetry::QUEUE_TIMES {
                crate::telemetry::queue_wait(now.saturating_sub(ticket.queued_at));
            }
            Ok(Permit::granted(owner, request, ticket.held, ticket.charges, ticket.tenant, now))
        }
        Outcome::Ended(rejection) => {
            owner.refund(ticket.charges, ticket.tenant.as_deref());
            owner.core().count_rejection(&rejection, request.tenant.is_some());
            Err(rejection)
        }
    }
}

/// Gives back whatever a waiter holds when its owner stops waiting for it. A wait that had ended
/// already (its owner never saw how) is counted here, by its reason, as if its owner had seen it: every
/// ended waiter is counted exactly once, however its future ends.
fn abandon(owner: &dyn Owner, ticket: &Ticket, has_tenant: bool) {
    let core = owner.core();
    let left = core.dispatcher.cancel(core.resources(), ticket.key, ticket.held, ticket.tenant.as_ref());
    owner.refund(ticket.charges, ticket.tenant.as_deref());
    if let Abandoned::Ended(rejection) = left {
        core.count_rejection(&rejection, has_tenant);
    }
}

impl Future for Admit {
    type Output = Result<Permit, Rejection>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match &this.state {
            State::Start => {
                let wait = WaitSpec { notify: Notify::Task(Some(cx.waker().clone())), timeout: None };
                match start(this.owner(), &this.request, wait) {
                    Attempt::Granted(permit) => {
                        this.state = State::Done;
                        this.owner = None;
                        Poll::Ready(Ok(permit))
                    }
                    Attempt::Refused(rejection) => {
                        this.state = State::Done;
                        let owner = this.owner.take().expect("present until completion");
                        owner.core().count_rejection(&rejection, this.request.tenant.is_some());
                        Poll::Ready(Err(rejection))
                    }
                    Attempt::Queued(ticket) => {
                        this.state = State::Waiting(ticket);
                        Poll::Pending
                    }
                }
            }
            State::Done => panic!("`Admit` polled after it completed"),
            State::Waiting(ticket) => {
                let owner = this.owner();
                let core = owner.core();
                // Only a waiter with a deadline needs the time to poll.
                let now = if ticket.deadline == u64::MAX { 0 } else { owner.now_nanos() };
                // The waker is cloned here, outside the waiting room's lock (its clone is user code).
                let waker = if ticket.key.granted() { None } else { Some(cx.waker().clone()) };
                match core.dispatcher.poll(core.resources(), ticket.key, now, waker) {
                    None => Poll::Pending,
                    Some(outcome) => {
                        let State::Waiting(ticket) = std::mem::replace(&mut this.state, State::Done) else {
                            unreachable!("matched above")
                        };
                        let owner = this.owner.take().expect("present until completion");
                        Poll::Ready(finish(owner, &this.request, ticket, outcome))
                    }
                }
            }
        }
    }
}

impl Drop for Admit {
    fn drop(&mut self) {
        if let (State::Waiting(ticket), Some(owner)) = (&self.state, &self.owner) {
            abandon(&**owner, ticket, self.request.tenant.is_some());
        }
    }
}

impl fmt::Debug for Admit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Start => "start",
            State::Waiting(_) => "waiting",
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
    let wait = WaitSpec { notify: Notify::Thread(std::thread::current()), timeout };
    let ticket = match start(&owner, &request, wait) {
        Attempt::Granted(permit) => return Ok(permit),
        Attempt::Queued(ticket) => ticket,
        Attempt::Refused(rejection) => {
            owner.core().count_rejection(&rejection, request.tenant.is_some());
            return Err(rejection);
        }
    };
    // Gives the place back if this thread unwinds while parked.
    struct Guard<'a> {
        owner: &'a dyn Owner,
        ticket: Option<Ticket>,
        has_tenant: bool,
    }
    impl Drop for Guard<'_> {
        fn drop(&mut self) {
            if let Some(ticket) = &self.ticket {
                abandon(self.owner, ticket, self.has_tenant);
            }
        }
    }
    let mut guard = Guard { owner: &*owner, ticket: Some(ticket), has_tenant: request.tenant.is_some() };
    loop {
        let core = owner.core();
        let now = owner.now_nanos();
        let (key, deadline) = guard.ticket.as_ref().map(|t| (t.key, t.deadline)).expect("held until resolved");
        if let Some(outcome) = core.dispatcher.poll(core.resources(), key, now, None) {
            let ticket = guard.ticket.take().expect("held until resolved");
            drop(guard);
            return finish(owner, &request, ticket, outcome);
        }
        if deadline == u64::MAX {
            std::thread::park();
        } else {
            std::thread::park_timeout(owner.real_time_until(deadline));
        }
    }
}
