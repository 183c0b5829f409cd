//! The local allowance: global rate tokens taken from Redis in batches and spent in-process.
//!
//! The pool holds requests and tokens already charged in Redis. An admission takes from it all or
//! nothing (both rates, when both are shared) under a short lock, or goes to Redis. When a pool falls
//! below half its batch, the background task takes the missing part (`admit.lua` in batch mode: up to
//! that much, whatever the bucket holds). Refunds of unused output tokens return to the pool. A pool
//! not used for the idle time is given back to Redis' buckets, so an idle replica does not sit on the
//! rate. Worst-case overshoot: see [`Allowance`].

use crate::limits::Allowance;
use parking_lot::Mutex;
use tokio::sync::Notify;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pool {
    pub(crate) requests: u64,
    pub(crate) tokens: u64,
}

#[derive(Debug)]
struct PoolState {
    pool: Pool,
    /// Clock nanoseconds of the last admission from the pool.
    last_used: u64,
}

/// One replica's allowance.
#[derive(Debug)]
pub(crate) struct AllowancePool {
    pub(crate) config: Allowance,
    /// Whether each rate is shared (a rate that is not needs no allowance).
    pub(crate) has_requests: bool,
    pub(crate) has_tokens: bool,
    state: Mutex<PoolState>,
    /// Wakes the background task to refill.
    pub(crate) wanted: Notify,
}

impl AllowancePool {
    pub(crate) fn new(config: Allowance, has_requests: bool, has_tokens: bool) -> Self {
        Self {
            config,
            has_requests: has_requests && config.requests > 0,
            has_tokens: has_tokens && config.tokens > 0,
            state: Mutex::new(PoolState { pool: Pool::default(), last_used: 0 }),
            wanted: Notify::new(),
        }
    }

    /// Whether the allowance can serve requests at all: every shared global rate has a batch.
    pub(crate) fn covers(&self, requests_shared: bool, tokens_shared: bool) -> bool {
        (self.has_requests || !requests_shared) && (self.has_tokens || !tokens_shared)
    }

    /// Takes one request and `tokens` tokens, all or nothing.
    pub(crate) fn take(&self, tokens: u64, now: u64) -> bool {
        let mut state = self.state.lock();
        let pool = &mut state.pool;
        let need_request = u64::from(self.has_requests);
        let need_tokens = if self.has_tokens { tokens } else { 0 };
        let ok = pool.requests >= need_request && pool.tokens >= need_tokens;
        if ok {
            pool.requests -= need_request;
            pool.tokens -= need_tokens;
            state.last_used = now;
        }
        let low = (self.has_requests && state.pool.requests * 2 < self.config.requests)
            || (self.has_tokens && state.pool.tokens * 2 < self.config.tokens);
        drop(state);
        if low {
            self.wanted.notify_one();
        }
        ok
    }

    /// Returns unused tokens of a permit admitted from the pool.
    pub(crate) fn refund(&self, tokens: u64) {
        if self.has_tokens {
            self.state.lock().pool.tokens += tokens;
        }
    }

    /// What a refill should ask for.
    pub(crate) fn missing(&self) -> Pool {
        let state = self.state.lock();
        Pool {
            requests: if self.has_requests { self.config.requests.saturating_sub(state.pool.requests) } else { 0 },
            tokens: if self.has_tokens { self.config.tokens.saturating_sub(state.pool.tokens) } else { 0 },
        }
    }

    /// Adds what a refill got.
    pub(crate) fn add(&self, got: Pool, now: u64) {
        let mut state = self.state.lock();
        state.pool.requests += got.requests;
        state.pool.tokens += got.tokens;
        if state.last_used == 0 {
            state.last_used = now;
        }
    }

    /// Empties the pool if it was not used since `idle_since`; returns what to give back.
    pub(crate) fn drain_if_idle(&self, now: u64, idle_nanos: u64) -> Pool {
        let mut state = self.state.lock();
        if now.saturating_sub(state.last_used) < idle_nanos {
            return Pool::default();
        }
        std::mem::take(&mut state.pool)
    }

    /// The pool now.
    pub(crate) fn held(&self) -> Pool {
        self.state.lock().pool
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_all_or_nothing_and_asks_for_more_below_half() {
        let pool = AllowancePool::new(Allowance::new().requests(4).tokens(100), true, true);
        assert!(!pool.take(1, 1));
        assert_eq!(pool.missing(), Pool { requests: 4, tokens: 100 });
        pool.add(Pool { requests: 4, tokens: 100 }, 1);
        assert!(pool.take(60, 2));
        assert!(!pool.take(60, 3), "40 tokens left");
        assert_eq!(pool.held(), Pool { requests: 3, tokens: 40 });
        pool.refund(10);
        assert_eq!(pool.missing(), Pool { requests: 1, tokens: 50 });
        assert_eq!(pool.drain_if_idle(5, 10), Pool::default(), "used at 2: not idle at 5");
        assert_eq!(pool.drain_if_idle(20, 10), Pool { requests: 3, tokens: 50 });
        assert_eq!(pool.held(), Pool::default());
    }

    #[test]
    fn a_rate_without_a_batch_is_not_covered() {
        let pool = AllowancePool::new(Allowance::new().requests(4), true, true);
        assert!(!pool.covers(true, true));
        assert!(pool.covers(true, false));
    }
}
