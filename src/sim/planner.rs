//! The planner: which admission limits keep the p99 time to first token under an SLO for a company of
//! a given size on one GPU server, and how many employees fit at that SLO.
//!
//! The KV planner ([`GpuPlan`]) says how many sequences fit in memory; this one says how many *people*
//! fit at an acceptable latency, by simulation. For a model, a GPU and a number of employees arriving in
//! a morning rush (the [`Workload::employees`] defaults: 60 s of mean think time, chat lengths), it
//! sweeps the gate's settings in the simulator (see [`plan`]).
//!
//! Every probe is one deterministic simulation, so the same request gives the same recommendation.

use super::client::ClientPolicy;
use super::dist::LengthDist;
use super::engine::{Engine, EngineConfig};
use super::report::Report;
use super::scenario::{Scenario, Slo};
use super::spec::{AdmissionSpec, GateSpec};
use super::workload::{Arrivals, Workload};
use crate::error::ConfigError;
use crate::kv::GpuPlan;
use crate::retry::SplitMix64;
use std::fmt;
use std::time::Duration;

/// What the planner is asked.
///
/// # Examples
///
/// ```
/// use kvgate::kv::{GpuPlan, KvDtype, ModelSpec};
/// use kvgate::sim::{EngineConfig, PlanRequest};
/// use std::time::Duration;
///
/// let plan = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b")?).gpu("l4").build()?;
/// let engine = EngineConfig::for_plan(&plan, KvDtype::Bf16)?;
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
    /// Simulated period of each probe.
    pub duration: Duration,
    /// Highest share of failed requests (shed, timed out) a setting may cause and still meet the SLO.
    pub max_failure_ratio: f64,
    /// Seed of every probe.
    pub seed: u64,
}

impl PlanRequest {
    /// `users` employees arriving in a rush that peaks 5 minutes into a 20-minute period (standard
    /// deviation 2.5 minutes), full-jitter clients, a 60 s end-to-end SLO, at most 1 % failed requests.
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
            seed: 1,
        }
    }
}

/// One setting tried, and what it gave.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The gate's settings.
    pub gate: AdmissionSpec,
    /// Good requests per second.
    pub goodput: f64,
    /// p99 TTFT of completed requests, seconds.
    pub p99_ttft: f64,
    /// Share of requests that failed.
    pub failure_ratio: f64,
    /// Whether it meets the p99 SLO and the failure bound.
    pub meets_slo: bool,
}

/// The planner's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Recommendation {
    /// The chosen gate settings.
    pub gate: AdmissionSpec,
    /// The flags of the gateway example that set them.
    pub gateway_flags: String,
    /// The run with the chosen settings and the requested number of employees.
    pub report: Report,
    /// Whether that run meets the p99 SLO and the failure bound.
    pub meets_slo: bool,
    /// The most employees that still meet both with these settings (0 if not even one does).
    pub employees_at_slo: u32,
    /// Whether the search for `employees_at_slo` stopped at its cap (64 × the users asked for): at least
    /// that many fit.
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
            "with them: goodput {:.2} requests/s, p99 TTFT {:.2} s, {:.1}% of requests failed",
            self.report.goodput,
            self.report.ttft.p99,
            100.0 * self.report.failure_ratio()
        )?;
        write!(
            f,
            "employees that fit at p99 TTFT <= {slo} s with these limits: {}{}",
            if self.employees_capped { "at least " } else { "" },
            self.employees_at_slo
        )?;
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
///    KV pool holds), the longest queue wait (¼, ½, ¾ of the SLO), the queue size (one or two waits'
///    worth of the engine's estimated throughput, or one place per employee) and a global request rate
///    (none, or the estimated throughput);
/// 2. keeps the setting with the best score: first whether the p99 TTFT meets the SLO *and* at most
///    [`PlanRequest::max_failure_ratio`] of the requests fail, then goodput, then the lower p99;
/// 3. with the chosen limits, searches for the largest number of employees that still meets both
///    (doubling, then bisecting to within 2 %).
///
/// Every probe is one deterministic simulation, so the same request gives the same recommendation.
///
/// # Errors
///
/// [`ConfigError`] for zero users, a zero SLO, a failure bound outside `[0, 1]`, or an invalid engine,
/// workload or client setting (the probes themselves cannot fail once the first one ran).
///
/// # Examples
///
/// ```no_run
/// use kvgate::kv::{GpuPlan, KvDtype, ModelSpec};
/// use kvgate::sim::{EngineConfig, PlanRequest, plan};
/// use std::time::Duration;
///
/// let gpu_plan = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b")?).gpu("l4").build()?;
/// let engine = EngineConfig::for_plan(&gpu_plan, KvDtype::Bf16)?;
/// let recommendation = plan(&PlanRequest::new(gpu_plan, engine, 300, Duration::from_secs(2)))?;
/// println!("{recommendation}");
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
pub fn plan(request: &PlanRequest) -> Result<Recommendation, ConfigError> {
    if request.users == 0 {
        return Err(ConfigError::Zero { what: "users" });
    }
    if !(0.0..=1.0).contains(&request.max_failure_ratio) {
        return Err(ConfigError::OutOfRange {
            what: "max_failure_ratio",
            reason: format!("{}; use a share of requests in [0, 1]", request.max_failure_ratio),
        });
    }
    let engine = Engine::new(&request.plan, request.engine.clone())?;
    let probe = Probe { request, base: base_scenario(request, request.users) };
    probe.base.validate()?;

    let (mean_prompt, mean_output) = request.workload.mean_lengths();
    let throughput = engine.capacity_estimate(mean_prompt, mean_output).max(0.01);
    // Sequences of a mean prompt with a full `max_tokens` reservation that the pool holds.
    let reservation = mean_prompt.ceil() as u64 + u64::from(request.workload.max_new_tokens);
    let full_reservations = (engine.pool_bytes() / engine.sequence_bytes(reservation).max(1)).max(1) as usize;
    let slo = request.slo.ttft;
    let queue_for = |wait: Duration, waits: f64| (throughput * wait.as_secs_f64() * waits).ceil() as usize + 1;

    let mut best = match GateSpec::kv_admit(None, queue_for(slo / 2, 1.0), slo / 2) {
        GateSpec::Admission(spec) => *spec,
        GateSpec::None => unreachable!("kv_admit builds an admission spec"),
    };
    best.label = "kvgate (planned)".into();
    let mut candidates = Vec::new();
    let mut best_score = probe.score(&best, &mut candidates)?;
    let dimensions: [Sweep<'_>; 4] = [
        &|spec| {
            let mut out = vec![AdmissionSpec { max_in_flight: None, ..spec.clone() }];
            for n in [full_reservations / 2, full_reservations / 4] {
                if n >= 1 {
                    out.push(AdmissionSpec { max_in_flight: Some(n), ..spec.clone() });
                }
            }
            out
        },
        &|spec| {
            [slo / 4, slo / 2, slo * 3 / 4]
                .into_iter()
                .filter(|w| !w.is_zero())
                .map(|w| AdmissionSpec { max_wait: Some(w), queue_capacity: queue_for(w, 1.0), ..spec.clone() })
                .collect()
        },
        &|spec| {
            let wait = spec.max_wait.unwrap_or(slo / 2);
            [queue_for(wait, 1.0), queue_for(wait, 2.0), request.users as usize]
                .into_iter()
                .map(|q| AdmissionSpec { queue_capacity: q, ..spec.clone() })
                .collect()
        },
        &|spec| {
            let burst = queue_for(spec.max_wait.unwrap_or(slo / 2), 1.0).min(u32::MAX as usize) as u32;
            vec![
                AdmissionSpec { request_rate: None, ..spec.clone() },
                AdmissionSpec { request_rate: Some((round_rate(throughput), burst.max(1))), ..spec.clone() },
            ]
        },
    ];
    for dimension in dimensions {
        for candidate in dimension(&best) {
            if candidates.iter().any(|c: &Candidate| c.gate == candidate) {
                continue;
            }
            let score = probe.score(&candidate, &mut candidates)?;
            if score.better_than(&best_score) {
                best = candidate;
                best_score = score;
            }
        }
    }

    let p99_prompt_tokens = p99_draw(&request.workload.prompt_tokens, request.seed);
    let unloaded_p99_ttft = engine.roofline().compute_time(u64::from(p99_prompt_tokens)).as_secs_f64();
    let report = probe.run(&best, request.users)?;
    let meets_slo = probe.meets(&report);
    let (employees_at_slo, employees_capped) = probe.employees_at_slo(&best, meets_slo)?;
    Ok(Recommendation {
        gateway_flags: best.gateway_flags(request.plan.model().name(), request.plan.gpu()),
        gate: best,
        report,
        meets_slo,
        employees_at_slo,
        employees_capped,
        candidates,
        ttft_slo: request.slo.ttft,
        users: request.users,
        p99_prompt_tokens,
        unloaded_p99_ttft,
    })
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

fn base_scenario(request: &PlanRequest, users: u32) -> Scenario {
    let mut workload = request.workload.clone();
    let (think_time, profile) = match workload.arrivals {
        Arrivals::Employees { think_time, profile, .. } => (think_time, profile),
        Arrivals::Poisson { profile, .. } => (Duration::from_secs(60), profile),
    };
    workload.arrivals = Arrivals::Employees { count: users, think_time, profile };
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
    fn better_than(&self, other: &Score) -> bool {
        (self.meets, self.goodput, -self.p99) > (other.meets, other.goodput, -other.p99)
    }
}

struct Probe<'r> {
    request: &'r PlanRequest,
    base: Scenario,
}

impl Probe<'_> {
    fn run(&self, gate: &AdmissionSpec, users: u32) -> Result<Report, ConfigError> {
        let mut scenario =
            if users == self.request.users { self.base.clone() } else { base_scenario(self.request, users) };
        scenario.gate = GateSpec::Admission(Box::new(gate.clone()));
        scenario.run()
    }

    fn meets(&self, report: &Report) -> bool {
        report.completed > 0
            && report.ttft.p99 <= self.request.slo.ttft.as_secs_f64()
            && report.failure_ratio() <= self.request.max_failure_ratio
    }

    fn score(&self, gate: &AdmissionSpec, tried: &mut Vec<Candidate>) -> Result<Score, ConfigError> {
        let report = self.run(gate, self.request.users)?;
        let meets = self.meets(&report);
        tried.push(Candidate {
            gate: gate.clone(),
            goodput: report.goodput,
            p99_ttft: report.ttft.p99,
            failure_ratio: report.failure_ratio(),
            meets_slo: meets,
        });
        Ok(Score { meets, goodput: report.goodput, p99: report.ttft.p99 })
    }

    /// The most employees meeting the SLO with `gate`: doubling from the users asked for while it holds,
    /// then bisecting; or bisecting below when it does not hold for them.
    fn employees_at_slo(&self, gate: &AdmissionSpec, meets_at_users: bool) -> Result<(u32, bool), ConfigError> {
        let users = self.request.users;
        let cap = users.saturating_mul(64);
        let (mut good, mut bad) = if meets_at_users {
            let mut good = users;
            loop {
                if good >= cap {
                    return Ok((good, true));
                }
                let next = good.saturating_mul(2).min(cap);
                if self.meets(&self.run(gate, next)?) {
                    good = next;
                } else {
                    break (good, next);
                }
            }
        } else {
            (0, users)
        };
        while bad - good > 1 && bad - good > good / 50 {
            let mid = good + (bad - good) / 2;
            if self.meets(&self.run(gate, mid)?) {
                good = mid;
            } else {
                bad = mid;
            }
        }
        Ok((good, false))
    }
}
