//! The policies of POLICIES.md judged in the overload lab: adaptive concurrency and engine feedback
//! against the best static configuration a sweep finds, token-fair queueing and deadline shedding against
//! the admission without them; one deterministic run each, side by side.
//!
//! ```sh
//! cargo run --release --example policies            # tables, and SVG plots written to docs/
//! cargo run --release --example policies -- --no-plots
//! ```
//!
//! 1. **Adaptive concurrency, steady load**: chat traffic at 2× what one H100 sustains (Llama-3.1-8B, a
//!    2 s TTFT SLO), 10 minutes. Every static setting of a sweep (`max_in_flight` × queue size, counting
//!    requests or pricing KV bytes) against the adaptive controller on the same pricing.
//! 2. **Adaptive concurrency, the mix shifts**: 10 minutes of chats, then 10 minutes of long documents,
//!    each at 2× what the engine sustains for it.
//! 3. **Stability**: the controller's limit on 30 minutes of steady 2× chat traffic.
//! 4. **Engine feedback**: a KV budget that overestimates the pool (1.5×, learned reservations), and a
//!    memory-bound GPU (an L4) where full `max_tokens` reservations leave the cache half empty.
//! 5. **Token-fair queueing**: two backlogged tenants whose requests differ 20× in size, served by
//!    requests and by tokens, at weights 1:1 and 2:1.
//! 6. **Deadline-aware shedding**: chat traffic at 3×, every request with a 2-s TTFT deadline; kvgate's
//!    queue without and with shedding, misses counted both ways.

use kvgate::clock::{Clock, ManualClock, MonotonicClock};
use kvgate::feedback::FeedbackConfig;
use kvgate::kv::{GpuPlan, ModelSpec, WeightDtype};
use kvgate::sim::{
    AdmissionGate, AdmissionSpec, Arrivals, EngineConfig, EngineStatus, Entry, FeedbackSetup, Gate, GateSpec,
    HeavyUser, Pricing, Profile, Report, Scenario, Workload, jain_index, plot, plot::Panel,
};
use kvgate::{Admission, ConfigError, Fairness, Request, Reservation, TenantLimits, WaitPolicy};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

const HELP: &str = "\
policies: adaptive concurrency, engine feedback, token fairness and deadline shedding in the overload lab

USAGE:
    cargo run --release --example policies -- [OPTIONS]

OPTIONS:
    --seed N      seed of every random draw (default 1)
    --out DIR     where the SVG plots go (default docs)
    --no-plots    print the tables only
    -h, --help    this help
";

fn main() -> ExitCode {
    let mut seed = 1;
    let mut out = Some(PathBuf::from("docs"));
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "-h" | "--help" => {
                print!("{HELP}");
                return ExitCode::SUCCESS;
            }
            "--seed" => match args.next().and_then(|v| v.parse().ok()) {
                Some(n) => seed = n,
                None => return usage("--seed needs a number"),
            },
            "--out" => match args.next() {
                Some(dir) => out = Some(PathBuf::from(dir)),
                None => return usage("--out needs a directory"),
            },
            "--no-plots" => out = None,
            other => return usage(&format!("unknown option {other}; see --help")),
        }
    }
    match run(seed, out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("policies: {message}");
            ExitCode::FAILURE
        }
    }
}

fn usage(message: &str) -> ExitCode {
    eprintln!("policies: {message}");
    ExitCode::from(2)
}

fn h100() -> Result<(GpuPlan, EngineConfig), ConfigError> {
    let plan = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b")?).gpu("h100-80").build()?;
    let engine = EngineConfig::for_plan(&plan, WeightDtype::Bf16)?;
    Ok((plan, engine))
}

/// Runs every gate on `scenario`.
fn run_all(scenario: &Scenario, gates: &[GateSpec]) -> Result<Vec<Report>, ConfigError> {
    gates
        .iter()
        .map(|gate| {
            let mut s = scenario.clone();
            s.gate = gate.clone();
            s.run()
        })
        .collect()
}

/// The best report by goodput (the first of equals).
fn best(reports: &[Report]) -> &Report {
    reports.iter().fold(&reports[0], |best, r| if r.goodput > best.goodput { r } else { best })
}

fn run(seed: u64, out: Option<PathBuf>) -> Result<(), String> {
    let clock = MonotonicClock::new();
    let started = clock.now_nanos();
    let (plan, engine) = h100().map_err(|e| e.to_string())?;
    let mut files: Vec<(&str, String)> = Vec::new();

    // 1 and 2: steady chats, and chats then documents.
    let steady =
        Scenario::overloaded(plan.clone(), engine.clone(), 2.0, Duration::from_secs(600)).map_err(|e| e.to_string())?;
    let shift = Scenario::chats_then_documents(plan.clone(), engine.clone(), 2.0, Duration::from_secs(1200))
        .map_err(|e| e.to_string())?;
    let mut shift_plot = Vec::new();
    for (number, scenario) in [(1, &steady), (2, &shift)] {
        let mut scenario = scenario.clone();
        scenario.seed = seed;
        println!(
            "{number}. {} ({} s, TTFT SLO {} s): the best static settings of the sweep and the controller\n",
            scenario.name,
            scenario.duration.as_secs(),
            scenario.slo.ttft.as_secs_f64()
        );
        let mut rows = Vec::new();
        for pricing in [Pricing::Count, Pricing::KvBytes] {
            let sweep = run_all(&scenario, &GateSpec::sweep(pricing)).map_err(|e| e.to_string())?;
            let adaptive = run_all(&scenario, &[GateSpec::adaptive(pricing, scenario.adaptive_config())])
                .map_err(|e| e.to_string())?
                .remove(0);
            let top = best(&sweep).clone();
            println!(
                "   {:?} pricing: {} static settings swept; best {} at {:.2} good/s; adaptive {:.2} good/s = {:.3}x",
                pricing,
                sweep.len(),
                top.gate,
                top.goodput,
                adaptive.goodput,
                adaptive.goodput / top.goodput
            );
            if number == 2 {
                shift_plot.push(top.clone());
                shift_plot.push(adaptive.clone());
            }
            let mut row = top.clone();
            row.gate = format!("{} (best of {})", top.gate, sweep.len());
            rows.push(row);
            rows.push(adaptive);
            if number == 2 && pricing == Pricing::Count {
                let oracle = oracle(&scenario).map_err(|e| e.to_string())?;
                println!(
                    "   an oracle switching from the best chat limit to the best document limit at the shift: \
                     {:.2} good/s = {:.3}x the best static ({})",
                    oracle.goodput,
                    oracle.goodput / top.goodput,
                    oracle.gate
                );
                rows.push(oracle);
            }
        }
        println!("\n{}", Report::table(&rows));
    }
    files.push((
        "policy-adaptive-shift.svg",
        plot::panels(
            &shift_plot,
            "Chats, then long documents from minute 10, each at 2x capacity",
            &[Panel::Goodput, Panel::MaxInFlight, Panel::Running, Panel::TtftP90],
        )
        .map_err(|e| e.to_string())?,
    ));

    // 3. Stability on a steady load.
    let mut long = Scenario::overloaded(plan.clone(), engine.clone(), 2.0, Duration::from_secs(1800))
        .map_err(|e| e.to_string())?;
    long.seed = seed;
    println!(
        "3. Stability: the controller's limit on 30 minutes of steady 2x chat traffic, after the first 5 minutes\n"
    );
    println!("| pricing | limit p5 / median / p95 | band (p5..p95 around the median) | direction changes per minute |");
    println!("|---|---:|---:|---:|");
    for pricing in [Pricing::Count, Pricing::KvBytes] {
        let report =
            run_all(&long, &[GateSpec::adaptive(pricing, long.adaptive_config())]).map_err(|e| e.to_string())?;
        let (p5, median, p95, turns) = stability(&report[0], 300.0);
        let pricing = match pricing {
            Pricing::Count => "count",
            Pricing::KvBytes => "KV bytes",
        };
        println!(
            "| {pricing} | {p5:.0} / {median:.0} / {p95:.0} | {:+.0} % .. {:+.0} % | {turns:.2} |",
            100.0 * (p5 / median - 1.0),
            100.0 * (p95 / median - 1.0)
        );
    }
    println!();

    // 4. Engine feedback.
    println!("4. Engine feedback: KV budgets that do not match the engine (chat traffic at 2x, 10 minutes)\n");
    let mut feedback_rows = Vec::new();
    let wrong = kv_gate("KV 1.5x pool, learned", 1.5, Reservation::learned());
    let l4_plan = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b").map_err(|e| e.to_string())?)
        .gpu("l4")
        .build()
        .map_err(|e| e.to_string())?;
    let l4_engine = EngineConfig::for_plan(&l4_plan, WeightDtype::Bf16).map_err(|e| e.to_string())?;
    let cases = [
        (Scenario::overloaded(plan.clone(), engine.clone(), 2.0, Duration::from_secs(600)), wrong, "h100 budget 1.5x"),
        (
            Scenario::overloaded(l4_plan, l4_engine, 2.0, Duration::from_secs(600)),
            kv_gate("KV pool, full reservation", 1.0, Reservation::Full),
            "l4",
        ),
    ];
    let mut feedback_plot = Vec::new();
    for (scenario, gate, name) in cases {
        let mut scenario = scenario.map_err(|e| e.to_string())?;
        scenario.seed = seed;
        scenario.name = format!("{} ({name})", scenario.name);
        let GateSpec::Admission(spec) = &gate else { unreachable!("kv_gate builds an admission spec") };
        let corrected = GateSpec::Admission(Box::new(AdmissionSpec {
            label: format!("{} + engine feedback", spec.label),
            feedback: Some(FeedbackSetup::new(FeedbackConfig::new())),
            ..(**spec).clone()
        }));
        let reports = run_all(&scenario, &[gate, corrected]).map_err(|e| e.to_string())?;
        if name.starts_with("h100") {
            feedback_plot = reports.clone();
        }
        feedback_rows.extend(reports);
    }
    println!("{}", Report::table(&feedback_rows));
    files.push((
        "policy-feedback.svg",
        plot::panels(
            &feedback_plot,
            "A KV budget 1.5x the engine's pool, with and without engine feedback (2x chat traffic)",
            &[Panel::Goodput, Panel::KvBudgetPercent, Panel::KvPercent, Panel::TtftP90],
        )
        .map_err(|e| e.to_string())?,
    ));

    // 5 and 6: token fairness and deadline shedding.
    let fairness_plot = fairness(&plan, &engine, seed).map_err(|e| e.to_string())?;
    let groups: Vec<(String, &Report)> = fairness_plot.iter().map(|(label, report)| (label.clone(), report)).collect();
    files.push((
        "policy-fairness.svg",
        plot::served_tokens(
            &groups,
            &[
                (Workload::script_tenant(0), "questions: 200 tokens in, 20 out"),
                (Workload::script_tenant(1), "documents: 4,000 tokens in, 400 out"),
            ],
            (1, 2),
            "Two backlogged tenants, 600 s: tokens served by request fairness and by token fairness",
        )
        .map_err(|e| e.to_string())?,
    ));
    let deadline_plot = deadlines(&plan, &engine, seed).map_err(|e| e.to_string())?;
    files.push((
        "policy-deadlines.svg",
        plot::panels(
            &deadline_plot,
            "3x chat traffic, 2 s TTFT deadline: kvgate's queue with and without deadline shedding",
            &[Panel::Goodput, Panel::Waiting, Panel::Running, Panel::TtftP90],
        )
        .map_err(|e| e.to_string())?,
    ));

    if let Some(dir) = out {
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for (name, svg) in files {
            let path = dir.join(name);
            std::fs::write(&path, svg).map_err(|e| format!("{}: {e}", path.display()))?;
            println!("wrote {}", path.display());
        }
    }
    println!("\nwall time {:.1} s", (clock.now_nanos() - started) as f64 / 1e9);
    Ok(())
}

/// Section 5, two backlogged tenants, one sending questions and one documents 20 times their size, served by
/// requests and by tokens, at weights 1:1 and 2:1 (the questions' tenant at 2): the tokens each was
/// served (prompt 1, output 2, as `Fairness::tokens()` charges them) over its weight. Returns each run's
/// report, labelled, for the plot.
fn fairness(plan: &GpuPlan, engine: &EngineConfig, seed: u64) -> Result<Vec<(String, Report)>, ConfigError> {
    let tenants = vec![HeavyUser::fixed(256, 200, 20), HeavyUser::fixed(256, 4000, 400)];
    let mut scenario = Scenario::backlogged_tenants(plan.clone(), engine.clone(), tenants, Duration::from_secs(600))?;
    scenario.seed = seed;
    println!(
        "5. Token fairness: two tenants with 256 streams each for {} s, questions (200 tokens in, 20 out) and \
         documents (4,000 in, 400 out); KV pricing, a queue of 1,024\n",
        scenario.duration.as_secs()
    );
    println!(
        "| fairness | weights (questions : documents) | requests served | tokens served (M) | per weight, questions / documents | Jain | difference (M tokens) |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    let mut plotted = Vec::new();
    for (fairness, weight) in
        [(Fairness::Requests, 1), (Fairness::tokens(), 1), (Fairness::Requests, 2), (Fairness::tokens(), 2)]
    {
        let mut s = scenario.clone();
        s.gate = GateSpec::kv_fairness(fairness, 1024, Duration::from_secs(3600));
        if let GateSpec::Admission(spec) = &mut s.gate {
            spec.tenant_limits = vec![(Workload::script_tenant(0), TenantLimits::new().weight(weight))];
        }
        let report = s.run()?;
        let tenant =
            |i| report.tenants.iter().find(|t| t.tenant == Workload::script_tenant(i)).copied().unwrap_or_default();
        let (questions, documents) = (tenant(0), tenant(1));
        let per_weight = [questions.served(1, 2) as f64 / f64::from(weight), documents.served(1, 2) as f64];
        let name = match fairness {
            Fairness::Requests => "requests",
            Fairness::Tokens { .. } => "tokens (prompt 1, output 2)",
        };
        println!(
            "| {name} | {weight} : 1 | {} / {} | {:.2} / {:.2} | {:.3} | {:.3} | {:.2} |",
            questions.completed,
            documents.completed,
            questions.served(1, 2) as f64 / 1e6,
            documents.served(1, 2) as f64 / 1e6,
            per_weight[0] / per_weight[1],
            jain_index(&per_weight),
            (per_weight[0] - per_weight[1]).abs() / 1e6
        );
        let short = if matches!(fairness, Fairness::Requests) { "by requests" } else { "by tokens" };
        plotted.push((format!("{short}, weights {weight}:1"), report));
    }
    println!();
    Ok(plotted)
}

/// Section 6, chat traffic at 3x, every request carrying a 2-s TTFT deadline: kvgate's queue without shedding
/// (its wait capped at the deadline, or not) and with it, at three allowances for the engine's prefill;
/// and `try_admit`, which never queues.
/// Returns the reports to plot: the FIFO queue capped at the deadline, FIFO with shedding (250 ms allowance),
/// and the default (controlled delay).
fn deadlines(plan: &GpuPlan, engine: &EngineConfig, seed: u64) -> Result<Vec<Report>, ConfigError> {
    let mut scenario = Scenario::overloaded(plan.clone(), engine.clone(), 3.0, Duration::from_secs(600))?;
    scenario.seed = seed;
    scenario.workload.ttft_deadline = Some(Duration::from_secs(2));
    println!(
        "6. Deadline shedding: {} ({} s), every request with a 2 s TTFT deadline; kvgate admit, a queue of 256\n",
        scenario.name,
        scenario.duration.as_secs()
    );
    let ms = Duration::from_millis;
    let labelled = |gate: GateSpec, label: &str| match gate {
        GateSpec::Admission(spec) => GateSpec::Admission(Box::new(AdmissionSpec { label: label.into(), ..*spec })),
        other => other,
    };
    let fifo = |gate: GateSpec, label: &str| gate.with_wait_policy(WaitPolicy::Fifo, label);
    let gates = [
        GateSpec::kv_try_admit(),
        fifo(GateSpec::kv_admit(None, 256, Duration::from_secs(2)), "kvgate admit, FIFO, wait capped at 2 s"),
        fifo(GateSpec::kv_admit(None, 256, Duration::from_secs(30)), "kvgate admit, FIFO"),
        fifo(GateSpec::kv_deadlines(256, Duration::from_secs(30), ms(250)), "kvgate admit, FIFO + deadline shedding"),
        labelled(GateSpec::kv_admit(None, 256, Duration::from_secs(30)), "kvgate admit"),
        GateSpec::kv_deadlines(256, Duration::from_secs(30), ms(0)),
        GateSpec::kv_deadlines(256, Duration::from_secs(30), ms(250)),
        GateSpec::kv_deadlines(256, Duration::from_secs(30), ms(500)),
    ];
    let reports = run_all(&scenario, &gates)?;
    println!(
        "| gate | max wait | allowance | good/s | TTFT p99 | admitted | met | missed | shed | shed, would have started in time | queued, predicted in time, expired | requests never admitted | of those, with a shed try in time |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (gate, r) in gates.iter().zip(&reports) {
        let GateSpec::Admission(spec) = gate else { unreachable!("admission specs") };
        let d = r.deadlines;
        let allowance = spec.deadline_shedding.map_or("-".to_string(), |a| format!("{} ms", a.as_millis()));
        let max_wait =
            spec.max_wait.filter(|_| spec.wait).map_or("no queue".to_string(), |w| format!("{} s", w.as_secs()));
        println!(
            "| {} | {max_wait} | {allowance} | {:.2} | {:.2} s | {} | {} ({:.1} %) | {} | {} | {} ({:.1} %) | {} | {} | {} |",
            r.gate,
            r.goodput,
            r.ttft.p99,
            d.admitted,
            d.met,
            100.0 * d.met_ratio(),
            d.missed,
            d.shed,
            d.shed_in_time,
            100.0 * d.shed_in_time as f64 / d.shed.max(1) as f64,
            d.expired,
            d.never_admitted,
            d.lost_in_time
        );
    }
    println!();
    Ok(vec![reports[1].clone(), reports[3].clone(), reports[4].clone()])
}

/// A count limit that knows the future: the best static limit for the chats until the shift, then the
/// best static limit for the documents (each found by the same sweep on that half alone). No policy that
/// only counts requests can do better than switching at the right moment to the right limit.
fn oracle(scenario: &Scenario) -> Result<Report, ConfigError> {
    let shift = scenario.workload.shift.expect("a scenario with a shift").at;
    let half = |documents: bool| -> Result<usize, ConfigError> {
        let mut s = scenario.clone();
        s.duration = shift;
        if documents {
            let mix = scenario.workload.shift.expect("a shift");
            s.workload.prompt_tokens = mix.prompt_tokens;
            s.workload.output_tokens = mix.output_tokens;
            s.workload.shift = None;
            let Arrivals::Poisson { rate, profile, tenants } = scenario.workload.arrivals else {
                unreachable!("overloaded scenarios are Poisson")
            };
            let Profile::Step { after, .. } = profile else { unreachable!("a step profile") };
            s.workload.arrivals = Arrivals::Poisson { rate: rate * after, profile: Profile::Flat, tenants };
        } else {
            s.workload.shift = None;
            s.workload.arrivals = match scenario.workload.arrivals {
                Arrivals::Poisson { rate, tenants, .. } => Arrivals::Poisson { rate, profile: Profile::Flat, tenants },
                other => other,
            };
        }
        let mut best = (0.0, 1);
        for limit in [16, 24, 32, 48, 64, 96, 128, 192, 256, 320, 384, 512] {
            s.gate = GateSpec::fixed(Pricing::Count, Some(limit), 0, Duration::ZERO);
            let goodput = s.run()?.goodput;
            if goodput > best.0 {
                best = (goodput, limit);
            }
        }
        Ok(best.1)
    };
    let (chats, documents) = (half(false)?, half(true)?);
    scenario.run_with_gate(|context| {
        let admission = Admission::builder()
            .clock(context.clock.clone())
            .deadline_timer(false)
            .queue_capacity(0)
            .max_in_flight(chats)
            .build()?;
        let label = format!("oracle: count {chats}, then {documents}");
        Ok(Box::new(Switch {
            gate: AdmissionGate::new(label, admission.clone(), false, None),
            admission,
            at: shift,
            to: documents,
        }))
    })
}

/// An [`AdmissionGate`] whose limit is set to `to` at `at`.
#[derive(Debug)]
struct Switch {
    gate: AdmissionGate,
    admission: Admission<ManualClock>,
    at: Duration,
    to: usize,
}

impl Gate for Switch {
    fn name(&self) -> &str {
        self.gate.name()
    }

    fn enter(&mut self, request: &Request) -> Entry {
        self.gate.enter(request)
    }

    fn control_interval(&self) -> Option<Duration> {
        Some(Duration::from_millis(100))
    }

    fn control(&mut self, now: Duration, _engine: &EngineStatus) {
        if now >= self.at && self.admission.snapshot().max_in_flight != self.to {
            let _ = self.admission.set_max_in_flight(self.to);
        }
    }

    fn max_in_flight(&self) -> Option<usize> {
        self.gate.max_in_flight()
    }
}

/// KV pricing, refused at once, with a budget of `factor` × the engine's pool.
fn kv_gate(label: &str, factor: f64, reservation: Reservation) -> GateSpec {
    let GateSpec::Admission(mut spec) = GateSpec::fixed(Pricing::KvBytes, None, 0, Duration::ZERO) else {
        unreachable!("fixed builds an admission spec")
    };
    spec.label = label.into();
    spec.kv_budget_factor = factor;
    spec.reservation = reservation;
    GateSpec::Admission(spec)
}

/// The limit's 5th, 50th and 95th percentile over the samples after `warm_up` seconds, and how often
/// per minute its direction of change reversed.
fn stability(report: &Report, warm_up: f64) -> (f64, f64, f64, f64) {
    let series = &report.series;
    let limits: Vec<f64> = series
        .t
        .iter()
        .zip(&series.max_in_flight)
        .filter(|&(&t, l)| t >= warm_up && t <= report.duration.as_secs_f64() && l.is_finite())
        .map(|(_, &l)| l)
        .collect();
    let mut sorted = limits.clone();
    sorted.sort_by(f64::total_cmp);
    let at = |q: f64| sorted[((q * sorted.len() as f64) as usize).min(sorted.len() - 1)];
    let mut turns = 0;
    let mut direction = 0.0f64;
    for pair in limits.windows(2) {
        let d = (pair[1] - pair[0]).signum();
        if d != 0.0 {
            if direction != 0.0 && d != direction {
                turns += 1;
            }
            direction = d;
        }
    }
    let minutes = (report.duration.as_secs_f64() - warm_up) / 60.0;
    (at(0.05), at(0.5), at(0.95), turns as f64 / minutes)
}
