//! Loom models of `BoundedQueue`: every interleaving (up to `LOOM_MAX_PREEMPTIONS`) of small scenarios.
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release --test queue_loom
//! ```
#![cfg(loom)]

use kvgate::queue::BoundedQueue;
use loom::sync::Arc;
use loom::thread;

/// Pushes `value`, yielding while the queue is full.
fn push_wait(q: &BoundedQueue<u32>, mut value: u32) {
    while let Err(v) = q.push(value) {
        value = v;
        thread::yield_now();
    }
}

/// Pops one item, yielding while the queue is empty.
fn pop_wait(q: &BoundedQueue<u32>) -> u32 {
    loop {
        match q.pop() {
            Some(v) => return v,
            None => thread::yield_now(),
        }
    }
}

/// Asserts that `seen` holds each of `0..n` exactly once.
fn assert_exactly_once(mut seen: Vec<u32>, n: u32) {
    seen.sort_unstable();
    assert_eq!(seen, (0..n).collect::<Vec<_>>(), "an item was lost or duplicated");
}

/// (a) Two producers and one consumer: every item is popped exactly once, in FIFO order per producer.
#[test]
fn two_producers_one_consumer() {
    loom::model(|| {
        let q = Arc::new(BoundedQueue::new(4));
        // Producer p pushes p*10, p*10 + 1.
        let producers: Vec<_> = (0..2u32)
            .map(|p| {
                let q = q.clone();
                thread::spawn(move || {
                    for i in 0..2 {
                        q.push(p * 10 + i).expect("capacity covers all items");
                    }
                })
            })
            .collect();
        let consumer = {
            let q = q.clone();
            thread::spawn(move || (0..2).filter_map(|_| q.pop()).collect::<Vec<_>>())
        };
        for p in producers {
            p.join().unwrap();
        }
        let mut order = consumer.join().unwrap();
        while let Some(v) = q.pop() {
            order.push(v);
        }
        assert!(q.is_empty());
        let mut all = order.clone();
        all.sort_unstable();
        assert_eq!(all, [0, 1, 10, 11], "an item was lost or duplicated");
        for p in 0..2 {
            let mine: Vec<_> = order.iter().copied().filter(|v| v / 10 == p).collect();
            assert_eq!(mine, [p * 10, p * 10 + 1], "FIFO order broken for producer {p}");
        }
    });
}

/// (b) Capacity 2, one producer and one consumer moving 5 items: the counters wrap around the ring over
/// several laps while both threads race on every slot.
#[test]
fn wrap_around_capacity_two() {
    loom::model(|| {
        const N: u32 = 5;
        let q = Arc::new(BoundedQueue::new(2));
        // Start mid-ring so the race also crosses a lap boundary at an odd index.
        q.push(100).unwrap();
        assert_eq!(q.pop(), Some(100));
        let producer = {
            let q = q.clone();
            thread::spawn(move || {
                for i in 0..N {
                    push_wait(&q, i);
                }
            })
        };
        let received: Vec<_> = (0..N).map(|_| pop_wait(&q)).collect();
        producer.join().unwrap();
        assert_eq!(received, (0..N).collect::<Vec<_>>(), "FIFO order broken");
        assert!(q.is_empty());
        assert_eq!(q.len(), 0);
    });
}

/// (c) `force_push` racing `pop` on a full queue: popped + displaced + left == pushed, each exactly once,
/// and what is left is in push order.
#[test]
fn force_push_races_pop() {
    loom::model(|| {
        let q = Arc::new(BoundedQueue::new(2));
        q.push(0).unwrap();
        q.push(1).unwrap();
        let forcer = {
            let q = q.clone();
            thread::spawn(move || [2, 3].into_iter().filter_map(|v| q.force_push(v)).collect::<Vec<_>>())
        };
        let popper = {
            let q = q.clone();
            thread::spawn(move || (0..2).filter_map(|_| q.pop()).collect::<Vec<_>>())
        };
        let displaced = forcer.join().unwrap();
        let popped = popper.join().unwrap();
        assert!(popped.windows(2).all(|w| w[0] < w[1]), "pops out of order: {popped:?}");
        assert!(displaced.windows(2).all(|w| w[0] < w[1]), "displaced out of order: {displaced:?}");
        let left: Vec<_> = Arc::try_unwrap(q).unwrap().into_iter().collect();
        assert!(left.windows(2).all(|w| w[0] < w[1]), "left out of order: {left:?}");
        assert!(left.len() <= 2);
        assert_exactly_once([popped, displaced, left].concat(), 4);
    });
}

/// (c') Capacity 1: `force_push` and `pop` fight over the single slot, which both of them empty and refill.
///
/// Only two threads touch the queue: with a third one, loom explores the unfair schedule in which two
/// threads waiting for a preempted one hand the processor back and forth forever, and gives up on it.
#[test]
fn force_push_races_pop_capacity_one() {
    loom::model(|| {
        let q = Arc::new(BoundedQueue::new(1));
        q.push(0).unwrap();
        let forcer = {
            let q = q.clone();
            thread::spawn(move || [1, 2].into_iter().filter_map(|v| q.force_push(v)).collect::<Vec<_>>())
        };
        let popped: Vec<_> = (0..2).filter_map(|_| q.pop()).collect();
        let displaced = forcer.join().unwrap();
        assert!(popped.windows(2).all(|w| w[0] < w[1]), "pops out of order: {popped:?}");
        let q = Arc::try_unwrap(q).unwrap();
        assert!(q.len() <= 1);
        let left: Vec<_> = q.into_iter().collect();
        assert_exactly_once([popped, displaced, left].concat(), 3);
    });
}
