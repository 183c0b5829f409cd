//! The controller: collects observations, measures at each decision, and moves the admission's
//! `max_in_flight` through its public API.

use super::config::AdaptiveConfig;
use super::decision::{Decision, Reason};
use super::law::{self, Ceiling};
use super::observation::Observation;
use super::window::{SampleWindow, quantile};
use crate::Admission;
use crate::clock::{Clock, MonotonicClock};
use crate::error::ConfigError;
use std::time::Duration;

/// The share of the TTFT target that the prefills released by one increase may take.
const BURST_SHARE: f64 = 0.5;

/// A TTFT sample: seconds from admission to the first token (or to abandonment), and the prompt's tokens.
#[derive(Debug, Clone, Copy)]
struct TtftSample {
    seconds: f64,
    prompt_tokens: f64,
    /// An abandoned request: its TTFT is only a lower bound, so it counts in the quantile but not in the
    /// fit of the prefill time per token.
    censored: bool,
}

/// Moves an [`Admission`]'s `max_in_flight` between bounds so that the time to first token stays within
/// an SLO. See the [module documentation](super) for the algorithm and its reasons.
///
/// The application reports what happens to admitted requests with [`observe`](Self::observe) and calls
/// [`tick`](Self::tick) with the admission clock's time, as often as it likes (every observation, or a
/// timer): a decision is taken at most once per [`interval`](AdaptiveConfig::interval), when enough
/// samples arrived. Methods take `&mut self`; a server with many threads keeps the controller in a mutex
/// (observing costs a few nanoseconds under it, a decision a few microseconds).
///
/// The controller owns the limit: it sets it when built and at every change. A limit set elsewhere in
/// the meantime is where the next decision starts from.
///
/// # Examples
///
/// ```
/// use kvgate::adaptive::{AdaptiveConcurrency, AdaptiveConfig, Observation, Reason};
/// use kvgate::clock::{Clock, ManualClock};
/// use kvgate::{Admission, Request};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let admission = Admission::builder().clock(clock.clone()).build()?;
/// let config = AdaptiveConfig { max_limit: 64, initial_limit: 8, min_samples: 4, ..AdaptiveConfig::new(Duration::from_secs(2)) };
/// let mut controller = AdaptiveConcurrency::new(admission.clone(), config)?;
/// assert_eq!(admission.snapshot().max_in_flight, 8);
///
/// let now = || Duration::from_nanos(clock.now_nanos());
/// controller.tick(now()); // starts the first interval
/// // Eight requests fill the limit; each gets its first token 50 ms after admission.
/// let permits: Vec<_> = (0..8).map(|_| admission.try_admit(&Request::new(500, 200)).unwrap()).collect();
/// clock.advance(Duration::from_millis(50));
/// for permit in &permits {
///     controller.observe(Observation::first_token(permit, now()));
/// }
/// clock.advance(Duration::from_secs(1));
/// let decision = controller.tick(now()).expect("an interval passed with enough samples");
/// assert_eq!(decision.reason, Reason::Slack); // far below the 1 s target, and the limit is in use
/// assert_eq!((decision.from, decision.to), (8, 9)); // up by 10 %, at least one
/// assert_eq!(admission.snapshot().max_in_flight, 9);
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug)]
pub struct AdaptiveConcurrency<C: Clock = MonotonicClock> {
    admission: Admission<C>,
    config: AdaptiveConfig,
    limit: usize,
    ttft: SampleWindow<TtftSample>,
    tpot: SampleWindow<f64>,
    scratch: Vec<f64>,
    /// When the limit last changed: TTFT samples of requests admitted before describe the old limit and
    /// are dropped.
    changed_at: Duration,
    /// When the current interval started; `None` until the first tick.
    interval_start: Option<Duration>,
    /// The admission's `admitted` counter at the start of the interval (to detect stalls).
    admitted_at_start: u64,
    ceiling: Option<Ceiling>,
    /// The prefill time per prompt token (seconds), smoothed over the decisions whose samples had
    /// prompts of different enough lengths to fit it.
    per_token: Option<f64>,
    last: Option<Decision>,
    stale: u64,
}

impl<C: Clock> AdaptiveConcurrency<C> {
    /// A controller of `admission`'s `max_in_flight`, which it sets to the configured initial limit.
    ///
    /// # Errors
    ///
    /// The [`ConfigError`] of [`AdaptiveConfig::validate`].
    pub fn new(admission: Admission<C>, config: AdaptiveConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let (min, max) = (config.min_limit, config.max_limit);
        let limit = config.initial_limit.clamp(min, max);
        admission.set_max_in_flight(limit)?;
        let window = config.window;
        Ok(Self {
            admission,
            limit,
            ttft: SampleWindow::new(window),
            tpot: SampleWindow::new(if config.tpot_slo.is_some() { window } else { 1 }),
            scratch: Vec::with_capacity(window),
            changed_at: Duration::ZERO,
            interval_start: None,
            admitted_at_start: 0,
            ceiling: None,
            per_token: None,
            last: None,
            stale: 0,
            config,
        })
    }

    /// Records what happened to an admitted request. Constant time, no allocation.
    ///
    /// A first token (or abandonment) of a request admitted before the last change describes the old
    /// limit and is dropped. A last token always counts: decoding spans many steps, so its time per token
    /// is an average over the recent past whatever the limit did meanwhile.
    #[inline]
    pub fn observe(&mut self, observation: Observation) {
        match observation {
            Observation::FirstToken { prompt_tokens, admitted_at, at } => {
                self.push_ttft(prompt_tokens, admitted_at, at, false);
            }
            Observation::Abandoned { prompt_tokens, admitted_at, at } => {
                self.push_ttft(prompt_tokens, admitted_at, at, true);
            }
            Observation::Finished { output_tokens, first_token_at, at } => {
                if self.config.tpot_slo.is_none() || output_tokens < 2 {
                    return;
                }
                self.tpot.push(at.saturating_sub(first_token_at).as_secs_f64() / f64::from(output_tokens - 1));
            }
        }
    }

    #[inline]
    fn push_ttft(&mut self, prompt_tokens: u32, admitted_at: Duration, at: Duration, censored: bool) {
        if admitted_at < self.changed_at {
            self.stale += 1;
            return;
        }
        self.ttft.push(TtftSample {
            seconds: at.saturating_sub(admitted_at).as_secs_f64(),
            prompt_tokens: f64::from(prompt_tokens.max(1)),
            censored,
        });
    }

    /// Takes a decision if an interval has passed since the last one and enough samples arrived (or
    /// admitted requests stalled), applies it to the admission, and returns it. `now` is the admission
    /// clock's time since its origin. The first call starts the first interval.
    pub fn tick(&mut self, now: Duration) -> Option<Decision> {
        let Some(start) = self.interval_start else {
            self.interval_start = Some(now);
            self.admitted_at_start = self.admission.snapshot().admitted;
            return None;
        };
        let elapsed = now.saturating_sub(start);
        if elapsed < self.config.interval {
            return None;
        }
        let snapshot = self.admission.snapshot();
        if snapshot.max_in_flight != self.limit {
            // Changed elsewhere: start from there.
            self.limit = snapshot.max_in_flight.clamp(self.config.min_limit, self.config.max_limit);
        }
        let min_samples = self.config.min_samples;
        let tpot_ready = self.tpot.len() >= min_samples;
        let mut max_step = usize::MAX;
        let (load, ttft_delay, prefill_per_token) = if self.ttft.len() >= min_samples {
            let measured = self.ttft_load();
            max_step = self.burst_budget();
            measured
        } else {
            let admitted = snapshot.admitted.saturating_sub(self.admitted_at_start);
            let stall_after = (self.config.interval * 10).max(self.config.ttft_slo * 2);
            if !(self.ttft.is_empty() && admitted >= min_samples as u64 && elapsed >= stall_after) {
                return None; // keep collecting
            }
            (f64::INFINITY, None, None)
        };
        let tpot = if tpot_ready { self.tpot_quantile() } else { None };
        let tpot_load = match (tpot, self.config.tpot_slo) {
            (Some(tpot), Some(slo)) => tpot.as_secs_f64() / slo.as_secs_f64(),
            _ => 0.0,
        };
        let from = self.limit;
        let (to, reason) = if load.is_infinite() {
            let (min, max) = (self.config.min_limit, self.config.max_limit);
            let down = ((from as f64 * self.config.max_backoff) as usize).clamp(min, max);
            self.ceiling = Some(Ceiling { limit: from, at: now, quiet: 0 });
            (down, Reason::Stalled)
        } else {
            let inputs = law::Inputs { load, tpot_load, in_flight: snapshot.in_flight, max_step };
            law::next_limit(&self.config, from, inputs, &mut self.ceiling, now)
        };
        let decision = Decision {
            at: now,
            from,
            to,
            reason,
            load,
            tpot_load,
            ttft_delay,
            tpot,
            prefill_per_token,
            samples: self.ttft.len(),
        };
        self.ttft.clear();
        if tpot_ready {
            self.tpot.clear();
        }
        // Applied also when a limit set elsewhere was outside the bounds and the decision holds.
        if to != snapshot.max_in_flight && self.admission.set_max_in_flight(to).is_ok() {
            self.limit = to;
            if to != from {
                self.changed_at = now;
            }
        }
        self.interval_start = Some(now);
        self.admitted_at_start = snapshot.admitted;
        self.last = Some(decision);
        Some(decision)
    }

    /// The TTFT load of the current samples: the quantile of each sample's queueing delay (its TTFT
    /// minus its own prefill, `prompt_tokens × per_token`) over the target. Also returns that quantile
    /// and the per-token prefill time used.
    ///
    /// `per_token` is the slope of TTFT against prompt length (least squares over the first-token
    /// samples), which a delay common to all requests does not bias; it is fitted only when the prompt
    /// lengths vary (coefficient of variation at least 0.1), smoothed over decisions, and capped at the
    /// lowest TTFT per prompt token of the samples, so that no sample's delay is negative.
    fn ttft_load(&mut self) -> (f64, Option<Duration>, Option<Duration>) {
        let samples = self.ttft.samples();
        let measured = || samples.iter().filter(|s| !s.censored);
        let n = measured().count() as f64;
        let upper = measured().map(|s| s.seconds / s.prompt_tokens).fold(f64::INFINITY, f64::min);
        if n >= 2.0 {
            let mean_p = measured().map(|s| s.prompt_tokens).sum::<f64>() / n;
            let mean_t = measured().map(|s| s.seconds).sum::<f64>() / n;
            let (var, cov) = measured().fold((0.0, 0.0), |(var, cov), s| {
                let dp = s.prompt_tokens - mean_p;
                (var + dp * dp, cov + dp * (s.seconds - mean_t))
            });
            if var / n >= (0.1 * mean_p).powi(2) {
                let slope = (cov / var).clamp(0.0, upper);
                self.per_token = Some(self.per_token.map_or(slope, |old| 0.5 * old + 0.5 * slope));
            }
        }
        let per_token = self.per_token.unwrap_or(0.0).min(upper);
        self.scratch.clear();
        self.scratch.extend(samples.iter().map(|s| (s.seconds - s.prompt_tokens * per_token).max(0.0)));
        let delay = quantile(&mut self.scratch, self.config.quantile).unwrap_or(0.0);
        let target = self.config.ttft_target().as_secs_f64();
        (delay / target, Some(secs(delay)), Some(secs(per_token)))
    }

    /// The largest increase whose prefills fit in half the TTFT target: a raised limit admits that many
    /// waiting or retrying requests at once, and each adds `mean prompt × per_token` of prefill ahead of
    /// the next ones. `usize::MAX` before the prefill time is known.
    fn burst_budget(&self) -> usize {
        let per_token = self.per_token.unwrap_or(0.0);
        let samples = self.ttft.samples();
        let mean_prompt = samples.iter().map(|s| s.prompt_tokens).sum::<f64>() / samples.len().max(1) as f64;
        let prefill = per_token * mean_prompt;
        if prefill <= 0.0 {
            return usize::MAX;
        }
        let budget = BURST_SHARE * self.config.ttft_target().as_secs_f64() / prefill;
        (budget.floor() as usize).max(1)
    }

    fn tpot_quantile(&mut self) -> Option<Duration> {
        self.scratch.clear();
        self.scratch.extend_from_slice(self.tpot.samples());
        quantile(&mut self.scratch, self.config.quantile).map(secs)
    }

    /// The limit the controller last set.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The last decision taken, if any.
    pub fn last_decision(&self) -> Option<&Decision> {
        self.last.as_ref()
    }

    /// The limit at which the target was last missed, while it still slows growth near it.
    pub fn ceiling(&self) -> Option<usize> {
        self.ceiling.map(|c| c.limit)
    }

    /// TTFT samples dropped because they described an older limit.
    pub fn stale_samples(&self) -> u64 {
        self.stale
    }

    /// The configuration.
    pub fn config(&self) -> &AdaptiveConfig {
        &self.config
    }

    /// The admission whose limit this controller moves.
    pub fn admission(&self) -> &Admission<C> {
        &self.admission
    }
}

/// Seconds as a `Duration`, saturating (the inputs are finite, non-negative differences of durations).
fn secs(seconds: f64) -> Duration {
    Duration::try_from_secs_f64(seconds.max(0.0)).unwrap_or(Duration::MAX)
}
