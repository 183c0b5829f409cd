//! Random draws: uniform, exponential and normal variates from the crate's seeded [`SplitMix64`], and
//! [`LengthDist`], the distribution of prompt and output lengths.
//!
//! Every draw of the lab goes through these functions with a generator seeded from the scenario's seed,
//! so a run is a pure function of its scenario. Floating-point operations used here (`ln`, `exp`, `sqrt`,
//! `cos`) are IEEE-754 correctly rounded or deterministic on every platform Rust supports for a given
//! binary, which is what makes two runs byte-identical.

use crate::error::ConfigError;
use crate::retry::SplitMix64;

/// A uniform draw in the open interval (0, 1): 53 random bits, centred in their bucket so that neither 0
/// nor 1 is ever returned (`ln` of the draw is always finite).
#[inline]
pub(crate) fn unit(rng: &mut SplitMix64) -> f64 {
    ((rng.next_u64() >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
}

/// An exponential draw with the given mean (inverse transform: `-mean · ln U`).
#[inline]
pub(crate) fn exponential(rng: &mut SplitMix64, mean: f64) -> f64 {
    -mean * unit(rng).ln()
}

/// A standard normal draw (Box–Muller, one of the pair).
#[inline]
pub(crate) fn standard_normal(rng: &mut SplitMix64) -> f64 {
    let (u, v) = (unit(rng), unit(rng));
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// A uniform integer in `0..n` (Lemire's multiply-shift; `n` must be at least 1).
#[inline]
pub(crate) fn below(rng: &mut SplitMix64, n: u64) -> u64 {
    ((u128::from(rng.next_u64()) * u128::from(n)) >> 64) as u64
}

/// The distribution of a token count (a prompt's length, an answer's length).
///
/// Chat traffic is heavy-tailed: most prompts are a few hundred tokens, a few paste a whole document.
/// [`LengthDist::LogNormal`] models that: half the draws fall below `median`, and `sigma` sets the tail
/// (the mean is `median · e^(σ²/2)` before clamping; with σ = 1 a draw above 5 × the median happens about
/// one time in 18). Draws are clamped to `[min, max]`, the way a client caps `max_tokens` and a server
/// caps the context.
///
/// # Examples
///
/// ```
/// use kvgate::retry::SplitMix64;
/// use kvgate::sim::LengthDist;
///
/// let prompts = LengthDist::log_normal(600.0, 1.0, 1, 16_000)?;
/// let mut rng = SplitMix64::new(1);
/// let draw = prompts.sample(&mut rng);
/// assert!((1..=16_000).contains(&draw));
/// assert!((prompts.mean() - 600.0 * 0.5f64.exp()).abs() < 15.0); // the clamp trims a little
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LengthDist {
    /// Always the same count.
    Fixed(u32),
    /// Uniform over `min..=max`.
    Uniform {
        /// Smallest count.
        min: u32,
        /// Largest count.
        max: u32,
    },
    /// `exp(ln(median) + sigma · Z)` for a standard normal `Z`, rounded and clamped to `[min, max]`.
    LogNormal {
        /// The median count.
        median: f64,
        /// Standard deviation of the logarithm (0: always the median).
        sigma: f64,
        /// Smallest count.
        min: u32,
        /// Largest count.
        max: u32,
    },
}

impl LengthDist {
    /// A checked [`LengthDist::LogNormal`].
    ///
    /// # Errors
    ///
    /// As [`validate`](Self::validate).
    pub fn log_normal(median: f64, sigma: f64, min: u32, max: u32) -> Result<Self, ConfigError> {
        let dist = LengthDist::LogNormal { median, sigma, min, max };
        dist.validate("length distribution")?;
        Ok(dist)
    }

    /// Checks that every draw is a positive count: `Fixed(n)` with `n ≥ 1`, `1 ≤ min ≤ max`, a finite
    /// positive median and a finite non-negative sigma. `what` names the distribution in the error.
    ///
    /// # Errors
    ///
    /// [`ConfigError::OutOfRange`] saying which value is wrong.
    pub fn validate(&self, what: &'static str) -> Result<(), ConfigError> {
        let bad = |reason: String| Err(ConfigError::OutOfRange { what, reason });
        match *self {
            LengthDist::Fixed(0) => bad("a fixed length of 0 tokens; use at least 1".into()),
            LengthDist::Fixed(_) => Ok(()),
            LengthDist::Uniform { min, max } | LengthDist::LogNormal { min, max, .. } if min == 0 || min > max => {
                bad(format!("bounds [{min}, {max}]; use 1 <= min <= max"))
            }
            LengthDist::LogNormal { median, .. } if !(median.is_finite() && median > 0.0) => {
                bad(format!("median {median}; use a finite positive token count"))
            }
            LengthDist::LogNormal { sigma, .. } if !(sigma.is_finite() && sigma >= 0.0) => {
                bad(format!("sigma {sigma}; use a finite value >= 0"))
            }
            LengthDist::Uniform { .. } | LengthDist::LogNormal { .. } => Ok(()),
        }
    }

    /// One draw.
    pub fn sample(&self, rng: &mut SplitMix64) -> u32 {
        match *self {
            LengthDist::Fixed(n) => n,
            LengthDist::Uniform { min, max } => min + below(rng, u64::from(max - min) + 1) as u32,
            LengthDist::LogNormal { median, sigma, min, max } => {
                let x = (median.ln() + sigma * standard_normal(rng)).exp().round();
                // `as` saturates for huge values and maps NaN to 0; the clamp does the rest.
                (x as u32).clamp(min, max)
            }
        }
    }

    /// The largest count a draw can take.
    pub fn max(&self) -> u32 {
        match *self {
            LengthDist::Fixed(n) => n,
            LengthDist::Uniform { max, .. } | LengthDist::LogNormal { max, .. } => max,
        }
    }

    /// The same distribution with draws clamped to at most `max` as well.
    pub fn capped_at(&self, max: u32) -> LengthDist {
        match *self {
            LengthDist::Fixed(n) => LengthDist::Fixed(n.min(max)),
            LengthDist::Uniform { min, max: hi } => LengthDist::Uniform { min: min.min(max), max: hi.min(max) },
            LengthDist::LogNormal { median, sigma, min, max: hi } => {
                LengthDist::LogNormal { median, sigma, min: min.min(max), max: hi.min(max) }
            }
        }
    }

    /// The expected draw, clamping included (computed by quadrature over the normal's density, accurate
    /// to well under a token; no sampling).
    pub fn mean(&self) -> f64 {
        match *self {
            LengthDist::Fixed(n) => f64::from(n),
            LengthDist::Uniform { min, max } => (f64::from(min) + f64::from(max)) / 2.0,
            LengthDist::LogNormal { median, sigma, min, max } => {
                // Simpson's rule for E[clamp(exp(mu + sigma z))] over z in [-8, 8].
                const STEPS: usize = 4000;
                let (lo, hi) = (-8.0f64, 8.0f64);
                let h = (hi - lo) / STEPS as f64;
                let f = |z: f64| {
                    let x = (median.ln() + sigma * z).exp().clamp(f64::from(min), f64::from(max));
                    x * (-0.5 * z * z).exp()
                };
                let mut sum = f(lo) + f(hi);
                for i in 1..STEPS {
                    let w = if i % 2 == 1 { 4.0 } else { 2.0 };
                    sum += w * f(lo + i as f64 * h);
                }
                sum * h / 3.0 / (std::f64::consts::TAU).sqrt()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_draws_stay_inside_the_open_interval() {
        let mut rng = SplitMix64::new(0);
        for _ in 0..10_000 {
            let u = unit(&mut rng);
            assert!(u > 0.0 && u < 1.0);
        }
    }

    #[test]
    fn exponential_mean_is_close() {
        let mut rng = SplitMix64::new(5);
        let n = 200_000;
        let mean = (0..n).map(|_| exponential(&mut rng, 2.0)).sum::<f64>() / f64::from(n);
        assert!((mean - 2.0).abs() < 0.03, "{mean}");
    }

    #[test]
    fn invalid_lengths_are_refused() {
        assert!(LengthDist::Fixed(0).validate("x").is_err());
        assert!(LengthDist::Uniform { min: 0, max: 3 }.validate("x").is_err());
        assert!(LengthDist::Uniform { min: 4, max: 3 }.validate("x").is_err());
        assert!(LengthDist::log_normal(-1.0, 1.0, 1, 10).is_err());
        assert!(LengthDist::log_normal(f64::NAN, 1.0, 1, 10).is_err());
        assert!(LengthDist::log_normal(10.0, -0.1, 1, 10).is_err());
        assert!(LengthDist::log_normal(10.0, f64::INFINITY, 1, 10).is_err());
        assert!(LengthDist::log_normal(10.0, 0.0, 1, 10).is_ok());
    }
}
