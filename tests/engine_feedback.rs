//! Engine feedback without a GPU: vLLM's and SGLang's metrics as they expose them, served by an HTTP
//! server on loopback, fetched, parsed, and turned into corrections of a real admission's KV budget.

use kvgate::feedback::{
    CorrectionReason, EngineFeedback, EngineKind, EngineMetrics, FeedbackConfig, FeedbackError, MAX_BODY, Quantity,
    fetch_metrics, samples,
};
use kvgate::{Admission, ConfigError, Permit, Request};
use proptest::prelude::*;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(10);

/// An excerpt of what vLLM (V1 engine, two data-parallel engines) serves on `/metrics`, with the
/// histograms and counters around the four values read.
fn vllm_text(usage: [f64; 2], waiting: u32, running: [u32; 2], preemptions: u32) -> String {
    let mut text = String::from(
        "# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.\n\
         # TYPE vllm:iteration_tokens_total histogram\n\
         vllm:iteration_tokens_total_sum{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 61234.0\n\
         vllm:iteration_tokens_total_bucket{engine=\"0\",le=\"1.0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 3.0\n\
         vllm:iteration_tokens_total_bucket{engine=\"0\",le=\"+Inf\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 912.0\n\
         # HELP vllm:num_requests_running Number of requests in model execution batches.\n\
         # TYPE vllm:num_requests_running gauge\n",
    );
    for (engine, running) in running.iter().enumerate() {
        text += &format!(
            "vllm:num_requests_running{{engine=\"{engine}\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"}} {running}.0\n"
        );
    }
    text += "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n\
             # TYPE vllm:num_requests_waiting gauge\n";
    text += &format!("vllm:num_requests_waiting{{engine=\"0\",model_name=\"m\"}} {waiting}.0\n");
    text += "vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 0.0\n";
    text += "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n\
             # TYPE vllm:kv_cache_usage_perc gauge\n";
    for (engine, usage) in usage.iter().enumerate() {
        text += &format!("vllm:kv_cache_usage_perc{{engine=\"{engine}\",model_name=\"m\"}} {usage}\n");
    }
    text += "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.\n\
             # TYPE vllm:num_preemptions_total counter\n";
    text += &format!("vllm:num_preemptions_total{{engine=\"0\",model_name=\"m\"}} {preemptions}.0\n");
    text += "vllm:num_preemptions_total{engine=\"1\",model_name=\"m\"} 0.0\n";
    text += "# HELP vllm:prefix_cache_queries_total Prefix cache queries.\n\
             # TYPE vllm:prefix_cache_queries_total counter\n\
             vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 1.2e+06\n";
    text
}

/// An excerpt of what SGLang serves with `--enable-metrics` (tensor parallel 2: rank 1 mirrors rank 0).
fn sglang_text(usage: f64, queue: u32, running: u32, retracted: u32) -> String {
    let mut text = String::new();
    for rank in 0..2 {
        let labels = format!(
            "engine_type=\"unified\",model_name=\"Qwen/Qwen3-8B\",moe_ep_rank=\"0\",pp_rank=\"0\",tp_rank=\"{rank}\""
        );
        text += &format!(
            "# HELP sglang:num_running_reqs The number of running requests.\n\
             # TYPE sglang:num_running_reqs gauge\n\
             sglang:num_running_reqs{{{labels}}} {running}.0\n\
             # HELP sglang:token_usage The token usage.\n\
             # TYPE sglang:token_usage gauge\n\
             sglang:token_usage{{{labels}}} {usage}\n\
             # HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n\
             # TYPE sglang:num_queue_reqs gauge\n\
             sglang:num_queue_reqs{{{labels}}} {queue}.0\n\
             # HELP sglang:num_retracted_requests_total Total number of retracted requests.\n\
             # TYPE sglang:num_retracted_requests_total counter\n\
             sglang:num_retracted_requests_total{{{labels}}} {retracted}.0\n\
             # HELP sglang:cache_hit_rate The prefix cache hit rate.\n\
             # TYPE sglang:cache_hit_rate gauge\n\
             sglang:cache_hit_rate{{{labels}}} 0.61\n"
        );
    }
    text
}

fn ok_response(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn chunked_response(body: &str) -> Vec<u8> {
    let mut out = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for chunk in body.as_bytes().chunks(100) {
        out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        out.extend_from_slice(chunk);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

/// A server on loopback that answers each connection with the next of `responses` (`None`: read the
/// request and hold the connection open without answering until the client goes away), sending each
/// request's first line back on `requests`.
fn serve(responses: Vec<Option<Vec<u8>>>) -> (String, mpsc::Receiver<String>, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/metrics", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::channel();
    let server = std::thread::spawn(move || {
        for response in responses {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let text = String::from_utf8_lossy(&request).into_owned();
            let _ = tx.send(text);
            match response {
                Some(bytes) => {
                    let _ = stream.write_all(&bytes);
                }
                None => {
                    // Hold the connection until the client times out and closes it.
                    let _ = stream.read(&mut buf);
                }
            }
        }
    });
    (url, rx, server)
}

fn budgeted(tokens: u64) -> Admission {
    Admission::builder().kv_capacity_tokens(tokens).queue_capacity(0).build().unwrap()
}

/// Reserves `tokens` of the admission's budget in requests of 10,000 tokens.
fn hold(admission: &Admission, tokens: u64) -> Vec<Permit> {
    (0..tokens / 10_000).map(|_| admission.try_admit(&Request::new(2_000, 8_000)).unwrap()).collect()
}

#[test]
fn vllm_metrics_are_read_and_combined_across_engines() {
    let metrics = EngineMetrics::parse(&vllm_text([0.31, 0.47], 5, [12, 9], 3)).unwrap();
    assert_eq!(metrics.engine, EngineKind::Vllm);
    assert_eq!(metrics.kv_cache_usage, Some(0.47));
    assert_eq!(metrics.requests_waiting, Some(5.0));
    assert_eq!(metrics.requests_running, Some(21.0));
    assert_eq!(metrics.preemptions, Some(3.0));
    // The name vLLM used before kv_cache_usage_perc.
    let old = EngineMetrics::parse("vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.25\n").unwrap();
    assert_eq!(old.kv_cache_usage, Some(0.25));
    assert_eq!(old.get(Quantity::Preemptions), None);
}

#[test]
fn sglang_metrics_are_read_and_tensor_parallel_mirrors_skipped() {
    let metrics = EngineMetrics::parse(&sglang_text(0.82, 4, 30, 7)).unwrap();
    assert_eq!(metrics.engine, EngineKind::Sglang);
    assert_eq!(metrics.kv_cache_usage, Some(0.82));
    assert_eq!(metrics.requests_waiting, Some(4.0));
    assert_eq!(metrics.requests_running, Some(30.0), "tp_rank 1 repeats rank 0");
    assert_eq!(metrics.preemptions, Some(7.0));
    for quantity in Quantity::ALL {
        assert!(EngineKind::Sglang.metric_names(quantity)[0].starts_with("sglang:"));
        assert!(EngineKind::Vllm.metric_names(quantity)[0].starts_with("vllm:"));
    }
}

#[test]
fn text_without_engine_metrics_or_with_a_malformed_line_is_an_error() {
    assert!(matches!(EngineMetrics::parse(""), Err(FeedbackError::NoEngineMetrics)));
    let other = "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.5\n";
    let error = EngineMetrics::parse(other).unwrap_err();
    assert!(error.to_string().contains("--enable-metrics"), "{error}");
    let broken = format!("{}vllm:num_requests_running{{engine=\"0\" 3\n", vllm_text([0.1, 0.1], 0, [1, 1], 0));
    let line = broken.lines().count();
    match EngineMetrics::parse(&broken) {
        Err(FeedbackError::Exposition { line: at, .. }) => assert_eq!(at, line),
        other => panic!("{other:?}"),
    }
    // Non-finite values are ignored rather than trusted.
    let nan = EngineMetrics::parse("vllm:kv_cache_usage_perc NaN\nvllm:num_requests_running 4\n").unwrap();
    assert_eq!((nan.kv_cache_usage, nan.requests_running), (None, Some(4.0)));
}

#[test]
fn feedback_fetched_over_http_corrects_the_budget() {
    let (url, requests, server) = serve(vec![
        Some(ok_response(&vllm_text([0.40, 0.35], 0, [40, 38], 0))), // far below the estimate: grow
        Some(chunked_response(&vllm_text([0.44, 0.40], 0, [44, 40], 0))), // still below: grow
        Some(ok_response(&vllm_text([0.97, 0.91], 6, [60, 55], 2))), // preempted: shrink
        Some(ok_response(&vllm_text([0.50, 0.45], 0, [40, 38], 2))), // room, but cooling down
        Some(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n".to_vec()),
    ]);
    let admission = budgeted(1_000_000);
    let _held = hold(&admission, 800_000);
    let mut feedback = EngineFeedback::new(admission.clone(), FeedbackConfig::new()).unwrap();
    let mut update = |at: u64| -> Result<_, FeedbackError> {
        let text = fetch_metrics(&url, TIMEOUT)?;
        Ok(feedback.update(Duration::from_secs(at), &EngineMetrics::parse(&text)?))
    };
    let first = update(5).unwrap();
    assert_eq!((first.reason, first.from, first.to), (CorrectionReason::CacheBelowEstimate, 1_000_000, 1_100_000));
    let second = update(10).unwrap();
    assert_eq!((second.reason, second.to), (CorrectionReason::CacheBelowEstimate, 1_210_000));
    let third = update(15).unwrap();
    assert_eq!((third.reason, third.preemptions, third.to), (CorrectionReason::Preempted, 2, 968_000));
    let fourth = update(20).unwrap();
    assert_eq!((fourth.reason, fourth.to), (CorrectionReason::Cooldown, 968_000));
    assert!(matches!(update(25), Err(FeedbackError::Status { status: 503, .. })));
    assert_eq!(admission.snapshot().kv_capacity, 968_000, "a failed scrape leaves the budget");
    server.join().unwrap();
    let first_request = requests.recv().unwrap();
    assert!(first_request.starts_with("GET /metrics HTTP/1.1\r\n"), "{first_request}");
    assert!(first_request.contains("Connection: close"), "{first_request}");
}

#[test]
fn sglang_served_over_http_is_read_too() {
    let (url, _requests, server) = serve(vec![Some(chunked_response(&sglang_text(0.55, 0, 12, 0)))]);
    let metrics = EngineMetrics::parse(&fetch_metrics(&url, TIMEOUT).unwrap()).unwrap();
    assert_eq!((metrics.engine, metrics.kv_cache_usage), (EngineKind::Sglang, Some(0.55)));
    server.join().unwrap();
}

#[test]
fn bad_servers_give_errors_not_hangs() {
    let big = format!("HTTP/1.1 200 OK\r\n\r\n{}", "x".repeat(MAX_BODY + 10));
    let (url, _requests, server) = serve(vec![
        None,                                                                  // never answers
        Some(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort".to_vec()), // closes early
        Some(b"garbage\r\n\r\n".to_vec()),
        Some(big.into_bytes()),
    ]);
    let quick = Duration::from_millis(300);
    assert!(matches!(fetch_metrics(&url, quick), Err(FeedbackError::Fetch { .. })));
    assert!(matches!(fetch_metrics(&url, quick), Err(FeedbackError::Http { .. })));
    assert!(matches!(fetch_metrics(&url, quick), Err(FeedbackError::Http { .. })));
    assert!(matches!(fetch_metrics(&url, TIMEOUT), Err(FeedbackError::TooLarge { .. })));
    server.join().unwrap();
    // Nobody listens any more.
    assert!(matches!(fetch_metrics(&url, quick), Err(FeedbackError::Fetch { .. })));
    assert!(matches!(fetch_metrics("https://127.0.0.1/metrics", quick), Err(FeedbackError::Url { .. })));
    assert!(matches!(fetch_metrics("http://127.0.0.1:1/metrics", Duration::ZERO), Err(FeedbackError::Url { .. })));
}

#[test]
fn each_rule_of_the_corrector() {
    let admission = budgeted(1_000_000);
    let held = hold(&admission, 800_000);
    let mut feedback = EngineFeedback::new(admission.clone(), FeedbackConfig::new()).unwrap();
    assert_eq!(feedback.bounds(), (500_000, 2_000_000));
    let at = Duration::from_secs;
    let metrics = |usage: f64, waiting: f64, preemptions: f64| {
        let mut metrics = EngineMetrics::new(EngineKind::Vllm);
        metrics.kv_cache_usage = Some(usage);
        metrics.requests_waiting = Some(waiting);
        metrics.preemptions = Some(preemptions);
        metrics
    };
    // The first scrape records the counter, whatever its value.
    assert_eq!(feedback.update(at(0), &metrics(0.72, 0.0, 50.0)).reason, CorrectionReason::InBand);
    // Requests queue inside the engine: no growth.
    assert_eq!(feedback.update(at(5), &metrics(0.3, 2.0, 50.0)).reason, CorrectionReason::EngineQueueing);
    // Fuller than the target: toward it.
    let full = feedback.update(at(10), &metrics(0.99, 0.0, 50.0));
    assert_eq!((full.reason, full.to), (CorrectionReason::EngineFull, 909_091));
    // A counter that went down (the engine restarted) is recorded, not read as preemptions.
    let restarted = feedback.update(at(15), &metrics(0.8, 0.0, 3.0));
    assert_eq!((restarted.preemptions, restarted.reason), (0, CorrectionReason::InBand));
    // Usage without a counter: no preemption can be seen, the rest applies.
    let mut no_counter = metrics(0.3, 0.0, 0.0);
    no_counter.preemptions = None;
    assert_eq!(feedback.update(at(20), &no_counter).reason, CorrectionReason::CacheBelowEstimate);
    assert_eq!(feedback.update(at(25), &EngineMetrics::new(EngineKind::Sglang)).reason, CorrectionReason::NoUsage);
    // Growth (while kvgate keeps using its budget) stops at the upper bound.
    let mut held = held;
    for t in 0..40 {
        while admission.snapshot().kv_used * 10 < admission.snapshot().kv_capacity * 8 {
            held.extend(hold(&admission, 10_000));
        }
        feedback.update(at(30 + t), &no_counter);
    }
    // (within the tolerance of it: changes under 5 % are not made)
    let top = admission.snapshot().kv_capacity;
    assert!((1_900_000..=2_000_000).contains(&top), "{top}");
    // Preemptions shrink at once, and block growth for the cooldown.
    for (i, count) in [13.0, 23.0, 33.0, 43.0, 53.0].into_iter().enumerate() {
        let c = feedback.update(at(100 + i as u64), &metrics(1.0, 5.0, count));
        assert_eq!((c.reason, c.preemptions), (CorrectionReason::Preempted, 10));
        assert_eq!(c.to, (c.from as f64 * 0.8).round() as u64);
    }
    assert_eq!(feedback.update(at(110), &metrics(0.3, 0.0, 50.0)).reason, CorrectionReason::Cooldown);
    assert_eq!(feedback.update(at(165), &metrics(0.3, 0.0, 50.0)).reason, CorrectionReason::CacheBelowEstimate);
    // Too little of the budget in use says nothing.
    drop(held);
    assert_eq!(feedback.update(at(170), &metrics(0.0, 0.0, 50.0)).reason, CorrectionReason::BudgetUnused);
    assert_eq!(feedback.last_correction().unwrap().at, at(170));
}

#[test]
fn bad_configurations_are_errors() {
    let no_budget = Admission::builder().build().unwrap();
    assert!(matches!(EngineFeedback::new(no_budget, FeedbackConfig::new()), Err(ConfigError::Conflict(_))));
    let admission = budgeted(1000);
    let base = FeedbackConfig::new();
    for (field, config) in [
        ("minimum bound", FeedbackConfig { min_factor: 0.0, ..base.clone() }),
        ("maximum bound", FeedbackConfig { max_factor: 0.9, ..base.clone() }),
        ("target_usage", FeedbackConfig { target_usage: 1.5, ..base.clone() }),
        ("shrink", FeedbackConfig { shrink: 1.0, ..base.clone() }),
        ("max_growth", FeedbackConfig { max_growth: f64::NAN, ..base.clone() }),
        ("min_budget_use", FeedbackConfig { min_budget_use: 0.0, ..base.clone() }),
        ("tolerance", FeedbackConfig { tolerance: 1.0, ..base.clone() }),
    ] {
        let error = EngineFeedback::new(admission.clone(), config).unwrap_err().to_string();
        assert!(error.contains(field), "{error}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn any_text_parses_or_fails_cleanly(text in "(\\PC|\n|\r|\"|\\{|\\}|=|,| |#){0,400}") {
        let _ = EngineMetrics::parse(&text);
        for sample in samples(&text).flatten() {
            let _ = sample.label("engine");
        }
    }

    #[test]
    fn written_samples_read_back(
        name in "[a-zA-Z_:][a-zA-Z0-9_:]{0,30}",
        labels in proptest::collection::vec(("[a-zA-Z_][a-zA-Z0-9_]{0,10}", "(\\PC|\\\\|\"|\n){0,12}"), 0..4),
        value in prop_oneof![any::<f64>().prop_filter("finite", |v| v.is_finite()), Just(f64::INFINITY)],
    ) {
        let escape = |v: &str| v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
        let body: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
        let line = format!("{name}{{{}}} {value:?}\n", body.join(","));
        let sample = samples(&line).next().unwrap().unwrap();
        prop_assert_eq!(sample.name, name.as_str());
        prop_assert_eq!(sample.value, value);
        if let Some((key, expected)) = labels.first() {
            // The first occurrence of a repeated name wins.
            prop_assert_eq!(sample.label(key), Some(expected.clone()));
        }
    }
}
