//! The overload lab: a deterministic discrete-event simulation of one GPU inference server under a
//! company's traffic, with the real [`Admission`](crate::Admission) in front of it.
//!
//! A [`Scenario`] puts together an [`Engine`] — a continuous-batching server scheduled like vLLM's v1
//! scheduler, on the paged KV pool of a [`GpuPlan`](crate::kv::GpuPlan), with step times from a
//! [`Roofline`] — a [`Workload`] of employees or Poisson arrivals with heavy-tailed lengths, clients that
//! time out and retry by a [`ClientPolicy`], and a [`Gate`] in between. [`Scenario::run`] returns a
//! [`Report`]: goodput, TTFT and end-to-end percentiles, tries per request, preemptions, peak KV,
//! fairness between tenants, and time series; [`plot`] draws them as SVG, and [`plan`] searches for the
//! admission limits that keep a TTFT SLO for a given number of employees.
//!
//! # The real admission, in virtual time
//! Every gate except [`NoGate`] is a real [`Admission`](crate::Admission) built on a
//! [`ManualClock`](crate::clock::ManualClock) with `deadline_timer(false)`: the lab sets the clock to
//! each event's time, calls `try_admit` or polls the `admit` future by hand with its own waker, and drops
//! or completes permits when requests leave the engine. Nothing is re-implemented: a change to the
//! admission core changes what the lab measures. A new policy is judged by implementing [`Gate`]; the
//! [`PolicyGate`] runs the adaptive concurrency controller ([`crate::adaptive`]) and engine feedback
//! ([`crate::feedback`]) inside the lab, fed as a gateway feeds them (every first token, last token and
//! abandoned request; the engine's counters rendered as vLLM's `/metrics` text).
//!
//! # Determinism
//! A run is a pure function of its scenario: one seeded [`SplitMix64`](crate::retry::SplitMix64) stream
//! per purpose (workload, clients, arrivals), events ordered by time and then by insertion, no hash-map
//! iteration, no threads, no real clock. The same scenario gives a byte-identical [`Report`] (its
//! `Debug` output) and byte-identical plots.
//!
//! # What the model leaves out (read before trusting a number)
//! - Step times are a roofline lower bound (see [`Roofline`]): no attention FLOPs, no tensor-parallel
//!   communication, peak bandwidth. Real servers are slower by a constant factor; comparisons between
//!   gates hold better than absolute latencies.
//! - The engine has no swapping, no speculative decoding, no priority scheduling, and counts
//!   prefix-cache hits' blocks for every sequence (see [`Engine`]).
//! - Output lengths are drawn when a request arrives and known to the engine (not to the gate, which
//!   reserves `max_tokens` as a real gateway must).
//! - One server; no network latency except [`IMMEDIATE_RETRY_GAP`] for immediate retries; streaming
//!   clients never disconnect once their first token arrived.
//!
//! # Examples
//!
//! ```
//! use kvgate::kv::{GpuPlan, ModelSpec, WeightDtype};
//! use kvgate::sim::{Arrivals, EngineConfig, GateSpec, Profile, Scenario, Workload};
//! use std::time::Duration;
//!
//! let plan = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b")?).gpu("l4").build()?;
//! let engine = EngineConfig::for_plan(&plan, WeightDtype::Bf16)?;
//! let workload = Workload::chat(Arrivals::Poisson { rate: 2.0, profile: Profile::Flat, tenants: 50 });
//! let mut scenario = Scenario::new(plan, engine, workload);
//! scenario.duration = Duration::from_secs(60);
//! for gate in [GateSpec::None, GateSpec::kv_admit(None, 64, Duration::from_secs(2))] {
//!     scenario.gate = gate;
//!     let report = scenario.run()?;
//!     println!("{report}");
//!     // Deterministic: the same scenario prints the same report.
//!     assert_eq!(format!("{report:?}"), format!("{:?}", scenario.run()?));
//! }
//! # Ok::<(), kvgate::ConfigError>(())
//! ```

mod client;
mod dist;
mod engine;
mod exposition;
mod gate;
mod lab;
mod planner;
pub mod plot;
mod policy_gate;
mod report;
mod roofline;
mod scenario;
mod spec;
mod workload;

pub use client::{ClientPolicy, IMMEDIATE_RETRY_GAP, RetryKind};
pub use dist::LengthDist;
pub use engine::{
    DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS, Engine, EngineConfig, EngineEvent, EngineRefusal,
    EngineStatus, SeqId,
};
pub use gate::{AdmissionGate, Entry, Gate, GateContext, NoGate};
pub use planner::{Candidate, PlanRequest, Recommendation, plan};
pub use policy_gate::{FeedbackSetup, PolicyGate};
pub use report::{ClassReport, DeadlineReport, Failures, Percentiles, Report, TenantReport, TimeSeries, jain_index};
pub use roofline::{DEFAULT_COMPUTE_EFFICIENCY, Hardware, Roofline};
pub use scenario::{Scenario, Slo};
pub use spec::{AdmissionSpec, GateSpec, Pricing};
pub use workload::{Arrivals, HEAVY_USER_TENANT, HeavyUser, MixShift, PoissonArrivals, Profile, Workload};
