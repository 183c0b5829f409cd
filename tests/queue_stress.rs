//! Threaded stress tests for `BoundedQueue`: conservation of items and exactly-once drops.
//!
//! Sizes shrink under miri (`cfg!(miri)`), as crossbeam's tests do.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;

use kvgate::queue::BoundedQueue;
use kvgate::retry::SplitMix64;

const THREADS: usize = if cfg!(miri) { 3 } else { 4 };
const OPS_PER_THREAD: usize = if cfg!(miri) { 150 } else { 50_000 };

/// Per-id drop counters shared by every [`Tracked`] item of one test.
#[derive(Debug)]
struct Drops(Vec<AtomicUsize>);

impl Drops {
    fn new(ids: usize) -> Arc<Self> {
        Arc::new(Self((0..ids).map(|_| AtomicUsize::new(0)).collect()))
    }

    fn count(&self, id: usize) -> usize {
        self.0[id].load(Ordering::SeqCst)
    }

    /// Asserts that each of the first `created` ids was dropped exactly once.
    fn assert_each_dropped_once(&self, created: usize) {
        for id in 0..created {
            assert_eq!(self.count(id), 1, "item {id} dropped {} times", self.count(id));
        }
    }
}

/// An item that records its own drop, so double drops and leaks are visible.
#[derive(Debug)]
struct Tracked {
    id: usize,
    /// Which thread created it and its sequence number there, for the per-producer FIFO check.
    producer: usize,
    seq: usize,
    drops: Arc<Drops>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.drops.0[self.id].fetch_add(1, Ordering::SeqCst);
    }
}

/// What one worker thread saw.
#[derive(Default)]
struct Log {
    /// Ids the queue accepted (`push` returned `Ok`, or `force_push` ran).
    accepted: Vec<usize>,
    /// Ids this thread popped, in pop order, with their producer and sequence number.
    popped: Vec<(usize, usize, usize)>,
    /// Ids `force_push` handed back to this thread.
    displaced: Vec<usize>,
    /// Ids `push` refused.
    refused: Vec<usize>,
}

/// `THREADS` threads each run a random mix of push / force_push / pop on one queue of capacity `cap`, then
/// the queue is partly drained through `into_iter` and the iterator is dropped with items still in it.
fn run_mixed(cap: usize, seed: u64) {
    let created = THREADS * OPS_PER_THREAD;
    let drops = Drops::new(created);
    let q = Arc::new(BoundedQueue::new(cap));

    let logs: Vec<Log> = thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let q = &q;
                let drops = &drops;
                s.spawn(move || {
                    let mut rng = SplitMix64::new(seed ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                    let mut log = Log::default();
                    for seq in 0..OPS_PER_THREAD {
                        // Every iteration creates one item; it is used only by the push variants.
                        let id = t * OPS_PER_THREAD + seq;
                        let item = Tracked { id, producer: t, seq, drops: Arc::clone(drops) };
                        match rng.next_u64() % 8 {
                            0..=2 => match q.push(item) {
                                Ok(()) => log.accepted.push(id),
                                Err(back) => log.refused.push(back.id),
                            },
                            3 => {
                                log.accepted.push(id);
                                if let Some(old) = q.force_push(item) {
                                    log.displaced.push(old.id);
                                }
                            }
                            _ => {
                                drop(item); // never entered the queue
                                log.refused.push(id);
                                if let Some(v) = q.pop() {
                                    log.popped.push((v.id, v.producer, v.seq));
                                }
                            }
                        }
                    }
                    log
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });

    // Per-producer FIFO: one consumer sees each producer's items in that producer's order.
    for log in &logs {
        let mut last_seq = [None; THREADS];
        for &(id, producer, seq) in &log.popped {
            assert!(last_seq[producer] < Some(seq), "item {id} popped out of order");
            last_seq[producer] = Some(seq);
        }
    }

    let q = Arc::try_unwrap(q).expect("all workers joined");
    let left = q.len();
    assert!(left <= cap);
    let mut iter = q.into_iter();
    assert_eq!(iter.len(), left);
    let drained: Vec<usize> = iter.by_ref().take(left / 2).map(|v| v.id).collect();
    let dropped_in_iter = iter.len();
    assert_eq!(drained.len() + dropped_in_iter, left);
    drop(iter);

    // Conservation: every accepted id left the queue exactly once, through one of four exits.
    let mut accepted: Vec<usize> = logs.iter().flat_map(|l| l.accepted.iter().copied()).collect();
    let mut out: Vec<usize> = logs
        .iter()
        .flat_map(|l| l.popped.iter().map(|p| p.0).chain(l.displaced.iter().copied()))
        .chain(drained)
        .collect();
    let out_len = out.len();
    accepted.sort_unstable();
    out.sort_unstable();
    out.dedup();
    assert_eq!(out.len(), out_len, "an item left the queue twice");
    assert!(out.iter().all(|id| accepted.binary_search(id).is_ok()), "an item appeared from nowhere");
    assert_eq!(accepted.len(), out.len() + dropped_in_iter, "an item was lost");
    let refused: usize = logs.iter().map(|l| l.refused.len()).sum();
    assert_eq!(accepted.len() + refused, created);

    // Exactly-once drops, including the items dropped inside the partly consumed iterator.
    drops.assert_each_dropped_once(created);
}

#[test]
fn mixed_ops_capacity_1() {
    run_mixed(1, 1);
}

#[test]
fn mixed_ops_capacity_2() {
    run_mixed(2, 2);
}

#[test]
fn mixed_ops_capacity_7() {
    run_mixed(7, 3);
}

#[test]
fn mixed_ops_capacity_64() {
    run_mixed(64, 4);
}

/// Dedicated producers and consumers: every item arrives exactly once, per-producer FIFO.
#[test]
fn producers_and_consumers() {
    const PRODUCERS: usize = 2;
    const CONSUMERS: usize = 2;
    let per_producer = if cfg!(miri) { 100 } else { 100_000 };
    let q = BoundedQueue::new(16);
    let popped = AtomicUsize::new(0);
    let total = PRODUCERS * per_producer;
    let mut seen: Vec<Vec<(usize, usize)>> = thread::scope(|s| {
        for p in 0..PRODUCERS {
            let q = &q;
            s.spawn(move || {
                for i in 0..per_producer {
                    let mut item = (p, i);
                    while let Err(back) = q.push(item) {
                        item = back;
                        thread::yield_now();
                    }
                }
            });
        }
        let consumers: Vec<_> = (0..CONSUMERS)
            .map(|_| {
                let (q, popped) = (&q, &popped);
                s.spawn(move || {
                    let mut got = Vec::new();
                    while popped.load(Ordering::Relaxed) < total {
                        match q.pop() {
                            Some(v) => {
                                popped.fetch_add(1, Ordering::Relaxed);
                                got.push(v);
                            }
                            None => thread::yield_now(),
                        }
                    }
                    got
                })
            })
            .collect();
        consumers.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for got in &seen {
        for p in 0..PRODUCERS {
            let mine: Vec<_> = got.iter().filter(|v| v.0 == p).map(|v| v.1).collect();
            assert!(mine.windows(2).all(|w| w[0] < w[1]), "producer {p} items out of order");
        }
    }
    let mut all: Vec<_> = seen.drain(..).flatten().collect();
    all.sort_unstable();
    let expected: Vec<_> = (0..PRODUCERS).flat_map(|p| (0..per_producer).map(move |i| (p, i))).collect();
    assert_eq!(all, expected);
    assert!(q.is_empty());
}

/// Dropping a queue (after several laps) drops each remaining item exactly once and nothing else again.
#[test]
fn drop_releases_remaining_items_once() {
    let cap = 5;
    let created = 3 + 15 * 3;
    let drops = Drops::new(created);
    let q = BoundedQueue::new(cap);
    let mut next = 0;
    let mut make = || {
        let id = next;
        next += 1;
        Tracked { id, producer: 0, seq: id, drops: Arc::clone(&drops) }
    };
    for _ in 0..3 {
        q.push(make()).unwrap();
    }
    for _ in 0..15 {
        drop(q.force_push(make()));
        drop(q.pop());
        q.push(make()).map_err(drop).ok();
    }
    assert!(next <= created);
    let left = q.len();
    assert!(left > 0);
    let before: usize = (0..next).map(|id| drops.count(id)).sum();
    drop(q);
    let after: usize = (0..next).map(|id| drops.count(id)).sum();
    assert_eq!(after - before, left);
    drops.assert_each_dropped_once(next);
}

/// A panicking destructor does not stop the queue from dropping the other items.
#[test]
fn drop_continues_after_a_panicking_item() {
    struct Bomb(Arc<AtomicUsize>, bool);
    impl Drop for Bomb {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
            if self.1 {
                panic!("boom");
            }
        }
    }
    let count = Arc::new(AtomicUsize::new(0));
    let q = BoundedQueue::new(4);
    q.push(Bomb(count.clone(), false)).ok().unwrap();
    q.push(Bomb(count.clone(), true)).ok().unwrap();
    q.push(Bomb(count.clone(), false)).ok().unwrap();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(q)));
    assert!(result.is_err());
    assert_eq!(count.load(Ordering::SeqCst), 3);
}

/// Zero-sized items still obey the capacity and are counted.
#[test]
fn zero_sized_items() {
    let q = BoundedQueue::new(3);
    for _ in 0..3 {
        q.push(()).unwrap();
    }
    assert_eq!(q.push(()), Err(()));
    assert_eq!(q.force_push(()), Some(()));
    assert_eq!(q.len(), 3);
    assert_eq!(q.into_iter().count(), 3);
}
