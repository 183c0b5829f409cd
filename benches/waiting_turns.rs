//! The waiting drain of `benches/waiting.rs` measured in turns: one drain of kvgate, one of tokio's
//! `Semaphore::acquire_many`, one of tokio in a future padded to kvgate's size, and again, in one process,
//! so that the machine's drift falls on the three alike. Criterion measures its rows one after the other,
//! seconds apart; on a shared VM whose speed wanders, that moves the ratio more than the code does.
//!
//! ```text
//! cargo bench -p kvgate --bench waiting_turns              # 300 rounds after 10 of warm-up
//! cargo bench -p kvgate --bench waiting_turns -- 1000      # more rounds
//! ```
//!
//! It prints the median time of a drain of each, and kvgate's and the padded row's ratios to tokio.
//! `-- --test` (how CI runs every bench) does two rounds and checks that every drain completes.

use kvgate::{Admission, Request};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::Semaphore;

const TASKS: usize = 1_000;
const PERMITS: usize = 8;
const WARM_UP: usize = 10;

/// Bytes that make `padded_task`'s future as large as `kvgate_task`'s (checked in `main`).
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

#[derive(Clone, Copy)]
enum Row {
    Kvgate,
    Tokio,
    Padded,
}

const ROWS: [Row; 3] = [Row::Kvgate, Row::Tokio, Row::Padded];

/// One drain: `TASKS` tasks spawned at once, all awaited; its wall time in microseconds.
fn drain(runtime: &tokio::runtime::Runtime, row: Row, admission: &Admission, semaphore: &Arc<Semaphore>) -> f64 {
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

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let test = args.iter().any(|a| a == "--test");
    let rounds =
        if test { 2 } else { args.iter().find_map(|a| a.parse::<usize>().ok()).filter(|&n| n > 0).unwrap_or(300) };
    let warm_up = if test { 0 } else { WARM_UP };

    let admission = Admission::builder()
        .max_in_flight(PERMITS)
        .kv_capacity_tokens(8 * 1024)
        .queue_capacity(TASKS)
        .build()
        .expect("valid limits");
    let semaphore = Arc::new(Semaphore::new(8 * 1024));
    let kvgate_size = std::mem::size_of_val(&kvgate_task(admission.clone()));
    let padded_size = std::mem::size_of_val(&padded_task(Arc::clone(&semaphore)));
    let tokio_size = std::mem::size_of_val(&tokio_task(Arc::clone(&semaphore)));
    assert_eq!(kvgate_size, padded_size, "the kvgate task's future is {kvgate_size} bytes: adjust PADDING");

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().expect("a runtime");
    let mut times = [Vec::new(), Vec::new(), Vec::new()];
    for round in 0..warm_up + rounds {
        for (i, row) in ROWS.into_iter().enumerate() {
            let us = drain(&runtime, row, &admission, &semaphore);
            if round >= warm_up {
                times[i].push(us);
            }
        }
    }
    let snapshot = admission.snapshot();
    assert_eq!((snapshot.in_flight, snapshot.queued), (0, 0), "every permit returned");
    assert_eq!(semaphore.available_permits(), 8 * 1024, "every tokio permit returned");

    let [kvgate, tokio, padded] = times.map(|mut t| median(&mut t));
    println!(
        "waiting drain in turns, {TASKS} tasks, {PERMITS} permits, {rounds} rounds (medians): kvgate {kvgate:.0} µs, \
         tokio {tokio:.0} µs ({tokio_size}-byte future), tokio padded to kvgate's future ({kvgate_size} bytes) \
         {padded:.0} µs; kvgate/tokio {:.3}×, padded/tokio {:.3}×",
        kvgate / tokio,
        padded / tokio
    );
}
