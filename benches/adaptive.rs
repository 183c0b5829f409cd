//! What adaptive concurrency and engine feedback add: the controller's cost per observation (alone, and
//! behind the mutex a multi-threaded server puts it in), a tick when no decision is due, a decision over
//! a window of samples, next to `try_admit` + drop as the reference; and the cost of one scrape of
//! vLLM's metrics (parse + correction). `cargo bench --bench adaptive`.

use criterion::{Criterion, criterion_group, criterion_main};
use kvgate::adaptive::{AdaptiveConcurrency, AdaptiveConfig, Observation};
use kvgate::clock::ManualClock;
use kvgate::feedback::{EngineFeedback, EngineMetrics, FeedbackConfig};
use kvgate::{Admission, Request};
use parking_lot::Mutex;
use std::fmt::Write as _;
use std::hint::black_box;
use std::time::{Duration, Instant};

fn controller(clock: &ManualClock) -> (Admission<ManualClock>, AdaptiveConcurrency<ManualClock>) {
    let admission = Admission::builder().clock(clock.clone()).queue_capacity(0).build().unwrap();
    let config = AdaptiveConfig { initial_limit: 1024, max_limit: 4096, ..AdaptiveConfig::new(Duration::from_secs(2)) };
    let controller = AdaptiveConcurrency::new(admission.clone(), config).unwrap();
    (admission, controller)
}

fn first_token(i: u64) -> Observation {
    Observation::FirstToken {
        prompt_tokens: 200 + (i % 4000) as u32,
        admitted_at: Duration::from_millis(i),
        at: Duration::from_millis(i + 150 + i % 300),
    }
}

fn adaptive(c: &mut Criterion) {
    let mut group = c.benchmark_group("adaptive");
    let clock = ManualClock::new();
    let (admission, mut alone) = controller(&clock);
    let mut i = 0u64;
    group.bench_function("kvgate observe (first token)", |b| {
        b.iter(|| {
            i += 1;
            alone.observe(black_box(first_token(i)));
        })
    });
    let (_, shared) = controller(&clock);
    let shared = Mutex::new(shared);
    group.bench_function("kvgate observe behind a mutex", |b| {
        b.iter(|| {
            i += 1;
            shared.lock().observe(black_box(first_token(i)));
        })
    });
    alone.tick(Duration::ZERO);
    group.bench_function("kvgate tick, no decision due", |b| {
        b.iter(|| black_box(alone.tick(black_box(Duration::from_millis(10)))))
    });
    // A decision over 256 samples (a busy second): the samples are added outside the measurement.
    group.bench_function("kvgate decision over 256 samples", |b| {
        b.iter_custom(|iterations| {
            let (_, mut controller) = controller(&clock);
            controller.tick(Duration::ZERO);
            let mut spent = Duration::ZERO;
            for n in 0..iterations {
                for k in 0..256 {
                    controller.observe(first_token(n * 256 + k));
                }
                let at = Duration::from_secs(n + 1);
                let started = Instant::now();
                black_box(controller.tick(at));
                spent += started.elapsed();
            }
            spent
        })
    });
    let request = Request::new(512, 256);
    group.bench_function("kvgate try_admit + drop (reference)", |b| {
        b.iter(|| drop(black_box(admission.try_admit(black_box(&request)))))
    });
    group.finish();
}

/// What one vLLM engine serves on `/metrics`: the four gauges and counters the feedback reads among
/// about 40 histograms and counters of 10 to 30 buckets each.
fn vllm_metrics() -> String {
    let mut text = String::new();
    let labels = "engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"";
    for h in 0..40 {
        let _ = writeln!(
            text,
            "# HELP vllm:histogram_{h}_seconds A histogram.\n# TYPE vllm:histogram_{h}_seconds histogram"
        );
        for bucket in 0..20 {
            let _ = writeln!(
                text,
                "vllm:histogram_{h}_seconds_bucket{{{labels},le=\"{}.0\"}} {}.0",
                1 << bucket,
                bucket * 7
            );
        }
        let _ = writeln!(
            text,
            "vllm:histogram_{h}_seconds_count{{{labels}}} 140.0\nvllm:histogram_{h}_seconds_sum{{{labels}}} 93.25"
        );
    }
    for (name, value) in [
        ("vllm:kv_cache_usage_perc", "0.42"),
        ("vllm:num_requests_running", "37.0"),
        ("vllm:num_requests_waiting", "2.0"),
        ("vllm:num_preemptions_total", "11.0"),
    ] {
        let _ = writeln!(text, "# HELP {name} -\n# TYPE {name} gauge\n{name}{{{labels}}} {value}");
    }
    text
}

fn feedback(c: &mut Criterion) {
    let mut group = c.benchmark_group("feedback");
    let text = vllm_metrics();
    let lines = text.lines().count();
    group.bench_function(format!("kvgate EngineMetrics::parse, vLLM /metrics of {lines} lines"), |b| {
        b.iter(|| black_box(EngineMetrics::parse(black_box(&text)).unwrap()))
    });
    let metrics = EngineMetrics::parse(&text).unwrap();
    let admission = Admission::builder().kv_capacity_tokens(1_000_000).build().unwrap();
    let _held: Vec<_> = (0..80).map(|_| admission.try_admit(&Request::new(2000, 8000)).unwrap()).collect();
    let mut corrector = EngineFeedback::new(admission.clone(), FeedbackConfig::new()).unwrap();
    let mut second = 0;
    group.bench_function("kvgate EngineFeedback::update", |b| {
        b.iter(|| {
            second += 1;
            black_box(corrector.update(Duration::from_secs(second), black_box(&metrics)))
        })
    });
    group.finish();
}

criterion_group!(benches, adaptive, feedback);
criterion_main!(benches);
