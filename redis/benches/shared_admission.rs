//! The latency one admission adds when its limits are shared through Redis, next to the in-process
//! path: p50 and p99 of `try_admit` + drop, measured one admission at a time on a local
//! `redis-server` (loopback, started by the bench). `cargo bench -p kvgate-redis --bench
//! shared_admission` prints the table in `BENCHMARKS.md`; `-- --test` runs each case a few times only
//! (CI). Without `redis-server` it says so and measures the in-process path alone.

use kvgate::clock::{Clock, MonotonicClock};
use kvgate::{Admission, Request};
use kvgate_redis::server::LocalRedis;
use kvgate_redis::{Allowance, SharedAdmission, SharedLimits};
use std::hint::black_box;

const RATES: (f64, u32, f64, u64) = (1e6, 1_000_000, 1e8, 100_000_000);

fn percentile(sorted: &[u64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0
}

fn report(name: &str, mut nanos: Vec<u64>) {
    nanos.sort_unstable();
    println!("| {name} | {:.2} µs | {:.2} µs | {} |", percentile(&nanos, 0.5), percentile(&nanos, 0.99), nanos.len());
}

fn local() -> Admission {
    Admission::builder().queue_capacity(0).build().unwrap()
}

async fn shared_case(name: &str, url: &str, limits: SharedLimits, n: usize, clock: &MonotonicClock) {
    let admission = SharedAdmission::connect(url, local(), limits).await.unwrap();
    // Warm up: scripts loaded, connection made, allowance filled.
    for _ in 0..100 {
        drop(admission.try_admit(&Request::new(100, 100)).await.unwrap());
    }
    let mut nanos = Vec::with_capacity(n);
    for _ in 0..n {
        let start = clock.now_nanos();
        let permit = admission.try_admit(black_box(&Request::new(100, 100))).await.unwrap();
        drop(black_box(permit));
        nanos.push(clock.now_nanos() - start);
    }
    admission.flush().await;
    report(name, nanos);
    let stats = admission.stats();
    eprintln!("  {name}: {} from Redis, {} from the allowance", stats.redis_admissions, stats.allowance_admissions);
}

fn main() {
    let quick = std::env::args().any(|a| a == "--test");
    let n = if quick { 200 } else { 20_000 };
    let clock = MonotonicClock::new();
    println!("| path | p50 | p99 | admissions |\n|---|---:|---:|---:|");

    let (rps, rburst, tps, tburst) = RATES;
    let in_process = Admission::builder()
        .max_in_flight(1000)
        .kv_capacity_tokens(1 << 40)
        .request_rate(rps, rburst)
        .token_rate(tps, tburst)
        .build()
        .unwrap();
    let mut nanos = Vec::with_capacity(n);
    for _ in 0..n {
        let start = clock.now_nanos();
        drop(black_box(in_process.try_admit(black_box(&Request::new(100, 100))).unwrap()));
        nanos.push(clock.now_nanos() - start);
    }
    report("in-process `Admission::try_admit` (slots, KV, both rates)", nanos);

    let redis = match LocalRedis::start() {
        Ok(redis) => redis,
        Err(error) => {
            eprintln!("skipped the shared cases: {error} (apt-get install -y redis-server)");
            return;
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let url = redis.url();
        let rates = |name: &str| SharedLimits::new(name).request_rate(rps, rburst).token_rate(tps, tburst);
        shared_case("shared rates, one `EVALSHA` per admission", &url, rates("rates"), n, &clock).await;
        let allowance = rates("allowance").allowance(Allowance::new().requests(256).tokens(256 * 200));
        shared_case("shared rates with a local allowance (256 requests)", &url, allowance, n, &clock).await;
        let capacity = rates("capacity").max_in_flight(1000).kv_capacity(1 << 40);
        shared_case("shared rates + capacity lease (release in the background)", &url, capacity, n, &clock).await;
    });
}
