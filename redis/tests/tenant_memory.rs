//! Invented tenant ids cannot grow Redis' memory for longer than a refill: every tenant bucket is a key
//! only while it is not full, with an expiry at the instant it would be full again.
//!
//! CI uses 100,000 ids; `scripts/tenant_memory.sh` runs the full 1,000,000 (`KVGATE_REDIS_TENANTS`).

mod support;

use kvgate::Request;
use kvgate_redis::TenantRates;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

async fn memory(redis: &kvgate_redis::server::LocalRedis) -> (u64, u64) {
    let info: String = support::cmd(redis, &["INFO", "memory"]).await;
    let used = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO memory has used_memory");
    let keys: u64 = support::cmd(redis, &["DBSIZE"]).await;
    (used, keys)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invented_tenant_ids_leave_nothing_behind() {
    let Some(redis) = support::redis() else { return };
    let tenants: u64 = std::env::var("KVGATE_REDIS_TENANTS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    // Each tenant's bucket is full again 2 s after its request: that is the idle time.
    let limits = support::limits("tenants").tenant_defaults(TenantRates::new().request_rate(0.5, 1));
    let admission = support::shared(&redis, limits).await;
    drop(admission.try_admit(&Request::new(1, 1).tenant(0u64)).await.unwrap()); // scripts loaded
    let (baseline, baseline_keys) = memory(&redis).await;
    let next = Arc::new(AtomicU64::new(1));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (admission, next) = (admission.clone(), Arc::clone(&next));
        tasks.push(tokio::spawn(async move {
            loop {
                let id = next.fetch_add(1, Ordering::Relaxed);
                if id > tenants {
                    return;
                }
                let permit = admission.try_admit(&Request::new(1, 1).tenant(id)).await;
                assert!(permit.is_ok(), "tenant {id}: {permit:?}");
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let (during, keys) = memory(&redis).await;
    eprintln!("{tenants} tenants: {baseline} B / {baseline_keys} keys before, {during} B / {keys} keys after the run");
    assert!(keys > baseline_keys, "the run's buckets were in Redis");
    // After the idle time, every tenant key has expired and Redis' memory is back to its baseline.
    let settled = support::eventually(Duration::from_secs(120), async || memory(&redis).await.1 <= baseline_keys).await;
    let (after, keys_after) = memory(&redis).await;
    eprintln!("after the idle time: {after} B, {keys_after} keys");
    assert!(settled, "{keys_after} keys left of {baseline_keys}");
    // Redis shrinks its key table in the background; allow it the memory of a few hundred keys.
    let settled =
        support::eventually(Duration::from_secs(30), async || memory(&redis).await.0 <= baseline + 64 * 1024).await;
    let (after, _) = memory(&redis).await;
    assert!(settled, "used_memory {after} B against a baseline of {baseline} B");
}
