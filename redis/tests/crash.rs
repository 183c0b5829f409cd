//! `kill -9` of a replica holding permits: its capacity is back within the lease time.
//!
//! The replica is this test binary run again as a child process (the ignored test
//! `replica_holding_permits`), so the kill is a real `SIGKILL` of a real process with its own
//! connection to Redis.

mod support;

use kvgate::Request;
use kvgate_redis::SharedLimits;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(2);
const SLOTS: u64 = 3;

fn limits() -> SharedLimits {
    support::limits("crash").max_in_flight(SLOTS).kv_capacity(10_000).lease_time(LEASE)
}

/// The child: takes every slot, says so, and holds them (renewing) until it is killed.
#[tokio::test]
#[ignore = "run by killed_replica_gives_its_capacity_back_within_the_lease_time as a child process"]
async fn replica_holding_permits() {
    let url = std::env::var("KVGATE_REDIS_CHILD_URL").expect("run by the crash test");
    let local = kvgate::Admission::builder().build().unwrap();
    let admission = kvgate_redis::SharedAdmission::connect(&url, local, limits()).await.unwrap();
    let mut held = Vec::new();
    for _ in 0..SLOTS {
        held.push(admission.try_admit(&Request::new(100, 100)).await.unwrap());
    }
    println!("HELD {}", admission.replica_id());
    // Bounded: the parent kills it long before.
    tokio::time::sleep(Duration::from_secs(60)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_replica_gives_its_capacity_back_within_the_lease_time() {
    let Some(redis) = support::redis() else { return };
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "replica_holding_permits", "--ignored", "--nocapture", "--test-threads=1"])
        .env("KVGATE_REDIS_CHILD_URL", redis.url())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // libtest may print the test's name on the same line first.
    let held = lines.find_map(|line| line.ok().filter(|l| l.contains("HELD "))).expect("the child holds its permits");
    eprintln!("child {held}");

    let survivor = support::shared(&redis, limits()).await;
    let usage = survivor.usage().await.unwrap();
    assert_eq!((usage.slots, usage.leases), (SLOTS, SLOTS), "the child holds every slot");
    assert!(matches!(survivor.try_admit(&Request::new(100, 100)).await, Err(kvgate::Rejection::NoCapacity { .. })));
    // Let one renewal of the child happen, so the kill is not right after the take.
    tokio::time::sleep(LEASE / 2).await;

    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let killed_at = support::redis_micros(&redis).await;
    // Every lease of the child was renewed (or taken) before the kill, so each expires by
    // killed_at + LEASE on Redis' clock. Wait until Redis' clock has passed that, then look.
    let lease_us = LEASE.as_micros() as u64;
    while support::redis_micros(&redis).await < killed_at + lease_us {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let usage = survivor.usage().await.unwrap();
    assert_eq!((usage.slots, usage.kv, usage.leases), (0, 0, 0), "the child's leases expired: {usage:?}");
    assert!(usage.consistent);
    let mut permits = Vec::new();
    for _ in 0..SLOTS {
        permits.push(survivor.try_admit(&Request::new(100, 100)).await.expect("the capacity is back"));
    }
    drop(permits);
    survivor.flush().await;
    assert_eq!(survivor.usage().await.unwrap().slots, 0);
}
