//! Waiting admission against tokio's Semaphore: 1,000 tokio tasks contend for 8 permits, each holds its
//! permit for one yield; the time to drain them all. `cargo bench --bench waiting`.
//!
//! A third row runs tokio's semaphore in a task whose future is padded to the size of the kvgate task's
//! (the request, the admission handle and the `Admit` future are larger than tokio's `Acquire`): the
//! executor moves each task's future several times, so it shows what the size alone costs.
//!
//! Criterion measures its rows one after the other, seconds apart; on a shared VM whose speed wanders, that
//! moves their ratio more than the code does. With `TURNS=<rounds>`, the bench also runs the three rows in
//! turns in one process — one drain of each, in a rotating order, `<rounds>` times after 10 of warm-up —
//! and prints the median drain of each and the ratios to tokio (`--test`, as CI runs every bench, does two
//! rounds and checks that every permit came back, as does a run without `--bench`):
//!
//! ```text
//! TURNS=300 cargo bench -p kvgate --bench waiting -- turns   # `turns` matches no criterion row: only the turns
//! ```

use criterion::{Criterion, criterion_group, criterion_main};
use kvgate::{Admission, Request};
use std::sync::Arc;
use std::time::Instant;
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

/// Fails when the padding no longer matches (the kvgate future's size changed): update `PADDING`.
fn check_padding() {
    let admission = Admission::builder().max_in_flight(1).build().unwrap();
    let kvgate = std::mem::size_of_val(&kvgate_task(admission));
    let padded = std::mem::size_of_val(&padded_task(Arc::new(Semaphore::new(1))));
    assert_eq!(kvgate, padded, "the kvgate task's future is {kvgate} bytes, the padded one {padded}: adjust PADDING");
}

/// Checks the padding, and the `TURNS` value before any row runs.
fn padding(_: &mut Criterion) {
    check_padding();
    let _ = turns_wanted();
}

/// The three rows of `drain`, measured in turns.
#[derive(Debug, Clone, Copy)]
enum Row {
    Kvgate,
    Tokio,
    Padded,
}

const ROWS: [Row; 3] = [Row::Kvgate, Row::Tokio, Row::Padded];

/// One drain of `row`: `TASKS` tasks spawned at once, all awaited; its wall time in microseconds.
fn drain_once(runtime: &tokio::runtime::Runtime, row: Row, admission: &Admission, semaphore: &Arc<Semaphore>) -> f64 {
    let started = Instant::now();
    runtime.block_on(async {
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| match row {
                Row::Kvgate => tokio::spawn(kvgate_task(admission.clone())),
                Row::Tokio => tokio::spawn(tokio_task(Arc::clone(semaphore))),
                Row::Padded => tokio::spawn(padded_task(Arc::clone(semaphore))),
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

/// The rows in turns (see the module docs).
fn turns(_: &mut Criterion) {
    let Some((rounds, warm_up)) = turns_wanted() else { return };
    let admission =
        Admission::builder().max_in_flight(PERMITS).kv_capacity_tokens(8 * 1024).queue_capacity(TASKS).build().unwrap();
    let semaphore = Arc::new(Semaphore::new(8 * 1024));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
    let mut times = [Vec::new(), Vec::new(), Vec::new()];
    for round in 0..warm_up + rounds {
        for i in 0..ROWS.len() {
            let row = (round + i) % ROWS.len();
            let us = drain_once(&runtime, ROWS[row], &admission, &semaphore);
            if round >= warm_up {
                times[row].push(us);
            }
        }
    }
    let snapshot = admission.snapshot();
    assert_eq!((snapshot.in_flight, snapshot.queued, snapshot.kv_used), (0, 0, 0), "every permit came back");
    assert_eq!(semaphore.available_permits(), 8 * 1024, "every tokio permit came back");
    let [kvgate, tokio, padded] = times.map(|mut t| {
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    });
    let kvgate_size = std::mem::size_of_val(&kvgate_task(admission.clone()));
    let tokio_size = std::mem::size_of_val(&tokio_task(Arc::clone(&semaphore)));
    println!(
        "waiting drain in turns, {TASKS} tasks, {PERMITS} permits, {rounds} rounds (medians): kvgate {kvgate:.0} µs \
         ({kvgate_size}-byte future), tokio {tokio:.0} µs ({tokio_size}-byte future), tokio padded to kvgate's size \
         {padded:.0} µs; kvgate/tokio {:.3}×, padded/tokio {:.3}×",
        kvgate / tokio,
        padded / tokio
    );
}

criterion_group!(benches, padding, drain, turns);
criterion_main!(benches);
