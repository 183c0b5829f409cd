//! The inference servers behind the gateway: [`Upstream`] — one engine (an OpenAI-compatible server, or
//! the simulated one), the admission that keeps its own in-flight cap and KV budget, and its health.
//!
//! # Health
//!
//! An upstream is *in* or *out*. It is taken out at once when a health check fails (`GET` of its health
//! path — `/v1/models` under its base URL unless configured — every `--health-interval`, answered 2xx
//! within the interval), or after `--max-fails` answers in a row to proxied requests that were 5xx or
//! never came (refused, reset, timed out). While out it gets no new request (running ones go on), and
//! the health check keeps probing it: the first check that passes puts it back in. The simulated
//! engine is always in.

use crate::limiter::Limiter;
use crate::proxy::Proxy;
use crate::sim::{SimBackend, SimStats};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// Where completions are generated.
#[derive(Debug, Clone)]
pub enum Backend {
    /// The built-in simulated engine.
    Simulated(Arc<SimBackend>),
    /// An OpenAI-compatible server (boxed: the client and its pool are large).
    Upstream(Box<Proxy>),
}

/// One inference server and the admission of its own capacity.
#[derive(Debug)]
pub struct Upstream {
    /// Its name, in metrics and logs (never its address, which may hold credentials).
    pub name: Arc<str>,
    /// The engine.
    pub backend: Backend,
    /// Its in-flight cap and KV budget (never waits: the gateway's dispatcher does the waiting).
    pub limiter: Limiter,
    /// Health-check path (absolute, on the server's origin), `None`: `/models` under the base URL.
    pub health_path: Option<String>,
    healthy: AtomicBool,
    failures: AtomicU32,
    max_fails: u32,
    /// Requests waiting inside the engine, from its metrics (engine feedback), else 0.
    engine_waiting: AtomicU64,
}

/// How one upstream looks now, for choosing one and for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    /// KV units free in its budget (`u64::MAX` without a budget).
    pub free_kv: u64,
    /// Requests waiting inside the engine (engine feedback), else 0.
    pub engine_waiting: u64,
    /// Requests it runs for this gateway.
    pub in_flight: usize,
}

impl Upstream {
    /// An upstream, in.
    pub fn new(
        name: Arc<str>,
        backend: Backend,
        limiter: Limiter,
        health_path: Option<String>,
        max_fails: u32,
    ) -> Self {
        Self {
            name,
            backend,
            limiter,
            health_path,
            healthy: AtomicBool::new(true),
            failures: AtomicU32::new(0),
            max_fails: max_fails.max(1),
            engine_waiting: AtomicU64::new(0),
        }
    }

    /// Whether it takes new requests.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }

    /// Records a health check: `true` when it changed the upstream's state.
    pub fn health_check(&self, passed: bool) -> bool {
        if passed {
            self.failures.store(0, Ordering::Release);
        }
        self.healthy.swap(passed, Ordering::AcqRel) != passed
    }

    /// Records the outcome of a proxied request (`false`: a 5xx or no answer): `true` when it took the
    /// upstream out.
    pub fn answered(&self, ok: bool) -> bool {
        if ok {
            self.failures.store(0, Ordering::Release);
            return false;
        }
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        failures >= self.max_fails && self.healthy.swap(false, Ordering::AcqRel)
    }

    /// Sets the engine's waiting count (engine feedback).
    pub fn set_engine_waiting(&self, waiting: u64) {
        self.engine_waiting.store(waiting, Ordering::Relaxed);
    }

    /// How it looks now.
    pub fn load(&self) -> Load {
        let snapshot = self.limiter.local().snapshot();
        Load {
            free_kv: snapshot.kv_capacity.saturating_sub(snapshot.kv_used),
            engine_waiting: self.engine_waiting.load(Ordering::Relaxed),
            in_flight: snapshot.in_flight,
        }
    }

    /// The simulated engine's books (`None` for a real server).
    pub fn sim_stats(&self) -> Option<SimStats> {
        match &self.backend {
            Backend::Simulated(sim) => Some(sim.stats()),
            Backend::Upstream(_) => None,
        }
    }

    /// The proxy, for a real server.
    pub fn proxy(&self) -> Option<&Proxy> {
        match &self.backend {
            Backend::Upstream(proxy) => Some(proxy),
            Backend::Simulated(_) => None,
        }
    }
}

impl Load {
    /// Orders upstreams best first: most free KV, then fewest waiting in the engine, then fewest running.
    pub fn key(&self) -> (std::cmp::Reverse<u64>, u64, usize) {
        (std::cmp::Reverse(self.free_kv), self.engine_waiting, self.in_flight)
    }
}
