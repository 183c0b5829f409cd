//! Soak load generator for the gateway (driven by `scripts/soak.sh`).
//!
//! Runs `--clients` closed-loop clients against `--url` for `--seconds`: each sends a chat completion
//! (every other one streamed), reads the answer to the end, and on a 429/503 sleeps for the response's
//! `Retry-After` (capped at 10 s, with ±50 % jitter) before trying again. Every `--sample-secs` it
//! appends one CSV row: the gateway's resident memory (`VmRSS` of `--pid`), `running`/`waiting` and the
//! KV units in use from `/metrics`, and the running status counts. After the load stops it waits for the
//! gateway to drain, samples once more, and checks:
//!
//! - memory flat: the last sample is within +10 % or +8 MiB (whichever is larger) of the first sample
//!   after `--warmup-secs`;
//! - running, waiting and KV in use are back to 0 within 30 s of the load stopping;
//! - every answer was a 200, 429 or 503 (no transport errors, no other statuses);
//! - the load was an overload (some 429/503 seen, the queue was used).
//!
//! It prints a one-line summary (`key=value ...`) and exits 1 when a check fails. Everything is bounded in
//! time: the run stops after `--seconds` plus at most 30 s of drain, and each request times out after 60 s.
//!
//! ```text
//! cargo run --release -p kvgate-gateway --example loadgen -- --url http://127.0.0.1:8080 --pid 1234 --clients 96 \
//!     --seconds 600 --csv target/soak/soak.csv
//! ```

use futures::StreamExt;
use serde_json::json;
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

struct Args {
    url: String,
    pid: u32,
    clients: usize,
    seconds: u64,
    sample_secs: u64,
    warmup_secs: u64,
    csv: String,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        url: "http://127.0.0.1:8080".into(),
        pid: 0,
        clients: 96,
        seconds: 600,
        sample_secs: 5,
        warmup_secs: 60,
        csv: "target/soak/soak.csv".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || value.parse::<u64>().map_err(|_| format!("{flag} {value}: expected a number"));
        match flag.as_str() {
            "--url" => args.url = value.trim_end_matches('/').to_owned(),
            "--pid" => args.pid = number()? as u32,
            "--clients" => args.clients = number()? as usize,
            "--seconds" => args.seconds = number()?,
            "--sample-secs" => args.sample_secs = number()?.max(1),
            "--warmup-secs" => args.warmup_secs = number()?,
            "--csv" => args.csv = value,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if args.pid == 0 {
        return Err("--pid (the gateway's process id) is required".into());
    }
    Ok(args)
}

/// Status counts shared by the clients: index 0 = 200, 1 = 429, 2 = 503, 3 = anything else.
#[derive(Default)]
struct Counts {
    by_class: [AtomicU64; 4],
    other: parking_lot::Mutex<BTreeMap<String, u64>>,
}

impl Counts {
    fn record(&self, status: u16) {
        let class = match status {
            200 => 0,
            429 => 1,
            503 => 2,
            _ => 3,
        };
        self.by_class[class].fetch_add(1, Ordering::Relaxed);
        if class == 3 {
            *self.other.lock().entry(status.to_string()).or_default() += 1;
        }
    }

    fn record_error(&self, what: &str) {
        self.by_class[3].fetch_add(1, Ordering::Relaxed);
        *self.other.lock().entry(what.to_owned()).or_default() += 1;
    }

    fn get(&self, i: usize) -> u64 {
        self.by_class[i].load(Ordering::Relaxed)
    }
}

/// One CSV row.
#[derive(Clone, Copy, Default)]
struct Sample {
    elapsed_s: f64,
    rss_kib: u64,
    running: u64,
    waiting: u64,
    kv_used: u64,
    ok: u64,
    r429: u64,
    r503: u64,
    other: u64,
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn metric(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
}

async fn sample(http: &reqwest::Client, args: &Args, start: Instant, counts: &Counts) -> Result<Sample, String> {
    let text = http
        .get(format!("{}/metrics", args.url))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .map_err(|e| format!("/metrics: {e}"))?
        .text()
        .await
        .map_err(|e| format!("/metrics: {e}"))?;
    let get = |name| metric(&text, name).ok_or_else(|| format!("/metrics has no {name}"));
    Ok(Sample {
        elapsed_s: start.elapsed().as_secs_f64(),
        rss_kib: rss_kib(args.pid).ok_or_else(|| format!("cannot read /proc/{}/status", args.pid))?,
        running: get("kvgate_num_requests_running")?,
        waiting: get("kvgate_num_requests_waiting")?,
        kv_used: get("kvgate_kv_cache_used")?,
        ok: counts.get(0),
        r429: counts.get(1),
        r503: counts.get(2),
        other: counts.get(3),
    })
}

/// A small deterministic generator (xorshift), so runs are repeatable and no dependency is needed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

async fn client(id: usize, http: reqwest::Client, url: String, deadline: Instant, counts: Arc<Counts>) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (id as u64 + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
    let mut n = 0u64;
    while Instant::now() < deadline {
        n += 1;
        let stream = (n + id as u64) % 2 == 0;
        let body = json!({
            "model": "kvgate-sim",
            "stream": stream,
            "max_tokens": 16 + rng.below(112),
            "messages": [{ "role": "user", "content": "word ".repeat(8 + rng.below(120) as usize) }],
        });
        let sent =
            http.post(format!("{url}/v1/chat/completions")).json(&body).timeout(Duration::from_secs(60)).send().await;
        let response = match sent {
            Ok(response) => response,
            Err(e) => {
                counts.record_error(if e.is_timeout() { "timeout" } else { "transport_error" });
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let status = response.status().as_u16();
        let retry_after =
            response.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
        // Read the whole answer (the permit is held until the last byte).
        let mut body = response.bytes_stream();
        let mut failed = false;
        while let Some(chunk) = body.next().await {
            if chunk.is_err() {
                failed = true;
                break;
            }
        }
        if failed {
            counts.record_error("body_error");
            continue;
        }
        counts.record(status);
        if status == 429 || status == 503 {
            // Honour Retry-After with full ±50 % jitter, capped, and never past the deadline.
            let base_ms = retry_after.unwrap_or(1).clamp(1, 10) * 1000;
            let wait = Duration::from_millis(base_ms / 2 + rng.below(base_ms));
            let left = deadline.saturating_duration_since(Instant::now());
            tokio::time::sleep(wait.min(left)).await;
        }
    }
}

fn write_row(csv: &mut std::fs::File, phase: &str, s: &Sample) -> std::io::Result<()> {
    writeln!(
        csv,
        "{:.1},{phase},{},{},{},{},{},{},{},{}",
        s.elapsed_s, s.rss_kib, s.running, s.waiting, s.kv_used, s.ok, s.r429, s.r503, s.other
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("loadgen: {e}");
            std::process::exit(2);
        }
    };
    if let Some(dir) = std::path::Path::new(&args.csv).parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let mut csv = std::fs::File::create(&args.csv).expect("cannot create the CSV file");
    writeln!(csv, "elapsed_s,phase,rss_kib,running,waiting,kv_used,ok_200,status_429,status_503,other").unwrap();

    let http = reqwest::Client::builder().no_proxy().build().expect("an HTTP client");
    let counts = Arc::new(Counts::default());
    let start = Instant::now();
    let deadline = start + Duration::from_secs(args.seconds);
    let first = match sample(&http, &args, start, &counts).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("loadgen: gateway not answering: {e}");
            std::process::exit(1);
        }
    };
    write_row(&mut csv, "start", &first).unwrap();

    let clients: Vec<_> = (0..args.clients)
        .map(|id| tokio::spawn(client(id, http.clone(), args.url.clone(), deadline, counts.clone())))
        .collect();

    let mut failures = Vec::new();
    let mut warm: Option<Sample> = None;
    let mut samples = vec![first];
    let mut next = start + Duration::from_secs(args.sample_secs);
    while next <= deadline {
        tokio::time::sleep_until(next.into()).await;
        next += Duration::from_secs(args.sample_secs);
        match sample(&http, &args, start, &counts).await {
            Ok(s) => {
                let warmed = s.elapsed_s >= args.warmup_secs as f64;
                if warmed && warm.is_none() {
                    warm = Some(s);
                }
                write_row(&mut csv, if warmed { "load" } else { "warmup" }, &s).unwrap();
                samples.push(s);
            }
            Err(e) => failures.push(format!("sample at {:.0}s failed: {e}", start.elapsed().as_secs_f64())),
        }
    }
    for task in clients {
        let _ = task.await;
    }

    // Drain: running, waiting and KV back to 0 within 30 s.
    let drain_start = Instant::now();
    let mut last = None;
    while drain_start.elapsed() < Duration::from_secs(30) {
        if let Ok(s) = sample(&http, &args, start, &counts).await {
            last = Some(s);
            if s.running == 0 && s.waiting == 0 && s.kv_used == 0 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let drained_in = drain_start.elapsed();
    let last = match last {
        Some(s) => s,
        None => {
            eprintln!("loadgen: no final sample");
            std::process::exit(1);
        }
    };
    write_row(&mut csv, "end", &last).unwrap();
    samples.push(last);

    // Checks.
    if last.running != 0 || last.waiting != 0 || last.kv_used != 0 {
        failures.push(format!(
            "not drained 30 s after the load: running {} waiting {} kv_used {}",
            last.running, last.waiting, last.kv_used
        ));
    }
    let warm = warm.unwrap_or(first);
    let allowed = (warm.rss_kib / 10).max(8 * 1024);
    if last.rss_kib > warm.rss_kib + allowed {
        failures.push(format!(
            "memory grew: {} KiB after warm-up, {} KiB at the end (allowed +{} KiB)",
            warm.rss_kib, last.rss_kib, allowed
        ));
    }
    if last.other != 0 {
        failures.push(format!("{} answers other than 200/429/503: {:?}", last.other, counts.other.lock()));
    }
    if last.r429 + last.r503 == 0 || samples.iter().all(|s| s.waiting == 0) {
        failures.push("no overload: no 429/503 seen or the queue never used".into());
    }
    if last.ok == 0 {
        failures.push("nothing was served".into());
    }

    let max_running = samples.iter().map(|s| s.running).max().unwrap_or(0);
    let max_waiting = samples.iter().map(|s| s.waiting).max().unwrap_or(0);
    let max_rss = samples.iter().map(|s| s.rss_kib).max().unwrap_or(0);
    println!(
        "clients={} seconds={} requests={} ok_200={} status_429={} status_503={} other={} \
         rss_start_kib={} rss_warm_kib={} rss_max_kib={} rss_end_kib={} max_running={} max_waiting={} \
         final_running={} final_waiting={} final_kv_used={} drained_in_ms={} checks={}",
        args.clients,
        args.seconds,
        last.ok + last.r429 + last.r503 + last.other,
        last.ok,
        last.r429,
        last.r503,
        last.other,
        first.rss_kib,
        warm.rss_kib,
        max_rss,
        last.rss_kib,
        max_running,
        max_waiting,
        last.running,
        last.waiting,
        last.kv_used,
        drained_in.as_millis(),
        if failures.is_empty() { "pass" } else { "FAIL" },
    );
    if !failures.is_empty() {
        for f in &failures {
            eprintln!("soak check failed: {f}");
        }
        std::process::exit(1);
    }
}
