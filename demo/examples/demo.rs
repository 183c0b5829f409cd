//! The kvgate demo: a company's worth of employees hit one GPU server at nine in the morning.
//!
//! ```text
//! cargo run --release --example demo
//! ```
//!
//! Starts the gateway (the `kvgate-gateway` crate) with its simulated LLM backend on a loopback port, in
//! this process; then a few hundred simulated employees — each a tenant with an API key of their own —
//! send chat requests over real HTTP, streaming the answers, and retry rejections with `kvgate::retry`
//! (full jitter, never earlier than `Retry-After`), while one colleague's script hammers the gateway
//! with 24 requests at a time for the whole rush. Fair queueing between tenants and a per-tenant cap keep
//! the script to its share.
//! A live line shows what the gateway admits; at the end a summary table reports latency, time to
//! first token, rejections, and the engine's peaks against its limits — and the demo fails (exit 1) if
//! any invariant it prints does not hold.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kvgate::retry::{RetryHint, RetryPolicy, SplitMix64, retry};
use kvgate_gateway::tenants::{TenantConfig, TenantLimitsConfig};
use kvgate_gateway::{BackendConfig, Config, Gateway};
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const EMPLOYEES: u64 = 200;
const REQUESTS_EACH: u64 = 2;
const MAX_IN_FLIGHT: usize = 24;
const KV_TOKENS: u64 = 12_000;
/// Requests in flight per tenant (the scripted heavy user included).
const TENANT_CAP: usize = 4;
/// The heavy user's script: this many requests at a time, back to back, for the whole rush.
const HEAVY_LOOPS: u64 = 24;

fn employee_key(id: u64) -> String {
    format!("sk-employee-{id:03}")
}

/// One finished request, as its employee saw it.
#[derive(Debug, Clone, Copy)]
struct Outcome {
    /// First attempt to last byte, retries and waits included; `None` if the employee gave up.
    latency: Option<Duration>,
    /// First attempt to the first generated token.
    ttft: Option<Duration>,
}

/// Client-side tallies.
#[derive(Debug, Default)]
struct Tally {
    served: AtomicU64,
    gave_up: AtomicU64,
    status_429: AtomicU64,
    status_503: AtomicU64,
    other_errors: AtomicU64,
    /// Retries after a rejection with a hint, and how many of them came earlier than the hint.
    hinted_retries: AtomicU64,
    early_retries: AtomicU64,
    /// Smallest margin by which a hinted retry waited longer than asked, microseconds.
    min_margin_us: AtomicU64,
    outcomes: Mutex<Vec<Outcome>>,
}

/// What the heavy user's script got.
#[derive(Debug, Default)]
struct Heavy {
    served: AtomicU64,
    refused: AtomicU64,
    latencies: Mutex<Vec<Duration>>,
    /// Most of its requests the gateway ran at once (sampled by the progress line).
    peak_running: AtomicU64,
}

/// Why an attempt failed.
#[derive(Debug)]
enum Failure {
    /// A rejection (429/503) with the server's hint, or another status.
    Status { status: u16, retry_after: Option<Duration> },
    /// The connection failed.
    Transport,
}

impl RetryHint for Failure {
    fn is_retryable(&self) -> bool {
        matches!(self, Failure::Status { status: 429 | 503, .. } | Failure::Transport)
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            Failure::Status { retry_after, .. } => *retry_after,
            Failure::Transport => None,
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let config = Config {
        backend: BackendConfig::Simulated { tokens_per_sec: 140.0 },
        max_in_flight: MAX_IN_FLIGHT,
        queue: 48,
        max_queue_wait: Duration::from_secs(2),
        rate: Some((50.0, 25)),
        kv_tokens: Some(KV_TOKENS),
        default_max_tokens: 128,
        // Every employee a tenant with a key; the heavy user too. Each may run TENANT_CAP requests at once.
        tenants: (0..EMPLOYEES)
            .map(|id| TenantConfig {
                name: format!("employee-{id:03}"),
                keys: vec![employee_key(id).as_str().into()],
                ..TenantConfig::default()
            })
            .chain(std::iter::once(TenantConfig {
                name: "heavy-script".into(),
                keys: vec!["sk-heavy-script".into()],
                ..TenantConfig::default()
            }))
            .collect(),
        tenant_defaults: Some(TenantLimitsConfig { max_in_flight: Some(TENANT_CAP), ..TenantLimitsConfig::default() }),
        ..Config::default()
    };
    let gateway = Gateway::new(config).expect("a valid configuration");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
    let addr = listener.local_addr().expect("a bound address");
    tokio::spawn(kvgate_gateway::serve(listener, gateway.clone()));
    let url = format!("http://{addr}/v1/chat/completions");
    println!(
        "kvgate demo: {EMPLOYEES} employees x {REQUESTS_EACH} chats and one script of {HEAVY_LOOPS} requests at a time \
         -> gateway on http://{addr} -> simulated GPU ({MAX_IN_FLIGHT} sequences, KV budget {KV_TOKENS} tokens, \
         50 requests/s, queue 48, max wait 2 s, {TENANT_CAP} requests at once per tenant)"
    );

    let http: HttpClient = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(64).build(HttpConnector::new());
    let tally = Arc::new(Tally { min_margin_us: AtomicU64::new(u64::MAX), ..Tally::default() });
    let started = Instant::now();
    let done = Arc::new(AtomicBool::new(false));
    let heavy = Arc::new(Heavy::default());
    let progress =
        tokio::spawn(progress(gateway.clone(), Arc::clone(&tally), Arc::clone(&heavy), Arc::clone(&done), started));
    let script: Vec<_> = (0..HEAVY_LOOPS)
        .map(|i| tokio::spawn(heavy_user(i, http.clone(), url.clone(), Arc::clone(&heavy), Arc::clone(&done))))
        .collect();

    let employees: Vec<_> =
        (0..EMPLOYEES).map(|id| tokio::spawn(employee(id, http.clone(), url.clone(), Arc::clone(&tally)))).collect();
    for employee in employees {
        employee.await.expect("an employee task panicked");
    }
    let elapsed = started.elapsed();
    done.store(true, Ordering::Release);
    progress.await.expect("the progress task panicked");
    for loop_ in script {
        loop_.await.expect("the heavy user's script panicked");
    }

    // Everything given back: poll briefly (the last bodies are dropped as their connections finish).
    let drain_start = Instant::now();
    while drain_start.elapsed() < Duration::from_secs(2) {
        let s = gateway.admission().snapshot();
        if s.in_flight == 0 && s.queued == 0 && s.kv_used == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if !summary(&gateway, &tally, &heavy, elapsed) {
        std::process::exit(1);
    }
}

/// One employee: arrives during the morning rush, sends a few chats with some reading time between.
/// The employees' HTTP client (hyper's, with a connection pool).
type HttpClient = Client<HttpConnector, Full<Bytes>>;

async fn employee(id: u64, http: HttpClient, url: String, tally: Arc<Tally>) {
    let mut rng = SplitMix64::new(0x5eed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    tokio::time::sleep(Duration::from_millis(rng.next_u64() % 3_000)).await;
    let key = employee_key(id);
    let policy = RetryPolicy::new().base(Duration::from_millis(250)).cap(Duration::from_secs(4)).max_tries(10);
    for request in 0..REQUESTS_EACH {
        let prompt = "Please summarise this paragraph for me. ".repeat(5 + (rng.next_u64() % 60) as usize);
        let max_tokens = 32 + rng.next_u64() % 129;
        let stream = rng.next_u64() % 8 != 0;
        let body = serde_json::json!({
            "model": "kvgate-sim",
            "stream": stream,
            "max_tokens": max_tokens,
            "messages": [{ "role": "system", "content": "You are a helpful assistant." }, { "role": "user", "content": prompt }],
        });
        let first_try = Instant::now();
        let ttft = Mutex::new(None);
        // When the last rejection arrived and what it asked for, to check the next try honours it.
        let last_rejection: Mutex<Option<(Instant, Duration)>> = Mutex::new(None);
        let result = retry(
            &policy,
            || attempt(&http, &url, &key, &body, first_try, &ttft, &last_rejection, &tally),
            tokio::time::sleep,
        )
        .await;
        let outcome = match result {
            Ok(()) => {
                tally.served.fetch_add(1, Ordering::Relaxed);
                Outcome { latency: Some(first_try.elapsed()), ttft: *ttft.lock().unwrap() }
            }
            Err(_) => {
                tally.gave_up.fetch_add(1, Ordering::Relaxed);
                Outcome { latency: None, ttft: None }
            }
        };
        tally.outcomes.lock().unwrap().push(outcome);
        if request + 1 < REQUESTS_EACH {
            // Reads the answer before asking the next question.
            tokio::time::sleep(Duration::from_millis(500 + rng.next_u64() % 2_500)).await;
        }
    }
}

/// One try: send, and on 200 read the whole (streamed) answer.
/// One loop of the heavy user's script: a request, then the next at once (after a rejection's
/// `Retry-After`, which the gateway's answer says), until the rush is over.
async fn heavy_user(i: u64, http: HttpClient, url: String, heavy: Arc<Heavy>, done: Arc<AtomicBool>) {
    let mut rng = SplitMix64::new(0x4ea5 ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    while !done.load(Ordering::Acquire) {
        let body = serde_json::json!({
            "model": "kvgate-sim",
            "max_tokens": 64 + rng.next_u64() % 65,
            "messages": [{ "role": "user", "content": "Summarise ticket #4711 again. ".repeat(20) }],
        });
        let request = http::Request::post(&url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::AUTHORIZATION, "Bearer sk-heavy-script")
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("a valid request");
        let sent = Instant::now();
        let Ok(response) = http.request(request).await else { continue };
        let status = response.status().as_u16();
        let hint = kvgate::http::retry_after(response.headers());
        let _ = response.into_body().collect().await;
        if status == 200 {
            heavy.served.fetch_add(1, Ordering::Relaxed);
            heavy.latencies.lock().unwrap().push(sent.elapsed());
        } else {
            heavy.refused.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(hint.unwrap_or(Duration::from_millis(100)).min(Duration::from_secs(2))).await;
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn attempt(
    http: &HttpClient,
    url: &str,
    key: &str,
    body: &serde_json::Value,
    first_try: Instant,
    ttft: &Mutex<Option<Duration>>,
    last_rejection: &Mutex<Option<(Instant, Duration)>>,
    tally: &Tally,
) -> Result<(), Failure> {
    if let Some((at, hint)) = last_rejection.lock().unwrap().take() {
        let waited = at.elapsed();
        tally.hinted_retries.fetch_add(1, Ordering::Relaxed);
        match waited.checked_sub(hint) {
            Some(margin) => {
                tally.min_margin_us.fetch_min(u64::try_from(margin.as_micros()).unwrap_or(u64::MAX), Ordering::Relaxed);
            }
            None => {
                tally.early_retries.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    let request = http::Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::AUTHORIZATION, format!("Bearer {key}"))
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a valid request");
    let response = http.request(request).await.map_err(|_| Failure::Transport)?;
    let status = response.status().as_u16();
    if status != 200 {
        let retry_after = kvgate::http::retry_after(response.headers());
        match status {
            429 => tally.status_429.fetch_add(1, Ordering::Relaxed),
            503 => tally.status_503.fetch_add(1, Ordering::Relaxed),
            _ => tally.other_errors.fetch_add(1, Ordering::Relaxed),
        };
        if let Some(hint) = retry_after {
            *last_rejection.lock().unwrap() = Some((Instant::now(), hint));
        }
        let _ = response.into_body().collect().await;
        return Err(Failure::Status { status, retry_after });
    }
    let mut body = response.into_body();
    while let Some(frame) = body.frame().await {
        let Ok(chunk) = frame.map_err(|_| Failure::Transport)?.into_data() else { continue };
        let mut ttft = ttft.lock().unwrap();
        if ttft.is_none() && has_token(&chunk) {
            *ttft = Some(first_try.elapsed());
        }
    }
    Ok(())
}

/// Whether a response chunk carries generated text: a non-empty `"content":"…"` (streamed delta or the
/// whole message).
fn has_token(chunk: &[u8]) -> bool {
    const KEY: &[u8] = b"\"content\":\"";
    chunk.windows(KEY.len() + 1).any(|w| w.starts_with(KEY) && w[KEY.len()] != b'"')
}

/// The live line: a `\r` redraw on a terminal, a plain line every 2 s otherwise.
async fn progress(gateway: Gateway, tally: Arc<Tally>, heavy: Arc<Heavy>, done: Arc<AtomicBool>, started: Instant) {
    let tty = std::io::stdout().is_terminal();
    let every = if tty { Duration::from_millis(200) } else { Duration::from_secs(2) };
    let total = EMPLOYEES * REQUESTS_EACH;
    let mut next = tokio::time::Instant::now() + every;
    while !done.load(Ordering::Acquire) {
        // Wake often to notice the end (and to sample the heavy user's share); draw every `every`.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let admission = gateway.admission();
        let script = kvgate::TenantId::from("heavy-script");
        let running = admission.busiest_tenants(10).into_iter().find(|(id, _)| *id == script).map_or(0, |(_, n)| n);
        heavy.peak_running.fetch_max(running, Ordering::Relaxed);
        if tokio::time::Instant::now() < next {
            continue;
        }
        next += every;
        let s = gateway.admission().snapshot();
        let line = format!(
            "{:5.1}s  served {:>3}/{total}  running {:>2}/{}  waiting {:>2}  admitted {:>3}  rejected {:>4} (429: {}, 503: {})  KV {:>5.1}%",
            started.elapsed().as_secs_f64(),
            tally.served.load(Ordering::Relaxed),
            s.in_flight,
            s.max_in_flight,
            s.queued,
            s.admitted,
            s.rejected.total(),
            tally.status_429.load(Ordering::Relaxed),
            tally.status_503.load(Ordering::Relaxed),
            s.kv_usage() * 100.0,
        );
        let mut out = std::io::stdout().lock();
        let _ = if tty { write!(out, "\r{line}\x1b[K") } else { writeln!(out, "{line}") };
        let _ = out.flush();
    }
    if tty {
        println!();
    }
}

fn percentile(sorted: &[Duration], p: f64) -> String {
    if sorted.is_empty() {
        return "-".into();
    }
    let at = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    format!("{:.2} s", sorted[at].as_secs_f64())
}

/// Prints the summary table; returns whether every invariant held.
fn summary(gateway: &Gateway, tally: &Tally, heavy: &Heavy, elapsed: Duration) -> bool {
    let outcomes = tally.outcomes.lock().unwrap().clone();
    let mut latencies: Vec<_> = outcomes.iter().filter_map(|o| o.latency).collect();
    let mut ttfts: Vec<_> = outcomes.iter().filter_map(|o| o.ttft).collect();
    latencies.sort();
    ttfts.sort();
    let s = gateway.admission().snapshot();
    let sim = gateway.sim_stats().expect("the demo runs the simulated backend");
    let total = EMPLOYEES * REQUESTS_EACH;
    let served = tally.served.load(Ordering::Relaxed);
    let gave_up = tally.gave_up.load(Ordering::Relaxed);
    let hinted = tally.hinted_retries.load(Ordering::Relaxed);
    let early = tally.early_retries.load(Ordering::Relaxed);
    let margin = tally.min_margin_us.load(Ordering::Relaxed);
    let (r429, r503) = (tally.status_429.load(Ordering::Relaxed), tally.status_503.load(Ordering::Relaxed));
    let other = tally.other_errors.load(Ordering::Relaxed);
    let (heavy_served, heavy_refused) = (heavy.served.load(Ordering::Relaxed), heavy.refused.load(Ordering::Relaxed));
    let mut heavy_latencies = heavy.latencies.lock().unwrap().clone();
    heavy_latencies.sort();
    let heavy_peak = heavy.peak_running.load(Ordering::Relaxed);
    let heavy_share = heavy_served as f64 / (heavy_served + served).max(1) as f64;
    let reasons: Vec<String> =
        s.rejected.by_reason().iter().filter(|(_, n)| *n > 0).map(|(reason, n)| format!("{reason} {n}")).collect();

    let checks = [
        ("every request answered (served or gave up after 10 tries)", served + gave_up == total),
        ("no status other than 200, 429, 503", other == 0),
        ("no retry earlier than Retry-After", early == 0),
        ("engine never over max_in_flight", sim.peak_running <= s.max_in_flight),
        ("engine never over the KV budget", sim.peak_kv_in_use <= s.kv_capacity && sim.overflows == 0),
        ("everything returned at the end", s.in_flight == 0 && s.queued == 0 && s.kv_used == 0 && sim.running == 0),
        ("the heavy script never ran more than its tenant cap at once", heavy_peak <= TENANT_CAP as u64),
        ("the heavy script got at most a third of the answers", heavy_share <= 1.0 / 3.0),
    ];

    let rows = [
        ("wall time", format!("{:.1} s", elapsed.as_secs_f64())),
        ("requests served", format!("{served} of {total} ({gave_up} gave up)")),
        (
            "latency p50 / p95 / p99",
            format!(
                "{} / {} / {}",
                percentile(&latencies, 0.5),
                percentile(&latencies, 0.95),
                percentile(&latencies, 0.99)
            ),
        ),
        (
            "time to first token p50 / p95 / p99",
            format!("{} / {} / {}", percentile(&ttfts, 0.5), percentile(&ttfts, 0.95), percentile(&ttfts, 0.99)),
        ),
        ("rejections seen by employees", format!("429: {r429}, 503: {r503}, other: {other}")),
        (
            "heavy script (1 tenant, 24 requests at a time)",
            format!(
                "{heavy_served} served, {heavy_refused} refused; latency p50 {}; at most {heavy_peak} running at once",
                percentile(&heavy_latencies, 0.5)
            ),
        ),
        (
            "fairness: share of answers",
            format!(
                "heavy script {:.1}% (1 of {} tenants), employees {:.1}%",
                heavy_share * 100.0,
                EMPLOYEES + 1,
                (1.0 - heavy_share) * 100.0
            ),
        ),
        ("rejections by reason (gateway)", if reasons.is_empty() { "none".into() } else { reasons.join(", ") }),
        (
            "Retry-After honoured",
            if hinted == 0 {
                "no hinted retries".into()
            } else if early == 0 {
                format!(
                    "yes: {hinted} of {hinted} retries waited at least the hint (closest: +{:.1} ms)",
                    margin as f64 / 1e3
                )
            } else {
                format!("NO: {early} of {hinted} retries came early")
            },
        ),
        (
            "peak KV in use vs budget",
            format!(
                "{} / {} tokens ({:.1}%)",
                sim.peak_kv_in_use,
                s.kv_capacity,
                100.0 * sim.peak_kv_in_use as f64 / s.kv_capacity as f64
            ),
        ),
        ("peak concurrent sequences vs max_in_flight", format!("{} / {}", sim.peak_running, s.max_in_flight)),
        ("engine overflows (refused for lack of KV or slots)", sim.overflows.to_string()),
        ("tokens generated", sim.tokens_generated.to_string()),
        ("returned at the end", format!("{} running, {} waiting, {} KV tokens held", s.in_flight, s.queued, s.kv_used)),
    ];
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let value_width = rows.iter().map(|(_, v)| v.len()).max().unwrap_or(0);
    println!("\n| {:width$} | {:value_width$} |", "summary", "");
    println!("|{}|{}|", "-".repeat(width + 2), "-".repeat(value_width + 2));
    for (k, v) in &rows {
        println!("| {k:width$} | {v:value_width$} |");
    }
    println!();
    let mut ok = true;
    for (check, passed) in checks {
        println!("{} {check}", if passed { "ok  " } else { "FAIL" });
        ok &= passed;
    }
    ok
}
