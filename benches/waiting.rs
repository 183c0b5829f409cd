//! Waiting admission against tokio's Semaphore: 1,000 tokio tasks contend for 8 permits, each holds its
//! permit for one yield; the time to drain them all. `cargo bench --bench waiting`.

use criterion::{Criterion, criterion_group, criterion_main};
use kvgate::{Admission, Request};
use std::sync::Arc;
use tokio::sync::Semaphore;

const TASKS: usize = 1_000;
const PERMITS: usize = 8;

fn drain(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
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
                        tokio::spawn(async move {
                            let permit = admission.admit(&Request::new(512, 512)).await.unwrap();
                            tokio::task::yield_now().await;
                            drop(permit);
                        })
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
                        tokio::spawn(async move {
                            let permit = semaphore.acquire_many(1024).await.unwrap();
                            tokio::task::yield_now().await;
                            drop(permit);
                        })
                    })
                    .collect();
                for task in tasks {
                    task.await.unwrap();
                }
            }
        })
    });
    group.finish();
}

criterion_group!(benches, drain);
criterion_main!(benches);
