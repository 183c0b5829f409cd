//! The runtime-free heart of admission: capacity gauges, the waiting room and the dispatcher that hands
//! released capacity to waiters in order.
//!
//! This part is independent of the clock type, so [`Permit`](crate::Permit) and
//! [`Admit`](crate::Admit) need no type parameter.
//!
//! # Invariants
//! - **Conservation**: `slots.used` and `kv.used` equal the sums over live permits and granted-but-unclaimed
//!   waiters. Every `take` is matched by exactly one `give`.
//! - **Exact waiting count**: the packed `waiting` word counts, per class, the waiters in state `WAITING`
//!   (plus, for a few instructions, one that is being enqueued). Whoever moves a waiter out of `WAITING`
//!   decrements it.
//! - **FIFO within a class, strict priority between classes**: only the dispatcher grants waiters, it runs
//!   on one thread at a time, it serves the highest class first and stops at a head that does not fit
//!   (head-of-line blocking: a large request at the head is never starved by smaller ones behind it).
//! - **No lost wake-up**: a release gives capacity back and then reads `waiting`; an enqueue increments
//!   `waiting` and then (through the dispatcher) reads the capacity. Every one of these four accesses is
//!   a read-modify-write, and RMWs read the latest value of their location, so at least one side sees
//!   the other (a plain load could miss it: the loom model `enqueue_racing_a_release_loses_no_wakeup`
//!   finds that interleaving).

use super::fair::FairQueue;
use super::waiter::{CLOSED, GRANTED, Waiter};
use crate::Priority;
use crate::queue::BoundedQueue;
use crate::sync::{self, AtomicBool, AtomicU8, AtomicU64, CachePadded, Mutex, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Bits of the packed waiting word per priority class.
const CLASS_BITS: u32 = 21;
const CLASS_MASK: u64 = (1 << CLASS_BITS) - 1;
/// Largest accepted `queue_capacity` (per class), so that a class count never overflows its bits.
pub(crate) const MAX_QUEUE_CAPACITY: usize = 1 << 20;

/// Dispatcher states.
const IDLE: u8 = 0;
const RUNNING: u8 = 1;
const RUNNING_AGAIN: u8 = 2;

/// Assumed permit hold time before any has been observed.
const DEFAULT_HOLD_NANOS: u64 = 1_000_000_000;
/// Bounds of every capacity retry hint.
const MIN_HINT: Duration = Duration::from_millis(1);
const MAX_HINT: Duration = Duration::from_secs(600);

/// A counted resource with a limit that can change at run time.
#[derive(Debug)]
pub(crate) struct Gauge {
    used: AtomicU64,
    /// `u64::MAX` means unlimited.
    limit: AtomicU64,
}

impl Gauge {
    fn new(limit: u64) -> Self {
        Self { used: AtomicU64::new(0), limit: AtomicU64::new(limit) }
    }

    /// Takes `n` if the result stays within the limit.
    #[inline]
    fn try_take(&self, n: u64) -> bool {
        self.take_from(self.used.load(Ordering::Relaxed), n)
    }

    /// Like `try_take`, but starts from a read-modify-write of `used`, which sees the latest value in
    /// its modification order. The dispatcher uses it after a waiter published itself, so that a
    /// release that did not see the waiter is seen here (see the module invariants).
    #[inline]
    fn try_take_latest(&self, n: u64) -> bool {
        self.take_from(self.used.fetch_add(0, Ordering::SeqCst), n)
    }

    #[inline]
    fn take_from(&self, mut used: u64, n: u64) -> bool {
        let limit = self.limit.load(Ordering::Relaxed);
        loop {
            let Some(next) = used.checked_add(n) else { return false };
            if next > limit {
                return false;
            }
            match self.used.compare_exchange_weak(used, next, Ordering::SeqCst, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(actual) => used = actual,
            }
        }
    }

    #[inline]
    fn give(&self, n: u64) {
        let before = self.used.fetch_sub(n, Ordering::SeqCst);
        debug_assert!(before >= n, "capacity returned twice");
    }

    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit.load(Ordering::Acquire)
    }

    pub(crate) fn set_limit(&self, limit: u64) {
        self.limit.store(limit, Ordering::SeqCst);
    }
}

/// The hot counters, on their own cache line.
#[derive(Debug)]
struct Hot {
    slots: Gauge,
    kv: Gauge,
    /// Live waiters per class, `CLASS_BITS` bits each, class `i` at bit `i * CLASS_BITS`.
    waiting: AtomicU64,
    closed: AtomicBool,
}

/// Monotonic statistics, on their own cache line.
#[derive(Debug)]
pub(crate) struct Stats {
    pub(crate) admitted: AtomicU64,
    pub(crate) rejected: [AtomicU64; crate::Rejection::REASONS],
    /// Exponentially weighted mean permit hold time in nanoseconds (weight 1/8), 0 before any sample.
    hold_ewma_nanos: AtomicU64,
}

/// Waiters the dispatcher took out of each class's ring, by tenant, not granted yet. Everything here is
/// older than everything still in the ring, so FIFO within a tenant holds.
type Staged = [FairQueue; Priority::COUNT];

/// Clock-independent admission state shared by an `Admission`, its permits and its waiters.
#[derive(Debug)]
pub(crate) struct Core {
    hot: CachePadded<Hot>,
    pub(crate) stats: CachePadded<Stats>,
    queue_capacity: usize,
    queues: [BoundedQueue<Arc<Waiter>>; Priority::COUNT],
    /// Waiters taken out of the rings but not granted yet; only the dispatch runner touches them (the
    /// mutex is never contended; it makes that ownership explicit). Every pass first moves the rings'
    /// contents here, so cancelled waiters never keep a ring full for long.
    staged: Mutex<Staged>,
    /// `IDLE`, `RUNNING` or `RUNNING_AGAIN`: who runs dispatch passes (see `dispatch`).
    dispatch_state: AtomicU8,
    /// Deadlines of waiters.
    timer: super::timer::Timer,
    /// Whether a timer thread enforces deadlines on its own.
    deadline_timer: bool,
}

impl Core {
    pub(crate) fn new(max_in_flight: u64, kv_capacity: u64, queue_capacity: usize, deadline_timer: bool) -> Self {
        // Cancelled waiters stay in the ring until they reach its head, so the ring has room for as
        // many tombstones as live waiters before a push can fail on it.
        let ring = queue_capacity.saturating_mul(2).max(1);
        Self {
            hot: CachePadded(Hot {
                slots: Gauge::new(max_in_flight),
                kv: Gauge::new(kv_capacity),
                waiting: AtomicU64::new(0),
                closed: AtomicBool::new(false),
            }),
            stats: CachePadded(Stats {
                admitted: AtomicU64::new(0),
                rejected: std::array::from_fn(|_| AtomicU64::new(0)),
                hold_ewma_nanos: AtomicU64::new(0),
            }),
            queue_capacity,
            queues: std::array::from_fn(|_| BoundedQueue::new(ring)),
            staged: Mutex::new(std::array::from_fn(|_| FairQueue::default())),
            dispatch_state: AtomicU8::new(IDLE),
            timer: super::timer::Timer::default(),
            deadline_timer,
        }
    }

    pub(crate) fn slots(&self) -> &Gauge {
        &self.hot.slots
    }

    pub(crate) fn kv(&self) -> &Gauge {
        &self.hot.kv
    }

    pub(crate) fn timer(&self) -> &super::timer::Timer {
        &self.timer
    }

    /// Registers a waiter's deadline with the timer thread (if enabled).
    pub(crate) fn watch_deadline(&self, owner: &Arc<dyn super::permit::Owner>, waiter: &Arc<Waiter>) {
        if self.deadline_timer {
            self.timer.watch(owner, waiter);
        } else {
            self.timer.register(waiter);
        }
    }

    /// Ends the waits whose deadline is at or before `now`.
    pub(crate) fn expire_waiters(&self, now: u64) -> usize {
        self.timer.expire(self, now)
    }

    pub(crate) fn queue_capacity(&self) -> usize {
        self.queue_capacity
    }

    #[inline]
    pub(crate) fn is_closed(&self) -> bool {
        self.hot.closed.load(Ordering::Acquire)
    }

    /// True if a waiter of `class` or a higher class exists: a new request of `class` must queue
    /// behind it rather than take capacity directly.
    #[inline]
    pub(crate) fn has_waiters_at_or_above(&self, class: usize) -> bool {
        let word = self.hot.waiting.load(Ordering::SeqCst);
        (word >> (class as u32 * CLASS_BITS)) != 0
    }

    /// Live waiters in all classes.
    pub(crate) fn queued(&self) -> usize {
        let word = self.hot.waiting.load(Ordering::Acquire);
        (0..Priority::COUNT).map(|c| ((word >> (c as u32 * CLASS_BITS)) & CLASS_MASK) as usize).sum()
    }

    /// Live waiters of one class.
    pub(crate) fn queued_in(&self, class: usize) -> usize {
        let word = self.hot.waiting.load(Ordering::Acquire);
        ((word >> (class as u32 * CLASS_BITS)) & CLASS_MASK) as usize
    }

    /// Takes one in-flight slot and `kv` KV units, all or nothing.
    #[inline]
    pub(crate) fn try_reserve(&self, kv: u64) -> bool {
        if !self.hot.slots.try_take(1) {
            return false;
        }
        if !self.hot.kv.try_take(kv) {
            self.release(0);
            return false;
        }
        true
    }

    /// Returns one slot and `kv` KV units, then lets waiters have them.
    #[inline]
    pub(crate) fn release(&self, kv: u64) {
        self.give_back(kv);
        self.dispatch_if_waiting();
    }

    /// Returns capacity without running the dispatcher (used inside a dispatch pass).
    #[inline]
    fn give_back(&self, kv: u64) {
        self.hot.slots.give(1);
        if kv != 0 {
            self.hot.kv.give(kv);
        }
    }

    /// Runs the dispatcher if anyone waits. The waiting count is read with a read-modify-write (on a
    /// cache line the release just wrote anyway): unlike a load, it cannot miss a waiter whose
    /// enqueue came first in the count's modification order.
    #[inline]
    pub(crate) fn dispatch_if_waiting(&self) {
        if self.hot.waiting.fetch_add(0, Ordering::SeqCst) != 0 {
            self.dispatch();
        }
    }

    /// Records one rejection.
    #[inline]
    pub(crate) fn count_rejection(&self, rejection: &crate::Rejection, has_tenant: bool) {
        self.stats.rejected[rejection.index()].fetch_add(1, Ordering::Relaxed);
        crate::telemetry::rejected(rejection, has_tenant);
    }

    /// Feeds one observed permit hold time into the moving average.
    pub(crate) fn record_hold(&self, nanos: u64) {
        let ewma = &self.stats.hold_ewma_nanos;
        let old = ewma.load(Ordering::Relaxed);
        // A racing update may be lost; the average only steers retry hints.
        let new = if old == 0 { nanos } else { old - old / 8 + nanos / 8 };
        ewma.store(new.max(1), Ordering::Relaxed);
    }

    /// Mean hold time of a permit as observed so far.
    pub(crate) fn mean_hold(&self) -> Duration {
        match self.stats.hold_ewma_nanos.load(Ordering::Relaxed) {
            0 => Duration::from_nanos(DEFAULT_HOLD_NANOS),
            n => Duration::from_nanos(n),
        }
    }

    /// Estimated time until capacity for one more request frees up, with `ahead` requests queued before
    /// it: permits are released at about `in_flight / mean_hold` per second, and each of the `ahead`
    /// waiters needs one release before this request's turn. Never zero.
    pub(crate) fn capacity_hint(&self, ahead: usize) -> Duration {
        let in_flight = self.hot.slots.used().max(1);
        let per_release = self.mean_hold().as_nanos() as u64 / in_flight;
        let nanos = per_release.saturating_mul(ahead as u64 + 1);
        Duration::from_nanos(nanos).clamp(MIN_HINT, MAX_HINT)
    }

    /// Adds a waiter to its class's queue.
    ///
    /// Returns false if the class already holds `queue_capacity` live waiters (or the admission is
    /// closed); the waiter was then not queued and the caller still owns everything.
    pub(crate) fn enqueue(&self, waiter: &Arc<Waiter>) -> bool {
        let class = waiter.class;
        let shift = class as u32 * CLASS_BITS;
        let limit = self.queue_capacity as u64;
        let counted = self
            .hot
            .waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |word| {
                ((word >> shift) & CLASS_MASK < limit).then(|| word + (1 << shift))
            })
            .is_ok();
        if !counted {
            return false;
        }
        let mut item = Arc::clone(waiter);
        for _ in 0..4 {
            match self.queues[class].push(item) {
                Ok(()) => {
                    // Grants, or closes, if that is already possible.
                    self.dispatch();
                    return true;
                }
                Err(back) => {
                    // The ring is full of waiters pushed since the last pass (live waiters alone never
                    // fill it: it has room for twice the queue capacity). A pass empties it.
                    item = back;
                    self.dispatch();
                    sync::yield_now();
                }
            }
        }
        self.uncount(class);
        false
    }

    /// Removes one waiter of `class` from the count: called by whoever moved it out of `WAITING`.
    #[inline]
    pub(crate) fn uncount(&self, class: usize) {
        self.hot.waiting.fetch_sub(1 << (class as u32 * CLASS_BITS), Ordering::SeqCst);
    }

    /// Gives up a waiter that is still `WAITING` (cancelled, timed out): true if this call won, in which
    /// case the waiter holds nothing and the queue has been told.
    pub(crate) fn abandon(&self, waiter: &Waiter, to: u8) -> bool {
        if self.leave(waiter, to) {
            // It may have been the head blocking others.
            self.dispatch();
            true
        } else {
            false
        }
    }

    /// Like `abandon`, without running the dispatcher (the caller runs it once for several waiters).
    pub(crate) fn leave(&self, waiter: &Waiter, to: u8) -> bool {
        if waiter.leave_waiting(to) {
            self.uncount(waiter.class);
            true
        } else {
            false
        }
    }

    /// Marks the admission closed and ends every wait with `Closed`.
    pub(crate) fn close(&self) {
        self.hot.closed.store(true, Ordering::SeqCst);
        self.dispatch();
    }

    /// Runs dispatch passes until no request for one is pending.
    ///
    /// At most one thread (the runner) runs passes at a time. The `dispatch` word is `IDLE`, `RUNNING`
    /// or `RUNNING_AGAIN`; every change to it is a read-modify-write, so a caller either becomes the
    /// runner (it saw `IDLE`) or leaves `RUNNING_AGAIN`, which the runner is certain to see before it
    /// can go idle — no request for a pass is ever lost, and nobody blocks.
    pub(crate) fn dispatch(&self) {
        let previous = self
            .dispatch_state
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| Some(if s == IDLE { RUNNING } else { RUNNING_AGAIN }))
            .unwrap_or(RUNNING);
        if previous != IDLE {
            return;
        }
        loop {
            self.pass(&mut sync::lock(&self.staged));
            match self.dispatch_state.compare_exchange(RUNNING, IDLE, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return,
                // RUNNING_AGAIN: someone asked for another pass while this one ran.
                Err(_) => self.dispatch_state.store(RUNNING, Ordering::SeqCst),
            }
        }
    }

    /// One pass: grant waiters in priority order, and within a class fairly across tenants and in
    /// arrival order within a tenant, while capacity lasts; on close, end every wait.
    fn pass(&self, staged: &mut Staged) {
        let closing = self.is_closed();
        // Empty every ring first, even of classes this pass will not reach, so that waiters that left
        // (cancelled, timed out) never keep a ring full.
        for (class, fair) in staged.iter_mut().enumerate() {
            while let Some(waiter) = self.queues[class].pop() {
                fair.push(waiter);
            }
            fair.shrink(self.queued_in(class));
        }
        for priority in Priority::HIGHEST_FIRST {
            let class = priority.index();
            let fair = &mut staged[class];
            if closing {
                for waiter in fair.drain() {
                    if waiter.leave_waiting(CLOSED) {
                        self.uncount(class);
                        waiter.wake();
                    }
                }
                continue;
            }
            // Tenants skipped in a row because their own limits are full; a full round of them ends
            // this class's turn.
            let mut skipped = 0;
            while let Some(head) = fair.head() {
                if let Some(tenant) = &head.tenant {
                    if !tenant.try_reserve(head.kv) {
                        skipped += 1;
                        if skipped >= fair.tenants() {
                            break;
                        }
                        fair.rotate();
                        continue;
                    }
                }
                if !self.reserve_for_waiter(head.kv) {
                    if let Some(tenant) = &head.tenant {
                        tenant.release(head.kv);
                    }
                    // Global capacity is short: nobody passes this head, in this class or below.
                    return;
                }
                skipped = 0;
                if head.leave_waiting(GRANTED) {
                    self.uncount(class);
                    head.wake();
                    fair.pop_head(true);
                } else {
                    // Cancelled or timed out while we reserved: undo, keep going.
                    self.give_back(head.kv);
                    if let Some(tenant) = &head.tenant {
                        tenant.release(head.kv);
                    }
                    fair.pop_head(false);
                }
            }
        }
    }

    /// Like `try_reserve`, without running the dispatcher on failure (we are the dispatcher).
    fn reserve_for_waiter(&self, kv: u64) -> bool {
        if !self.hot.slots.try_take_latest(1) {
            return false;
        }
        if !self.hot.kv.try_take_latest(kv) {
            self.hot.slots.give(1);
            return false;
        }
        true
    }
}
