//! Model-based test of waiting admission: random interleavings of admit / poll / cancel / drop / close /
//! advance time, on a deterministic executor (each future polled by hand with a no-op waker), against a
//! sequential model of the waiting room. Checked after every step: each outcome (so a waiter granted out
//! of FIFO or priority order fails at once), and conservation (in-flight, KV and queued counts equal the model's).
#![cfg(not(loom))]

use futures::FutureExt;
use kvgate::clock::ManualClock;
use kvgate::{Admission, Admit, Permit, Priority, Rejection, Request};
use proptest::prelude::*;
use std::collections::VecDeque;
use std::time::Duration;

#[derive(Debug, Clone)]
enum Op {
    Admit { kv: u32, class: usize, max_wait_ms: Option<u64> },
    Poll(usize),
    Cancel(usize),
    DropPermit(usize),
    Advance(u64),
    Close,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (1u32..40, 0usize..3, prop::option::of(0u64..30))
            .prop_map(|(kv, class, max_wait_ms)| Op::Admit { kv, class, max_wait_ms }),
        4 => any::<usize>().prop_map(Op::Poll),
        2 => any::<usize>().prop_map(Op::Cancel),
        4 => any::<usize>().prop_map(Op::DropPermit),
        2 => (1u64..20).prop_map(Op::Advance),
        1 => Just(Op::Close),
    ]
}

const CLASSES: [Priority; 3] = [Priority::Batch, Priority::Normal, Priority::Interactive];

#[derive(Debug, Clone, Copy, PartialEq)]
enum WState {
    Waiting,
    Granted,
    TimedOut,
    Closed,
}

#[derive(Debug)]
struct MWaiter {
    kv: u64,
    class: usize,
    deadline: u64,
    state: WState,
}

#[derive(Debug)]
struct Model {
    max_in_flight: usize,
    kv_capacity: u64,
    queue_capacity: usize,
    now: u64,
    closed: bool,
    in_flight: usize,
    kv_used: u64,
    waiters: Vec<MWaiter>,
    queues: [VecDeque<usize>; 3],
}

impl Model {
    fn fits(&self, kv: u64) -> bool {
        self.in_flight < self.max_in_flight && self.kv_used + kv <= self.kv_capacity
    }
    fn take(&mut self, kv: u64) {
        self.in_flight += 1;
        self.kv_used += kv;
    }
    fn give(&mut self, kv: u64) {
        self.in_flight -= 1;
        self.kv_used -= kv;
    }
    fn queued(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }
    fn pass(&mut self) {
        for class in (0..3).rev() {
            while let Some(&id) = self.queues[class].front() {
                if self.closed {
                    self.waiters[id].state = WState::Closed;
                } else if self.fits(self.waiters[id].kv) {
                    self.take(self.waiters[id].kv);
                    self.waiters[id].state = WState::Granted;
                } else {
                    return;
                }
                self.queues[class].pop_front();
            }
        }
    }
    /// Returns Ok(true) admitted at once, Ok(false) queued (new waiter id = waiters.len() - 1).
    fn admit(&mut self, kv: u64, class: usize, max_wait: Option<u64>) -> Result<bool, &'static str> {
        if self.closed {
            return Err("closed");
        }
        if kv > self.kv_capacity {
            return Err("too_large");
        }
        let waiters_ahead = (class..3).any(|c| !self.queues[c].is_empty());
        if !waiters_ahead && self.fits(kv) {
            self.take(kv);
            return Ok(true);
        }
        if self.queue_capacity == 0 {
            return Err("no_capacity");
        }
        // A request that may not wait at all times out before it would take a place.
        let deadline = max_wait.map_or(u64::MAX, |w| self.now + w * 1_000_000);
        if deadline <= self.now {
            return Err("timed_out");
        }
        if self.queues[class].len() >= self.queue_capacity {
            return Err("queue_full");
        }
        self.waiters.push(MWaiter { kv, class, deadline, state: WState::Waiting });
        self.queues[class].push_back(self.waiters.len() - 1);
        self.pass();
        Ok(false)
    }
    fn cancel(&mut self, id: usize) {
        match self.waiters[id].state {
            WState::Waiting => {
                let class = self.waiters[id].class;
                self.queues[class].retain(|&w| w != id);
            }
            WState::Granted => self.give(self.waiters[id].kv),
            _ => {}
        }
        self.pass();
    }
    fn advance(&mut self, ms: u64) {
        self.now += ms * 1_000_000;
        let now = self.now;
        for class in 0..3 {
            let expired: Vec<usize> =
                self.queues[class].iter().copied().filter(|&id| self.waiters[id].deadline <= now).collect();
            for id in expired {
                self.waiters[id].state = WState::TimedOut;
                self.queues[class].retain(|&w| w != id);
            }
        }
        self.pass();
    }
}

proptest! {
    #![proptest_config(support::proptest_config(256))]

    #[test]
    fn waiting_room_matches_sequential_model(
        max_in_flight in 1usize..4,
        kv_capacity in 20u64..100,
        queue_capacity in 0usize..4,
        ops in prop::collection::vec(op(), 1..150),
    ) {
        let clock = ManualClock::new();
        let admission = Admission::builder()
            .max_in_flight(max_in_flight)
            .kv_capacity_tokens(kv_capacity)
            .queue_capacity(queue_capacity)
            .deadline_timer(false)
            .clock(clock.clone())
            .build()
            .unwrap();
        let mut model = Model {
            max_in_flight, kv_capacity, queue_capacity, now: 0, closed: false, in_flight: 0, kv_used: 0,
            waiters: Vec::new(), queues: Default::default(),
        };
        // (future, model waiter id)
        let mut futures: Vec<(Admit, usize)> = Vec::new();
        // (permit, kv, model waiter id if it came from the queue)
        let mut permits: Vec<(Permit, u64)> = Vec::new();

        for op in ops {
            match op {
                Op::Admit { kv, class, max_wait_ms } => {
                    let mut request = Request::new(kv, 0).priority(CLASSES[class]);
                    if let Some(ms) = max_wait_ms {
                        request = request.max_wait(Duration::from_millis(ms));
                    }
                    let mut fut = admission.admit(&request);
                    let real = (&mut fut).now_or_never();
                    let expected = model.admit(u64::from(kv), class, max_wait_ms);
                    match (real, expected) {
                        (Some(Ok(p)), Ok(true)) => permits.push((p, u64::from(kv))),
                        (None, Ok(false)) => futures.push((fut, model.waiters.len() - 1)),
                        (Some(Err(r)), Err(e)) => prop_assert_eq!(r.reason(), e),
                        (real, expected) => prop_assert!(false, "admit: real {:?} vs model {:?}", real.map(|r| r.map(|_| "permit")), expected),
                    }
                }
                Op::Poll(i) if !futures.is_empty() => {
                    let i = i % futures.len();
                    let id = futures[i].1;
                    let real = (&mut futures[i].0).now_or_never();
                    match (real, model.waiters[id].state) {
                        (None, WState::Waiting) => {}
                        (Some(Ok(p)), WState::Granted) => {
                            drop(futures.remove(i));
                            permits.push((p, model.waiters[id].kv));
                            // Granted capacity now belongs to the permit (model keeps it as taken).
                            model.waiters[id].state = WState::Closed; // picked up: no longer cancellable
                            model.waiters[id].kv = 0;
                        }
                        (Some(Err(Rejection::TimedOut)), WState::TimedOut)
                        | (Some(Err(Rejection::Closed)), WState::Closed) => drop(futures.remove(i)),
                        (real, state) => prop_assert!(false, "poll {}: real {:?} vs model {:?}", id, real.map(|r| r.map(|_| "permit")), state),
                    }
                }
                Op::Cancel(i) if !futures.is_empty() => {
                    let i = i % futures.len();
                    let (fut, id) = futures.remove(i);
                    drop(fut);
                    model.cancel(id);
                }
                Op::DropPermit(i) if !permits.is_empty() => {
                    let i = i % permits.len();
                    let (permit, kv) = permits.remove(i);
                    drop(permit);
                    model.give(kv);
                    model.pass();
                }
                Op::Advance(ms) => {
                    clock.advance(Duration::from_millis(ms));
                    admission.expire_waiters();
                    model.advance(ms);
                }
                Op::Close => {
                    admission.close();
                    model.closed = true;
                    model.pass();
                }
                _ => {}
            }
            let s = admission.snapshot();
            prop_assert_eq!(s.in_flight, model.in_flight, "{:?}", model);
            prop_assert_eq!(s.kv_used, model.kv_used);
            prop_assert_eq!(s.queued, model.queued());
        }
        drop(futures);
        drop(permits);
        let s = admission.snapshot();
        prop_assert_eq!((s.in_flight, s.kv_used, s.queued), (0, 0, 0));
    }
}
