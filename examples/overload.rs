//! The overload lab: one H100 serving Llama-3.1-8B to a whole company, simulated in virtual time with the
//! real `kvgate::Admission` in front of it.
//!
//! ```sh
//! cargo run --release --example overload            # tables, and SVG plots written to docs/
//! cargo run --release --example overload -- --bench # simulated requests per minute of wall time
//! ```
//!
//! Three experiments, each a set of deterministic simulations (`--seed N` changes the draws):
//!
//! 1. **Overload**: a morning rush whose peak is 2× and 5× what the engine sustains, with no gate, a
//!    request-count limit, kvgate `try_admit`, kvgate `admit` with a bounded queue and a max wait, and
//!    kvgate with tenants. Clients retry with full jitter.
//! 2. **Retries**: the 2× rush behind kvgate `admit`, with clients that never retry, retry immediately,
//!    after a fixed delay, with exponential backoff, or with full jitter (at most 100 tries each).
//! 3. **A heavy user**: 200 employees, with and without one script keeping 64 long requests in flight,
//!    behind kvgate without and with per-tenant limits.
//! 4. **Bursts**: short spikes at 3× capacity between quiet periods, behind `try_admit`, a FIFO queue and
//!    the default waiting room.

use kvgate::clock::{Clock, MonotonicClock};
use kvgate::kv::{GpuPlan, ModelSpec, WeightDtype};
use kvgate::sim::{
    Arrivals, ClientPolicy, EngineConfig, GateSpec, HeavyUser, Profile, Report, RetryKind, Scenario, Workload, plot,
};
use kvgate::{TenantLimits, WaitPolicy};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

const HELP: &str = "\
overload: the overload lab (deterministic simulation of one GPU server behind kvgate)

USAGE:
    cargo run --release --example overload -- [OPTIONS]

OPTIONS:
    --seed N      seed of every random draw (default 1)
    --out DIR     where the SVG plots go (default docs)
    --no-plots    print the tables only
    --bench       measure simulated requests per minute of wall time on one long scenario, then exit
    -h, --help    this help
";

struct Args {
    seed: u64,
    out: Option<PathBuf>,
    bench: bool,
}

fn parse_args() -> Result<Option<Args>, String> {
    let mut args = Args { seed: 1, out: Some(PathBuf::from("docs")), bench: false };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "-h" | "--help" => return Ok(None),
            "--seed" => {
                let value = it.next().ok_or("--seed needs a number")?;
                args.seed = value.parse().map_err(|_| format!("--seed {value}: not a number"))?;
            }
            "--out" => args.out = Some(PathBuf::from(it.next().ok_or("--out needs a directory")?)),
            "--no-plots" => args.out = None,
            "--bench" => args.bench = true,
            other => return Err(format!("unknown option {other}; see --help")),
        }
    }
    Ok(Some(args))
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(Some(args)) => args,
        Ok(None) => {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("overload: {message}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("overload: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The common setup: Llama-3.1-8B in bf16 on one H100-80 with vLLM's defaults.
fn base(args: &Args) -> Result<(Scenario, f64), String> {
    let plan = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b").map_err(|e| e.to_string())?)
        .gpu("h100-80")
        .build()
        .map_err(|e| e.to_string())?;
    let engine = EngineConfig::for_plan(&plan, WeightDtype::Bf16).map_err(|e| e.to_string())?;
    let workload = Workload::chat(Arrivals::Poisson { rate: 1.0, profile: Profile::Flat, tenants: 200 });
    let mut scenario = Scenario::new(plan, engine, workload);
    scenario.seed = args.seed;
    let engine = scenario.build_engine().map_err(|e| e.to_string())?;
    let (prompt, output) = scenario.workload.mean_lengths();
    Ok((scenario, engine.capacity_estimate(prompt, output)))
}

/// 30 minutes of bursts: BURST_FACTOR × capacity for the first BURST of every PERIOD, BURST_FLOOR of that
/// (well under capacity) the rest of the time.
fn bursty(scenario: &Scenario, capacity: f64) -> Scenario {
    let mut bursty = scenario.clone();
    bursty.duration = Duration::from_secs(1800);
    bursty.workload.arrivals = Arrivals::Poisson {
        rate: BURST_FACTOR * capacity,
        profile: Profile::Bursts { period: BURST_PERIOD, burst: BURST, floor: BURST_FLOOR },
        tenants: 200,
    };
    bursty.name = "bursts".into();
    bursty
}

const BURST_FACTOR: f64 = 3.0;
const BURST_PERIOD: Duration = Duration::from_secs(10);
const BURST: Duration = Duration::from_secs(2);
const BURST_FLOOR: f64 = 0.2;

/// A 30-minute morning rush peaking at `factor` × capacity at minute 12.
fn rush(scenario: &Scenario, capacity: f64, factor: f64) -> Scenario {
    let mut rush = scenario.clone();
    rush.duration = Duration::from_secs(1800);
    rush.workload.arrivals = Arrivals::Poisson {
        rate: factor * capacity,
        profile: Profile::MorningRush {
            peak_at: Duration::from_secs(720),
            spread: Duration::from_secs(300),
            floor: 0.2,
        },
        tenants: 200,
    };
    rush.name = format!("rush {factor}x");
    rush
}

fn gates(capacity: f64) -> Vec<GateSpec> {
    let wait = Duration::from_secs(1);
    let queue = (capacity * wait.as_secs_f64()).ceil() as usize + 1;
    vec![
        GateSpec::None,
        GateSpec::count_limit(1024, queue, wait),
        GateSpec::kv_try_admit(),
        GateSpec::kv_admit(None, queue, wait).with_wait_policy(WaitPolicy::Fifo, "kvgate admit, FIFO"),
        GateSpec::kv_admit(None, queue, wait),
        GateSpec::kv_tenants(queue, wait, TenantLimits::new().max_in_flight(8).kv_share(0.25)),
    ]
}

fn run(args: &Args) -> Result<(), String> {
    let (base, capacity) = base(args)?;
    if args.bench {
        return bench(&base, capacity);
    }
    let clock = MonotonicClock::new();
    let started = clock.now_nanos();
    println!(
        "overload lab: llama-3.1-8b bf16 on one h100-80 (3.35 TB/s, 989 TFLOP/s), vLLM defaults \
         (max_num_seqs 1024, 8192 tokens a step), KV pool {:.1} GiB; estimated capacity {capacity:.1} requests/s\n",
        base.build_engine().map_err(|e| e.to_string())?.pool_bytes() as f64 / f64::from(1u32 << 30)
    );

    // 1. Overload.
    let mut overload = Vec::new();
    for factor in [2.0, 5.0] {
        let scenario = rush(&base, capacity, factor);
        let mut reports = Vec::new();
        for gate in gates(capacity) {
            let mut s = scenario.clone();
            s.gate = gate;
            reports.push(s.run().map_err(|e| e.to_string())?);
        }
        overload.push(reports);
    }
    println!(
        "1. A morning rush at 2x and 5x capacity (full-jitter clients: 5 tries, a try cancelled after 30 s \
         without a first token, giving up after 60 s)\n"
    );
    println!("{}", Report::table(&overload.concat()));

    // Bursts: short spikes well above capacity between quiet periods.
    let mut bursts = Vec::new();
    for gate in gates(capacity).into_iter().skip(2).take(3) {
        let mut s = bursty(&base, capacity);
        s.gate = gate;
        bursts.push(s.run().map_err(|e| e.to_string())?);
    }

    // 2. Retries.
    let mut retries = Vec::new();
    let ms = Duration::from_millis;
    for kind in [
        RetryKind::None,
        RetryKind::Immediate,
        RetryKind::Fixed(ms(1000)),
        RetryKind::Exponential { base: ms(250), cap: ms(8000) },
        RetryKind::FullJitter { base: ms(250), cap: ms(8000) },
    ] {
        let mut s = rush(&base, capacity, 2.0);
        s.name = "rush 2x, retries".into();
        s.gate = gates(capacity).swap_remove(4);
        s.client = ClientPolicy { max_tries: 100, ..ClientPolicy::new(kind) };
        retries.push(s.run().map_err(|e| e.to_string())?);
    }
    println!("2. Retry policies in the 2x rush behind kvgate admit (at most 100 tries, giving up after 60 s)\n");
    println!("{}", Report::table(&retries));

    // 3. A heavy user.
    let mut heavy = Vec::new();
    for (with_script, gate) in [(false, 4), (true, 4), (false, 5), (true, 5)] {
        let mut s = base.clone();
        s.duration = Duration::from_secs(1200);
        s.workload.arrivals = Arrivals::Employees {
            count: 200,
            think_time: Duration::from_secs(20),
            profile: Profile::MorningRush {
                peak_at: Duration::from_secs(300),
                spread: Duration::from_secs(120),
                floor: 0.0,
            },
        };
        s.workload.heavy_user = with_script.then(|| HeavyUser::script(64));
        s.name = if with_script { "200 employees + script".into() } else { "200 employees".into() };
        s.gate = gates(capacity).swap_remove(gate);
        heavy.push(s.run().map_err(|e| e.to_string())?);
    }
    println!("3. 200 employees (20 s think time) and one script with 64 parallel long requests\n");
    println!(
        "| scenario | gate | employees' good/s | employees' TTFT p99 | script's good/s | script's tokens | Jain |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    for r in &heavy {
        println!(
            "| {} | {} | {:.2} | {:.2} s | {:.2} | {} | {:.3} |",
            r.scenario, r.gate, r.humans.goodput, r.humans.ttft.p99, r.scripted.goodput, r.scripted.tokens, r.fairness
        );
    }
    println!();

    println!(
        "4. Bursts: {BURST_FACTOR}x capacity for {} s of every {} s, {BURST_FLOOR} of that in between (full-jitter clients)\n",
        BURST.as_secs(),
        BURST_PERIOD.as_secs()
    );
    println!("{}", Report::table(&bursts));

    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let slo = base.slo.ttft.as_secs_f64();
        let files = [
            ("overload-timeseries-2x.svg", plot::time_series(&overload[0], "Morning rush peaking at 2x capacity")),
            ("overload-timeseries-5x.svg", plot::time_series(&overload[1], "Morning rush peaking at 5x capacity")),
            ("overload-ttft-cdf-2x.svg", plot::ttft_cdf(&overload[0], "Time to first token, rush at 2x capacity", slo)),
            ("overload-ttft-cdf-5x.svg", plot::ttft_cdf(&overload[1], "Time to first token, rush at 5x capacity", slo)),
            (
                "overload-retries.svg",
                plot::tries_per_request(&retries, "Tries per request by client retry policy (2x rush, kvgate admit)"),
            ),
        ];
        for (name, svg) in files {
            let path = dir.join(name);
            std::fs::write(&path, svg.map_err(|e| e.to_string())?).map_err(|e| format!("{}: {e}", path.display()))?;
            println!("wrote {}", path.display());
        }
    }
    let wall = (clock.now_nanos() - started) as f64 / 1e9;
    let simulated: u64 = overload.iter().flatten().chain(&retries).chain(&heavy).map(|r| r.arrived).sum();
    println!("\n{simulated} requests simulated in {wall:.1} s of wall time");
    Ok(())
}

/// Measures simulated requests per minute of wall time on one long scenario: 2 hours at 2× capacity
/// behind kvgate admit.
fn bench(base: &Scenario, capacity: f64) -> Result<(), String> {
    let mut scenario = base.clone();
    scenario.duration = Duration::from_secs(7200);
    scenario.workload.arrivals = Arrivals::Poisson { rate: 2.0 * capacity, profile: Profile::Flat, tenants: 200 };
    scenario.gate = gates(capacity).swap_remove(4);
    let clock = MonotonicClock::new();
    let started = clock.now_nanos();
    let report = scenario.run().map_err(|e| e.to_string())?;
    let wall = (clock.now_nanos() - started) as f64 / 1e9;
    println!(
        "{} requests ({} tries, {} tokens generated) simulated in {wall:.2} s: {:.0} requests per minute of wall time",
        report.arrived,
        report.tries,
        report.humans.tokens,
        report.arrived as f64 / wall * 60.0
    );
    Ok(())
}
