//! The waiting room: every waiting request of one admission, and the passes that grant them.
//!
//! All waiting state sits behind one mutex (the *dispatcher role* is holding it). Every operation —
//! enqueue, poll, cancel, a pass after a release, close, resize, expiry — takes the lock, changes the
//! state, moves the wake-ups it owes into a [`WakeList`], releases the lock and only then wakes (see
//! `wake_list.rs`). Taking and returning capacity stays lock-free: only a release that finds a
//! `HELD_BACK` bit set (see `capacity.rs`) comes here.
//!
//! # Invariants (under the lock)
//! 1. Class `c`'s global `HELD_BACK` bit is set whenever its ring has a flow; it is set before the pass
//!    tries to take capacity for that flow's head, and cleared only when the ring is empty.
//! 2. A flow is parked exactly when its tenant's `HELD_BACK` bit for its class is set; parking sets the
//!    bit and then takes another look at the tenant's capacity (a release in between would have missed
//!    the bit).
//! 3. `queued[c]` equals the number of waiters of class `c` in state `Waiting`, so `QueueFull` happens
//!    exactly when `queued[c] == queue_capacity`.
//! 4. Once `closed` is set, no waiter is granted: `close()` sets it and the global `CLOSED` bit under
//!    the lock, and every grant is made under the lock by a take that fails on `CLOSED`.
//! 5. A waiter in state `Waiting` needs no more than the KV budget and its tenant's share of it: a resize
//!    resolves the ones that no longer fit as `TooLarge`, and an enqueue checks under the lock.
//!
//! # Work per operation
//! A pass costs O(1) per grant, per flow it parks and per class it visits; it grants only while capacity
//! lasts, so the thread that returned capacity does work proportional to the waiters that capacity
//! admits, waking them 32 at a time outside the lock. A resize or close visits every waiter once.

use super::fair::FairQueue;
use super::timer::Deadlines;
use super::waiter::{Notify, Slab, WaitState, Waiter, WaiterKey};
use super::wake_list::WakeList;
use crate::Priority;
use crate::admission::capacity::{Capacity, Credit, Limit as KvLimit, Shortage};
use crate::admission::fairness::ServiceLevels;
use crate::admission::prefix::{PrefixId, PrefixTable, Sharing, Split};
use crate::admission::stats::{Load, Stats, capacity_hint};
use crate::admission::tenant::{FlowKey, TenantHandle};
use crate::admission::wait_policy::Delay;
use crate::admission::{Limit, Rejection};
use crate::sync::{self, AtomicU64, AtomicUsize, Mutex, MutexGuard, Ordering};
use std::sync::Arc;
use std::task::Waker;

/// How often expiry looks again at waiters with a start deadline while any waits: the predicted start of
/// a waiter moves past its deadline as time goes by without a release, long before the deadline itself
/// is due, and the timer thread sleeps until the next *due* deadline otherwise. The overload lab's gate
/// runs `expire_waiters` at the same interval.
pub(crate) const START_DEADLINE_RECHECK: std::time::Duration = std::time::Duration::from_millis(100);

/// How many older waiters of its flow a standing queue tries when its newest does not fit (controlled
/// delay's first fit: bounded work per pass).
const FIRST_FIT_LOOKS: usize = 8;

/// An admission's clock reading, without the clock's type.
pub(crate) struct ClockFn(pub(crate) Box<dyn Fn() -> u64 + Send + Sync>);

impl std::fmt::Debug for ClockFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClockFn")
    }
}

/// What the waiting room needs from the admission around it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Resources<'a> {
    pub(crate) capacity: &'a Capacity,
    pub(crate) kv_limit: &'a KvLimit,
    pub(crate) stats: &'a Stats,
    /// Each class's service level from grants that never waited (token fairness).
    pub(crate) levels: &'a ServiceLevels,
    /// The admission's clock (read outside the room's lock: a clock may be user code).
    pub(crate) now: &'a ClockFn,
}

/// How a wait stood when its owner gave it up ([`Dispatcher::cancel`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Abandoned {
    /// It was still waiting: its place is given up.
    Waiting,
    /// It had been granted and never collected: the grant goes to the next waiters.
    Granted,
    /// Its wait had ended already (timed out, closed, displaced, too large), unseen by its owner.
    Ended(Rejection),
}

/// A request about to wait.
#[derive(Debug)]
pub(crate) struct NewWaiter {
    pub(crate) class: usize,
    /// KV units it reserves (its whole cost; with a shared prefix, see `split`).
    pub(crate) kv: u64,
    /// Its cost around a shared prefix, when prefix sharing is on and it named one.
    pub(crate) split: Option<Split>,
    /// Its weighted token cost for token fairness (0 with request fairness).
    pub(crate) cost: u64,
    /// Its deadline is a start deadline (`Request::ttft_deadline`): it may leave early once it cannot
    /// start in time.
    pub(crate) start_deadline: bool,
    pub(crate) deadline: u64,
    pub(crate) tenant: Option<Arc<dyn TenantHandle>>,
    pub(crate) notify: Notify,
}

/// How an enqueue went.
#[derive(Debug)]
pub(crate) enum Enqueued {
    /// Queued; its owner polls with this key. `earliest_deadline` says the deadline it registered is
    /// now the earliest (the caller wakes the timer thread). `deadline` is the one it waits with: its own,
    /// or shorter when its class's queue stands (controlled delay).
    Waiting { key: WaiterKey, deadline_added: Option<bool>, held: Held, deadline: u64 },
    /// Granted by the enqueue's own pass: capacity is reserved, the entry is gone.
    Granted(Held),
}

/// What a granted request holds itself: its own KV units, and the shared prefix it holds a share of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) kv: u64,
    pub(crate) prefix: Option<PrefixId>,
    /// KV units it did not have to take because its prefix was held already (counted once it is granted).
    pub(crate) saved: u64,
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Granted,
    Ended(Rejection),
}

#[derive(Debug)]
struct Room {
    /// Since when each class's queue has held a waiter (controlled delay: it stands after `interval`);
    /// `None` while it is empty.
    nonempty_since: [Option<u64>; Priority::COUNT],
    waiters: Slab,
    prefixes: PrefixTable,
    classes: [FairQueue; Priority::COUNT],
    /// Mirror of the global capacity's `HELD_BACK` bits (written only under this lock), so that the hot
    /// capacity word is written only when a bit really changes.
    held_back: [bool; Priority::COUNT],
    deadlines: Deadlines,
    /// Waiters with a start deadline (the early-leave scan runs only when there are some).
    start_deadlines: usize,
    closed: bool,
}

/// The waiting room of one admission.
#[derive(Debug)]
pub(crate) struct Dispatcher {
    room: Mutex<Room>,
    /// `queued[c]` mirrored for lock-free reads (snapshots, hints).
    queued: [AtomicUsize; Priority::COUNT],
    /// KV units the waiters of each class need (for start predictions).
    queued_kv: [AtomicU64; Priority::COUNT],
    /// Waiters with a deadline (written under the lock): a pass needs the time only when there are some.
    timed: AtomicUsize,
    queue_capacity: usize,
    /// Controlled delay's parameters (`None`: FIFO with the full wait).
    delay: Option<Delay>,
    /// `Room::nonempty_since` mirrored for lock-free reads (`u64::MAX`: empty), written under the lock.
    since: [AtomicU64; Priority::COUNT],
}

impl Dispatcher {
    pub(crate) fn new(queue_capacity: usize, max_prefixes: usize, token_fairness: bool, delay: Option<Delay>) -> Self {
        Self {
            room: Mutex::new(Room {
                waiters: Slab::default(),
                prefixes: PrefixTable::new(max_prefixes),
                classes: std::array::from_fn(|_| FairQueue::new(token_fairness)),
                held_back: [false; Priority::COUNT],
                deadlines: Deadlines::default(),
                start_deadlines: 0,
                nonempty_since: [None; Priority::COUNT],
                closed: false,
            }),
            queued: std::array::from_fn(|_| AtomicUsize::new(0)),
            queued_kv: std::array::from_fn(|_| AtomicU64::new(0)),
            timed: AtomicUsize::new(0),
            queue_capacity,
            delay,
            since: std::array::from_fn(|_| AtomicU64::new(u64::MAX)),
        }
    }

    /// Whether class `class`'s queue stands at `now` (controlled delay; never in FIFO mode). Lock-free: a
    /// start prediction reads it to know which waiters a new request would queue behind.
    pub(crate) fn stands(&self, class: usize, now: u64) -> bool {
        let since = self.since[class].load(Ordering::Relaxed);
        self.delay.is_some_and(|delay| delay.stands((since != u64::MAX).then_some(since), now))
    }

    /// Whether the policy is controlled delay (a start prediction reads the clock only then).
    pub(crate) fn controlled_delay(&self) -> bool {
        self.delay.is_some()
    }

    pub(crate) fn queue_capacity(&self) -> usize {
        self.queue_capacity
    }

    /// Waiters of one class.
    pub(crate) fn queued_in(&self, class: usize) -> usize {
        self.queued[class].load(Ordering::Relaxed)
    }

    /// Waiters of `class` and every higher class: those a new request of `class` queues behind.
    pub(crate) fn queued_at_or_above(&self, class: usize) -> usize {
        (class..Priority::COUNT).map(|c| self.queued_in(c)).sum()
    }

    /// KV units the waiters of `class` and every higher class need.
    pub(crate) fn queued_kv_at_or_above(&self, class: usize) -> u64 {
        (class..Priority::COUNT).map(|c| self.queued_kv[c].load(Ordering::Relaxed)).sum()
    }

    /// Waiters of every class.
    pub(crate) fn queued(&self) -> usize {
        self.queued_at_or_above(0)
    }

    /// Queues a waiter, then runs a pass when one could grant something now (it may be granted at once;
    /// see the comment before the pass for when none is owed).
    ///
    /// # Errors
    /// `Closed`, `QueueFull` (its class holds `queue_capacity` waiters) or `TooLarge` (the budget shrank
    /// below it since it was validated). Nothing was queued.
    pub(crate) fn enqueue(&self, res: Resources<'_>, new: NewWaiter) -> Result<Enqueued, Rejection> {
        let class = new.class;
        let mut wakes = WakeList::new();
        let now = self.pass_time(res);
        let mut room = sync::lock(&self.room);
        if room.closed {
            return Err(Rejection::Closed);
        }
        let flow_key = new.tenant.as_ref().map_or(FlowKey::Anonymous, |t| t.core().flow);
        fits(res, new.kv, new.split.map_or(new.kv, |s| s.alone), new.tenant.as_deref())?;
        let mut displaced = false;
        let standing = self.delay.is_some_and(|delay| delay.stands(room.nonempty_since[class], now));
        // Controlled delay, a standing queue that is full: the newcomer queues, a pass runs (it serves the
        // newest first, perhaps the newcomer itself), and only if the class is still over its bound does the
        // oldest waiter of the longest flows give its place (below).
        let overfull = standing && self.queue_capacity > 0 && self.queued_in(class) >= self.queue_capacity;
        if self.queued_in(class) >= self.queue_capacity && !overfull {
            let hint = capacity_hint(res.stats.hold.mean(), res.capacity.slots_used(), self.queued_in(class));
            // Longest queue drop: the newest waiter of the flow with the most waiters gives its place to a
            // request of a flow with at least two fewer, so that no tenant can hold every place.
            let own = room.classes[class].len_of(flow_key);
            match room.classes[class].longest() {
                Some((longest, newest)) if longest > own + 1 => {
                    if let Some(wake) = room.leave(res, self, newest, WaitState::Displaced { retry_after: hint }) {
                        wakes.push(wake);
                    }
                    displaced = true;
                }
                _ => return Err(Rejection::QueueFull { retry_after: hint }),
            }
        }
        let held = match new.split.map(|split| (room.prefixes.wait(&split), split)) {
            Some((Sharing::Shared(id), split)) => Held { kv: split.suffix, prefix: Some(id), saved: 0 },
            Some((Sharing::Alone, split)) => Held { kv: split.alone, prefix: None, saved: 0 },
            None => Held { kv: new.kv, prefix: None, saved: 0 },
        };
        // Controlled delay: a class whose queue stands gives a new arrival `target` of waiting at most.
        let (deadline, policy_deadline) = match self.delay {
            Some(delay) if delay.stands(room.nonempty_since[class], now) => {
                let target = now.saturating_add(delay.target);
                (new.deadline.min(target), target < new.deadline)
            }
            _ => (new.deadline, false),
        };
        let mut waiter = Waiter::new(class, held.kv, deadline, new.notify);
        waiter.queued_at = now;
        waiter.policy_deadline = policy_deadline;
        waiter.prefix = held.prefix;
        waiter.saving = new.split.filter(|_| held.prefix.is_some()).map_or(0, |s| s.saving());
        waiter.cost = new.cost;
        waiter.start_deadline = new.start_deadline;
        room.start_deadlines += usize::from(new.start_deadline);
        let key = room.waiters.insert(waiter);
        let Room { waiters, classes, .. } = &mut *room;
        let entered = classes[class].push(waiters, key.index(), flow_key, new.tenant.as_ref(), res.levels.get(class));
        if entered {
            // Invariant 1: the bit before any attempt to grant.
            room.hold_back(res, class);
        }
        self.count(class, new.tenant.as_deref(), 1, held.kv, deadline);
        // The server's queue is non-empty from now on only if some flow is eligible: a waiter that joined a
        // parked flow waits for its tenant, not for the server.
        if room.nonempty_since[class].is_none() && !room.classes[class].ring_is_empty() {
            room.set_since(self, class, Some(now));
        }
        let deadline_added = (deadline != u64::MAX).then(|| room.deadlines.push(deadline, key));
        if deadline_added.is_some() {
            let Room { waiters, deadlines, .. } = &mut *room;
            deadlines.compact_if_grown(|k| waiters.lookup(k).is_some_and(|w| w.state == WaitState::Waiting));
        }
        // A waiter that joined a flow already queued is behind that flow's older waiters, and capacity
        // returned since the last pass found the class held back (or, for a parked flow, its tenant) and
        // dispatches once this lock is free: no pass is owed unless this enqueue changed what one would
        // look at (a new flow, a displaced waiter, a prefix) or some waiter has a deadline (a pass ends
        // the heads whose deadline passed).
        if entered || displaced || overfull || new.split.is_some() || self.timed.load(Ordering::Relaxed) != 0 {
            room = self.run_passes(res, room, &mut wakes, now);
        }
        if overfull && self.queued_in(class) > self.queue_capacity {
            // The oldest waiter of the longest flows (by age, not by tenant id) — the one least likely to be
            // served in time — gives its place; it is told when a slot is expected.
            if let Some((_, victim)) = room.classes[class].longest_oldest_eligible(&room.waiters) {
                let retry_after = room.shed_hint(res);
                res.stats.count_shed(1);
                if let Some(wake) = room.leave(res, self, victim, WaitState::Shed { retry_after }) {
                    wakes.push(wake);
                }
            }
        }
        let granted = key.granted();
        drop(room);
        self.wake(res, &mut wakes);
        Ok(if granted { Enqueued::Granted(held) } else { Enqueued::Waiting { key, deadline_added, held, deadline } })
    }

    /// Looks at a waiter for its owner: `None` while it waits (after registering `waker`), or how its
    /// wait ended (its entry is then gone). A waiter whose deadline is at or before `now` ends `TimedOut`.
    pub(crate) fn poll(&self, res: Resources<'_>, key: WaiterKey, now: u64, waker: Option<Waker>) -> Option<Outcome> {
        if key.granted() {
            return Some(Outcome::Granted);
        }
        let mut wakes = WakeList::new();
        // User values (wakers) that leave the room are dropped after the lock is released.
        let mut outside = Outside::default();
        let mut room = sync::lock(&self.room);
        let outcome = if key.granted() {
            Outcome::Granted
        } else {
            let waiter = room.waiters.get_mut(key.index());
            match waiter.state {
                WaitState::Waiting if now < waiter.deadline => {
                    if let Some(waker) = waker {
                        outside.waker = waiter.notify.update(waker);
                    }
                    drop(room);
                    outside.drop_all(res);
                    return None;
                }
                WaitState::Waiting => {
                    let ended = room.past_deadline(res, key.index());
                    outside.wake = room.leave(res, self, key.index(), ended);
                    // It may have been the head holding others back.
                    room = self.run_passes(res, room, &mut wakes, now);
                    outside.waiter = Some(room.waiters.remove(key.index()));
                    outcome_of(ended)
                }
                state => {
                    let outcome = outcome_of(state);
                    outside.waiter = Some(room.waiters.remove(key.index()));
                    outcome
                }
            }
        };
        drop(room);
        outside.waker = waker;
        self.wake(res, &mut wakes);
        outside.drop_all(res);
        Some(outcome)
    }

    /// The owner stopped waiting (its future was dropped, its thread unwound): removes the entry and
    /// gives back a grant it never collected. Returns how the wait stood when it was given up (the caller
    /// refunds its rate charges either way, and counts a wait that had ended already).
    pub(crate) fn cancel(
        &self,
        res: Resources<'_>,
        key: WaiterKey,
        held: Held,
        tenant: Option<&Arc<dyn TenantHandle>>,
    ) -> Abandoned {
        let mut wakes = WakeList::new();
        let mut outside = Outside::default();
        let now = self.pass_time(res);
        let mut room = sync::lock(&self.room);
        let granted = key.granted();
        let mut credit = Credit::default();
        if granted {
            // Granted but never collected: the reservation (and its share of a prefix, if it was the last
            // holder) is handed to the next waiters.
            let prefix = held.prefix.map_or(0, |id| room.prefixes.release(id));
            credit = Credit { slots: 1, kv: held.kv + prefix };
            let kv = held.kv;
            if let Some(tenant) = tenant {
                let core = tenant.core();
                if core.capacity.release(core.kv_units(kv)) {
                    room.unpark(res, tenant.as_ref());
                }
            }
        } else {
            let state = room.waiters.get(key.index()).state;
            let waiting = state == WaitState::Waiting;
            if waiting {
                // Its own wake-up is not run (its owner is the one leaving), only dropped, outside.
                outside.wake = room.leave(res, self, key.index(), WaitState::Closed);
            }
            outside.waiter = Some(room.waiters.remove(key.index()));
            if !waiting {
                drop(room);
                outside.drop_all(res);
                let Outcome::Ended(rejection) = outcome_of(state) else { unreachable!("an ended state") };
                return Abandoned::Ended(rejection);
            }
        }
        room = self.run_passes_with(res, room, &mut wakes, credit, now);
        drop(room);
        self.wake(res, &mut wakes);
        outside.drop_all(res);
        if granted { Abandoned::Granted } else { Abandoned::Waiting }
    }

    /// Takes capacity for a new request of `class` whose cost is split around a shared prefix: its suffix,
    /// plus the prefix when nobody holds it (or its whole cost when the table is full). Under the lock,
    /// where the prefix table lives.
    pub(crate) fn take_shared(&self, res: Resources<'_>, split: &Split, class: usize) -> Result<Held, Shortage> {
        let mut wakes = WakeList::new();
        let now = self.pass_time(res);
        let mut room = sync::lock(&self.room);
        let (need, sharing) = room.prefixes.need(split);
        let taken = res.capacity.try_take(need, res.kv_limit.get(), class);
        let result = match taken {
            Ok(()) => Ok(match sharing {
                Sharing::Shared(id) => {
                    let saved = room.prefixes.hold(split);
                    Held { kv: split.suffix, prefix: Some(id), saved }
                }
                Sharing::Alone => Held { kv: split.alone, prefix: None, saved: 0 },
            }),
            Err(refused) => {
                if refused.dispatch {
                    room = self.run_passes(res, room, &mut wakes, now);
                }
                Err(refused.shortage)
            }
        };
        drop(room);
        self.wake(res, &mut wakes);
        result
    }

    /// Returns what a request holding a share of `prefix` holds (one slot, `kv` own units, and the prefix's
    /// units if it was the last holder), handing it to waiters; `unpark` is its tenant when that tenant had
    /// parked waiters.
    pub(crate) fn release_shared(
        &self,
        res: Resources<'_>,
        kv: u64,
        prefix: PrefixId,
        unpark: Option<&dyn TenantHandle>,
    ) {
        let mut wakes = WakeList::new();
        let now = self.pass_time(res);
        let mut room = sync::lock(&self.room);
        if let Some(tenant) = unpark {
            room.unpark(res, tenant);
        }
        let units = room.prefixes.release(prefix);
        room = self.run_passes_with(res, room, &mut wakes, Credit { slots: 1, kv: kv + units }, now);
        drop(room);
        self.wake(res, &mut wakes);
    }

    /// The KV units a new request split around a shared prefix would take now: its suffix while the
    /// prefix is resident, else its whole cost (what [`take_shared`](Self::take_shared) would take).
    pub(crate) fn shared_need(&self, split: &Split) -> u64 {
        sync::lock(&self.room).prefixes.need(split).0
    }

    /// The waiting room's lock, held by the caller (`Admission::__hold_waiting_room`, for tests).
    #[cfg(not(loom))]
    pub(crate) fn hold_room(&self) -> impl Sized + '_ {
        sync::lock(&self.room)
    }

    /// Prefixes tracked now.
    pub(crate) fn prefixes(&self) -> usize {
        sync::lock(&self.room).prefixes.len()
    }

    /// Runs a pass after capacity was returned and a `HELD_BACK` bit was seen; `unpark` is a tenant that
    /// returned room while some of its waiters were parked; `credit` is capacity a permit hands over to
    /// waiters directly (the rest goes back to the capacity words).
    pub(crate) fn dispatch(&self, res: Resources<'_>, unpark: Option<&dyn TenantHandle>, credit: Credit) {
        let mut wakes = WakeList::new();
        let now = self.pass_time(res);
        let mut room = sync::lock(&self.room);
        if let Some(tenant) = unpark {
            room.unpark(res, tenant);
        }
        room = self.run_passes_with(res, room, &mut wakes, credit, now);
        drop(room);
        self.wake(res, &mut wakes);
    }

    /// Closes the room: every waiter ends `Closed`, nothing is granted from now on (invariant 4).
    pub(crate) fn close(&self, res: Resources<'_>) {
        let mut wakes = WakeList::new();
        let mut room = sync::lock(&self.room);
        room.closed = true;
        res.capacity.close();
        let keys = room.waiters.waiting_keys();
        for key in keys {
            if wakes.is_full() {
                drop(room);
                self.wake(res, &mut wakes);
                room = sync::lock(&self.room);
            }
            if room.waiters.lookup(key).is_some_and(|w| w.state == WaitState::Waiting) {
                if let Some(wake) = room.leave(res, self, key.index(), WaitState::Closed) {
                    wakes.push(wake);
                }
            }
        }
        for class in 0..Priority::COUNT {
            room.clear_held_back(res, self, class);
        }
        drop(room);
        self.wake(res, &mut wakes);
    }

    /// After the KV budget changed: waiters that no longer fit it (or their tenant's share of it) end
    /// `TooLarge` (invariant 5), parked flows go back into their rings (their tenants' shares changed
    /// with the budget), then a pass grants what fits now (and parks again what still does not).
    pub(crate) fn resized(&self, res: Resources<'_>) {
        let mut wakes = WakeList::new();
        let now = self.pass_time(res);
        let mut room = sync::lock(&self.room);
        for key in room.waiters.waiting_keys() {
            if wakes.is_full() {
                drop(room);
                self.wake(res, &mut wakes);
                room = sync::lock(&self.room);
            }
            let Some(waiter) = room.waiters.lookup(key) else { continue };
            if waiter.state != WaitState::Waiting {
                continue;
            }
            let (class, flow) = (waiter.class, waiter.flow);
            let kv = waiter.kv + waiter.prefix.map_or(0, |id| room.prefixes.units(id));
            let tenant = room.classes[class].tenant(flow).cloned();
            if let Err(Rejection::TooLarge { limit, requested, capacity }) = fits(res, kv, waiter.kv, tenant.as_deref())
            {
                if let Some(wake) =
                    room.leave(res, self, key.index(), WaitState::TooLarge { limit, requested, capacity })
                {
                    wakes.push(wake);
                }
            }
        }
        // Tenant shares follow the budget: flows parked on a share look again.
        room.unpark_all(res);
        room = self.run_passes(res, room, &mut wakes, now);
        drop(room);
        self.wake(res, &mut wakes);
    }

    /// Ends every wait whose deadline is at or before `now`, then runs a pass. Returns how many ended and
    /// the next pending deadline.
    pub(crate) fn expire(&self, res: Resources<'_>, now: u64) -> (usize, Option<u64>) {
        let mut wakes = WakeList::new();
        let mut room = sync::lock(&self.room);
        let mut ended = 0;
        while let Some(key) = room.deadlines.pop_expired(now) {
            if wakes.is_full() {
                drop(room);
                self.wake(res, &mut wakes);
                room = sync::lock(&self.room);
            }
            if room.waiters.lookup(key).is_some_and(|w| w.state == WaitState::Waiting) {
                let to = room.past_deadline(res, key.index());
                if let Some(wake) = room.leave(res, self, key.index(), to) {
                    wakes.push(wake);
                }
                ended += 1;
            }
        }
        // Waiters with a start deadline that can no longer be met leave now rather than at it: not even
        // with nobody ahead would capacity for them come free in time.
        let load = res.load(0, 0);
        let keys = if room.start_deadlines == 0 { Vec::new() } else { room.waiters.waiting_keys() };
        for key in keys {
            // Still waiting: a batch's wake-ups run without the lock, and another thread (close, a resize,
            // another expiry) may have ended the waiters after this one meanwhile.
            let Some(waiter) = room.waiters.lookup(key).filter(|w| w.state == WaitState::Waiting) else { continue };
            // Its own units, plus the prefix's when nobody holds the prefix now (what a pass would take).
            let need = waiter.prefix.map_or(waiter.kv, |id| room.prefixes.waiter_need(id, waiter.kv));
            if !waiter.start_deadline
                || now.saturating_add(duration_nanos(load.predicted_wait(need))) <= waiter.deadline
            {
                continue;
            }
            if wakes.is_full() {
                drop(room);
                self.wake(res, &mut wakes);
                room = sync::lock(&self.room);
                if room.waiters.lookup(key).is_none_or(|w| w.state != WaitState::Waiting) {
                    continue;
                }
            }
            if let Some(wake) = room.leave(res, self, key.index(), WaitState::TimedOut) {
                wakes.push(wake);
            }
            res.stats.count_shed(1);
            ended += 1;
        }
        // Controlled delay: a standing class's waiters that have waited `target` leave.
        let standing =
            self.delay.filter(|delay| (0..Priority::COUNT).any(|c| delay.stands(room.nonempty_since[c], now)));
        if standing.is_some() {
            for class in 0..Priority::COUNT {
                while room.shed_over_age(res, self, class, &mut wakes, now, &mut ended) {
                    drop(room);
                    self.wake(res, &mut wakes);
                    room = sync::lock(&self.room);
                }
            }
        }
        if ended != 0 {
            room = self.run_passes(res, room, &mut wakes, now);
        }
        let mut next = room.deadlines.next();
        if let Some(delay) = standing {
            // Over-age waiters of a standing queue leave within `target` of their age passing it.
            let recheck = now.saturating_add(delay.target / 2);
            next = Some(next.map_or(recheck, |due| due.min(recheck)));
        }
        if room.start_deadlines != 0 {
            // A start deadline can become unreachable before it is due: look again soon.
            let recheck = now.saturating_add(duration_nanos(START_DEADLINE_RECHECK));
            next = Some(next.map_or(recheck, |due| due.min(recheck)));
        }
        drop(room);
        self.wake(res, &mut wakes);
        (ended, next)
    }

    /// The time a pass runs at: the clock, read before the lock is taken, when some waiter has a deadline
    /// or the policy is controlled delay (0 otherwise, which ends nobody and finds no queue standing). A
    /// waiter queued after the reading is not ended by that pass, as if the pass had run before it queued.
    fn pass_time(&self, res: Resources<'_>) -> u64 {
        if self.timed.load(Ordering::Relaxed) == 0 && self.delay.is_none() { 0 } else { (res.now.0)() }
    }

    /// Runs passes at `now` until one completes, releasing the lock to wake each full batch.
    fn run_passes<'a>(
        &'a self,
        res: Resources<'_>,
        room: MutexGuard<'a, Room>,
        wakes: &mut WakeList,
        now: u64,
    ) -> MutexGuard<'a, Room> {
        self.run_passes_with(res, room, wakes, Credit::default(), now)
    }

    /// Runs passes at `now` handing `credit` over first; what is left of it is returned to the capacity
    /// words before the lock is released.
    fn run_passes_with<'a>(
        &'a self,
        res: Resources<'_>,
        mut room: MutexGuard<'a, Room>,
        wakes: &mut WakeList,
        mut credit: Credit,
        now: u64,
    ) -> MutexGuard<'a, Room> {
        loop {
            let more = room.pass(res, self, wakes, &mut credit, now);
            // The pass looked at every head it could with the credit counted as free, so returning the
            // rest cannot make a head fit that did not.
            let _ = res.capacity.return_credit(std::mem::take(&mut credit));
            if !more {
                return room;
            }
            drop(room);
            self.wake(res, wakes);
            room = sync::lock(&self.room);
        }
    }

    /// Runs collected wake-ups (no lock held), counting panicking wakers.
    fn wake(&self, res: Resources<'_>, wakes: &mut WakeList) {
        if !wakes.is_empty() {
            for _ in 0..wakes.wake_all() {
                res.stats.count_waker_panic();
            }
        }
    }

    /// Counts a waiter of `class` needing `kv` units, with `deadline`, in or out (under the lock).
    ///
    /// The mirrors are written only here, under the lock, so a load and a store update them (no
    /// read-modify-write); readers without the lock see each value whole.
    fn count(&self, class: usize, tenant: Option<&dyn TenantHandle>, delta: i64, kv: u64, deadline: u64) {
        fn add(counter: &AtomicUsize, delta: i64) {
            let n = counter.load(Ordering::Relaxed);
            counter.store(if delta > 0 { n + 1 } else { n - 1 }, Ordering::Relaxed);
        }
        add(&self.queued[class], delta);
        let units = self.queued_kv[class].load(Ordering::Relaxed);
        self.queued_kv[class].store(if delta > 0 { units + kv } else { units - kv }, Ordering::Relaxed);
        if deadline != u64::MAX {
            add(&self.timed, delta);
        }
        if let Some(tenant) = tenant {
            tenant.core().add_queued(delta);
        }
    }
}

/// User values taken out of the room under its lock — a waiter's waker, its wake-up, a replaced waker —
/// dropped after the lock is released, each drop panic-contained (a waker's drop is user code).
#[derive(Default)]
struct Outside {
    waiter: Option<Waiter>,
    wake: Option<super::waiter::Wake>,
    waker: Option<Waker>,
}

impl Outside {
    fn drop_all(&mut self, res: Resources<'_>) {
        let (waiter, wake, waker) = (self.waiter.take(), self.wake.take(), self.waker.take());
        for panicked in [drop_contained(waiter), drop_contained(wake), drop_contained(waker)] {
            if panicked {
                res.stats.count_waker_panic();
            }
        }
    }
}

/// Drops `value`; true if its drop panicked (the panic is contained).
fn drop_contained<T>(value: T) -> bool {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(value))).is_err()
}

fn duration_nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Resources<'_> {
    /// The load a start prediction reads, with `ahead` waiters needing `ahead_kv` units before it.
    pub(crate) fn load(&self, ahead: u64, ahead_kv: u64) -> Load {
        Load {
            mean_hold: self.stats.hold.mean(),
            slots_used: self.capacity.slots_used(),
            slot_limit: self.capacity.slot_limit(),
            kv_used: self.capacity.kv_used(),
            kv_limit: self.kv_limit.get(),
            ahead,
            ahead_kv,
        }
    }
}

/// Whether a waiter needing `kv` units of the KV budget fits it, and `own` units (what its tenant is
/// charged: its units beyond a shared prefix) fit its tenant's share of it.
fn fits(res: Resources<'_>, kv: u64, own: u64, tenant: Option<&dyn TenantHandle>) -> Result<(), Rejection> {
    let budget = res.kv_limit.get();
    if kv > budget {
        return Err(Rejection::TooLarge { limit: Limit::KvBudget, requested: kv, capacity: budget });
    }
    tenant.map_or(Ok(()), |t| t.core().fits_share(own, budget))
}

/// The rejection an ended state stands for.
fn outcome_of(state: WaitState) -> Outcome {
    match state {
        WaitState::TimedOut | WaitState::Waiting => Outcome::Ended(Rejection::TimedOut),
        WaitState::Closed => Outcome::Ended(Rejection::Closed),
        WaitState::TooLarge { limit, requested, capacity } => {
            Outcome::Ended(Rejection::TooLarge { limit, requested, capacity })
        }
        WaitState::Displaced { retry_after } => Outcome::Ended(Rejection::QueueFull { retry_after }),
        WaitState::Shed { retry_after } => Outcome::Ended(Rejection::NoCapacity { retry_after }),
    }
}

impl Room {
    /// Sets since when class `class`'s queue has held a waiter (`None`: it drained), and its mirror.
    fn set_since(&mut self, d: &Dispatcher, class: usize, since: Option<u64>) {
        self.nonempty_since[class] = since;
        d.since[class].store(since.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Sets class `class`'s global `HELD_BACK` bit (if not set already).
    fn hold_back(&mut self, res: Resources<'_>, class: usize) {
        if !self.held_back[class] {
            self.held_back[class] = true;
            res.capacity.hold_back(class);
        }
    }

    /// Clears class `class`'s global `HELD_BACK` bit (if set). No flow is eligible: whatever still waits is
    /// held back by its own tenant, so the server's queue has drained (controlled delay starts again).
    fn clear_held_back(&mut self, res: Resources<'_>, d: &Dispatcher, class: usize) {
        self.set_since(d, class, None);
        if self.held_back[class] {
            self.held_back[class] = false;
            res.capacity.clear_held_back(class);
        }
    }

    /// Moves a `Waiting` waiter to an ended state `to`: unlinks it from its flow and uncounts it.
    /// Returns its wake-up (for waiters that others end: close, resize, expiry).
    fn leave(&mut self, res: Resources<'_>, d: &Dispatcher, index: u32, to: WaitState) -> Option<super::waiter::Wake> {
        let (class, flow) = {
            let w = self.waiters.get(index);
            debug_assert_eq!(w.state, WaitState::Waiting);
            (w.class, w.flow)
        };
        if let Some(id) = self.waiters.get(index).prefix {
            self.prefixes.stop_waiting(id, false);
        }
        let tenant = self.classes[class].tenant(flow).cloned();
        let left = self.classes[class].remove(&mut self.waiters, index);
        if left.emptied && left.was_parked {
            if let Some(tenant) = &tenant {
                tenant.core().capacity.clear_held_back(class);
                // The tenant's lower-class flows may have been parked behind this one: they look again
                // in the pass that follows every leave.
                self.unpark(res, tenant.as_ref());
            }
        }
        let (kv, deadline) = (self.waiters.get(index).kv, self.waiters.get(index).deadline);
        d.count(class, tenant.as_deref(), -1, kv, deadline);
        if d.queued_in(class) == 0 {
            self.set_since(d, class, None);
        }
        self.start_deadlines -= usize::from(self.waiters.get(index).start_deadline);
        if self.classes[class].ring_is_empty() {
            self.clear_held_back(res, d, class);
        }
        let waiter = self.waiters.get_mut(index);
        waiter.state = to;
        waiter.notify.take()
    }

    /// A tenant returned room: its parked flows go back into their rings.
    fn unpark(&mut self, res: Resources<'_>, tenant: &dyn TenantHandle) {
        let core = tenant.core();
        for class in 0..Priority::COUNT {
            if !core.capacity.is_held_back(class) {
                continue;
            }
            if let Some(flow) = self.classes[class].find(core.flow) {
                // Invariant 1: the class bit before the flow is eligible.
                self.hold_back(res, class);
                self.classes[class].unpark(flow, res.levels.get(class));
            }
            core.capacity.clear_held_back(class);
        }
    }

    /// Every parked flow goes back into its ring (the limits they were parked on changed).
    fn unpark_all(&mut self, res: Resources<'_>) {
        for class in 0..Priority::COUNT {
            for flow in self.classes[class].parked_flows() {
                // Invariant 1: the class bit before the flow is eligible.
                self.hold_back(res, class);
                self.classes[class].unpark(flow, res.levels.get(class));
                if let Some(tenant) = self.classes[class].tenant(flow) {
                    tenant.core().capacity.clear_held_back(class);
                }
            }
        }
    }

    /// How a `Waiting` waiter whose deadline passed ends: `TimedOut`, or shed (counted) when the deadline was
    /// controlled delay's `target`.
    fn past_deadline(&self, res: Resources<'_>, index: u32) -> WaitState {
        let waiter = self.waiters.get(index);
        if !waiter.policy_deadline {
            return WaitState::TimedOut;
        }
        res.stats.count_shed(1);
        WaitState::Shed { retry_after: self.shed_hint(res) }
    }

    /// The `Retry-After` of a waiter shed by controlled delay: the time to the next release. A standing
    /// queue serves the newest first, so a request that comes back then is served before the older
    /// waiters: none is ahead of it.
    fn shed_hint(&self, res: Resources<'_>) -> std::time::Duration {
        capacity_hint(res.stats.hold.mean(), res.capacity.slots_used(), 0)
    }

    /// Controlled delay, a standing queue whose chosen waiter `index` (of a flow without a tenant) does not
    /// fit the global capacity: the next older waiters of its flow, at most [`FIRST_FIT_LOOKS`] of them,
    /// are tried in turn; the first that fits has its capacity taken and is returned. Waiters past their
    /// deadline are skipped (a later pass ends them).
    fn first_fit(&self, res: Resources<'_>, index: u32, budget: u64, credit: &mut Credit, now: u64) -> Option<u32> {
        let mut candidate = self.waiters.get(index).prev;
        for _ in 0..FIRST_FIT_LOOKS {
            let c = candidate?;
            let w = self.waiters.get(c);
            candidate = w.prev;
            if w.deadline != u64::MAX && w.deadline <= now {
                continue;
            }
            let need = w.prefix.map_or(w.kv, |id| self.prefixes.waiter_need(id, w.kv));
            match res.capacity.try_take_for_waiter_with(need, budget, credit) {
                Ok(()) => return Some(c),
                Err(refused) if refused.shortage == Shortage::Full => {}
                Err(_) => return None,
            }
        }
        None
    }

    /// Controlled delay: if class `class`'s queue stands, ends (`NoCapacity`, counted as shed) every waiter
    /// of it that has waited `target` or longer, from the oldest end of each flow (flows in slot order),
    /// adding them to `ended`. Returns true if it stopped because `wakes` is full (call it again after
    /// waking them).
    fn shed_over_age(
        &mut self,
        res: Resources<'_>,
        d: &Dispatcher,
        class: usize,
        wakes: &mut WakeList,
        now: u64,
        ended: &mut usize,
    ) -> bool {
        let Some(delay) = d.delay.filter(|delay| delay.stands(self.nonempty_since[class], now)) else {
            return false;
        };
        for flow in 0..self.classes[class].flow_slots() {
            // A parked flow waits for its own tenant's limits, not for the server: it is not shed.
            while let Some(oldest) = self.classes[class].oldest(flow).filter(|_| !self.classes[class].is_parked(flow)) {
                if now.saturating_sub(self.waiters.get(oldest).queued_at) < delay.target {
                    break;
                }
                if wakes.is_full() {
                    return true;
                }
                let retry_after = self.shed_hint(res);
                if let Some(wake) = self.leave(res, d, oldest, WaitState::Shed { retry_after }) {
                    wakes.push(wake);
                }
                res.stats.count_shed(1);
                *ended += 1;
            }
        }
        false
    }

    /// One pass at `now`: grant waiters in priority order — fairly across flows within a class, in arrival
    /// order within a flow — while capacity lasts; a head whose deadline is at or before `now` ends
    /// `TimedOut` instead of being granted. Returns true if it stopped because `wakes` is full (run it
    /// again after waking them).
    fn pass(
        &mut self,
        res: Resources<'_>,
        d: &Dispatcher,
        wakes: &mut WakeList,
        credit: &mut Credit,
        now: u64,
    ) -> bool {
        if self.closed {
            return false;
        }
        let budget = res.kv_limit.get();
        for priority in Priority::HIGHEST_FIRST {
            let class = priority.index();
            let standing = d.delay.is_some_and(|delay| delay.stands(self.nonempty_since[class], now));
            loop {
                // A standing queue serves the newest of the chosen flow first (adaptive LIFO).
                let Some((flow, mut index)) = self.classes[class].head(standing) else {
                    self.clear_held_back(res, d, class);
                    break;
                };
                if wakes.is_full() {
                    return true;
                }
                let (mut kv, mut prefix, mut saving, mut cost, mut deadline, mut start_deadline) = {
                    let w = self.waiters.get(index);
                    (w.kv, w.prefix, w.saving, w.cost, w.deadline, w.start_deadline)
                };
                if deadline != u64::MAX && deadline <= now {
                    // Past its deadline: it is not granted (its owner, polling, sees `TimedOut`, or
                    // `NoCapacity` for controlled delay's). A waiter without one (`u64::MAX`) waits even on a
                    // clock at its end.
                    let to = self.past_deadline(res, index);
                    if let Some(wake) = self.leave(res, d, index, to) {
                        wakes.push(wake);
                    }
                    continue;
                }
                // Its own units, plus the prefix's when nobody holds the prefix now.
                let need = prefix.map_or(kv, |id| self.prefixes.waiter_need(id, kv));
                let tenant = self.classes[class].tenant(flow);
                if let Some(core) = tenant.map(|t| t.core()) {
                    let (tenant_kv, tenant_limit) = (core.kv_units(kv), core.kv_limit(budget));
                    if core.capacity.try_take_for_waiter_of(tenant_kv, tenant_limit, class).is_err() {
                        // Park, then look once more (invariant 2): a release between the failed take and
                        // the bit did not see the bit, but its room is visible now.
                        core.capacity.hold_back(class);
                        if core.capacity.try_take_for_waiter_of(tenant_kv, tenant_limit, class).is_err() {
                            self.classes[class].park(flow);
                            continue;
                        }
                        core.capacity.clear_held_back(class);
                    }
                }
                if let Err(refused) = res.capacity.try_take_for_waiter_with(need, budget, credit) {
                    if let Some(core) = self.classes[class].tenant(flow).map(|t| t.core()) {
                        // Taken and given back under the lock: no parking decision saw the difference,
                        // so the tenant's parked flows (if any) stay parked.
                        let _ = core.capacity.release(core.kv_units(kv));
                    }
                    // Global capacity is short (or closed): nobody passes this head — except, in a standing
                    // queue (already out of arrival order), a smaller waiter of the same flow that fits.
                    let alternative = match (standing, tenant.is_some(), refused.shortage) {
                        (true, false, Shortage::Full) => self.first_fit(res, index, budget, credit, now),
                        _ => None,
                    };
                    let Some(fit) = alternative else { return false };
                    index = fit;
                    let w = self.waiters.get(index);
                    (kv, prefix, saving, cost, deadline, start_deadline) =
                        (w.kv, w.prefix, w.saving, w.cost, w.deadline, w.start_deadline);
                }
                d.count(class, self.classes[class].tenant(flow).map(|t| t.as_ref()), -1, kv, deadline);
                if d.queued_in(class) == 0 {
                    self.set_since(d, class, None);
                }
                self.start_deadlines -= usize::from(start_deadline);
                if let Some(id) = prefix {
                    if self.prefixes.stop_waiting(id, true) {
                        res.stats.count_prefix_saved(saving);
                    }
                }
                self.classes[class].count_grant(flow, cost);
                self.classes[class].remove(&mut self.waiters, index);
                // The capacity is the waiter's now: its wake-up is taken out, it leaves the slab, and its
                // owner sees the grant by the slot's generation.
                if let Some(wake) = self.waiters.get_mut(index).notify.take() {
                    wakes.push(wake);
                }
                self.waiters.discard(index);
            }
        }
        false
    }
}
