//! The gateway's overhead: the latency it adds to a request, next to the same request sent straight to a
//! zero-delay upstream and through a bare axum reverse proxy, in the same run.
//!
//! ```text
//! cargo run --release -p kvgate-gateway --example overhead -- [--seconds 1] [--rounds 12] [--rate 1000] [--clients 32]
//! cargo run --release -p kvgate-gateway --example overhead -- --only 2 --clients 1    # one target, closed loop
//! cargo run --release -p kvgate-gateway --example overhead -- --only-rate 2 --rate 200 # one target, fixed rate
//! ```
//!
//! Targets by index: 0 direct, 1 bare proxy, 2 kvgate, 3 kvgate with an API key, 4 the bare proxy with kvgate's
//! admission in its handler.
//!
//! Everything runs in this process on loopback: an upstream that answers every chat completion at once
//! with a fixed JSON body; a bare reverse proxy (axum + hyper's client: read the body, forward it, pass the
//! answer on — what any proxy does, and nothing more); the kvgate gateway in front of the same upstream,
//! without keys and with an API key (a tenant: hashing and lookup, tenant limits, fair queueing, the
//! request log off); and the bare proxy with kvgate's admission alone in its handler, as a service that
//! embeds the library writes it (`examples/axum_handler.rs`): the body read by `kvgate::openai`,
//! `admit().await`, the reservation forwarded, the answer's body holding the permit and counting output
//! tokens — no keys, tenants, budgets, ids, request log or metrics. A hyper client with a connection pool
//! is the load generator:
//!
//! - **fixed rate**: requests sent on a schedule of `--rate` per second (open loop: a slow answer delays
//!   no other request's sending), latency measured from each request's sending;
//! - **saturation**: `--clients` closed-loop clients sending back to back; throughput and latency.
//!
//! The targets are measured in turns (each target at the fixed rate, then at saturation; `--rounds`
//! times, 12 turns of 1 s each by default), so that drift on a shared machine falls on all of them
//! alike. It prints one table per mode: p50, p99 and requests per second for each target, and what
//! kvgate adds over the bare proxy at p50 and p99.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kvgate::Admission;
use kvgate::http::{PermitBody, rejection_response};
use kvgate::openai::{Endpoint, OutputTokens, Parser};
use kvgate_gateway::keys::KeyHash;
use kvgate_gateway::tenants::{KeyConfig, TenantConfig};
use kvgate_gateway::{BackendConfig, Config, Gateway};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// The gateway binary's allocator (its `mimalloc` feature, on by default), for every target alike: the
/// load generator, the upstream and both proxies share this process.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ANSWER: &str = r#"{"id":"x","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}"#;
const BODY: &str = r#"{"model":"m","max_tokens":16,"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Say hello."}]}"#;

struct Args {
    seconds: f64,
    rate: f64,
    clients: usize,
    rounds: usize,
    /// Only this target (its index), saturation only: for profiling one path.
    only: Option<usize>,
    /// Only this target (its index), at the fixed rate only: for profiling one path at a given load.
    only_rate: Option<usize>,
}

const USAGE: &str = "usage: overhead [--seconds S] [--rate R] [--clients N] [--rounds N] [--only TARGET] \
[--only-rate TARGET]   (targets: 0 direct, 1 bare proxy, 2 kvgate, 3 kvgate with an API key, \
4 bare proxy with kvgate's admission)";

/// The flags, or a message saying which one is wrong.
fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut args = Args { seconds: 1.0, rate: 1000.0, clients: 32, rounds: 12, only: None, only_rate: None };
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            return Err(USAGE.to_string());
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let number: f64 = value
            .parse()
            .ok()
            .filter(|n: &f64| n.is_finite() && *n >= 0.0)
            .ok_or_else(|| format!("{flag} {value}: not a number of zero or more\n{USAGE}"))?;
        let count = number as usize;
        match flag.as_str() {
            "--seconds" if number > 0.0 && number <= 3600.0 => args.seconds = number,
            "--rate" if number > 0.0 && number <= 1e6 => args.rate = number,
            "--clients" if (1..=10_000).contains(&count) => args.clients = count,
            "--rounds" if (1..=1_000).contains(&count) => args.rounds = count,
            "--only" | "--only-rate" if count > 4 => {
                return Err(format!("{flag} {value}: targets are 0 to 4\n{USAGE}"));
            }
            "--only" => args.only = Some(count),
            "--only-rate" => args.only_rate = Some(count),
            "--seconds" | "--rate" | "--clients" | "--rounds" => {
                let bound = "seconds up to 3600, rate up to 1e6, clients up to 10000, rounds up to 1000";
                return Err(format!("{flag} {value}: must be more than zero and at most its bound ({bound})\n{USAGE}"));
            }
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    Ok(args)
}

fn args() -> Args {
    parse_args(std::env::args().skip(1)).unwrap_or_else(|message| {
        eprintln!("{message}");
        std::process::exit(2)
    })
}

async fn listen() -> (tokio::net::TcpListener, SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

/// The zero-delay upstream.
async fn upstream() -> SocketAddr {
    let (listener, addr) = listen().await;
    let app = axum::Router::new()
        .route(
            "/v1/chat/completions",
            axum::routing::post(|_body: Bytes| async { ([("content-type", "application/json")], ANSWER) }),
        )
        .route("/v1/models", axum::routing::get(|| async { r#"{"object":"list","data":[]}"# }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// The bare reverse proxy: reads the body, forwards it, passes the answer on.
async fn bare_proxy(upstream: SocketAddr) -> SocketAddr {
    let (listener, addr) = listen().await;
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let url = format!("http://{upstream}/v1/chat/completions");
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move |body: Bytes| {
            let (client, url) = (client.clone(), url.clone());
            async move {
                let request =
                    http::Request::post(url).header("content-type", "application/json").body(Full::new(body)).unwrap();
                match client.request(request).await {
                    Ok(response) => response.map(axum::body::Body::new),
                    Err(_) => http::Response::builder().status(502).body(axum::body::Body::empty()).unwrap(),
                }
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// The bare reverse proxy with kvgate's admission in its handler (the limits of the gateway targets: 4,096
/// in flight, a KV budget that never binds, a waiting room of 4,096).
async fn admitted_proxy(upstream: SocketAddr) -> SocketAddr {
    let (listener, addr) = listen().await;
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let url: http::Uri = format!("http://{upstream}/v1/chat/completions").parse().unwrap();
    let admission =
        Admission::builder().max_in_flight(4096).kv_capacity_tokens(1 << 40).queue_capacity(4096).build().unwrap();
    let parser = Parser::new();
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move |body: Bytes| {
            let (client, url, admission, parser) = (client.clone(), url.clone(), admission.clone(), parser.clone());
            async move {
                let chat = match parser.parse(Endpoint::Chat, body) {
                    Ok(chat) => chat,
                    Err(error) => return error.to_response().map(axum::body::Body::from),
                };
                let permit = match admission.admit(&chat.request()).await {
                    Ok(permit) => permit,
                    Err(rejection) => {
                        return rejection_response(&rejection, &admission, false).map(axum::body::Body::from);
                    }
                };
                let request = http::Request::post(url)
                    .header("content-type", "application/json")
                    .body(Full::new(chat.into_forward_body()))
                    .unwrap();
                match client.request(request).await {
                    Ok(response) => response.map(|body| {
                        axum::body::Body::new(PermitBody::new(body, permit).count_with(OutputTokens::new()))
                    }),
                    Err(_) => http::Response::builder().status(502).body(axum::body::Body::empty()).unwrap(),
                }
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

async fn gateway(upstream: SocketAddr, keyed: bool) -> SocketAddr {
    let tenants = if keyed {
        vec![TenantConfig {
            name: "bench".into(),
            keys: vec![KeyConfig::Key(KeyHash::of("sk-bench").to_string())],
            ..TenantConfig::default()
        }]
    } else {
        Vec::new()
    };
    let config = Config {
        backend: BackendConfig::Upstream(format!("http://{upstream}")),
        max_in_flight: 4096,
        queue: 4096,
        kv_tokens: Some(1 << 40),
        tenants,
        ..Config::default()
    };
    let gateway = Gateway::new(config).unwrap();
    let (listener, addr) = listen().await;
    tokio::spawn(kvgate_gateway::serve(listener, gateway));
    addr
}

#[derive(Clone)]
struct Target {
    name: &'static str,
    url: String,
    key: Option<&'static str>,
}

async fn once(client: &HttpClient, target: &Target) -> bool {
    let mut request = http::Request::post(&target.url).header("content-type", "application/json");
    if let Some(key) = target.key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    let Ok(response) = client.request(request.body(Full::new(Bytes::from_static(BODY.as_bytes()))).unwrap()).await
    else {
        return false;
    };
    let ok = response.status() == 200;
    ok && response.into_body().collect().await.is_ok()
}

/// Latencies (µs) of requests sent at `rate` per second for `seconds` (open loop: a slow answer delays
/// no other request's sending), each from the moment it was sent (the runtime's timer wakes the senders
/// up to a millisecond late, the same for every target).
async fn fixed_rate(client: &HttpClient, target: &Target, rate: f64, seconds: f64) -> (Vec<f64>, usize) {
    let n = (rate * seconds) as usize;
    let start = tokio::time::Instant::now() + Duration::from_millis(20);
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (client, target) = (client.clone(), target.clone());
            let at = start + Duration::from_secs_f64(i as f64 / rate);
            tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                let sent = Instant::now();
                let ok = once(&client, &target).await;
                (ok, sent.elapsed().as_secs_f64() * 1e6)
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(n);
    let mut failed = 0;
    for task in tasks {
        let (ok, us) = task.await.unwrap();
        if ok { latencies.push(us) } else { failed += 1 }
    }
    (latencies, failed)
}

/// Latencies (µs) of `clients` closed-loop clients for `seconds`, and requests per second.
async fn saturation(client: &HttpClient, target: &Target, clients: usize, seconds: f64) -> (Vec<f64>, usize, f64) {
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(seconds);
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (client, target) = (client.clone(), target.clone());
            tokio::spawn(async move {
                let (mut latencies, mut failed) = (Vec::new(), 0);
                while Instant::now() < until {
                    let sent = Instant::now();
                    if once(&client, &target).await {
                        latencies.push(sent.elapsed().as_secs_f64() * 1e6);
                    } else {
                        failed += 1;
                    }
                }
                (latencies, failed)
            })
        })
        .collect();
    let (mut latencies, mut failed) = (Vec::new(), 0);
    for task in tasks {
        let (l, f) = task.await.unwrap();
        latencies.extend(l);
        failed += f;
    }
    let rate = latencies.len() as f64 / started.elapsed().as_secs_f64();
    (latencies, failed, rate)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

struct Row {
    latencies: Vec<f64>,
    failed: usize,
    rate: f64,
}

fn table(title: &str, targets: &[Target], rows: &mut [Row]) {
    println!("\n{title}\n");
    println!("| target | p50 | p99 | requests/s | failed |");
    println!("|---|---:|---:|---:|---:|");
    let mut p = Vec::new();
    for (target, row) in targets.iter().zip(rows.iter_mut()) {
        row.latencies.sort_by(f64::total_cmp);
        let (p50, p99) = (percentile(&row.latencies, 0.5), percentile(&row.latencies, 0.99));
        p.push((p50, p99));
        println!("| {} | {p50:.1} µs | {p99:.1} µs | {:.0} | {} |", target.name, row.rate, row.failed);
    }
    for (i, target) in targets.iter().enumerate().skip(2) {
        println!(
            "kvgate adds over the bare proxy ({}): p50 {:+.1} µs, p99 {:+.1} µs",
            target.name,
            p[i].0 - p[1].0,
            p[i].1 - p[1].1
        );
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args = args();
    let upstream = upstream().await;
    let targets = [
        Target { name: "direct to the upstream", url: format!("http://{upstream}/v1/chat/completions"), key: None },
        Target {
            name: "bare axum reverse proxy",
            url: format!("http://{}/v1/chat/completions", bare_proxy(upstream).await),
            key: None,
        },
        Target {
            name: "kvgate gateway",
            url: format!("http://{}/v1/chat/completions", gateway(upstream, false).await),
            key: None,
        },
        Target {
            name: "kvgate gateway, API key (tenant)",
            url: format!("http://{}/v1/chat/completions", gateway(upstream, true).await),
            key: Some("sk-bench"),
        },
        Target {
            name: "bare proxy with kvgate's admission",
            url: format!("http://{}/v1/chat/completions", admitted_proxy(upstream).await),
            key: None,
        },
    ];
    let client: HttpClient =
        Client::builder(TokioExecutor::new()).pool_max_idle_per_host(1024).build(HttpConnector::new());
    if let Some(i) = args.only_rate {
        let (mut latencies, failed) = fixed_rate(&client, &targets[i], args.rate, args.seconds).await;
        latencies.sort_by(f64::total_cmp);
        let (p50, p99) = (percentile(&latencies, 0.5), percentile(&latencies, 0.99));
        println!("{}: {} requests/s, p50 {p50:.1} µs, p99 {p99:.1} µs, {failed} failed", targets[i].name, args.rate);
        return;
    }
    if let Some(i) = args.only {
        let (latencies, failed, rate) = saturation(&client, &targets[i], args.clients, args.seconds).await;
        println!("{}: {rate:.0} requests/s, {} answered, {failed} failed", targets[i].name, latencies.len());
        return;
    }
    // Warm up every path and its connection pools.
    for target in &targets {
        let _ = saturation(&client, target, args.clients, 0.5).await;
    }
    println!(
        "kvgate-gateway overhead: {} s per target and mode, {} rounds, fixed rate {} requests/s, saturation {} clients; {} cores",
        args.seconds,
        args.rounds,
        args.rate,
        args.clients,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let new_rows =
        || (0..targets.len()).map(|_| Row { latencies: Vec::new(), failed: 0, rate: 0.0 }).collect::<Vec<_>>();
    let (mut fixed, mut saturated) = (new_rows(), new_rows());
    for _ in 0..args.rounds {
        for (i, target) in targets.iter().enumerate() {
            let (latencies, failed) = fixed_rate(&client, target, args.rate, args.seconds).await;
            fixed[i].latencies.extend(latencies);
            fixed[i].failed += failed;
            fixed[i].rate += args.rate / args.rounds as f64;
            let (latencies, failed, rate) = saturation(&client, target, args.clients, args.seconds).await;
            saturated[i].latencies.extend(latencies);
            saturated[i].failed += failed;
            saturated[i].rate += rate / args.rounds as f64;
        }
    }
    table(&format!("fixed rate, {} requests/s (open loop)", args.rate), &targets, &mut fixed);
    table(&format!("saturation, {} closed-loop clients", args.clients), &targets, &mut saturated);
}
