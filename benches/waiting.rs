//! Waiting admission against tokio's Semaphore: 1,000 tokio tasks contend for 8 permits, each holds its
//! permit for one yield; the time to drain them all. `cargo bench --bench waiting`.
//!
//! A third row runs tokio's semaphore in a task whose future is padded to the size of the kvgate task's
//! (the request, the admission handle and the `Admit` future are larger than tokio's `Acquire`): the
//! executor moves each task's future several times, so it shows what the size alone costs.

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
    group.finish();
}

/// Bytes that make `padded_task`'s future as large as `kvgate_task`'s (checked in `main`).
const PADDING: usize = 224;

async fn kvgate_task(admission: Admission) {
    let permit = admission.admit(&Request::new(512, 512)).await.unwrap();
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

/// Fails when the padding no longer matches (the kvgate future's size changed): update `PADDING`.
fn check_padding() {
    let admission = Admission::builder().max_in_flight(1).build().unwrap();
    let kvgate = std::mem::size_of_val(&kvgate_task(admission));
    let padded = std::mem::size_of_val(&padded_task(Arc::new(Semaphore::new(1))));
    assert_eq!(kvgate, padded, "the kvgate task's future is {kvgate} bytes, the padded one {padded}: adjust PADDING");
}

fn padding(_: &mut Criterion) {
    check_padding();
}

criterion_group!(benches, padding, drain);
criterion_main!(benches);
