//! The planner: which admission limits keep the p99 time to first token under an SLO for a company of
//! a given size on one GPU server, and how many employees fit at that SLO.
//!
//! The KV planner ([`GpuPlan`]) says how many sequences fit in memory; this one says how many *people*
//! fit at an acceptable latency, by simulation. For a model, a GPU and a number of employees arriving in
//! a morning rush (the [`Workload::employees`] defaults: 60 s of mean think time, chat lengths), it
//! sweeps the gate's settings in the simulator (see [`plan`]).
//!
//! # A probe pools enough requests to have a p99
//! A probe asks one question: with these limits, do `n` employees meet the SLO — p99 TTFT of the
//! completed requests within it, at most [`PlanRequest::max_failure_ratio`] of the requests failed? A
//! few employees send few requests (two send about 24 in the 20-minute rush), and the nearest-rank p99 of
//! 24 requests is their maximum: a single prompt near the workload's 12,000-token cap, whose prefill
//! alone takes about 3 s on an L4, fails two employees that twenty pass. So a probe runs the same rush
//! with successive seeds and pools their requests until it holds [`PlanRequest::samples_per_probe`] of
//! them, then judges the pooled p99 and failure share. With one run per probe, whether `n` employees
//! fit went up and down with `n`, and the search below could stop anywhere (issue #33: 26 employees fit
//! when asked about 20, 1 when asked about 300).
//!
//! Pooling is not enough where the p99 grows slowly with the employees: on an L4 it stays within a
//! tenth of a second of 2 s from 16 to 22 employees, and the p99 of a few thousand requests moves by
//! that much from one set of seeds to another. A probe whose p99 is that close to the SLO (a close call)
//! pools four times as many requests before the search relies on it.
//!
//! # "Employees that fit" is searched independently of the number asked about
//! With the recommended limits, the search starts where the employees would ask for the engine's
//! estimated throughput (one request per think time each), doubles while the probe passes or halves
//! while it fails (down to one employee: 0 fit if even one fails), then bisects between the most that
//! passed and the fewest that failed. The number asked about plays no part, so the figure is a property
//! of the model, the GPU, the SLO, the workload and the limits. It is monotone-safe: every count that
//! passed is at most the figure and every count that failed is above it, so a probe passing by luck
//! above one that failed never raises it. The old search started from the number asked about and, when
//! that failed, bisected down to wherever a lucky pass was (300 asked: 150, 75 and 37 failed from
//! overload; 18, 9, 4 and 2 because the p99 of a few hundred requests or fewer is one of the longest
//! prompts' prefill; 1 passed).
//!
//! # The waiting room is decided in one place
//! The queue settings the planner tries and recommends (how many requests may wait, for how long) come
//! from [`QueueLimits`] alone, and only [`QueueLimits::apply`] writes them into a gate.
//!
//! Every probe is deterministic (its runs' seeds derive from [`PlanRequest::seed`]), so the same request
//! gives the same recommendation.

use super::client::ClientPolicy;
use super::dist::LengthDist;
use super::engine::{Engine, EngineConfig};
use super::report::{Percentiles, Report};
use super::scenario::{Scenario, Slo};
use super::spec::{AdmissionSpec, GateSpec};
use super::workload::{Arrivals, Workload};
use crate::error::ConfigError;
use crate::kv::GpuPlan;
use crate::retry::SplitMix64;
use std::fmt;
use std::time::Duration;

/// Most runs one probe pools, whatever [`PlanRequest::samples_per_probe`] asks (one employee in a short
/// rush sends very few requests).
const MAX_RUNS_PER_PROBE: u32 = 2048;

/// A probe is a close call when its p99 TTFT is within this share of the SLO (or its failure share within
/// this share of the bound): where the p99 grows slowly with the employees, the noise of a p99 over a
/// few thousand requests would move the search's answer by a tenth.
const CLOSE_CALL: f64 = 0.1;

/// A close call pools this many times [`PlanRequest::samples_per_probe`] requests (halving the noise of
/// its p99) before it is judged.
const CLOSE_CALL_FACTOR: u64 = 4;

/// The employee search stops doubling here (or at the employees asked for, if more): at least this many
/// fit.
const EMPLOYEE_CAP: u32 = 16_384;

/// The runs of a probe after the first take their seeds from this stream of [`PlanRequest::seed`].
const RUN_SEED_STREAM: u64 = 0x706c_616e_6e65_7273; // "planners"

/// What the planner is asked.
///
/// # Examples
///
/// ```
/// use kvgate::kv::{GpuPlan, ModelSpec, WeightDtype};
/// use kvgate::sim::{EngineConfig, PlanRequest};
/// use std::time::Duration;
///
/// let plan = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b")?).gpu("l4").build()?;
/// let engine = EngineConfig::for_plan(&plan, WeightDtype::Bf16)?;
/// let request = PlanRequest::new(plan, engine, 300, Duration::from_secs(2));
/// assert_eq!(request.slo.ttft, Duration::from_secs(2));
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct PlanRequest {
    /// The model on the GPU(s).
    pub plan: GpuPlan,
    /// The engine's settings.
    pub engine: EngineConfig,
    /// Employees to serve.
    pub users: u32,
    /// The SLOs: the p99 TTFT must stay within `slo.ttft`; a request counts as good within both.
    pub slo: Slo,
    /// The traffic; its arrivals are replaced by `users` employees (the other fields are kept).
    pub workload: Workload,
    /// What the clients do.
    pub client: ClientPolicy,
    /// Simulated period of each run.
    pub duration: Duration,
    /// Highest share of failed requests (shed, timed out) a setting may cause and still meet the SLO.
    pub max_failure_ratio: f64,
    /// Requests a probe pools, over runs with successive seeds, before it judges their p99 TTFT (at most
    /// 512 runs): the p99 of fewer than a few hundred requests is their slowest one. More is steadier
    /// and slower.
    pub samples_per_probe: u32,
    /// Seed of every probe's first run, and of the seeds of its further runs.
    pub seed: u64,
}

impl PlanRequest {
    /// `users` employees arriving in a rush that peaks 5 minutes into a 20-minute period (standard
    /// deviation 2.5 minutes), full-jitter clients, a 60 s end-to-end SLO, at most 1 % failed requests,
    /// 4,000 requests per probe.
    pub fn new(plan: GpuPlan, engine: EngineConfig, users: u32, ttft_slo: Duration) -> Self {
        Self {
            plan,
            engine,
            users,
            slo: Slo { ttft: ttft_slo, ..Slo::default() },
            workload: Workload::employees(users, Duration::from_secs(300), Duration::from_secs(150)),
            client: ClientPolicy::full_jitter(),
            duration: Duration::from_secs(1200),
            max_failure_ratio: 0.01,
            samples_per_probe: 4000,
            seed: 1,
        }
    }
}

/// One setting tried, and what it gave with the employees asked for (pooled over a probe's runs with
/// successive seeds).
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The gate's settings.
    pub gate: AdmissionSpec,
    /// Good requests per second, the mean over the runs.
    pub goodput: f64,
    /// p99 TTFT of the completed requests of all the runs, seconds.
    pub p99_ttft: f64,
    /// Share of the requests of all the runs that failed.
    pub failure_ratio: f64,
    /// Whether it meets the p99 SLO and the failure bound.
    pub meets_slo: bool,
    /// Runs pooled.
    pub runs: u32,
    /// Requests pooled (arrived in all the runs).
    pub requests: u64,
    /// The most employees that meet the SLO with it, when the planner searched (see [`plan`]).
    pub employees_at_slo: Option<u32>,
}

/// The planner's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Recommendation {
    /// The chosen gate settings.
    pub gate: AdmissionSpec,
    /// The flags of the gateway example that set them.
    pub gateway_flags: String,
    /// The chosen settings with the requested number of employees, pooled over the probe's runs (what
    /// `meets_slo` is judged on).
    pub measured: Candidate,
    /// The first of those runs (seed [`PlanRequest::seed`]), for its details and time series.
    pub report: Report,
    /// Whether the chosen settings meet the p99 SLO and the failure bound with the employees asked for.
    pub meets_slo: bool,
    /// The most employees that still meet both with these settings (0 if not even one does), searched
    /// the same way whatever the number asked for (see [`plan`]).
    pub employees_at_slo: u32,
    /// Whether the search for `employees_at_slo` stopped at its cap (16,384 employees, or the users asked
    /// for if more): at least that many fit.
    pub employees_capped: bool,
    /// Every setting tried, in order.
    pub candidates: Vec<Candidate>,
    /// The TTFT SLO planned for.
    pub ttft_slo: Duration,
    /// Employees asked for.
    pub users: u32,
    /// The 99th-percentile prompt length of the workload (estimated from 20,000 draws).
    pub p99_prompt_tokens: u32,
    /// How long that prompt's prefill alone takes on an idle engine (roofline compute time), seconds: a
    /// floor under the p99 TTFT that no admission limit can lower.
    pub unloaded_p99_ttft: f64,
}

impl fmt::Display for Recommendation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let slo = self.ttft_slo.as_secs_f64();
        writeln!(
            f,
            "recommended gateway flags for {} employees, p99 TTFT <= {slo} s{}:",
            self.users,
            if self.meets_slo { "" } else { " (NOT met: these limits come closest)" }
        )?;
        writeln!(f, "  {}", self.gateway_flags)?;
        writeln!(
            f,
            "with them: goodput {:.2} requests/s, p99 TTFT {:.2} s, {:.1}% of requests failed \
             ({} requests over {} run(s) of the rush)",
            self.measured.goodput,
            self.measured.p99_ttft,
            100.0 * self.measured.failure_ratio,
            self.measured.requests,
            self.measured.runs
        )?;
        write!(
            f,
            "employees that fit at p99 TTFT <= {slo} s with these limits ({}): {}{}",
            self.gateway_flags,
            if self.employees_capped { "at least " } else { "" },
            self.employees_at_slo
        )?;
        if self.meets_slo != (self.users <= self.employees_at_slo) {
            write!(
                f,
                "\nnote: {} employees {} the SLO in their own runs, which the search for the employees that fit \
                 contradicts: near {} employees the p99 TTFT barely changes with their number, so both are estimates",
                self.users,
                if self.meets_slo { "met" } else { "missed" },
                self.employees_at_slo
            )?;
        }
        if self.unloaded_p99_ttft > slo {
            write!(
                f,
                "\nnote: the 99th-percentile prompt ({} tokens) alone takes {:.2} s to prefill on an idle engine, \
                 so no limit keeps the p99 TTFT under {slo} s: shorten prompts, use prefix caching or a faster GPU",
                self.p99_prompt_tokens, self.unloaded_p99_ttft
            )?;
        }
        Ok(())
    }
}

/// Runs the planner for `request`:
///
/// 1. sweeps the kvgate gate's settings one at a time around a starting point (coordinate search):
///    `max_in_flight` (the engine's `max_num_seqs`, or half or a quarter of the full reservations the
///    KV pool holds), the waiting room (a longest wait of ¼, ½ or ¾ of the SLO, a queue of one, two or
///    four such waits' worth of the engine's estimated throughput) and a global request rate (none, or
///    the estimated throughput); each setting is judged with the employees asked for, on at least
///    [`PlanRequest::samples_per_probe`] requests pooled over runs with successive seeds;
/// 2. ranks the settings: first whether the p99 TTFT meets the SLO *and* at most
///    [`PlanRequest::max_failure_ratio`] of the requests fail, then goodput, then the lower p99;
/// 3. with the best-ranked setting, searches for the largest number of employees that still meets both:
///    from the employees that would ask for the engine's estimated throughput, doubling while they meet
///    it or halving while they do not, then bisecting to within 2 % — never from the number asked about,
///    so that the figure depends on the limits and not on the question. A probe within a tenth of the
///    SLO (or of the failure bound) pools four times the requests before the search relies on it. A
///    setting with which not even one employee meets the SLO is never recommended while another lets
///    some fit (the next-ranked is searched instead);
/// 4. measures the recommended setting with the employees asked for, as the search measures a count.
///
/// Every probe is deterministic, so the same request gives the same recommendation.
///
/// # Errors
///
/// [`ConfigError`] for zero users, a zero SLO, a failure bound outside `[0, 1]`, zero samples per probe,
/// or an invalid engine, workload or client setting (the probes themselves cannot fail once the first
/// one ran).
///
/// # Examples
///
/// ```no_run
/// use kvgate::kv::{GpuPlan, ModelSpec, WeightDtype};
/// use kvgate::sim::{EngineConfig, PlanRequest, plan};
/// use std::time::Duration;
///
/// let gpu_plan = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b")?).gpu("l4").build()?;
/// let engine = EngineConfig::for_plan(&gpu_plan, WeightDtype::Bf16)?;
/// let recommendation = plan(&PlanRequest::new(gpu_plan, engine, 300, Duration::from_secs(2)))?;
/// println!("{recommendation}");
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
pub fn plan(request: &PlanRequest) -> Result<Recommendation, ConfigError> {
    if request.users == 0 {
        return Err(ConfigError::Zero { what: "users" });
    }
    if request.samples_per_probe == 0 {
        return Err(ConfigError::Zero { what: "samples per probe" });
    }
    if !(0.0..=1.0).contains(&request.max_failure_ratio) {
        return Err(ConfigError::OutOfRange {
            what: "max_failure_ratio",
            reason: format!("{}; use a share of requests in [0, 1]", request.max_failure_ratio),
        });
    }
    let engine = Engine::new(&request.plan, request.engine.clone())?;
    let probe = Probe { request };
    base_scenario(request, request.users).validate()?;

    let (mean_prompt, mean_output) = request.workload.mean_lengths();
    let throughput = engine.capacity_estimate(mean_prompt, mean_output).max(0.01);
    // Sequences of a mean prompt with a full `max_tokens` reservation that the pool holds.
    let reservation = mean_prompt.ceil() as u64 + u64::from(request.workload.max_new_tokens);
    let full_reservations = (engine.pool_bytes() / engine.sequence_bytes(reservation).max(1)).max(1) as usize;
    let slo = request.slo.ttft;

    let mut start = match GateSpec::kv_admit(None, 1, slo) {
        GateSpec::Admission(spec) => *spec,
        GateSpec::None => unreachable!("kv_admit builds an admission spec"),
    };
    start.label = "kvgate (planned)".into();
    let mut best = QueueLimits::starting(throughput, slo).apply(&start);
    let mut candidates = vec![probe.measure(&best, request.users, Pooling::Rank)?];
    let mut best_score = Score::of(&candidates[0]);
    let dimensions: [Sweep<'_>; 3] = [
        &|spec| {
            let mut out = vec![AdmissionSpec { max_in_flight: None, ..spec.clone() }];
            for n in [full_reservations / 2, full_reservations / 4] {
                if n >= 1 {
                    out.push(AdmissionSpec { max_in_flight: Some(n), ..spec.clone() });
                }
            }
            out
        },
        &|spec| QueueLimits::options(throughput, slo).into_iter().map(|queue| queue.apply(spec)).collect(),
        &|spec| {
            let wait = spec.max_wait.unwrap_or(slo / 2);
            let burst = QueueLimits::sized(throughput, wait, 1).capacity.min(u32::MAX as usize) as u32;
            vec![
                AdmissionSpec { request_rate: None, ..spec.clone() },
                AdmissionSpec { request_rate: Some((round_rate(throughput), burst.max(1))), ..spec.clone() },
            ]
        },
    ];
    for dimension in dimensions {
        for gate in dimension(&best) {
            if candidates.iter().any(|c| c.gate == gate) {
                continue;
            }
            let candidate = probe.measure(&gate, request.users, Pooling::Rank)?;
            let score = Score::of(&candidate);
            candidates.push(candidate);
            if score.better_than(&best_score) {
                best = gate;
                best_score = score;
            }
        }
    }

    let p99_prompt_tokens = p99_draw(&request.workload.prompt_tokens, request.seed);
    let unloaded_p99_ttft = engine.roofline().compute_time(u64::from(p99_prompt_tokens)).as_secs_f64();

    // The search for the employees that fit starts where they would ask for the engine's estimated
    // throughput (each sends about one request per think time), never at the number asked about.
    let search_start = (throughput * think_time(&request.workload).as_secs_f64()).round();
    let search_start = search_start.clamp(1.0, f64::from(EMPLOYEE_CAP)) as u32;
    let search_cap = EMPLOYEE_CAP.max(request.users);
    // Best-ranked first (ties in the order tried); recommend the first with which anyone fits. When the
    // prefill alone misses the SLO, no limit lets anyone fit: the best-ranked is searched alone.
    let mut ranked: Vec<usize> = (0..candidates.len()).collect();
    ranked.sort_by(|&a, &b| Score::of(&candidates[b]).rank_cmp(&Score::of(&candidates[a])));
    debug_assert_eq!(candidates[ranked[0]].gate, best);
    let mut chosen = ranked[0];
    for &index in &ranked {
        let fit = probe.employees_at_slo(&candidates[index].gate, search_start, search_cap)?;
        candidates[index].employees_at_slo = Some(fit);
        if fit > 0 || unloaded_p99_ttft > slo.as_secs_f64() {
            chosen = index;
            break;
        }
    }
    let employees_at_slo = candidates[chosen].employees_at_slo.unwrap_or(0);
    let measured = Candidate {
        employees_at_slo: Some(employees_at_slo),
        ..probe.measure(&candidates[chosen].gate, request.users, Pooling::Verdict)?
    };
    let employees_capped = employees_at_slo >= search_cap;

    let report = probe.scenario(&measured.gate, request.users).run()?;
    Ok(Recommendation {
        gateway_flags: measured.gate.gateway_flags(request.plan.model().name(), request.plan.gpu()),
        gate: measured.gate.clone(),
        report,
        meets_slo: measured.meets_slo,
        measured,
        employees_at_slo,
        employees_capped,
        candidates,
        ttft_slo: request.slo.ttft,
        users: request.users,
        p99_prompt_tokens,
        unloaded_p99_ttft,
    })
}

/// A waiting room: how many requests may wait, and for how long.
///
/// The one place the planner's queue settings come from — [`starting`](Self::starting) and
/// [`options`](Self::options) decide them from the engine's throughput and the SLO, never from the number
/// of employees asked about — and [`apply`](Self::apply) the one place that writes them into a gate. A
/// further queue setting (an order of service for the waiters, say) belongs here and nowhere else.
#[derive(Debug, Clone, Copy, PartialEq)]
struct QueueLimits {
    /// Requests that may wait (per priority class).
    capacity: usize,
    /// Longest wait before a waiter is shed.
    max_wait: Duration,
}

impl QueueLimits {
    /// `waits` longest waits' worth of the engine's estimated `throughput` (requests per second), plus
    /// one place, each waiting at most `max_wait`: a full queue drains within about `waits` × `max_wait`.
    fn sized(throughput: f64, max_wait: Duration, waits: u32) -> Self {
        let capacity = (throughput * max_wait.as_secs_f64() * f64::from(waits)).ceil() as usize + 1;
        Self { capacity, max_wait }
    }

    /// Where the sweep starts: waits of at most half the SLO, one such wait's worth of places.
    fn starting(throughput: f64, slo: Duration) -> Self {
        Self::sized(throughput, slo / 2, 1)
    }

    /// Every waiting room the sweep tries: a longest wait of ¼, ½ or ¾ of the SLO (the rest is left for
    /// the prefill), each with one, two or four such waits' worth of places.
    fn options(throughput: f64, slo: Duration) -> Vec<Self> {
        let mut out = Vec::new();
        for max_wait in [slo / 4, slo / 2, slo * 3 / 4] {
            if max_wait.is_zero() {
                continue;
            }
            for waits in [1, 2, 4] {
                let limits = Self::sized(throughput, max_wait, waits);
                if !out.contains(&limits) {
                    out.push(limits);
                }
            }
        }
        out
    }

    /// `spec` waiting in this room (`admit`, not `try_admit`).
    fn apply(self, spec: &AdmissionSpec) -> AdmissionSpec {
        AdmissionSpec { wait: true, queue_capacity: self.capacity, max_wait: Some(self.max_wait), ..spec.clone() }
    }
}

/// The 99th percentile of 20,000 draws of `dist`.
fn p99_draw(dist: &LengthDist, seed: u64) -> u32 {
    let mut rng = SplitMix64::new(seed);
    let mut draws: Vec<u32> = (0..20_000).map(|_| dist.sample(&mut rng)).collect();
    draws.sort_unstable();
    draws[draws.len() * 99 / 100]
}

/// One dimension of the search: the variants of a setting to try.
type Sweep<'a> = &'a dyn Fn(&AdmissionSpec) -> Vec<AdmissionSpec>;

/// A rate rounded to two significant decimals (so that flags read well).
fn round_rate(rate: f64) -> f64 {
    if rate >= 10.0 { rate.round() } else { (rate * 100.0).round() / 100.0 }
}

/// The employees' mean think time (60 s if the workload's arrivals are Poisson).
fn think_time(workload: &Workload) -> Duration {
    match workload.arrivals {
        Arrivals::Employees { think_time, .. } => think_time,
        Arrivals::Poisson { .. } => Duration::from_secs(60),
    }
}

/// `request`'s scenario with `users` employees (of its workload's think time and profile).
fn base_scenario(request: &PlanRequest, users: u32) -> Scenario {
    let mut workload = request.workload.clone();
    let (Arrivals::Employees { profile, .. } | Arrivals::Poisson { profile, .. }) = workload.arrivals;
    workload.arrivals = Arrivals::Employees { count: users, think_time: think_time(&request.workload), profile };
    let mut scenario = Scenario::new(request.plan.clone(), request.engine.clone(), workload);
    scenario.name = format!("plan {users} employees");
    scenario.seed = request.seed;
    scenario.client = request.client;
    scenario.slo = request.slo;
    scenario.duration = request.duration;
    scenario.sample_every = Duration::from_secs(60);
    scenario
}

/// How a setting did, compared lexicographically.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Score {
    meets: bool,
    goodput: f64,
    p99: f64,
}

impl Score {
    fn of(candidate: &Candidate) -> Self {
        Self { meets: candidate.meets_slo, goodput: candidate.goodput, p99: candidate.p99_ttft }
    }

    fn better_than(&self, other: &Score) -> bool {
        self.rank_cmp(other).is_gt()
    }

    /// `Greater` when `self` ranks higher: meets first, then more goodput, then a lower p99.
    fn rank_cmp(&self, other: &Score) -> std::cmp::Ordering {
        (self.meets, self.goodput, -self.p99)
            .partial_cmp(&(other.meets, other.goodput, -other.p99))
            .unwrap_or(std::cmp::Ordering::Equal)
    }
}

/// How many requests a probe pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pooling {
    /// [`PlanRequest::samples_per_probe`]: enough to rank settings against each other.
    Rank,
    /// As many, or [`CLOSE_CALL_FACTOR`] times as many for a close call: a verdict an answer rests on
    /// (a count of employees in the search, the recommended setting with the employees asked for).
    Verdict,
}

/// The requests of a probe's runs, pooled.
#[derive(Debug, Default)]
struct Pool {
    runs: u32,
    arrived: u64,
    completed: u64,
    failed: u64,
    goodput_sum: f64,
    /// TTFT of every completed request, seconds; sorted by [`p99`](Self::p99).
    ttft: Vec<f64>,
}

impl Pool {
    fn add(&mut self, report: &Report) {
        self.runs += 1;
        self.arrived += report.arrived;
        self.completed += report.completed;
        self.failed += report.failed.total();
        self.goodput_sum += report.goodput;
        self.ttft.extend_from_slice(&report.ttft_sorted);
    }

    /// Nearest-rank p99 TTFT of the completed requests (0 without any).
    fn p99(&mut self) -> f64 {
        self.ttft.sort_unstable_by(f64::total_cmp);
        Percentiles::of_sorted(&self.ttft).p99
    }

    /// Share of the arrived requests that failed.
    fn failure_ratio(&self) -> f64 {
        if self.arrived == 0 { 0.0 } else { self.failed as f64 / self.arrived as f64 }
    }
}

struct Probe<'r> {
    request: &'r PlanRequest,
}

impl Probe<'_> {
    /// The first run of a probe of `users` employees behind `gate`.
    fn scenario(&self, gate: &AdmissionSpec, users: u32) -> Scenario {
        let mut scenario = base_scenario(self.request, users);
        scenario.gate = GateSpec::Admission(Box::new(gate.clone()));
        scenario
    }

    /// `users` employees behind `gate`: runs with seed [`PlanRequest::seed`], then seeds drawn from it,
    /// until [`PlanRequest::samples_per_probe`] requests arrived, pooled; for a [`Pooling::Verdict`], a
    /// close call — a pooled p99 within [`CLOSE_CALL`] of the SLO, or a failure share within it of the
    /// bound — pools [`CLOSE_CALL_FACTOR`] times as many before it is judged. Never more than
    /// [`MAX_RUNS_PER_PROBE`] runs.
    fn measure(&self, gate: &AdmissionSpec, users: u32, pooling: Pooling) -> Result<Candidate, ConfigError> {
        let request = self.request;
        let slo = request.slo.ttft.as_secs_f64();
        let close_call = |pool: &mut Pool| {
            (pool.p99() - slo).abs() <= CLOSE_CALL * slo
                || (pool.failure_ratio() - request.max_failure_ratio).abs() <= CLOSE_CALL * request.max_failure_ratio
        };
        let mut scenario = self.scenario(gate, users);
        let mut seeds = SplitMix64::new(request.seed ^ RUN_SEED_STREAM);
        let mut pool = Pool::default();
        let mut target = u64::from(request.samples_per_probe);
        while pool.runs < MAX_RUNS_PER_PROBE {
            pool.add(&scenario.run()?);
            scenario.seed = seeds.next_u64();
            if pool.arrived < target {
                continue;
            }
            if pooling == Pooling::Rank || target > u64::from(request.samples_per_probe) || !close_call(&mut pool) {
                break;
            }
            target *= CLOSE_CALL_FACTOR;
        }
        let (p99_ttft, failure_ratio) = (pool.p99(), pool.failure_ratio());
        let meets_slo = pool.completed > 0 && p99_ttft <= slo && failure_ratio <= request.max_failure_ratio;
        Ok(Candidate {
            gate: gate.clone(),
            goodput: pool.goodput_sum / f64::from(pool.runs),
            p99_ttft,
            failure_ratio,
            meets_slo,
            runs: pool.runs,
            requests: pool.arrived,
            employees_at_slo: None,
        })
    }

    /// The most employees meeting the SLO with `gate` (0 if not even one does; `cap` if that many do),
    /// searched from `start` whatever the number asked about: doubling while the probe passes, or halving
    /// while it fails, then bisecting between the most that passed and the fewest that failed (to within
    /// 2 %).
    ///
    /// Monotone-safe: every count probed that passed is at most the answer and every count that failed is
    /// above it, so a probe that passes by luck above one that failed cannot raise the answer.
    fn employees_at_slo(&self, gate: &AdmissionSpec, start: u32, cap: u32) -> Result<u32, ConfigError> {
        let passes = |users: u32| Ok::<_, ConfigError>(self.measure(gate, users, Pooling::Verdict)?.meets_slo);
        let start = start.clamp(1, cap);
        let (mut good, mut bad) = if passes(start)? {
            let mut good = start;
            loop {
                if good >= cap {
                    return Ok(good);
                }
                let next = good.saturating_mul(2).min(cap);
                if !passes(next)? {
                    break (good, next);
                }
                good = next;
            }
        } else {
            let mut bad = start;
            loop {
                if bad == 1 {
                    return Ok(0);
                }
                let next = bad / 2;
                if passes(next)? {
                    break (next, bad);
                }
                bad = next;
            }
        };
        while bad - good > 1 && bad - good > good / 50 {
            let mid = good + (bad - good) / 2;
            if passes(mid)? {
                good = mid;
            } else {
                bad = mid;
            }
        }
        Ok(good)
    }
}
