//! Helpers shared by the integration tests: a real `redis-server` per test, and raw Redis access to
//! look at what the scripts wrote.
#![allow(dead_code)] // each test file uses a different subset

use kvgate::Admission;
use kvgate::clock::{Clock, ManualClock};
use kvgate_redis::server::LocalRedis;
use kvgate_redis::{SharedAdmission, SharedLimits, TimeSource};

/// A fresh server, or `None` (the test prints that it skipped) when `redis-server` is missing and `CI`
/// is not set.
pub fn redis() -> Option<LocalRedis> {
    LocalRedis::for_test().expect("redis-server should start")
}

/// A raw connection for looking at keys, memory, or sending `DEBUG SLEEP`.
pub async fn raw(redis: &LocalRedis) -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap()
}

/// Runs one command on a fresh connection.
pub async fn cmd<T: redis::FromRedisValue>(redis: &LocalRedis, args: &[&str]) -> T {
    let mut conn = raw(redis).await;
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query_async(&mut conn).await.unwrap()
}

/// Limits under `name` with a call timeout generous enough for a loaded 2-core machine (tests about
/// timeouts set their own after it).
pub fn limits(name: &str) -> SharedLimits {
    SharedLimits::new(name).call_timeout(std::time::Duration::from_secs(1))
}

/// A shared admission with no local limits around `limits`.
pub async fn shared(redis: &LocalRedis, limits: SharedLimits) -> SharedAdmission {
    let local = Admission::builder().queue_capacity(100_000).build().unwrap();
    SharedAdmission::connect(&redis.url(), local, limits).await.unwrap()
}

/// A shared admission whose scripts and local admission read `clock` (whole microseconds).
pub async fn manual(redis: &LocalRedis, limits: SharedLimits, clock: &ManualClock) -> SharedAdmission<ManualClock> {
    let local = Admission::builder().clock(clock.clone()).queue_capacity(100_000).build().unwrap();
    let limits = limits.time_source(TimeSource::Manual(clock.clone()));
    SharedAdmission::connect(&redis.url(), local, limits).await.unwrap()
}

/// Redis' clock in microseconds.
pub async fn redis_micros(redis: &LocalRedis) -> u64 {
    let (secs, micros): (u64, u64) = cmd(redis, &["TIME"]).await;
    secs * 1_000_000 + micros
}

/// Waits (real time) until `f` holds, up to `limit`; returns whether it did.
pub async fn eventually<F: AsyncFnMut() -> bool>(limit: std::time::Duration, mut f: F) -> bool {
    let clock = kvgate::clock::MonotonicClock::new();
    let end = clock.now_nanos() + limit.as_nanos() as u64;
    loop {
        if f().await {
            return true;
        }
        if clock.now_nanos() >= end {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
