//! Three replicas (three `SharedAdmission`s, each with its own connection and background tasks) share
//! one real Redis: the global rate holds under 3x overload, and the engine never sees more than the
//! shared capacity.

mod support;

use kvgate::Request;
use kvgate_redis::{Allowance, SharedAdmission, SharedLimits};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

const REPLICAS: usize = 3;

/// Every replica offers `per_replica` requests per second with `try_admit` for `seconds`; returns the
/// admissions and the Redis time that passed (µs).
async fn overload(
    redis: &kvgate_redis::server::LocalRedis,
    limits: SharedLimits,
    per_replica: f64,
    seconds: u64,
) -> (u64, u64, Vec<SharedAdmission>) {
    let mut replicas = Vec::new();
    for _ in 0..REPLICAS {
        replicas.push(support::shared(redis, limits.clone()).await);
    }
    let admitted = Arc::new(AtomicU64::new(0));
    let start = support::redis_micros(redis).await;
    let mut tasks = Vec::new();
    for replica in &replicas {
        let (replica, admitted) = (replica.clone(), Arc::clone(&admitted));
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_replica));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let ticks = (per_replica * seconds as f64) as u64;
            for _ in 0..ticks {
                tick.tick().await;
                if let Ok(permit) = replica.try_admit(&Request::new(10, 10)).await {
                    admitted.fetch_add(1, Ordering::Relaxed);
                    drop(permit);
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = support::redis_micros(redis).await - start;
    (admitted.load(Ordering::Relaxed), elapsed, replicas)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_hold_the_global_rate_under_3x_overload_for_20s() {
    let Some(redis) = support::redis() else { return };
    let (rate, burst) = (100.0, 10);
    let limits = support::limits("overload").request_rate(rate, burst);
    let (admitted, elapsed_us, replicas) = overload(&redis, limits, rate, 20).await;
    let allowed = f64::from(burst) + rate * elapsed_us as f64 / 1e6;
    let ratio = admitted as f64 / (rate * elapsed_us as f64 / 1e6);
    eprintln!("admitted {admitted} in {elapsed_us} µs of Redis time: {ratio:.4} of the rate (bound {allowed:.1})");
    // GCRA's bound is exact: never more than the burst plus what accrued.
    assert!(admitted as f64 <= allowed, "admitted {admitted} > {allowed}");
    assert!(ratio > 0.95, "the replicas together got {ratio:.3} of the rate under 3x overload");
    let decided: u64 = replicas.iter().map(|r| r.stats().redis_admissions).sum();
    assert_eq!(decided, admitted, "every admission was decided in Redis");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_allowance_overshoots_by_at_most_replicas_times_batch() {
    let Some(redis) = support::redis() else { return };
    let (rate, burst, batch) = (100.0, 10, 10);
    let limits = support::limits("allowance").request_rate(rate, burst).allowance(Allowance::new().requests(batch));
    let (admitted, elapsed_us, replicas) = overload(&redis, limits, rate, 5).await;
    // Tokens held in the allowances at the end were charged but not spent.
    let held: u64 = replicas.iter().map(|r| r.allowance_held().0).sum();
    let accrued = f64::from(burst) + rate * elapsed_us as f64 / 1e6;
    let overshoot = admitted as f64 - accrued;
    eprintln!(
        "admitted {admitted} (allowance {}), {held} held unspent, accrued {accrued:.1}: overshoot {overshoot:.1} \
         (bound {})",
        replicas.iter().map(|r| r.stats().allowance_admissions).sum::<u64>(),
        REPLICAS as u64 * batch
    );
    assert!(overshoot <= (REPLICAS as u64 * batch) as f64, "overshoot {overshoot}");
    // Under overload the buckets are mostly empty, so batches are small: the allowance serves whatever
    // it got, and the rest is decided in Redis.
    assert!(replicas.iter().map(|r| r.stats().allowance_admissions).sum::<u64>() > 0);
}

/// A small deterministic generator (xorshift) for request sizes and hold times.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_never_exceed_the_shared_capacity() {
    let Some(redis) = support::redis() else { return };
    const SLOTS: u64 = 6;
    const KV: u64 = 6_000;
    let limits =
        support::limits("capacity").max_in_flight(SLOTS).kv_capacity(KV).poll_interval(Duration::from_millis(20));
    let mut replicas = Vec::new();
    for _ in 0..REPLICAS {
        replicas.push(support::shared(&redis, limits.clone()).await);
    }
    // The engine: what really runs at each instant, across every replica.
    let running = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    let served = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (r, replica) in replicas.iter().enumerate() {
        for w in 0..8u64 {
            let (replica, running, served, stop) = (replica.clone(), running.clone(), served.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let mut rng = 0x9e37_79b9_7f4a_7c15 ^ ((r as u64) << 32 | w);
                while !stop.load(Ordering::Relaxed) {
                    let tokens = 200 + next(&mut rng) % 1800;
                    let request = Request::new(tokens as u32 / 2, tokens as u32 / 2).max_wait(Duration::from_secs(5));
                    let Ok(permit) = replica.admit(&request).await else { continue };
                    let kv = permit.kv_reserved();
                    let slots_now = running.0.fetch_add(1, Ordering::SeqCst) + 1;
                    let kv_now = running.1.fetch_add(kv, Ordering::SeqCst) + kv;
                    assert!(slots_now <= SLOTS && kv_now <= KV, "engine runs {slots_now} slots, {kv_now} KV");
                    tokio::time::sleep(Duration::from_millis(1 + next(&mut rng) % 15)).await;
                    running.0.fetch_sub(1, Ordering::SeqCst);
                    running.1.fetch_sub(kv, Ordering::SeqCst);
                    drop(permit);
                    served.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    // Sample Redis and every replica while they run.
    let mut samples = 0;
    for _ in 0..200 {
        let usage = replicas[0].usage().await.unwrap();
        assert!(usage.consistent, "Redis' totals equal the sum over its leases: {usage:?}");
        assert!(usage.slots <= SLOTS && usage.kv <= KV, "Redis holds {usage:?}");
        for replica in &replicas {
            let (slots, kv) = replica.held();
            assert!(slots <= SLOTS && kv <= KV, "replica {} holds {slots} slots, {kv} KV", replica.replica_id());
        }
        samples += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    for replica in &replicas {
        replica.flush().await;
    }
    let usage = replicas[0].usage().await.unwrap();
    let served = served.load(Ordering::Relaxed);
    eprintln!("{served} requests served, {samples} samples, end usage {usage:?}");
    assert!(served > 100, "the replicas kept serving ({served})");
    assert_eq!((usage.slots, usage.kv, usage.leases), (0, 0, 0), "everything came back: {usage:?}");
    for replica in &replicas {
        assert_eq!(replica.held(), (0, 0));
        assert_eq!(replica.local().snapshot().in_flight, 0);
    }
}

/// The worst case of the allowance: every replica's allowance is full and the shared bucket too, then
/// all replicas burst at once. The overshoot over what the bucket alone admits is measured and bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_allowance_worst_case_is_a_full_batch_per_replica() {
    let Some(redis) = support::redis() else { return };
    let (rate, burst, batch) = (100.0, 10, 10);
    let limits = support::limits("worst").request_rate(rate, burst).allowance(Allowance::new().requests(batch));
    let mut replicas = Vec::new();
    for _ in 0..REPLICAS {
        replicas.push(support::shared(&redis, limits.clone()).await);
    }
    // Light load (30/s of 100/s) keeps every allowance topped up.
    for _ in 0..20 {
        for replica in &replicas {
            let _ = replica.try_admit(&Request::new(1, 1)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The bucket refills to its burst; then everyone bursts.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let held: u64 = replicas.iter().map(|r| r.allowance_held().0).sum();
    let start = support::redis_micros(&redis).await;
    let mut admitted = 0u64;
    for _ in 0..40 {
        for replica in &replicas {
            if replica.try_admit(&Request::new(1, 1)).await.is_ok() {
                admitted += 1;
            }
        }
    }
    let elapsed = support::redis_micros(&redis).await - start;
    let bucket_alone = f64::from(burst) + rate * elapsed as f64 / 1e6;
    let overshoot = admitted as f64 - bucket_alone;
    eprintln!(
        "worst case: {held} held in the allowances, {admitted} admitted in {elapsed} µs where the bucket alone \
         admits {bucket_alone:.1}: overshoot {overshoot:.1} (bound {})",
        REPLICAS as u64 * batch
    );
    assert!(overshoot <= (REPLICAS as u64 * batch) as f64);
}
