//! [`SplitMix64`]: the small seedable generator behind every jittered delay.

use std::time::Duration;

/// A tiny, fast, seedable pseudo-random generator (SplitMix64, Steele, Lea and Flood 2014).
///
/// Good enough to spread retries; not for cryptography.
///
/// # Examples
///
/// ```
/// use kvgate::retry::SplitMix64;
///
/// let mut a = SplitMix64::new(7);
/// let mut b = SplitMix64::new(7);
/// assert_eq!(a.next_u64(), b.next_u64());
/// ```
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator that starts from `seed`: the same seed gives the same sequence.
    pub const fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A generator seeded from the process's hash randomness and a counter, so that two generators made
    /// one after the other (or in two processes) differ.
    pub fn from_entropy() -> Self {
        use std::collections::hash_map::RandomState;
        use std::hash::{BuildHasher, Hasher};
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        Self::new(hasher.finish())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A duration drawn uniformly from `0..=max` (nanosecond resolution).
    pub fn duration_up_to(&mut self, max: Duration) -> Duration {
        let max = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
        // Lemire's multiply-shift: maps 64 random bits onto 0..=max without a division.
        let nanos = ((u128::from(self.next_u64()) * (u128::from(max) + 1)) >> 64) as u64;
        Duration::from_nanos(nanos)
    }
}
