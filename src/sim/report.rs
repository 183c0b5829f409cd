//! What a run measured: goodput, latency percentiles, retry amplification, preemptions, KV peaks,
//! fairness, and the time series the plots draw.
//!
//! # Definitions
//! - A request is one user question; its **tries** are the attempts a client made for it.
//! - **Time to first token (TTFT)** and **end-to-end latency** run from the request's *first* try to its
//!   first and last token: backoff, queueing and retries are part of what the user waits for. The
//!   percentiles are over completed requests; failures are counted separately.
//! - **Good**: completed with TTFT ≤ the TTFT SLO and end-to-end ≤ the end-to-end SLO. **Goodput** is
//!   good requests per second of the simulated period. Refused, timed-out and given-up requests are
//!   failures.
//! - **Jain's fairness index** over tenants' generated tokens: `(Σx)² / (n · Σx²)` over the `n` tenants
//!   that sent anything; 1 when all got the same, `1/n` when one got everything.

use std::fmt::{self, Write as _};
use std::time::Duration;

/// Nearest-rank percentiles of a set of durations, in seconds. All zero for an empty set.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

impl Percentiles {
    /// The percentiles of `sorted` (ascending, seconds).
    pub fn of_sorted(sorted: &[f64]) -> Self {
        if sorted.is_empty() {
            return Self::default();
        }
        Self {
            p50: nearest_rank(sorted, 0.50),
            p95: nearest_rank(sorted, 0.95),
            p99: nearest_rank(sorted, 0.99),
            max: sorted[sorted.len() - 1],
            mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
        }
    }
}

/// The value at quantile `q` of ascending `sorted` (nearest rank; `sorted` must not be empty).
pub(crate) fn nearest_rank(sorted: &[f64], q: f64) -> f64 {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Jain's fairness index of `shares` (1.0 for an empty or all-zero set).
///
/// # Examples
///
/// ```
/// use kvgate::sim::jain_index;
/// assert_eq!(jain_index(&[5.0, 5.0, 5.0]), 1.0);
/// assert_eq!(jain_index(&[9.0, 0.0, 0.0]), 1.0 / 3.0);
/// ```
pub fn jain_index(shares: &[f64]) -> f64 {
    let sum: f64 = shares.iter().sum();
    let squares: f64 = shares.iter().map(|x| x * x).sum();
    if squares == 0.0 { 1.0 } else { sum * sum / (shares.len() as f64 * squares) }
}

/// How the requests of one class of users fared: the people (employees, or Poisson arrivals), or the scripted
/// users (the heavy user and `Workload::scripts`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ClassReport {
    /// Requests that arrived.
    pub arrived: u64,
    /// Requests completed.
    pub completed: u64,
    /// Requests completed within both SLOs.
    pub good: u64,
    /// Good requests per second.
    pub goodput: f64,
    /// Tokens generated for completed requests.
    pub tokens: u64,
    /// Time to first token of the completed requests, from their first try.
    pub ttft: Percentiles,
}

/// What one tenant was served: its completed requests and their tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TenantReport {
    /// The lab's tenant number: employees `0..count`, scripted users
    /// [`Workload::script_tenant`](super::Workload::script_tenant).
    pub tenant: u64,
    /// Requests completed.
    pub completed: u64,
    /// Prompt tokens of the completed requests.
    pub prompt_tokens: u64,
    /// Tokens generated for the completed requests.
    pub output_tokens: u64,
}

impl TenantReport {
    /// The tokens served, each prompt token counted `prompt_weight` times and each output token
    /// `output_weight` times (the weights of [`Fairness::Tokens`](crate::Fairness::Tokens)).
    pub fn served(&self, prompt_weight: u32, output_weight: u32) -> u64 {
        self.prompt_tokens * u64::from(prompt_weight) + self.output_tokens * u64::from(output_weight)
    }
}

/// How requests carrying a TTFT deadline ([`Workload::ttft_deadline`](super::Workload::ttft_deadline))
/// fared, counted both ways: admitted but late, and refused although they would have made it.
///
/// # The counterfactual
/// A try refused at once because it was predicted to miss its start deadline, or ended while waiting
/// for that reason, is *shed*. Had it waited instead, the admission's waiting room (one class, no
/// tenants: first come, first served) would have granted it before any try that came after it. So the
/// lab replays it against the drain it actually saw: its counterfactual start is the first grant, after
/// it was shed, to a try that entered the gate after it at which the admission's free capacity plus what
/// it granted to such later tries since covers the shed try's own (a slot and its KV units). A shed try whose counterfactual start fell
/// within its start deadline is counted in [`shed_in_time`](Self::shed_in_time) — refused although it
/// would have started in time. The replay estimates, it does not re-run: it counts the capacity granted
/// to later tries as if none of it had been returned since, and a shed try replayed to a start holds
/// its capacity against the shed tries behind it only at that one grant; both err toward counting a
/// shed try in time, so `shed_in_time` is an upper
/// estimate of the prediction's misses this way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeadlineReport {
    /// Tries granted (entered the engine) of requests carrying a deadline.
    pub admitted: u64,
    /// Of those, tries whose first token came within the request's deadline (from its first try).
    pub met: u64,
    /// Of those, tries whose first token came later, or never.
    pub missed: u64,
    /// Tries the gate shed by their deadline: refused at once or ended while waiting because the
    /// admission predicted they would not start in time.
    pub shed: u64,
    /// Shed tries that, replayed against the lab's actual drain, would have started within their start
    /// deadline (see the type's documentation).
    pub shed_in_time: u64,
    /// Tries that queued, predicted to start in time, and reached their start deadline without starting
    /// (the prediction's miss the other way).
    pub expired: u64,
    /// Requests carrying a deadline that failed without a try granted.
    pub never_admitted: u64,
    /// Of those, requests with a shed try that replayed in time: requests lost to a pessimistic
    /// prediction (a shed try that replays in time costs nothing when a retry of it is served in time).
    pub lost_in_time: u64,
}

impl DeadlineReport {
    /// Share of admitted tries that met their deadline (1.0 when none was admitted).
    pub fn met_ratio(&self) -> f64 {
        if self.admitted == 0 { 1.0 } else { self.met as f64 / self.admitted as f64 }
    }
}

/// Why requests failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Failures {
    /// The client gave up after refusals (429/503) — its last try was refused.
    pub shed: u64,
    /// The client gave up after its last try got no first token in time.
    pub timed_out: u64,
    /// Refused for good (413/400): the request can never run.
    pub refused: u64,
}

impl Failures {
    /// All failures.
    pub fn total(&self) -> u64 {
        self.shed + self.timed_out + self.refused
    }
}

/// Samples taken every `interval` of virtual time.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TimeSeries {
    /// Time between samples.
    pub interval: Duration,
    /// Sample times, seconds.
    pub t: Vec<f64>,
    /// Requests waiting: in the gate's queue and in the engine's.
    pub waiting: Vec<f64>,
    /// Sequences running in the engine.
    pub running: Vec<f64>,
    /// KV pool in use, percent.
    pub kv_percent: Vec<f64>,
    /// 90th percentile of the TTFTs of first tokens produced since the previous sample, seconds (NaN
    /// when none was).
    pub ttft_p90: Vec<f64>,
    /// Good requests completed since the previous sample, per second.
    pub goodput: Vec<f64>,
    /// The gate's in-flight limit (NaN when it has none).
    pub max_in_flight: Vec<f64>,
    /// The gate's KV budget, percent of the engine's pool (NaN when it has none).
    pub kv_budget_percent: Vec<f64>,
}

/// The measures of one run. `Debug` prints every field; two runs of the same scenario print the same
/// (compare that text rather than with `==`: the TTFT series holds NaN for intervals without a first
/// token, and NaN is unequal to itself).
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The scenario's name.
    pub scenario: String,
    /// The gate's name.
    pub gate: String,
    /// The client retry policy's name.
    pub retry: String,
    /// The simulated period (arrivals stop at its end; requests in flight may finish during the drain).
    pub duration: Duration,
    /// Requests that arrived.
    pub arrived: u64,
    /// Requests completed.
    pub completed: u64,
    /// Completed within both SLOs.
    pub good: u64,
    /// Failed requests, by cause.
    pub failed: Failures,
    /// Still waiting or running when the run stopped (after the drain).
    pub in_system: u64,
    /// Good requests per second of `duration`.
    pub goodput: f64,
    /// Time to first token of completed requests.
    pub ttft: Percentiles,
    /// End-to-end latency of completed requests.
    pub e2e: Percentiles,
    /// Tries made, all requests.
    pub tries: u64,
    /// Tries per finished (completed or failed) request.
    pub tries_per_request: f64,
    /// Preemptions by the engine.
    pub preemptions: u64,
    /// Highest KV use, percent of the pool.
    pub peak_kv_percent: f64,
    /// Most sequences running at once.
    pub peak_running: usize,
    /// Jain's index over tenants' generated tokens.
    pub fairness: f64,
    /// What each tenant that sent anything was served, by tenant number.
    pub tenants: Vec<TenantReport>,
    /// How requests carrying a TTFT deadline fared (all zero without deadlines).
    pub deadlines: DeadlineReport,
    /// The people's requests: employees, or Poisson arrivals.
    pub humans: ClassReport,
    /// The scripted users' requests: the heavy user and [`Workload::scripts`](super::Workload::scripts).
    pub scripted: ClassReport,
    /// Time series.
    pub series: TimeSeries,
    /// TTFT of every completed request, ascending, seconds (for CDFs).
    pub ttft_sorted: Vec<f64>,
    /// `tries_histogram[k]`: finished requests that took `k + 1` tries.
    pub tries_histogram: Vec<u64>,
}

impl Report {
    /// Share of arrived requests that failed.
    pub fn failure_ratio(&self) -> f64 {
        if self.arrived == 0 { 0.0 } else { self.failed.total() as f64 / self.arrived as f64 }
    }

    /// A Markdown table of `reports`, one row each.
    pub fn table(reports: &[Report]) -> String {
        let mut out = String::from(
            "| scenario | gate | retry | arrived | good/s | failed | TTFT p50 / p99 | e2e p99 | tries/req | preempt | peak KV | Jain |\n\
             |---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for r in reports {
            let _ = writeln!(out, "{r}");
        }
        out
    }
}

impl fmt::Display for Report {
    /// One row of [`Report::table`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "| {} | {} | {} | {} | {:.2} | {:.1}% | {:.2} s / {:.2} s | {:.1} s | {:.2} | {} | {:.0}% | {:.3} |",
            self.scenario,
            self.gate,
            self.retry,
            self.arrived,
            self.goodput,
            100.0 * self.failure_ratio(),
            self.ttft.p50,
            self.ttft.p99,
            self.e2e.p99,
            self.tries_per_request,
            self.preemptions,
            self.peak_kv_percent,
            self.fairness,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = Percentiles::of_sorted(&v);
        assert_eq!((p.p50, p.p95, p.p99, p.max), (50.0, 95.0, 99.0, 100.0));
        assert_eq!(Percentiles::of_sorted(&[]), Percentiles::default());
        assert_eq!(nearest_rank(&[3.0], 0.99), 3.0);
    }

    #[test]
    fn jain_bounds() {
        assert_eq!(jain_index(&[]), 1.0);
        assert_eq!(jain_index(&[0.0, 0.0]), 1.0);
        assert!((jain_index(&[1.0, 2.0, 3.0]) - 36.0 / 42.0).abs() < 1e-12);
    }
}
