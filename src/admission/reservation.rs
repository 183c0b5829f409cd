//! The reservation policy: how much of a request's `max_new_tokens` its KV reservation covers, and what
//! it has learned from completed permits.

use super::request::Request;
use crate::error::ConfigError;
use crate::sync::{AtomicU64, Ordering};

/// How much of a request's `max_new_tokens` its KV reservation covers.
///
/// - [`Reservation::Full`] (the default) reserves `prompt + max_new_tokens`: the engine can never need
///   more KV than the budget, so it never has to preempt, but most requests stop long before
///   `max_new_tokens` and their unused reservation keeps other users waiting.
/// - [`Reservation::Learned`] reserves `prompt + ceil(max_new_tokens × ratio)`, where `ratio` is learned
///   from completed permits ([`Permit::complete`](crate::Permit::complete) reports the tokens really generated): an exponentially
///   weighted mean of `output / max_new_tokens`, multiplied by `headroom` and kept within
///   `[floor, 1]`. More users fit on the same GPU; the price is that a request generating more than
///   its estimate holds KV the budget did not count, and the engine may have to preempt (vLLM and
///   SGLang recompute or swap a sequence out when the cache runs full). SGLang schedules with a similar
///   decaying `new_token_ratio`. The current ratio is [`Admission::output_estimate`](crate::Admission::output_estimate).
///
/// # Examples
///
/// ```
/// use kvgate::{Admission, Request, Reservation};
///
/// let admission = Admission::builder()
///     .kv_capacity_tokens(100_000)
///     .reservation(Reservation::learned())
///     .build()?;
/// for _ in 0..64 {
///     // Clients ask for 4096 output tokens but stop after about 400.
///     admission.try_admit(&Request::new(1_000, 4_096)).unwrap().complete(400);
/// }
/// let permit = admission.try_admit(&Request::new(1_000, 4_096)).unwrap();
/// assert!(permit.kv_reserved() < 1_000 + 4_096 / 2);
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reservation {
    /// Reserve `prompt + max_new_tokens`.
    Full,
    /// Reserve `prompt + ceil(max_new_tokens × ratio)` with a learned ratio.
    Learned {
        /// Ratio used before any permit completed, in `(0, 1]`.
        initial: f64,
        /// Lowest ratio ever used, in `(0, 1]`.
        floor: f64,
        /// Factor (≥ 1) applied to the observed mean, a margin against longer-than-usual outputs.
        headroom: f64,
    },
}

impl Reservation {
    /// [`Reservation::Learned`] with `initial` 1.0 (start safe), `floor` 0.05 and `headroom` 1.25.
    pub const fn learned() -> Self {
        Reservation::Learned { initial: 1.0, floor: 0.05, headroom: 1.25 }
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if let Reservation::Learned { initial, floor, headroom } = *self {
            let fraction = |v: f64| v > 0.0 && v <= 1.0;
            if !(fraction(initial) && fraction(floor) && headroom >= 1.0 && headroom.is_finite()) {
                return Err(ConfigError::OutOfRange {
                    what: "learned reservation",
                    reason: format!(
                        "initial {initial} and floor {floor} must be in (0, 1], headroom {headroom} at least 1"
                    ),
                });
            }
        }
        Ok(())
    }
}

/// The reservation policy and what it has learned.
#[derive(Debug)]
pub(crate) struct ReservationState {
    policy: Reservation,
    /// Mean observed `output / max_new`, as `f64` bits.
    mean_ratio: AtomicU64,
}

impl ReservationState {
    pub(crate) fn new(policy: Reservation) -> Self {
        let initial = match policy {
            Reservation::Full => 1.0,
            Reservation::Learned { initial, .. } => initial,
        };
        Self { policy, mean_ratio: AtomicU64::new(f64::to_bits(initial)) }
    }

    /// The fraction of `max_new_tokens` reserved now.
    pub(crate) fn ratio(&self) -> f64 {
        match self.policy {
            Reservation::Full => 1.0,
            Reservation::Learned { floor, headroom, .. } => {
                let mean = f64::from_bits(self.mean_ratio.load(Ordering::Relaxed));
                (mean * headroom).clamp(floor, 1.0)
            }
        }
    }

    /// Tokens a request reserves: its prompt and the reserved part of its output.
    #[inline]
    pub(crate) fn tokens(&self, request: &Request) -> u64 {
        match self.policy {
            Reservation::Full => request.total_tokens(),
            Reservation::Learned { .. } => {
                let output = (f64::from(request.max_new_tokens) * self.ratio()).ceil() as u64;
                u64::from(request.prompt_tokens) + output.min(u64::from(request.max_new_tokens))
            }
        }
    }

    /// Feeds one completed request into the mean (weight 1/16; a racing update may be lost, which only
    /// slows learning).
    pub(crate) fn observe(&self, output: u32, max_new: u32) {
        if matches!(self.policy, Reservation::Full) || max_new == 0 {
            return;
        }
        let sample = (f64::from(output) / f64::from(max_new)).min(1.0);
        let mean = f64::from_bits(self.mean_ratio.load(Ordering::Relaxed));
        let next = mean + (sample - mean) / 16.0;
        self.mean_ratio.store(next.to_bits(), Ordering::Relaxed);
    }
}
