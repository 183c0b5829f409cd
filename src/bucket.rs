//! TEMPORARY stand-in (replaced by the real GCRA bucket from the bucket branch).
#![allow(missing_docs)]
use crate::clock::{Clock, MonotonicClock};
use crate::error::ConfigError;
use std::time::Duration;

#[derive(Debug)]
pub struct TokenBucket<C: Clock = MonotonicClock> {
    st: parking_lot::Mutex<(f64, u64, f64, u64)>, // rate/ns, burst, tokens, last
    clock: C,
}
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AcquireError {
    #[error("not yet")]
    NotYet { retry_after: Duration },
    #[error("never")]
    NeverFits { requested: u64, burst: u64 },
}
impl AcquireError {
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::NotYet { retry_after } => Some(*retry_after),
            Self::NeverFits { .. } => None,
        }
    }
}
impl TokenBucket<MonotonicClock> {
    pub fn new(r: f64, b: u64) -> Result<Self, ConfigError> {
        Self::with_clock(r, b, MonotonicClock::new())
    }
}
impl<C: Clock> TokenBucket<C> {
    pub fn with_clock(r: f64, b: u64, clock: C) -> Result<Self, ConfigError> {
        if !(r.is_finite() && (0.001..=1e9).contains(&r)) {
            return Err(ConfigError::InvalidRate { what: "token bucket rate", value: r, min: 0.001, max: 1e9 });
        }
        if b == 0 {
            return Err(ConfigError::Zero { what: "token bucket burst" });
        }
        let now = clock.now_nanos();
        Ok(Self { st: parking_lot::Mutex::new((r / 1e9, b, b as f64, now)), clock })
    }
    fn refill(s: &mut (f64, u64, f64, u64), now: u64) {
        if now > s.3 {
            s.2 = (s.2 + (now - s.3) as f64 * s.0).min(s.1 as f64);
            s.3 = now;
        }
    }
    pub fn try_acquire(&self, n: u64) -> Result<(), AcquireError> {
        self.try_acquire_at(n, self.clock.now_nanos())
    }
    pub fn try_acquire_at(&self, n: u64, now: u64) -> Result<(), AcquireError> {
        let mut s = self.st.lock();
        if n > s.1 {
            return Err(AcquireError::NeverFits { requested: n, burst: s.1 });
        }
        Self::refill(&mut s, now);
        if s.2 >= n as f64 {
            s.2 -= n as f64;
            Ok(())
        } else {
            let ns = ((n as f64 - s.2) / s.0).ceil().max(1.0);
            Err(AcquireError::NotYet { retry_after: Duration::from_nanos(ns as u64) })
        }
    }
    pub fn available(&self) -> u64 {
        self.available_at(self.clock.now_nanos())
    }
    pub fn available_at(&self, now: u64) -> u64 {
        let mut s = self.st.lock();
        Self::refill(&mut s, now);
        s.2 as u64
    }
    pub fn refund(&self, n: u64) {
        self.refund_at(n, self.clock.now_nanos())
    }
    pub fn refund_at(&self, n: u64, now: u64) {
        let mut s = self.st.lock();
        Self::refill(&mut s, now);
        s.2 = (s.2 + n as f64).min(s.1 as f64);
    }
    pub fn set_rate(&self, r: f64, b: u64) -> Result<(), ConfigError> {
        let now = self.clock.now_nanos();
        let mut s = self.st.lock();
        Self::refill(&mut s, now);
        s.0 = r / 1e9;
        s.1 = b;
        s.2 = s.2.min(b as f64);
        Ok(())
    }
    pub fn rate(&self) -> f64 {
        self.st.lock().0 * 1e9
    }
    pub fn burst(&self) -> u64 {
        self.st.lock().1
    }
    pub fn clock(&self) -> &C {
        &self.clock
    }
}
