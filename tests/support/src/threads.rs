//! [`time_on_two_threads`]: the timing loop of the contended benches.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

/// Runs `op` `iters` times on each of two threads released together by a barrier, and returns the time
/// each thread took for its own `iters` calls (a bench reports the slower, or the mean).
///
/// # Panics
///
/// When `op` panics on either thread.
pub fn time_on_two_threads(iters: u64, op: impl Fn() + Send + Clone + 'static) -> [Duration; 2] {
    let barrier = Arc::new(Barrier::new(2));
    let workers = [(); 2].map(|()| {
        let (barrier, op) = (Arc::clone(&barrier), op.clone());
        thread::spawn(move || {
            barrier.wait();
            let start = Instant::now();
            for _ in 0..iters {
                op();
            }
            start.elapsed()
        })
    });
    workers.map(|w| w.join().expect("a bench thread panicked"))
}
