//! A scenario: one GPU server, its traffic, its clients, its gate and its SLOs — everything a run
//! depends on, seed included.

use super::client::ClientPolicy;
use super::engine::{Engine, EngineConfig};
use super::gate::{Gate, GateContext};
use super::lab;
use super::report::Report;
use super::spec::GateSpec;
use super::workload::{Arrivals, HeavyUser, MixShift, Profile, Workload};
use crate::adaptive::AdaptiveConfig;
use crate::error::ConfigError;
use crate::kv::GpuPlan;
use std::time::Duration;

/// The service levels a request must meet to count as good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slo {
    /// Longest acceptable time from the first try to the first token.
    pub ttft: Duration,
    /// Longest acceptable time from the first try to the last token.
    pub e2e: Duration,
}

impl Default for Slo {
    /// 2 s to the first token, 60 s to the last.
    fn default() -> Self {
        Self { ttft: Duration::from_secs(2), e2e: Duration::from_secs(60) }
    }
}

/// Everything one run depends on. The same scenario always gives the same [`Report`].
///
/// # Examples
///
/// ```
/// use kvgate::kv::{GpuPlan, ModelSpec, WeightDtype};
/// use kvgate::sim::{EngineConfig, GateSpec, Scenario, Workload};
/// use std::time::Duration;
///
/// let plan = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b")?).gpu("l4").build()?;
/// let workload = Workload::employees(40, Duration::from_secs(60), Duration::from_secs(30));
/// let mut scenario = Scenario::new(plan.clone(), EngineConfig::for_plan(&plan, WeightDtype::Bf16)?, workload);
/// scenario.duration = Duration::from_secs(120);
/// scenario.gate = GateSpec::kv_admit(None, 64, Duration::from_secs(2));
/// let report = scenario.run()?;
/// assert_eq!(report.arrived, report.completed + report.failed.total() + report.in_system);
/// assert_eq!(report.preemptions, 0); // kvgate reserves prompt + max_tokens: the pool never runs out
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// A name for tables.
    pub name: String,
    /// Seed of every random draw.
    pub seed: u64,
    /// The model on the GPU(s), and the KV pool it leaves.
    pub plan: GpuPlan,
    /// The engine's settings and the GPU's figures.
    pub engine: EngineConfig,
    /// The traffic.
    pub workload: Workload,
    /// What clients do when refused or kept waiting.
    pub client: ClientPolicy,
    /// The gate in front of the engine.
    pub gate: GateSpec,
    /// What counts as good.
    pub slo: Slo,
    /// The simulated period: arrivals stop at its end.
    pub duration: Duration,
    /// Extra time after `duration` for requests in flight to finish; what is left then is `in_system`.
    pub drain: Duration,
    /// Time between samples of the time series.
    pub sample_every: Duration,
}

impl Scenario {
    /// A scenario with seed 1, no gate, full-jitter clients, the default [`Slo`], 10 simulated minutes,
    /// 5 minutes of drain and a sample every 5 s.
    pub fn new(plan: GpuPlan, engine: EngineConfig, workload: Workload) -> Self {
        Self {
            name: String::from("scenario"),
            seed: 1,
            plan,
            engine,
            workload,
            client: ClientPolicy::full_jitter(),
            gate: GateSpec::None,
            slo: Slo::default(),
            duration: Duration::from_secs(600),
            drain: Duration::from_secs(300),
            sample_every: Duration::from_secs(5),
        }
    }

    /// Chat traffic ([`Workload::chat`]: Poisson arrivals over 200 employees, flat) at `factor` × what
    /// `engine` sustains for it ([`Engine::capacity_estimate`]), for `duration`, with two minutes of drain.
    ///
    /// # Errors
    ///
    /// As [`Engine::new`]; [`ConfigError`] for a `factor` that is not finite and positive.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::kv::{GpuPlan, ModelSpec, WeightDtype};
    /// use kvgate::sim::{Arrivals, EngineConfig, Scenario};
    /// use std::time::Duration;
    ///
    /// let plan = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b")?).gpu("h100-80").build()?;
    /// let engine = EngineConfig::for_plan(&plan, WeightDtype::Bf16)?;
    /// let scenario = Scenario::overloaded(plan, engine, 2.0, Duration::from_secs(600))?;
    /// let Arrivals::Poisson { rate, .. } = scenario.workload.arrivals else { unreachable!() };
    /// assert!((35.0..45.0).contains(&rate)); // 2 × about 20 requests/s
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn overloaded(
        plan: GpuPlan,
        engine: EngineConfig,
        factor: f64,
        duration: Duration,
    ) -> Result<Self, ConfigError> {
        super::roofline::positive("overload factor", factor)?;
        let mut scenario = Scenario::new(
            plan,
            engine,
            Workload::chat(Arrivals::Poisson { rate: 1.0, profile: Profile::Flat, tenants: 200 }),
        );
        let (prompt, output) = scenario.workload.mean_lengths();
        let capacity = scenario.build_engine()?.capacity_estimate(prompt, output);
        scenario.workload.arrivals =
            Arrivals::Poisson { rate: factor * capacity, profile: Profile::Flat, tenants: 200 };
        scenario.name = format!("chat {factor}x");
        scenario.duration = duration;
        scenario.drain = Duration::from_secs(120);
        Ok(scenario)
    }

    /// [`overloaded`](Self::overloaded), but halfway through the chats give way to long documents
    /// ([`MixShift::documents`]), and the arrival rate to `factor` × what the engine sustains for them: the
    /// same overload on both halves, for traffic that no single static limit suits.
    ///
    /// # Errors
    ///
    /// As [`overloaded`](Self::overloaded).
    pub fn chats_then_documents(
        plan: GpuPlan,
        engine: EngineConfig,
        factor: f64,
        duration: Duration,
    ) -> Result<Self, ConfigError> {
        let mut scenario = Self::overloaded(plan, engine, factor, duration)?;
        let shift = MixShift::documents(duration / 2);
        scenario.workload.shift = Some(shift);
        let engine = scenario.build_engine()?;
        let (prompt, output) = scenario.workload.mean_lengths();
        let (doc_prompt, doc_output) = scenario.workload.mean_lengths_after_shift();
        let (chats, documents) =
            (engine.capacity_estimate(prompt, output), engine.capacity_estimate(doc_prompt, doc_output));
        scenario.workload.arrivals = Arrivals::Poisson {
            rate: factor * chats,
            profile: Profile::Step { at: shift.at, after: (documents / chats).min(1.0) },
            tenants: 200,
        };
        scenario.name = format!("chats then documents {factor}x");
        Ok(scenario)
    }

    /// Tenants that are never idle: each of `scripts` keeps its streams busy for `duration`
    /// ([`Workload::scripted`]; `scripts[i]` is tenant [`Workload::script_tenant`]`(i)`), with clients
    /// that wait as long as it takes (a batch job does not give up), and no drain, so that what each
    /// tenant was served ([`Report::tenants`]) is what it got while all of them were backlogged.
    /// `max_tokens` is 512.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for an empty `scripts` or a script with no streams or a bad length.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::Fairness;
    /// use kvgate::kv::{GpuPlan, KvDtype, ModelSpec};
    /// use kvgate::sim::{EngineConfig, GateSpec, HeavyUser, Scenario, Workload, jain_index};
    /// use std::time::Duration;
    ///
    /// let plan = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b")?).gpu("h100-80").build()?;
    /// let engine = EngineConfig::for_plan(&plan, KvDtype::Bf16)?;
    /// let questions = HeavyUser::fixed(256, 200, 20);
    /// let documents = HeavyUser::fixed(256, 4000, 400); // 20 times the size
    /// let mut scenario =
    ///     Scenario::backlogged_tenants(plan, engine, vec![questions, documents], Duration::from_secs(120))?;
    /// scenario.gate = GateSpec::kv_fairness(Fairness::tokens(), 1024, Duration::from_secs(3600));
    /// let report = scenario.run()?;
    /// let served: Vec<f64> = report.tenants.iter().map(|t| t.served(1, 2) as f64).collect();
    /// assert!(jain_index(&served) > 0.95); // by request count it would be about 0.55
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn backlogged_tenants(
        plan: GpuPlan,
        engine: EngineConfig,
        scripts: Vec<HeavyUser>,
        duration: Duration,
    ) -> Result<Self, ConfigError> {
        if scripts.is_empty() {
            return Err(ConfigError::Zero { what: "backlogged tenants (scripts)" });
        }
        let mut workload = Workload::scripted(scripts);
        workload.max_new_tokens = 512;
        workload.validate()?;
        let mut scenario = Scenario::new(plan, engine, workload);
        scenario.name = format!("{} backlogged tenants", scenario.workload.scripts.len());
        scenario.duration = duration;
        scenario.drain = Duration::ZERO;
        scenario.client.first_token_timeout = duration.max(Duration::from_secs(1));
        scenario.client.give_up_after = duration.max(Duration::from_secs(1));
        Ok(scenario)
    }

    /// The adaptive controller as an operator of this scenario configures it: from its SLOs alone — the
    /// TTFT SLO, and the end-to-end SLO spread over `max_new_tokens` as a time per output token — with at
    /// least 4 requests in flight.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::kv::{GpuPlan, ModelSpec, WeightDtype};
    /// use kvgate::sim::{EngineConfig, GateSpec, Pricing, Scenario};
    /// use std::time::Duration;
    ///
    /// let plan = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b")?).gpu("h100-80").build()?;
    /// let engine = EngineConfig::for_plan(&plan, WeightDtype::Bf16)?;
    /// let mut scenario = Scenario::overloaded(plan, engine, 2.0, Duration::from_secs(60))?;
    /// let config = scenario.adaptive_config();
    /// assert_eq!(config.tpot_slo, Some(Duration::from_secs(60) / 1024));
    /// scenario.gate = GateSpec::adaptive(Pricing::Count, config);
    /// let report = scenario.run()?;
    /// assert!(report.series.max_in_flight.iter().any(|&limit| limit > 16.0)); // it grew from 16
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn adaptive_config(&self) -> AdaptiveConfig {
        let tpot = self.slo.e2e / self.workload.max_new_tokens.max(1);
        AdaptiveConfig { tpot_slo: Some(tpot), min_limit: 4, ..AdaptiveConfig::new(self.slo.ttft) }
    }

    /// Checks every setting that can be checked without building the engine.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the bad value (see [`Workload::validate`], [`ClientPolicy::validate`]); a
    /// zero SLO, duration or sample interval.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.slo.ttft.is_zero() {
            return Err(ConfigError::Zero { what: "TTFT SLO" });
        }
        if self.slo.e2e.is_zero() {
            return Err(ConfigError::Zero { what: "end-to-end SLO" });
        }
        if self.duration.is_zero() {
            return Err(ConfigError::Zero { what: "scenario duration" });
        }
        if self.sample_every.is_zero() {
            return Err(ConfigError::Zero { what: "sample interval" });
        }
        // Virtual time is u64 nanoseconds: keep every horizon far below 584 years.
        if self.duration.saturating_add(self.drain) > Duration::from_secs(365 * 24 * 3600) {
            return Err(ConfigError::OutOfRange {
                what: "scenario duration",
                reason: "duration plus drain exceed a year of simulated time".into(),
            });
        }
        if self.duration.as_nanos() / self.sample_every.as_nanos() > 10_000_000 {
            return Err(ConfigError::OutOfRange {
                what: "sample interval",
                reason: format!("{:?} gives over 10 million samples; use a longer interval", self.sample_every),
            });
        }
        self.workload.validate()?;
        self.client.validate()
    }

    /// Builds the engine this scenario runs on.
    ///
    /// # Errors
    ///
    /// As [`Engine::new`].
    pub fn build_engine(&self) -> Result<Engine, ConfigError> {
        Engine::new(&self.plan, self.engine.clone())
    }

    /// Runs the scenario with its [`GateSpec`].
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for an invalid scenario, engine or gate; nothing fails once the run started.
    pub fn run(&self) -> Result<Report, ConfigError> {
        self.run_with_gate(|context| self.gate.build(context))
    }

    /// Runs the scenario with a gate of the caller's (a policy under evaluation). `make_gate` gets the
    /// lab's clock and engine.
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run), and whatever `make_gate` returns.
    pub fn run_with_gate(
        &self,
        make_gate: impl FnOnce(&GateContext<'_>) -> Result<Box<dyn Gate>, ConfigError>,
    ) -> Result<Report, ConfigError> {
        self.validate()?;
        let engine = self.build_engine()?;
        lab::run(self, engine, make_gate)
    }
}
