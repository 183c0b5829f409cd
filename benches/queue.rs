//! `BoundedQueue` against the queues a user would otherwise pick: crossbeam's `ArrayQueue` and
//! `concurrent_queue::ConcurrentQueue::bounded`, side by side in each group.
//!
//! ```sh
//! cargo bench --bench queue -- --warm-up-time 1 --measurement-time 3
//! ```

use std::hint::black_box;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvgate::queue::BoundedQueue;

/// The common shape of the three queues.
trait Queue: Sync + Sized {
    const NAME: &'static str;
    fn bounded(cap: usize) -> Self;
    fn try_push(&self, v: u64) -> Result<(), u64>;
    fn try_pop(&self) -> Option<u64>;
}

/// `BoundedQueue` has the API of crossbeam's `ArrayQueue` (`new`, `push -> Result<(), T>`, `pop`), so one
/// implementation serves both: if the APIs drifted apart, this would stop compiling.
macro_rules! array_queue_api {
    ($queue:ty, $name:literal) => {
        impl Queue for $queue {
            const NAME: &'static str = $name;
            fn bounded(cap: usize) -> Self {
                <$queue>::new(cap)
            }
            #[inline]
            fn try_push(&self, v: u64) -> Result<(), u64> {
                self.push(v)
            }
            #[inline]
            fn try_pop(&self) -> Option<u64> {
                self.pop()
            }
        }
    };
}

array_queue_api!(BoundedQueue<u64>, "kvgate::BoundedQueue");
array_queue_api!(crossbeam_queue::ArrayQueue<u64>, "crossbeam::ArrayQueue");

impl Queue for concurrent_queue::ConcurrentQueue<u64> {
    const NAME: &'static str = "concurrent_queue::bounded";
    fn bounded(cap: usize) -> Self {
        concurrent_queue::ConcurrentQueue::bounded(cap)
    }
    #[inline]
    fn try_push(&self, v: u64) -> Result<(), u64> {
        self.push(v).map_err(|e| e.into_inner())
    }
    #[inline]
    fn try_pop(&self) -> Option<u64> {
        self.pop().ok()
    }
}

const CAPACITY: usize = 1024;
/// Items moved per measured iteration of the threaded groups.
const MESSAGES: u64 = 20_000;

fn push_pop_single_thread<Q: Queue>(c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    let q = Q::bounded(CAPACITY);
    c.bench_function(BenchmarkId::from_parameter(Q::NAME), |b| {
        b.iter(|| {
            let _ = q.try_push(black_box(7));
            black_box(q.try_pop())
        })
    });
}

/// Moves `MESSAGES` items from `producers` threads to `consumers` threads, yielding on full/empty (the
/// reference machine has 2 shared cores, where pure spinning measures the OS scheduler).
fn transfer<Q: Queue>(producers: u64, consumers: u64) -> Duration {
    let q = Q::bounded(CAPACITY);
    let per_producer = MESSAGES / producers;
    let per_consumer = MESSAGES / consumers;
    let start = Instant::now();
    thread::scope(|s| {
        for _ in 0..producers {
            s.spawn(|| {
                for i in 0..per_producer {
                    let mut v = i;
                    while let Err(back) = q.try_push(v) {
                        v = back;
                        thread::yield_now();
                    }
                }
            });
        }
        for _ in 0..consumers {
            s.spawn(|| {
                let mut sum = 0u64;
                for _ in 0..per_consumer {
                    loop {
                        if let Some(v) = q.try_pop() {
                            sum = sum.wrapping_add(v);
                            break;
                        }
                        thread::yield_now();
                    }
                }
                black_box(sum);
            });
        }
    });
    start.elapsed()
}

fn threaded<Q: Queue>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    producers: u64,
    consumers: u64,
) {
    g.bench_function(BenchmarkId::from_parameter(Q::NAME), |b| {
        b.iter_custom(|iters| (0..iters).map(|_| transfer::<Q>(producers, consumers)).sum())
    });
}

fn benches(c: &mut Criterion) {
    {
        let mut g = c.benchmark_group("push_pop_single_thread");
        g.throughput(Throughput::Elements(1));
        push_pop_single_thread::<BoundedQueue<u64>>(&mut g);
        push_pop_single_thread::<crossbeam_queue::ArrayQueue<u64>>(&mut g);
        push_pop_single_thread::<concurrent_queue::ConcurrentQueue<u64>>(&mut g);
        g.finish();
    }
    for (name, producers, consumers) in [("spsc_1p1c", 1, 1), ("mpmc_2p2c", 2, 2)] {
        let mut g = c.benchmark_group(name);
        g.throughput(Throughput::Elements(MESSAGES));
        g.sample_size(20);
        threaded::<BoundedQueue<u64>>(&mut g, producers, consumers);
        threaded::<crossbeam_queue::ArrayQueue<u64>>(&mut g, producers, consumers);
        threaded::<concurrent_queue::ConcurrentQueue<u64>>(&mut g, producers, consumers);
        g.finish();
    }
}

criterion_group!(queue, benches);
criterion_main!(queue);
