//! Waiting admission against tokio's Semaphore: 1,000 tokio tasks contend for 8 permits, each holds its
//! permit for one yield; the time to drain them all. `cargo bench --bench waiting`.
//!
//! A third row runs tokio's semaphore in a task whose future is padded to the size of the kvgate task's
//! (the request, the admission handle and the `Admit` future are larger than tokio's `Acquire`): the
//! executor moves each task's future several times, so it shows what the size alone costs.
//!
//! tokio's semaphore is one FIFO queue; kvgate's waiting room is a fair scheduler. Three more rows compare
//! like with like: the same drain with every task of one of 8 tenants and one of the 3 priority classes
//! (task `i`: tenant `i % 8`, class `i % 3`) and every waiter with a deadline an hour away, through kvgate
//! (its default wait policy, controlled delay, and `WaitPolicy::Fifo`) and through [`fair_tokio`]: tokio's
//! semaphore behind a per-tenant fair scheduler built from tokio primitives, as a user would write it
//! (priority classes served highest first, weighted round-robin across tenants within a class, FIFO within
//! a tenant, a per-class queue bound, `tokio::time::timeout` for the deadline). `check_fair_order` checks
//! that both grant the same waiters in the same order.
//!
//! Criterion measures its rows one after the other, seconds apart; on a shared VM whose speed wanders, that
//! moves their ratio more than the code does. With `TURNS=<rounds>`, the bench also runs the six rows in
//! turns in one process — one drain of each, in a rotating order, `<rounds>` times after 10 of warm-up —
//! and prints the median drain of each and the ratios (`--test`, as CI runs every bench, does two rounds
//! and checks that every permit came back, as does a run without `--bench`):
//!
//! ```text
//! TURNS=300 cargo bench -p kvgate --bench waiting -- turns   # `turns` matches no criterion row: only the turns
//! ```

use criterion::{Criterion, criterion_group, criterion_main};
use fair_tokio::{FairSemaphore, Refused};
use kvgate::{Admission, Priority, Request, TenantLimits, WaitPolicy};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

const TASKS: usize = 1_000;
const PERMITS: usize = 8;
/// Tenants and priority classes of the fair rows.
const TENANTS: usize = 8;
/// Every waiter's deadline in the fair rows: far enough never to expire.
const DEADLINE: Duration = Duration::from_secs(3600);
/// What a fair row's task asks the semaphore for (kvgate's request reserves as much KV).
const COST: u32 = 1024;

/// Task `i`'s tenant and class in the fair rows: every pair of the 8 × 3 occurs.
fn shape(i: usize) -> (u64, Priority) {
    ((i % TENANTS) as u64, Priority::HIGHEST_FIRST[i % Priority::COUNT])
}

/// kvgate as in the plain row, with tenants on (every tenant weight 1) and `policy`.
fn fair_admission(policy: WaitPolicy) -> Admission {
    Admission::builder()
        .max_in_flight(PERMITS)
        .kv_capacity_tokens(8 * 1024)
        .queue_capacity(TASKS)
        .tenant_defaults(TenantLimits::new())
        .wait_policy(policy)
        .build()
        .unwrap()
}

/// The fair competitor with the same capacity, bound and weights.
fn fair_tokio() -> Arc<FairSemaphore> {
    FairSemaphore::new(PERMITS * COST as usize, TASKS, HashMap::new())
}

fn drain(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_time().build().unwrap();
    let mut group = c.benchmark_group("waiting_drain_1000_tasks_8_permits");
    group.sample_size(30);

    let admission =
        Admission::builder().max_in_flight(PERMITS).kv_capacity_tokens(8 * 1024).queue_capacity(TASKS).build().unwrap();
    group.bench_function("kvgate admit().await", |b| {
        b.to_async(&runtime).iter(|| {
            let admission = admission.clone();
            async move {
                let tasks: Vec<_> = (0..TASKS)
                    .map(|_| {
                        let admission = admission.clone();
                        tokio::spawn(kvgate_task(admission))
                    })
                    .collect();
                for task in tasks {
                    task.await.unwrap();
                }
            }
        })
    });

    let semaphore = Arc::new(Semaphore::new(8 * 1024));
    group.bench_function("tokio Semaphore::acquire_many", |b| {
        b.to_async(&runtime).iter(|| {
            let semaphore = Arc::clone(&semaphore);
            async move {
                let tasks: Vec<_> = (0..TASKS)
                    .map(|_| {
                        let semaphore = Arc::clone(&semaphore);
                        tokio::spawn(tokio_task(semaphore))
                    })
                    .collect();
                for task in tasks {
                    task.await.unwrap();
                }
            }
        })
    });
    let semaphore = Arc::new(Semaphore::new(8 * 1024));
    group.bench_function("tokio Semaphore::acquire_many, future of kvgate's size", |b| {
        b.to_async(&runtime).iter(|| {
            let semaphore = Arc::clone(&semaphore);
            async move {
                let tasks: Vec<_> = (0..TASKS).map(|_| tokio::spawn(padded_task(Arc::clone(&semaphore)))).collect();
                for task in tasks {
                    task.await.unwrap();
                }
            }
        })
    });

    for (name, policy) in [
        ("kvgate admit().await, 8 tenants x 3 classes, deadlines", WaitPolicy::default()),
        ("kvgate admit().await, 8 tenants x 3 classes, deadlines, WaitPolicy::Fifo", WaitPolicy::Fifo),
    ] {
        let admission = fair_admission(policy);
        group.bench_function(name, |b| {
            b.to_async(&runtime).iter(|| {
                let admission = admission.clone();
                async move {
                    let tasks: Vec<_> =
                        (0..TASKS).map(|i| tokio::spawn(kvgate_fair_task(admission.clone(), i))).collect();
                    for task in tasks {
                        task.await.unwrap();
                    }
                }
            })
        });
    }
    let fair = fair_tokio();
    group.bench_function("tokio Semaphore + fair scheduler, 8 tenants x 3 classes, deadlines", |b| {
        b.to_async(&runtime).iter(|| {
            let fair = Arc::clone(&fair);
            async move {
                let tasks: Vec<_> = (0..TASKS).map(|i| tokio::spawn(fair_tokio_task(Arc::clone(&fair), i))).collect();
                for task in tasks {
                    task.await.unwrap();
                }
            }
        })
    });
    group.finish();
}

/// Bytes that make `padded_task`'s future as large as `kvgate_task`'s (checked by `check_padding`).
const PADDING: usize = 224;

async fn kvgate_task(admission: Admission) {
    let permit = admission.admit(&Request::new(512, 512)).await.unwrap();
    tokio::task::yield_now().await;
    drop(permit);
}

async fn tokio_task(semaphore: Arc<Semaphore>) {
    let permit = semaphore.acquire_many(1024).await.unwrap();
    tokio::task::yield_now().await;
    drop(permit);
}

async fn padded_task(semaphore: Arc<Semaphore>) {
    let padding = std::hint::black_box([0u8; PADDING]);
    let permit = semaphore.acquire_many(1024).await.unwrap();
    tokio::task::yield_now().await;
    std::hint::black_box(&padding);
    drop(permit);
}

/// Task `i` of the fair rows through kvgate: its tenant, class and deadline.
async fn kvgate_fair_task(admission: Admission, i: usize) {
    let (tenant, class) = shape(i);
    let permit = admission.admit(&fair_request(tenant, class)).await.unwrap();
    tokio::task::yield_now().await;
    drop(permit);
}

fn fair_request(tenant: u64, class: Priority) -> Request {
    Request::new(512, 512).tenant(tenant).priority(class).max_wait(DEADLINE)
}

/// Task `i` of the fair rows through the fair competitor.
async fn fair_tokio_task(fair: Arc<FairSemaphore>, i: usize) {
    let (tenant, class) = shape(i);
    let permit = fair.acquire(tenant, class.index(), COST, DEADLINE).await.unwrap();
    tokio::task::yield_now().await;
    drop(permit);
}

/// tokio's semaphore behind a per-tenant fair scheduler built from tokio primitives: what a user who needs
/// kvgate's waiting room without kvgate would write.
///
/// # Algorithm
/// Capacity is a [`tokio::sync::Semaphore`]; only `try_acquire_many_owned` is called on it, under the
/// scheduler's lock, so the scheduler alone decides who waits and who is served. The waiting room is one
/// `std::sync::Mutex` over one [`Class`] per priority class; a class holds a `VecDeque` of waiters per
/// tenant (a *flow*) and a ring (`VecDeque`) of the tenants that have waiters. The next waiter served is
/// the oldest of the ring's front flow in the highest class that has waiters; the front flow is served up
/// to its tenant's weight in a row, then moves to the back of the ring (kvgate's weighted round-robin by
/// requests, `src/admission/dispatcher/fair.rs`). A request that finds nobody waiting takes the semaphore's
/// permits at once; otherwise (or when they are short) it joins its flow, unless its class already holds
/// `queue_capacity` waiters (then `QueueFull`), and waits on a `tokio::sync::oneshot` for its permit, inside
/// `tokio::time::timeout` for its deadline. A returned permit goes straight to the next waiter when it is of
/// the waiter's size (the drain's case); otherwise back into the semaphore, and waiters are served while
/// the semaphore has their size. A waiter whose future ends before its grant (deadline, drop) takes itself
/// out of its flow (a scan of that flow); if a release had already picked it, it closes its channel and
/// passes on the permit it may have been sent.
///
/// # Invariants
/// 1. Permits go back into the semaphore only under the lock, so a request that found too few permits
///    there (under the lock) is in a flow before anyone can return them, and that returner serves it.
/// 2. A class's `waiting` is the number of waiters in its flows, and a flow is in the ring iff it has
///    waiters; `Rooms::waiting` is the sum over the classes.
/// 3. Wake-ups (the `oneshot` sends) run after the lock is released, one grant per lock hold.
///
/// Unlike kvgate it has no slot count and KV budget apart (one semaphore), no per-tenant limits (so no
/// parking), no token fairness, no longest-queue drop (a full class refuses), no controlled delay, no
/// close, no counters, and it allocates per waiter (the `oneshot`, a timer entry).
mod fair_tokio {
    use std::collections::{HashMap, VecDeque};
    use std::sync::{Arc, Mutex, MutexGuard};
    use std::time::Duration;
    use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

    /// Priority classes (indices `0..CLASSES`, the highest served first).
    const CLASSES: usize = kvgate::Priority::COUNT;

    /// Flows without waiters kept for reuse, beyond which they are dropped (bounded memory per tenant).
    const IDLE_FLOWS: usize = 1024;

    /// Why a request was not admitted.
    #[derive(Debug, PartialEq, Eq)]
    pub enum Refused {
        /// Its class holds `queue_capacity` waiters.
        QueueFull,
        /// Its deadline passed while it waited.
        TimedOut,
    }

    /// A tokio semaphore behind the fair scheduler (see the module docs).
    #[derive(Debug)]
    pub struct FairSemaphore {
        semaphore: Arc<Semaphore>,
        permits: usize,
        queue_capacity: usize,
        weights: HashMap<u64, u32>,
        rooms: Mutex<Rooms>,
    }

    #[derive(Debug, Default)]
    struct Rooms {
        classes: [Class; CLASSES],
        /// Waiters in every class.
        waiting: usize,
        next_id: u64,
    }

    /// The waiters of one priority class.
    #[derive(Debug, Default)]
    struct Class {
        flows: HashMap<u64, Flow>,
        /// Tenants with waiters, the one served next at the front.
        ring: VecDeque<u64>,
        /// Grants to the ring's front flow in its current turn.
        served_in_turn: u32,
        waiting: usize,
    }

    #[derive(Debug)]
    struct Flow {
        weight: u32,
        waiters: VecDeque<Waiter>,
    }

    #[derive(Debug)]
    struct Waiter {
        id: u64,
        cost: u32,
        grant: oneshot::Sender<OwnedSemaphorePermit>,
    }

    /// Permits held; returned to the scheduler on drop.
    #[derive(Debug)]
    pub struct FairPermit {
        permit: Option<OwnedSemaphorePermit>,
        fair: Arc<FairSemaphore>,
    }

    impl Drop for FairPermit {
        fn drop(&mut self) {
            self.fair.release(self.permit.take());
        }
    }

    impl Class {
        fn push(&mut self, tenant: u64, weight: u32, waiter: Waiter) {
            let flow = self.flows.entry(tenant).or_insert_with(|| Flow { weight, waiters: VecDeque::new() });
            if flow.waiters.is_empty() {
                self.ring.push_back(tenant);
            }
            flow.waiters.push_back(waiter);
            self.waiting += 1;
        }

        /// The size of the next waiter to serve.
        fn head_cost(&self) -> Option<u32> {
            let tenant = self.ring.front()?;
            Some(self.flows[tenant].waiters.front().expect("a flow in the ring has waiters").cost)
        }

        /// Takes out the next waiter to serve (there is one) and ends its flow's turn when due.
        fn pop(&mut self) -> Waiter {
            let tenant = *self.ring.front().expect("a class with waiters has a flow in the ring");
            let flow = self.flows.get_mut(&tenant).expect("a flow in the ring exists");
            let waiter = flow.waiters.pop_front().expect("a flow in the ring has waiters");
            self.waiting -= 1;
            self.served_in_turn += 1;
            if flow.waiters.is_empty() {
                self.ring.pop_front();
                self.served_in_turn = 0;
                if self.flows.len() > IDLE_FLOWS + self.ring.len() {
                    self.flows.retain(|_, flow| !flow.waiters.is_empty());
                }
            } else if self.served_in_turn >= flow.weight {
                self.ring.rotate_left(1);
                self.served_in_turn = 0;
            }
            waiter
        }

        /// Takes out waiter `id` of `tenant` if it still waits.
        fn remove(&mut self, tenant: u64, id: u64) -> bool {
            let Some(flow) = self.flows.get_mut(&tenant) else { return false };
            let Some(at) = flow.waiters.iter().position(|w| w.id == id) else { return false };
            flow.waiters.remove(at);
            self.waiting -= 1;
            if flow.waiters.is_empty() {
                let at = self.ring.iter().position(|&t| t == tenant).expect("a flow with waiters is in the ring");
                self.ring.remove(at);
                if at == 0 {
                    self.served_in_turn = 0;
                }
            }
            true
        }
    }

    /// A waiter's side while it waits: takes it out of its flow if its future ends before the grant.
    struct Wait<'a> {
        fair: &'a FairSemaphore,
        tenant: u64,
        class: usize,
        id: u64,
        grant: oneshot::Receiver<OwnedSemaphorePermit>,
        granted: bool,
    }

    impl Drop for Wait<'_> {
        fn drop(&mut self) {
            if self.granted {
                return;
            }
            let removed = {
                let mut rooms = self.fair.lock();
                let removed = rooms.classes[self.class].remove(self.tenant, self.id);
                rooms.waiting -= usize::from(removed);
                removed
            };
            if !removed {
                // A release picked it: its permit is in the channel, or its send will fail and the
                // releaser passes the permit on.
                self.grant.close();
                if let Ok(permit) = self.grant.try_recv() {
                    self.fair.release(Some(permit));
                }
            }
        }
    }

    impl FairSemaphore {
        /// `permits` of capacity, at most `queue_capacity` waiters per class, tenants' weights (default 1).
        pub fn new(permits: usize, queue_capacity: usize, weights: HashMap<u64, u32>) -> Arc<Self> {
            Arc::new(Self {
                semaphore: Arc::new(Semaphore::new(permits)),
                permits,
                queue_capacity,
                weights,
                rooms: Mutex::new(Rooms::default()),
            })
        }

        fn lock(&self) -> MutexGuard<'_, Rooms> {
            self.rooms.lock().expect("no panic under the scheduler's lock")
        }

        /// Waiters in every class.
        pub fn waiting(&self) -> usize {
            self.lock().waiting
        }

        /// Whether every permit is back in the semaphore and nobody waits.
        pub fn is_idle(&self) -> bool {
            let rooms = self.lock();
            rooms.waiting == 0 && self.semaphore.available_permits() == self.permits
        }

        /// `cost` permits for `tenant` in `class` (`0..3`, higher served first), waiting at most `deadline`.
        ///
        /// # Errors
        /// [`Refused::QueueFull`] at once when it would wait and its class is full; [`Refused::TimedOut`]
        /// when `deadline` passed first.
        ///
        /// # Cancel safety
        /// Dropping the future before it completes takes the waiter out (or passes on a permit it was sent).
        pub async fn acquire(
            self: &Arc<Self>,
            tenant: u64,
            class: usize,
            cost: u32,
            deadline: Duration,
        ) -> Result<FairPermit, Refused> {
            let (id, grant) = {
                let mut rooms = self.lock();
                if rooms.waiting == 0 {
                    if let Ok(permit) = Arc::clone(&self.semaphore).try_acquire_many_owned(cost) {
                        return Ok(FairPermit { permit: Some(permit), fair: Arc::clone(self) });
                    }
                }
                if rooms.classes[class].waiting >= self.queue_capacity {
                    return Err(Refused::QueueFull);
                }
                let (sender, receiver) = oneshot::channel();
                let id = rooms.next_id;
                rooms.next_id += 1;
                rooms.waiting += 1;
                let weight = self.weights.get(&tenant).copied().unwrap_or(1);
                rooms.classes[class].push(tenant, weight, Waiter { id, cost, grant: sender });
                (id, receiver)
            };
            let mut wait = Wait { fair: self, tenant, class, id, grant, granted: false };
            match tokio::time::timeout(deadline, &mut wait.grant).await {
                Ok(granted) => {
                    wait.granted = true;
                    let permit = granted.expect("a waiter's sender is dropped only after its send");
                    Ok(FairPermit { permit: Some(permit), fair: Arc::clone(self) })
                }
                Err(_elapsed) => Err(Refused::TimedOut),
            }
        }

        /// Returns `freed` and serves the waiters that now fit.
        fn release(&self, mut freed: Option<OwnedSemaphorePermit>) {
            loop {
                let (waiter, permit, handed_over) = {
                    let mut rooms = self.lock();
                    let Some(class) = rooms.classes.iter_mut().rev().find(|class| class.waiting > 0) else {
                        drop(freed); // into the semaphore, under the lock (invariant 1)
                        return;
                    };
                    let cost = class.head_cost().expect("a class with waiters has a head");
                    let (permit, handed_over) = match freed.take() {
                        Some(permit) if permit.num_permits() == cost as usize => (permit, true),
                        other => {
                            drop(other);
                            match Arc::clone(&self.semaphore).try_acquire_many_owned(cost) {
                                Ok(permit) => (permit, false),
                                Err(_) => return,
                            }
                        }
                    };
                    let waiter = class.pop();
                    rooms.waiting -= 1;
                    (waiter, permit, handed_over)
                };
                match waiter.grant.send(permit) {
                    // A handed-over permit freed nothing more; one taken from the semaphore may leave room.
                    Ok(()) if handed_over => return,
                    Ok(()) => {}
                    // The waiter gave up after it was picked: its permit goes to the next one.
                    Err(permit) => freed = Some(permit),
                }
            }
        }
    }
}

/// Fails when the padding no longer matches (the kvgate future's size changed): update `PADDING`.
fn check_padding() {
    let admission = Admission::builder().max_in_flight(1).build().unwrap();
    let kvgate = std::mem::size_of_val(&kvgate_task(admission));
    let padded = std::mem::size_of_val(&padded_task(Arc::new(Semaphore::new(1))));
    assert_eq!(kvgate, padded, "the kvgate task's future is {kvgate} bytes, the padded one {padded}: adjust PADDING");
}

/// Waiters of `check_fair_order`.
const ORDER_WAITERS: usize = 60;

/// The fair competitor does what kvgate's waiting room does in the fair rows: with one permit held and
/// `ORDER_WAITERS` waiters queued in the fair rows' shape (tenant 1 of weight 2), both grant the same
/// waiters in the same order; a full class refuses, and a deadline ends a wait and takes the waiter out.
fn check_fair_order() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let kvgate = |policy| {
        Admission::builder()
            .max_in_flight(1)
            .queue_capacity(ORDER_WAITERS)
            .tenant_defaults(TenantLimits::new())
            .tenant_limits(1u64, TenantLimits::new().weight(2))
            .wait_policy(policy)
            .build()
            .unwrap()
    };
    let fair = FairSemaphore::new(COST as usize, ORDER_WAITERS, HashMap::from([(1, 2)]));
    let controlled_delay = grant_order(&runtime, Contender::Kvgate(kvgate(WaitPolicy::default())));
    let fifo = grant_order(&runtime, Contender::Kvgate(kvgate(WaitPolicy::Fifo)));
    let fair_order = grant_order(&runtime, Contender::FairTokio(Arc::clone(&fair)));
    assert_eq!(controlled_delay, fifo, "kvgate's two policies agree while the queue drains");
    assert_eq!(fair_order, fifo, "the fair competitor grants in kvgate's order");
    assert!(fair.is_idle());

    runtime.block_on(async {
        let fair = FairSemaphore::new(COST as usize, 1, HashMap::new());
        let held = fair.acquire(0, 1, COST, DEADLINE).await.unwrap();
        let waiter = tokio::spawn({
            let fair = Arc::clone(&fair);
            async move { fair.acquire(0, 1, COST, Duration::from_millis(1)).await.map(drop) }
        });
        while fair.waiting() < 1 {
            tokio::task::yield_now().await;
        }
        assert_eq!(fair.acquire(2, 1, COST, DEADLINE).await.err(), Some(Refused::QueueFull));
        assert_eq!(waiter.await.unwrap(), Err(Refused::TimedOut));
        assert_eq!(fair.waiting(), 0);
        drop(held);
        assert!(fair.is_idle());
    });
}

enum Contender {
    Kvgate(Admission),
    FairTokio(Arc<FairSemaphore>),
}

/// The order in which `contender`, its only permit held, grants `ORDER_WAITERS` waiters queued one by one.
fn grant_order(runtime: &tokio::runtime::Runtime, contender: Contender) -> Vec<usize> {
    let order = Arc::new(Mutex::new(Vec::new()));
    runtime.block_on(async {
        let held: Box<dyn Send> = match &contender {
            Contender::Kvgate(admission) => Box::new(admission.try_admit(&Request::new(1, 1)).unwrap()),
            Contender::FairTokio(fair) => Box::new(fair.acquire(0, 0, COST, DEADLINE).await.unwrap()),
        };
        let mut tasks = Vec::new();
        for i in 0..ORDER_WAITERS {
            let order = Arc::clone(&order);
            let (tenant, class) = shape(i);
            tasks.push(match &contender {
                Contender::Kvgate(admission) => {
                    let admission = admission.clone();
                    tokio::spawn(async move {
                        let permit = admission.admit(&fair_request(tenant, class)).await.unwrap();
                        order.lock().unwrap().push(i);
                        drop(permit);
                    })
                }
                Contender::FairTokio(fair) => {
                    let fair = Arc::clone(fair);
                    tokio::spawn(async move {
                        let permit = fair.acquire(tenant, class.index(), COST, DEADLINE).await.unwrap();
                        order.lock().unwrap().push(i);
                        drop(permit);
                    })
                }
            });
            let queued = || match &contender {
                Contender::Kvgate(admission) => admission.snapshot().queued,
                Contender::FairTokio(fair) => fair.waiting(),
            };
            while queued() <= i {
                tokio::task::yield_now().await;
            }
        }
        drop(held);
        for task in tasks {
            task.await.unwrap();
        }
    });
    Arc::into_inner(order).unwrap().into_inner().unwrap()
}

/// Checks the padding, the fair competitor's order, and the `TURNS` value before any row runs.
fn padding(_: &mut Criterion) {
    check_padding();
    check_fair_order();
    let _ = turns_wanted();
}

/// The rows of `drain`, measured in turns.
#[derive(Debug, Clone, Copy)]
enum Row {
    Kvgate,
    Tokio,
    Padded,
    KvgateFair,
    KvgateFairFifo,
    FairTokio,
}

const ROWS: [Row; 6] = [Row::Kvgate, Row::Tokio, Row::Padded, Row::KvgateFair, Row::KvgateFairFifo, Row::FairTokio];

/// What the rows drain.
struct Contenders {
    admission: Admission,
    semaphore: Arc<Semaphore>,
    fair: Admission,
    fair_fifo: Admission,
    fair_tokio: Arc<FairSemaphore>,
}

/// One drain of `row`: `TASKS` tasks spawned at once, all awaited; its wall time in microseconds.
fn drain_once(runtime: &tokio::runtime::Runtime, row: Row, on: &Contenders) -> f64 {
    let started = Instant::now();
    runtime.block_on(async {
        let tasks: Vec<_> = (0..TASKS)
            .map(|i| match row {
                Row::Kvgate => tokio::spawn(kvgate_task(on.admission.clone())),
                Row::Tokio => tokio::spawn(tokio_task(Arc::clone(&on.semaphore))),
                Row::Padded => tokio::spawn(padded_task(Arc::clone(&on.semaphore))),
                Row::KvgateFair => tokio::spawn(kvgate_fair_task(on.fair.clone(), i)),
                Row::KvgateFairFifo => tokio::spawn(kvgate_fair_task(on.fair_fifo.clone(), i)),
                Row::FairTokio => tokio::spawn(fair_tokio_task(Arc::clone(&on.fair_tokio), i)),
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
    started.elapsed().as_secs_f64() * 1e6
}

/// The rounds and warm-up rounds of the turns (see the module docs): `TURNS` of them when measuring, two
/// and none when criterion runs the bench as a test (without `--bench`), none when it lists the benches or
/// `TURNS` is unset. A `TURNS` that is not a whole number above 0 ends the bench with a message.
fn turns_wanted() -> Option<(usize, usize)> {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list") {
        return None;
    }
    let test = args.iter().any(|a| a == "--test") || !args.iter().any(|a| a == "--bench");
    match std::env::var("TURNS") {
        Ok(value) => match value.parse::<usize>() {
            Ok(rounds) if rounds > 0 => Some(if test { (2, 0) } else { (rounds, 10) }),
            _ => {
                eprintln!("TURNS={value}: the number of rounds must be a whole number above 0");
                std::process::exit(2);
            }
        },
        Err(_) if test => Some((2, 0)),
        Err(_) => None,
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The rows in turns (see the module docs).
fn turns(_: &mut Criterion) {
    let Some((rounds, warm_up)) = turns_wanted() else { return };
    let on = Contenders {
        admission: Admission::builder()
            .max_in_flight(PERMITS)
            .kv_capacity_tokens(8 * 1024)
            .queue_capacity(TASKS)
            .build()
            .unwrap(),
        semaphore: Arc::new(Semaphore::new(8 * 1024)),
        fair: fair_admission(WaitPolicy::default()),
        fair_fifo: fair_admission(WaitPolicy::Fifo),
        fair_tokio: fair_tokio(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_time().build().unwrap();
    let mut times: [Vec<f64>; ROWS.len()] = Default::default();
    for round in 0..warm_up + rounds {
        for i in 0..ROWS.len() {
            let row = (round + i) % ROWS.len();
            let us = drain_once(&runtime, ROWS[row], &on);
            if round >= warm_up {
                times[row].push(us);
            }
        }
    }
    for admission in [&on.admission, &on.fair, &on.fair_fifo] {
        let snapshot = admission.snapshot();
        assert_eq!((snapshot.in_flight, snapshot.queued, snapshot.kv_used), (0, 0, 0), "every permit came back");
    }
    assert_eq!(on.semaphore.available_permits(), 8 * 1024, "every tokio permit came back");
    assert!(on.fair_tokio.is_idle(), "every permit came back to the fair competitor");
    // Per round, one row over another: drift between rounds cancels.
    let ratio = |a: Row, b: Row| {
        let (a, b) = (&times[a as usize], &times[b as usize]);
        median(a.iter().zip(b).map(|(a, b)| a / b).collect())
    };
    let [kvgate, tokio, padded, fair, fair_fifo, fair_tokio] = times.clone().map(median);
    let future = |row| match row {
        Row::Kvgate => std::mem::size_of_val(&kvgate_task(on.admission.clone())),
        Row::Tokio => std::mem::size_of_val(&tokio_task(Arc::clone(&on.semaphore))),
        Row::Padded => std::mem::size_of_val(&padded_task(Arc::clone(&on.semaphore))),
        Row::KvgateFair | Row::KvgateFairFifo => std::mem::size_of_val(&kvgate_fair_task(on.fair.clone(), 0)),
        Row::FairTokio => std::mem::size_of_val(&fair_tokio_task(Arc::clone(&on.fair_tokio), 0)),
    };
    println!("waiting drain in turns, {TASKS} tasks, {PERMITS} permits, {rounds} rounds (median drain):");
    for (row, us, what) in [
        (Row::Kvgate, kvgate, "kvgate admit().await"),
        (Row::Tokio, tokio, "tokio Semaphore::acquire_many"),
        (Row::Padded, padded, "tokio, future padded to kvgate's size"),
        (Row::KvgateFair, fair, "kvgate, 8 tenants x 3 classes, deadlines (controlled delay)"),
        (Row::KvgateFairFifo, fair_fifo, "kvgate, 8 tenants x 3 classes, deadlines, WaitPolicy::Fifo"),
        (Row::FairTokio, fair_tokio, "tokio Semaphore + fair scheduler, 8 tenants x 3 classes, deadlines"),
    ] {
        println!("  {what:<68} {us:>7.0} µs  ({}-byte future)", future(row));
    }
    println!("ratios (of the medians; in brackets the median of the rounds' ratios):");
    for (what, a, b, (ra, rb)) in [
        ("kvgate fair / tokio fair", fair, fair_tokio, (Row::KvgateFair, Row::FairTokio)),
        ("kvgate fair, Fifo / tokio fair", fair_fifo, fair_tokio, (Row::KvgateFairFifo, Row::FairTokio)),
        ("kvgate fair / tokio", fair, tokio, (Row::KvgateFair, Row::Tokio)),
        ("tokio fair / tokio", fair_tokio, tokio, (Row::FairTokio, Row::Tokio)),
        ("kvgate / tokio", kvgate, tokio, (Row::Kvgate, Row::Tokio)),
        ("padded / tokio", padded, tokio, (Row::Padded, Row::Tokio)),
    ] {
        println!("  {what:<32} {:.3}×  ({:.3}×)", a / b, ratio(ra, rb));
    }
}

criterion_group!(benches, padding, drain, turns);
criterion_main!(benches);
