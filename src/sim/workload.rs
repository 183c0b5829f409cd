//! Who sends what, and when: employees with think times or Poisson arrivals, shaped by a morning rush,
//! with heavy-tailed prompt and answer lengths and an optional scripted heavy user.

use super::dist::{self, LengthDist};
use super::roofline::positive;
use crate::error::ConfigError;
use crate::retry::SplitMix64;
use std::time::Duration;

/// How the arrival rate (or the arrival of employees at work) varies over the simulated period.
///
/// # Examples
///
/// ```
/// use kvgate::sim::Profile;
/// use std::time::Duration;
///
/// let rush = Profile::MorningRush { peak_at: Duration::from_secs(600), spread: Duration::from_secs(180), floor: 0.2 };
/// assert_eq!(rush.level(Duration::from_secs(600)), 1.0);
/// assert!(rush.level(Duration::from_secs(0)) < 0.3);
/// assert_eq!(Profile::Flat.level(Duration::from_secs(5)), 1.0);
/// let step = Profile::Step { at: Duration::from_secs(900), after: 0.25 };
/// assert_eq!((step.level(Duration::from_secs(899)), step.level(Duration::from_secs(900))), (1.0, 0.25));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Profile {
    /// The same rate all the time; employees start at random times within their first think time.
    Flat,
    /// A bump: the rate is `floor + (1 − floor) · exp(−(t − peak_at)² / (2 · spread²))` of the peak rate;
    /// employees arrive at work at normally distributed times around `peak_at` (standard deviation
    /// `spread`).
    MorningRush {
        /// When the rush peaks, from the start of the simulation.
        peak_at: Duration,
        /// Its standard deviation.
        spread: Duration,
        /// The rate far from the peak, as a share of the peak rate, in `[0, 1]`.
        floor: f64,
    },
    /// The full rate until `at`, then `after` of it (a traffic change, such as a [`MixShift`] to longer
    /// requests that the same engine serves fewer of); employees arrive at work as with [`Profile::Flat`].
    Step {
        /// When the rate changes.
        at: Duration,
        /// The rate from then on, as a share of the rate before, in `[0, 1]`.
        after: f64,
    },
    /// Short spikes between quiet periods: the full rate for the first `burst` of every `period`, `floor`
    /// of it for the rest; employees arrive at work as with [`Profile::Flat`].
    Bursts {
        /// From the start of one spike to the start of the next (`> 0`).
        period: Duration,
        /// How long each spike lasts (`<= period`).
        burst: Duration,
        /// The rate between spikes, as a share of the peak rate, in `[0, 1]`.
        floor: f64,
    },
}

impl Profile {
    /// The rate at time `at` as a share of the peak rate, in `[0, 1]`.
    pub fn level(&self, at: Duration) -> f64 {
        match *self {
            Profile::Flat => 1.0,
            Profile::Step { at: change, after } => {
                if at < change {
                    1.0
                } else {
                    after
                }
            }
            Profile::MorningRush { peak_at, spread, floor } => {
                let z = (at.as_secs_f64() - peak_at.as_secs_f64()) / spread.as_secs_f64();
                floor + (1.0 - floor) * (-0.5 * z * z).exp()
            }
            Profile::Bursts { period, burst, floor } => {
                let into = at.as_nanos() % period.as_nanos().max(1);
                if into < burst.as_nanos() { 1.0 } else { floor }
            }
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        match *self {
            Profile::Flat => Ok(()),
            Profile::Step { after, .. } => {
                if !(0.0..=1.0).contains(&after) {
                    return Err(ConfigError::OutOfRange {
                        what: "step profile share after the change",
                        reason: format!("{after}; use a share of the earlier rate in [0, 1]"),
                    });
                }
                Ok(())
            }
            Profile::Bursts { period, burst, floor } => {
                if period.is_zero() || burst.is_zero() {
                    return Err(ConfigError::Zero { what: "burst profile period and burst" });
                }
                if burst > period || !(0.0..=1.0).contains(&floor) {
                    return Err(ConfigError::OutOfRange {
                        what: "burst profile",
                        reason: format!(
                            "burst {burst:?} of period {period:?}, floor {floor}; use burst <= period and a floor in [0, 1]"
                        ),
                    });
                }
                Ok(())
            }
            Profile::MorningRush { spread, floor, .. } => {
                if spread.is_zero() {
                    return Err(ConfigError::Zero { what: "morning rush spread" });
                }
                if !(0.0..=1.0).contains(&floor) {
                    return Err(ConfigError::OutOfRange {
                        what: "morning rush floor",
                        reason: format!("{floor}; use a share of the peak rate in [0, 1]"),
                    });
                }
                Ok(())
            }
        }
    }
}

/// Poisson arrivals whose rate follows a [`Profile`] (Lewis–Shedler thinning: candidates at the peak
/// rate, each kept with probability `level(t)`). An endless iterator of arrival times.
///
/// # Examples
///
/// ```
/// use kvgate::sim::{PoissonArrivals, Profile};
/// use std::time::Duration;
///
/// let arrivals = PoissonArrivals::new(10.0, Profile::Flat, 42)?;
/// let in_a_minute = arrivals.take_while(|t| *t < Duration::from_secs(60)).count();
/// assert!((500..700).contains(&in_a_minute)); // 600 expected
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct PoissonArrivals {
    rate: f64,
    profile: Profile,
    rng: SplitMix64,
    at: f64,
}

impl PoissonArrivals {
    /// Arrivals at `rate` per second at the profile's peak, drawn from `seed`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for a rate that is not finite and positive, or an invalid profile.
    pub fn new(rate: f64, profile: Profile, seed: u64) -> Result<Self, ConfigError> {
        positive("arrival rate (requests/s)", rate)?;
        profile.validate()?;
        Ok(Self { rate, profile, rng: SplitMix64::new(seed), at: 0.0 })
    }
}

impl Iterator for PoissonArrivals {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        loop {
            self.at += dist::exponential(&mut self.rng, 1.0 / self.rate);
            let at = Duration::from_secs_f64(self.at.min(1e12));
            if matches!(self.profile, Profile::Flat) || dist::unit(&mut self.rng) < self.profile.level(at) {
                return Some(at);
            }
        }
    }
}

/// Where requests come from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrivals {
    /// Open loop: requests arrive as a Poisson process of `rate` per second at the profile's peak,
    /// whatever happens to earlier ones; each is attributed to one of `tenants` employees at random.
    Poisson {
        /// Requests per second at the peak.
        rate: f64,
        /// How the rate varies.
        profile: Profile,
        /// Employees the requests are attributed to (their tenants).
        tenants: u32,
    },
    /// Closed loop: `count` employees, each its own tenant, arriving at work as the profile says; each
    /// sends a request, waits for its answer (or gives up), thinks for an exponentially distributed
    /// time, and sends the next, until the simulated period ends.
    Employees {
        /// Employees.
        count: u32,
        /// Mean think time between an answer and the next request.
        think_time: Duration,
        /// When they arrive at work.
        profile: Profile,
    },
}

/// The tenant of the workload's [`heavy_user`](Workload::heavy_user) (employees are tenants
/// `0..count`; the further [`scripts`](Workload::scripts) are [`Workload::script_tenant`]).
pub const HEAVY_USER_TENANT: u64 = u64::MAX / 2;

/// A scripted heavy user: one tenant keeping `streams` requests in flight back to back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeavyUser {
    /// Parallel workers, each sending its next request as soon as the previous one ends (at least 1 ms
    /// later: a network round trip).
    pub streams: u32,
    /// When the script starts.
    pub start: Duration,
    /// Its prompts.
    pub prompt_tokens: LengthDist,
    /// Its answers (clamped to the workload's `max_new_tokens`).
    pub output_tokens: LengthDist,
}

impl HeavyUser {
    /// A batch script with `streams` workers from the start, sending long prompts (log-normal, median
    /// 3,000 tokens, σ 0.5, up to 12,000) for long answers (median 600, σ 0.5).
    pub fn script(streams: u32) -> Self {
        Self {
            streams,
            start: Duration::ZERO,
            prompt_tokens: LengthDist::LogNormal { median: 3000.0, sigma: 0.5, min: 16, max: 12_000 },
            output_tokens: LengthDist::LogNormal { median: 600.0, sigma: 0.5, min: 8, max: 4096 },
        }
    }

    /// A script with `streams` workers from the start, every request `prompt` tokens in and `output` out.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::sim::{HeavyUser, LengthDist};
    ///
    /// let documents = HeavyUser::fixed(64, 4000, 400);
    /// assert_eq!((documents.prompt_tokens, documents.output_tokens), (LengthDist::Fixed(4000), LengthDist::Fixed(400)));
    /// ```
    pub fn fixed(streams: u32, prompt: u32, output: u32) -> Self {
        Self {
            streams,
            start: Duration::ZERO,
            prompt_tokens: LengthDist::Fixed(prompt),
            output_tokens: LengthDist::Fixed(output),
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.streams == 0 {
            return Err(ConfigError::Zero { what: "heavy user streams" });
        }
        self.prompt_tokens.validate("heavy user prompt length distribution")?;
        self.output_tokens.validate("heavy user output length distribution")
    }
}

/// A change of the employees' request lengths during the run: from `at` on, prompts and answers follow
/// these distributions instead of the workload's (a company's chat traffic giving way to a batch of long
/// documents, the case where any limit tuned for one half is wrong for the other).
///
/// # Examples
///
/// ```
/// use kvgate::sim::{Arrivals, MixShift, Profile, Workload};
/// use std::time::Duration;
///
/// let mut workload = Workload::chat(Arrivals::Poisson { rate: 40.0, profile: Profile::Flat, tenants: 200 });
/// workload.shift = Some(MixShift::documents(Duration::from_secs(900)));
/// let (chat_prompt, _) = workload.mean_lengths();
/// let (document_prompt, _) = workload.mean_lengths_after_shift();
/// assert!(document_prompt > 6.0 * chat_prompt); // about 6,500 against 990 tokens
/// workload.validate()?;
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MixShift {
    /// When the lengths change.
    pub at: Duration,
    /// Prompt lengths from then on.
    pub prompt_tokens: LengthDist,
    /// Answer lengths from then on (clamped to the workload's `max_new_tokens`).
    pub output_tokens: LengthDist,
}

impl MixShift {
    /// Long documents from `at` on: prompts log-normal with a median of 6,000 tokens, σ 0.4, clamped to
    /// 1,000..=16,000 (mean ≈ 6,500); answers as in [`Workload::chat`] (median 250, σ 0.7).
    pub fn documents(at: Duration) -> Self {
        Self {
            at,
            prompt_tokens: LengthDist::LogNormal { median: 6000.0, sigma: 0.4, min: 1000, max: 16_000 },
            output_tokens: CHAT_OUTPUT,
        }
    }
}

/// Answer lengths of [`Workload::chat`].
const CHAT_OUTPUT: LengthDist = LengthDist::LogNormal { median: 250.0, sigma: 0.7, min: 8, max: 1024 };

/// The traffic of a scenario.
///
/// # Default parameters ([`Workload::chat`])
/// Chosen to resemble a company's chat assistant, some prompts carrying a pasted document; they are
/// assumptions to change, not measurements of a trace:
///
/// | what | distribution |
/// |---|---|
/// | prompt | log-normal, median 600 tokens, σ = 1.0 (mean ≈ 990), clamped to 16..=12,000 |
/// | answer | log-normal, median 250 tokens, σ = 0.7 (mean ≈ 320), clamped to 8..=`max_new_tokens` |
/// | `max_tokens` asked | 1024 |
/// | think time between an employee's requests | exponential, mean 60 s |
///
/// The heavy user ([`HeavyUser::script`]) is a batch script with 16 parallel workers sending long
/// prompts back to back (median 3,000 tokens, answers median 600).
///
/// # Examples
///
/// ```
/// use kvgate::sim::{Arrivals, HeavyUser, Profile, Workload};
/// use std::time::Duration;
///
/// let mut workload = Workload::chat(Arrivals::Employees {
///     count: 200,
///     think_time: Duration::from_secs(60),
///     profile: Profile::Flat,
/// });
/// workload.heavy_user = Some(HeavyUser::script(16));
/// workload.validate()?;
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// Where requests come from.
    pub arrivals: Arrivals,
    /// Prompt lengths of the employees' requests.
    pub prompt_tokens: LengthDist,
    /// Answer lengths (what the model really generates; clamped to `max_new_tokens`).
    pub output_tokens: LengthDist,
    /// The `max_tokens` every request asks for (what a KV reservation must cover).
    pub max_new_tokens: u32,
    /// An optional scripted heavy user on top.
    pub heavy_user: Option<HeavyUser>,
    /// An optional change of the employees' request lengths during the run.
    pub shift: Option<MixShift>,
    /// Further scripted users, each its own tenant ([`Workload::script_tenant`]): backlogged tenants
    /// whose requests differ in size, for judging fairness between them.
    pub scripts: Vec<HeavyUser>,
    /// A deadline for the first token that every employee's request carries (a gateway's header or
    /// default), counted from its first try: each try tells the gate what is left of it
    /// ([`Request::ttft_deadline`](crate::Request::ttft_deadline), which a gate passes on or ignores), and
    /// the client starts no try once it has passed. `None`: requests carry none.
    pub ttft_deadline: Option<Duration>,
}

impl Workload {
    /// Chat traffic with the default lengths (see [`Workload`]) from `arrivals`.
    pub fn chat(arrivals: Arrivals) -> Self {
        Self {
            arrivals,
            prompt_tokens: LengthDist::LogNormal { median: 600.0, sigma: 1.0, min: 16, max: 12_000 },
            output_tokens: CHAT_OUTPUT,
            max_new_tokens: 1024,
            heavy_user: None,
            shift: None,
            scripts: Vec::new(),
            ttft_deadline: None,
        }
    }

    /// Scripted users only, no employees: each of `scripts` is a tenant keeping its streams busy
    /// ([`Workload::script_tenant`] is the tenant of `scripts[i]`).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::sim::{HeavyUser, Workload};
    ///
    /// // Two backlogged tenants: short questions, and documents 20 times their size.
    /// let workload = Workload::scripted(vec![HeavyUser::fixed(256, 200, 20), HeavyUser::fixed(256, 4000, 400)]);
    /// workload.validate()?;
    /// assert_ne!(Workload::script_tenant(0), Workload::script_tenant(1));
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn scripted(scripts: Vec<HeavyUser>) -> Self {
        Self {
            scripts,
            ..Self::chat(Arrivals::Employees { count: 0, think_time: Duration::from_secs(60), profile: Profile::Flat })
        }
    }

    /// The tenant of `scripts[index]`: distinct from the employees' (`0..count`) and the heavy user's
    /// ([`HEAVY_USER_TENANT`]).
    pub const fn script_tenant(index: usize) -> u64 {
        HEAVY_USER_TENANT + 1 + index as u64
    }

    /// `count` employees thinking 60 s on average, arriving at work in a rush that peaks at `peak_at`
    /// with a standard deviation of `spread`.
    pub fn employees(count: u32, peak_at: Duration, spread: Duration) -> Self {
        Self::chat(Arrivals::Employees {
            count,
            think_time: Duration::from_secs(60),
            profile: Profile::MorningRush { peak_at, spread, floor: 0.0 },
        })
    }

    /// Checks every parameter.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the bad value: a rate that is not finite and positive, zero employees (with
    /// no scripted user either) or zero tenants, zero heavy-user streams, a `max_new_tokens` of 0, a bad
    /// length distribution or profile, a zero TTFT deadline.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self.arrivals {
            Arrivals::Poisson { rate, profile, tenants } => {
                positive("arrival rate (requests/s)", rate)?;
                profile.validate()?;
                if tenants == 0 {
                    return Err(ConfigError::Zero { what: "Poisson tenants (employees)" });
                }
            }
            Arrivals::Employees { count, profile, .. } => {
                if count == 0 && self.heavy_user.is_none() && self.scripts.is_empty() {
                    return Err(ConfigError::Zero { what: "employees" });
                }
                profile.validate()?;
            }
        }
        if self.max_new_tokens == 0 {
            return Err(ConfigError::Zero { what: "max_new_tokens" });
        }
        self.prompt_tokens.validate("prompt length distribution")?;
        self.output_tokens.validate("output length distribution")?;
        if let Some(shift) = &self.shift {
            shift.prompt_tokens.validate("mix shift prompt length distribution")?;
            shift.output_tokens.validate("mix shift output length distribution")?;
        }
        if self.ttft_deadline.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError::Zero { what: "TTFT deadline (leave it unset for none)" });
        }
        self.heavy_user.iter().chain(&self.scripts).try_for_each(HeavyUser::validate)
    }

    /// The mean `(prompt, answer)` lengths of the employees' requests (before any [`MixShift`]).
    pub fn mean_lengths(&self) -> (f64, f64) {
        let output = self.output_tokens.capped_at(self.max_new_tokens).mean();
        (self.prompt_tokens.mean(), output)
    }

    /// The mean `(prompt, answer)` lengths after the [`MixShift`] (the same as
    /// [`mean_lengths`](Self::mean_lengths) without one).
    pub fn mean_lengths_after_shift(&self) -> (f64, f64) {
        match &self.shift {
            Some(shift) => (shift.prompt_tokens.mean(), shift.output_tokens.capped_at(self.max_new_tokens).mean()),
            None => self.mean_lengths(),
        }
    }

    /// The distributions of `(prompt, answer)` lengths of an employee's request arriving at `at`.
    pub(crate) fn lengths_at(&self, at: Duration) -> (LengthDist, LengthDist) {
        match &self.shift {
            Some(shift) if at >= shift.at => (shift.prompt_tokens, shift.output_tokens),
            _ => (self.prompt_tokens, self.output_tokens),
        }
    }
}
