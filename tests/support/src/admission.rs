//! The exact sequential model of an admission — global and per-tenant capacity, a global request rate and
//! token rate, tenant-only token rates, the waiting room with its fair queues (weighted round-robin or
//! virtual token counters, weights from 1 to the maximum, parking at a tenant's own limit), shared
//! prefixes, deadlines and TTFT deadlines, resize and close — and a harness that applies the same
//! operations to the real `Admission` (futures polled by hand) and to the model, and compares them after
//! every step. Shared by `tests/admission_model.rs` (proptest) and the `admission_ops` fuzz target;
//! [`assert_idle`] by every test that checks an admission holds nothing.
//!
//! # What is checked after every step (the specification)
//! - **Outcomes**: every grant, wait and refusal (by reason) equals the model's.
//! - **Conservation**: every gauge and bucket, global and per tenant, equals the model's; at the end all
//!   is back to zero.
//! - **Counts**: `Snapshot::rejected` equals the model's count of every refusal and every ended waiter,
//!   by reason — counted once whether its future was polled or dropped.
//! - **Hint soundness**: no refusal's hint is earlier than the first instant at which every rate the
//!   request meets would pass it, computed from the model's buckets; a rate refusal's hint is the promised
//!   one: the k-th request refused by one pair of rates is told the moment they admit the k-th (spaced by
//!   one request's worth of the rate, at most a minute ahead, never earlier than its exact wait).
//! - **The rate bound**: in every window `[t0, t1]` of the run, each bucket (global requests, global
//!   tokens, each tenant's tokens) handed out, net of refunds, at most `burst + rate · (t1 − t0)`.
//! - **The fairness bound**: for two flows continuously eligible in one class (and charged nothing
//!   elsewhere meanwhile), the one ahead never gains more than one of its own requests' charge:
//!   `gap(t) ≤ max(gap(start), largest charge of a)`, where `gap = counter_a − counter_b` (virtual token
//!   counters, or grants over weight with round-robin; see `Fairness`).
//!
//! The model follows the real admission where the specification leaves a choice open: whether a request
//! with a TTFT deadline is shed (the prediction is an estimate), and which start-deadline waiters an
//! expiry sheds early. It checks what follows from each choice (what the shed request holds and is told,
//! what the others get).

use kvgate::clock::{Clock, ManualClock};
use kvgate::{Admission, Admit, Permit, Priority, Rejection, Request, TenantId, TenantLimits};
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// Asserts that `admission` holds nothing: no permit, no KV, no waiter (conservation, after a refusal or
/// a fault).
///
/// # Panics
///
/// When it holds anything, at the caller's line, with the snapshot.
#[track_caller]
pub fn assert_idle<C: Clock>(admission: &Admission<C>) {
    let s = admission.snapshot();
    assert_eq!((s.in_flight, s.kv_used, s.queued), (0, 0, 0), "capacity still held: {s:?}");
}

/// Tenants the operations use (ids 0..TENANTS), each with its weight from [`Config::weights`].
pub const TENANTS: u8 = 3;
/// Fixed-point scale of virtual counters (the admission's, so that every charge is an exact integer for
/// power-of-two weights up to the maximum).
const SCALE: u128 = 1 << 16;
/// Round-robin "counter" of one full turn (grants / weight, in units of 1/SCALE turn).
const TURN: u128 = SCALE;
const CLASSES: [Priority; 3] = [Priority::Batch, Priority::Normal, Priority::Interactive];
const MS: u64 = 1_000_000;

/// An admission's configuration, in whole tokens per millisecond so that every bucket level is an integer.
#[derive(Debug, Clone)]
pub struct Config {
    pub max_in_flight: usize,
    pub kv_capacity: u64,
    pub queue_capacity: usize,
    /// (tokens per ms, burst)
    pub request_rate: Option<(u64, u64)>,
    pub token_rate: Option<(u64, u64)>,
    pub tenant_cap: Option<usize>,
    /// Tenant KV share in percent (1..=100).
    pub tenant_share_pct: Option<u8>,
    pub tenant_token_rate: Option<(u64, u64)>,
    pub max_queue_wait_ms: Option<u64>,
    /// Prefix sharing with this many entries at most.
    pub prefix_sharing: Option<usize>,
    /// Token fairness (`Fairness::tokens()`) instead of request round-robin.
    pub fairness_tokens: bool,
    /// Each tenant's weight: a power of two from 1 to `TenantLimits::MAX_WEIGHT`.
    pub weights: [u32; TENANTS as usize],
}

impl Config {
    pub fn build(&self, clock: &ManualClock) -> Admission<ManualClock> {
        let mut b = Admission::builder()
            .max_in_flight(self.max_in_flight)
            .kv_capacity_tokens(self.kv_capacity)
            .queue_capacity(self.queue_capacity)
            .deadline_timer(false)
            .wait_policy(kvgate::WaitPolicy::Fifo)
            .clock(clock.clone());
        if let Some((per_ms, burst)) = self.request_rate {
            b = b.request_rate(per_ms as f64 * 1000.0, burst as u32);
        }
        if let Some((per_ms, burst)) = self.token_rate {
            b = b.token_rate(per_ms as f64 * 1000.0, burst);
        }
        if let Some(ms) = self.max_queue_wait_ms {
            b = b.max_queue_wait(Duration::from_millis(ms));
        }
        if let Some(n) = self.prefix_sharing {
            b = b.prefix_sharing(n);
        }
        let mut limits = TenantLimits::new();
        if let Some(cap) = self.tenant_cap {
            limits = limits.max_in_flight(cap);
        }
        if let Some(pct) = self.tenant_share_pct {
            limits = limits.kv_share(f64::from(pct) / 100.0);
        }
        if let Some((per_ms, burst)) = self.tenant_token_rate {
            limits = limits.token_rate(per_ms as f64 * 1000.0, burst);
        }
        if self.fairness_tokens {
            b = b.fairness(kvgate::Fairness::tokens());
        }
        b = b.tenant_defaults(limits.clone());
        for (t, &weight) in self.weights.iter().enumerate() {
            b = b.tenant_limits(t as u64, limits.clone().weight(weight));
        }
        b.build().expect("valid configuration")
    }
}

/// One request as the operations describe it.
#[derive(Debug, Clone, Copy)]
pub struct Req {
    pub prompt: u32,
    pub max_new: u32,
    pub class: usize,
    pub tenant: Option<u8>,
    pub max_wait_ms: Option<u64>,
    /// (prefix id, prefix tokens)
    pub prefix: Option<(u8, u32)>,
    /// Time-to-first-token deadline, in ms.
    pub ttft_ms: Option<u64>,
}

impl Req {
    pub fn request(&self) -> Request {
        let mut r = Request::new(self.prompt, self.max_new).priority(CLASSES[self.class % 3]);
        if let Some(t) = self.tenant {
            r = r.tenant(u64::from(t));
        }
        if let Some(ms) = self.max_wait_ms {
            r = r.max_wait(Duration::from_millis(ms));
        }
        if let Some((id, tokens)) = self.prefix {
            r = r.prefix(u64::from(id), tokens);
        }
        if let Some(ms) = self.ttft_ms {
            r = r.ttft_deadline(Duration::from_millis(ms));
        }
        r
    }
    /// Its weighted token cost under token fairness (prompt weight 1, output weight 2).
    fn cost(&self) -> u128 {
        u128::from(self.prompt) + 2 * u128::from(self.max_new)
    }
    fn total(&self) -> u64 {
        u64::from(self.prompt) + u64::from(self.max_new)
    }
}

/// One operation.
#[derive(Debug, Clone)]
pub enum Op {
    TryAdmit(Req),
    Admit(Req),
    Poll(usize),
    Cancel(usize),
    DropPermit(usize),
    Complete(usize, u32),
    Advance { ms: u64, expire: bool },
    SetMaxInFlight(usize),
    SetKv(u64),
    Close,
}

/// A bucket in whole tokens, with the log of what it handed out (for the rate bound).
#[derive(Debug, Clone)]
struct Bucket {
    level: u64,
    burst: u64,
    per_ms: u64,
    /// (ms, tokens taken, or given back as a negative number), in time order.
    log: Vec<(u64, i64)>,
}

impl Bucket {
    fn new((per_ms, burst): (u64, u64)) -> Self {
        Bucket { level: burst, burst, per_ms, log: Vec::new() }
    }
    fn take(&mut self, n: u64, now_ms: u64) -> bool {
        if self.level < n {
            return false;
        }
        self.level -= n;
        self.log.push((now_ms, n as i64));
        true
    }
    fn refund(&mut self, n: u64, now_ms: u64) {
        let back = n.min(self.burst - self.level);
        self.level += back;
        if back != 0 {
            self.log.push((now_ms, -(back as i64)));
        }
    }
    fn advance(&mut self, ms: u64) {
        self.level = (self.level + ms * self.per_ms).min(self.burst);
    }
    /// The exact time until `n` tokens are there, in ns (0 when they are).
    fn wait_ns(&self, n: u64) -> u64 {
        let missing = n.saturating_sub(self.level);
        (missing * 1_000_000).div_ceil(self.per_ms)
    }
    /// The rate bound: in every window of the log, net tokens handed out ≤ burst + rate · length.
    fn check_window(&self, what: &str) -> Result<(), String> {
        for (i, &(t0, _)) in self.log.iter().enumerate() {
            let mut net = 0i64;
            for &(t1, n) in &self.log[i..] {
                net += n;
                let bound = (self.burst + self.per_ms * (t1 - t0)) as i64;
                if net > bound {
                    return Err(format!("{what}: {net} tokens in [{t0}, {t1}] ms, over burst + rate·t = {bound}"));
                }
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum WState {
    Waiting,
    Granted,
    Ended(&'static str),
    /// Collected by its owner.
    Gone,
}

/// What each bucket was charged.
#[derive(Debug, Clone, Copy, Default)]
struct Charges {
    request: bool,
    tokens: u64,
    tenant_tokens: u64,
}

#[derive(Debug, Clone)]
struct MWaiter {
    /// Its deadline is a start (TTFT) deadline: an expiry may shed it early.
    start_deadline: bool,
    req: Req,
    /// Its own KV units (beyond a shared prefix it refers to).
    kv: u64,
    prefix: Option<u8>,
    deadline: u64,
    state: WState,
    charges: Charges,
}

#[derive(Debug, Clone)]
struct MPermit {
    req: Req,
    kv: u64,
    prefix: Option<u8>,
    charges: Charges,
    live: bool,
}

#[derive(Debug, Clone, Default)]
struct MTenant {
    in_flight: usize,
    kv_used: u64,
    tokens: Option<Bucket>,
    /// The last moment promised to a request its rates refused (ns).
    promised: u64,
}

/// `None` is the anonymous flow.
type FlowKey = Option<u8>;

#[derive(Debug, Clone)]
struct MFlow {
    key: FlowKey,
    queue: VecDeque<usize>,
    parked: bool,
}

#[derive(Debug, Clone, Default)]
struct MClass {
    flows: Vec<MFlow>,
    ring: VecDeque<FlowKey>,
    served_in_turn: u32,
}

impl MClass {
    fn flow(&mut self, key: FlowKey) -> Option<&mut MFlow> {
        self.flows.iter_mut().find(|f| f.key == key)
    }
    fn remove_flow(&mut self, key: FlowKey) {
        if self.ring.front() == Some(&key) {
            self.served_in_turn = 0;
        }
        self.ring.retain(|k| *k != key);
        self.flows.retain(|f| f.key != key);
    }
}

/// A shared prefix in use.
#[derive(Debug, Clone)]
struct MPrefix {
    id: u8,
    units: u64,
    holders: u32,
    waiters: u32,
}

/// A request's cost around its shared prefix: (id, prefix units, suffix units).
type Split = (u8, u64, u64);

/// `n` tokens of a rate of `per_ms` per millisecond, in ns rounded up — as the admission computes it from
/// the rate per second.
fn spacing_ns(n: u64, per_ms: u64) -> u64 {
    (n as f64 * 1e9 / (per_ms as f64 * 1000.0)).ceil() as u64
}

/// The longest promised hint (the admission's horizon).
const PROMISE_AHEAD_NS: u64 = 60_000_000_000;

/// The specification of promised hints: a request refused at `now_ns` whose exact wait is `exact` is told
/// the later of `now + exact` and the moment after the last one promised (`last + spacing`), which becomes
/// the last promised; a moment beyond the horizon (a minute ahead) is not promised, and the request is told
/// the horizon (or its exact wait if later).
fn promise(last: &mut u64, now_ns: u64, exact: u64, spacing: u64) -> u64 {
    let earliest = now_ns + exact;
    let next = if *last == 0 || *last <= now_ns { 0 } else { *last + spacing };
    let at = earliest.max(next);
    if at > (now_ns + PROMISE_AHEAD_NS).max(earliest) {
        return exact.max(PROMISE_AHEAD_NS);
    }
    *last = at.max(1);
    at - now_ns
}

/// Index of a flow's counters: tenants 0..TENANTS, then the anonymous flow.
fn fidx(key: FlowKey) -> usize {
    key.map_or(usize::from(TENANTS), usize::from)
}

/// Two flows continuously eligible in one class since `gap0` was taken (the fairness bound).
#[derive(Debug, Clone)]
struct Pair {
    /// `counter_a − counter_b` when both became eligible.
    gap0: i128,
    /// Each one's counter changes made outside this class's queue, when it started: the pair restarts
    /// when they change (direct grants, refunds, lifts, grants in another class).
    other: (i128, i128),
    /// The largest charge of one of `a`'s grants in this class since it started.
    max_charge_a: i128,
}

/// The sequential model.
#[derive(Debug, Clone)]
pub struct Model {
    prefixes: Vec<MPrefix>,
    saved: u64,
    cfg: Config,
    now_ms: u64,
    closed: bool,
    max_in_flight: usize,
    budget: u64,
    in_flight: usize,
    kv_used: u64,
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
    tenants: Vec<MTenant>,
    waiters: Vec<MWaiter>,
    permits: Vec<MPermit>,
    classes: [MClass; 3],
    /// Refusals and ended waiters, by reason, each counted once.
    counts: BTreeMap<&'static str, u64>,
    /// Requests shed for their TTFT deadline (the real admission's choice, followed).
    shed: u64,
    /// Virtual token counters of the tenants (shared by their flows in every class).
    counters: [u128; TENANTS as usize],
    /// The anonymous flow's counter in each class.
    anonymous: [u128; 3],
    /// Each class's last served level through its queue, and through grants that never waited.
    clock: [u128; 3],
    levels: [u128; 3],
    /// What each flow was charged through each class's queue (token units, or turns for round-robin).
    internal: [[u128; TENANTS as usize + 1]; 3],
    /// Each class's tracked pairs (ordered by flow index), for the fairness bound.
    pairs: [BTreeMap<(usize, usize), Pair>; 3],
    /// The last refusal came from a rate (its hint is exact).
    rate_refusal: bool,
    /// The hint the last rate refusal must carry (promised, see `promise`).
    hint: Option<u64>,
    /// The last moment promised to a request the global rates refused (ns).
    promised: u64,
}

impl Model {
    pub fn new(cfg: &Config) -> Self {
        Model {
            prefixes: Vec::new(),
            saved: 0,
            now_ms: 0,
            closed: false,
            max_in_flight: cfg.max_in_flight,
            budget: cfg.kv_capacity,
            in_flight: 0,
            kv_used: 0,
            requests: cfg.request_rate.map(Bucket::new),
            tokens: cfg.token_rate.map(Bucket::new),
            tenants: (0..TENANTS)
                .map(|_| MTenant { tokens: cfg.tenant_token_rate.map(Bucket::new), ..MTenant::default() })
                .collect(),
            waiters: Vec::new(),
            permits: Vec::new(),
            classes: Default::default(),
            counts: BTreeMap::new(),
            shed: 0,
            counters: [0; TENANTS as usize],
            anonymous: [0; 3],
            clock: [0; 3],
            levels: [0; 3],
            internal: [[0; TENANTS as usize + 1]; 3],
            pairs: Default::default(),
            rate_refusal: false,
            hint: None,
            promised: 0,
            cfg: cfg.clone(),
        }
    }

    fn count(&mut self, reason: &'static str) {
        *self.counts.entry(reason).or_default() += 1;
    }

    /// The exact time until every rate `req` meets would pass it, in ns (its hints' lower bound).
    fn rate_wait_ns(&self, req: &Req) -> u64 {
        let total = req.total();
        let tenant = req.tenant.and_then(|t| self.tenants[usize::from(t)].tokens.as_ref());
        [
            self.requests.as_ref().map(|b| b.wait_ns(1)),
            self.tokens.as_ref().map(|b| b.wait_ns(total)),
            tenant.map(|b| b.wait_ns(total)),
        ]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(0)
    }

    /// The flow's fairness counter in `class`: its virtual token counter, or (round-robin) the turns it
    /// was served through the class's queue.
    fn counter(&self, class: usize, key: FlowKey) -> u128 {
        if !self.cfg.fairness_tokens {
            return self.internal[class][fidx(key)];
        }
        match key {
            Some(t) => self.counters[usize::from(t)],
            None => self.anonymous[class],
        }
    }

    fn set_counter(&mut self, class: usize, key: FlowKey, value: u128) {
        match key {
            Some(t) => self.counters[usize::from(t)] = value,
            None => self.anonymous[class] = value,
        }
    }

    /// A flow becomes eligible in `class`: (token fairness) lifted to the smallest counter of the flows
    /// eligible there, or when there are none to the class's service level (queued or direct grants), then
    /// into the ring.
    fn enter(&mut self, class: usize, key: FlowKey) {
        if self.cfg.fairness_tokens {
            let ring = &self.classes[class].ring;
            let floor =
                ring.iter().map(|&k| self.counter(class, k)).min().unwrap_or(self.clock[class].max(self.levels[class]));
            if self.counter(class, key) < floor {
                self.set_counter(class, key, floor);
            }
        }
        self.classes[class].ring.push_back(key);
    }

    /// The flow to serve next in `class`: the ring's front, or (token fairness) the eligible flow with the
    /// smallest counter, the first in ring order among equals.
    fn head(&self, class: usize) -> Option<FlowKey> {
        let ring = &self.classes[class].ring;
        if !self.cfg.fairness_tokens {
            return ring.front().copied();
        }
        let mut best: Option<(FlowKey, u128)> = None;
        for &k in ring {
            let c = self.counter(class, k);
            if best.is_none_or(|(_, b)| c < b) {
                best = Some((k, c));
            }
        }
        best.map(|(k, _)| k)
    }

    /// Counts a grant of `req` to flow `key` of `class` through its queue.
    fn count_grant(&mut self, class: usize, key: FlowKey, req: &Req) {
        let weight = u128::from(self.weight(key));
        let charge = if self.cfg.fairness_tokens {
            let served_at = self.counter(class, key);
            self.clock[class] = self.clock[class].max(served_at);
            let units = req.cost() * SCALE / weight;
            self.set_counter(class, key, served_at + units);
            units
        } else {
            TURN / weight
        };
        self.internal[class][fidx(key)] += charge;
        for ((a, _), pair) in self.pairs[class].iter_mut() {
            if *a == fidx(key) {
                pair.max_charge_a = pair.max_charge_a.max(charge as i128);
            }
        }
    }

    /// What changed `key`'s counter outside `class`'s queue (the pair restarts when it changes).
    fn other(&self, class: usize, key: FlowKey) -> i128 {
        self.counter(class, key) as i128 - self.internal[class][fidx(key)] as i128
    }

    /// The fairness bound, for every pair of flows eligible in one class (see the module docs).
    fn check_fairness(&mut self) -> Result<(), String> {
        for class in 0..3 {
            let ring: Vec<FlowKey> = self.classes[class].ring.iter().copied().collect();
            let mut pairs = BTreeMap::new();
            for &a in &ring {
                for &b in &ring {
                    if a == b {
                        continue;
                    }
                    let key = (fidx(a), fidx(b));
                    let gap = self.counter(class, a) as i128 - self.counter(class, b) as i128;
                    let other = (self.other(class, a), self.other(class, b));
                    let pair = match self.pairs[class].remove(&key) {
                        Some(pair) if pair.other == other => {
                            // Token fairness serves the smallest counter: `a` gets ahead by one of its own
                            // charges at most. Round-robin serves whole turns: by one turn at most.
                            let bound = if self.cfg.fairness_tokens {
                                pair.gap0.max(pair.max_charge_a)
                            } else {
                                pair.gap0 + TURN as i128
                            };
                            if gap > bound {
                                return Err(format!(
                                    "fairness bound in class {class}: flow {a:?} is {gap} ahead of {b:?}, over {bound} \
                                     (gap at start {}, its largest charge {})",
                                    pair.gap0, pair.max_charge_a
                                ));
                            }
                            pair
                        }
                        _ => Pair { gap0: gap, other, max_charge_a: 0 },
                    };
                    pairs.insert(key, pair);
                }
            }
            self.pairs[class] = pairs;
        }
        Ok(())
    }

    /// A one-line summary, for debugging a failing case.
    pub fn brief(&self) -> String {
        format!(
            "in_flight {} kv {} budget {} waiters {:?} prefixes {:?} rings {:?}",
            self.in_flight,
            self.kv_used,
            self.budget,
            self.waiters.iter().map(|w| (w.kv, w.prefix, w.state)).collect::<Vec<_>>(),
            self.prefixes,
            self.classes.iter().map(|c| c.ring.clone()).collect::<Vec<_>>()
        )
    }

    fn split(&self, req: &Req) -> Option<Split> {
        let (id, tokens) = req.prefix.filter(|_| self.cfg.prefix_sharing.is_some())?;
        // At most prompt − 1 tokens come from the prefix (the engine computes the last one).
        let p = u64::from(tokens.min(req.prompt.saturating_sub(1)));
        (p > 0).then(|| (id, p, req.total() - p))
    }

    fn entry(&mut self, id: u8) -> Option<&mut MPrefix> {
        self.prefixes.iter_mut().find(|e| e.id == id)
    }

    /// (units to take now, shared?)
    fn prefix_need(&self, (id, p, s): Split) -> (u64, bool) {
        match self.prefixes.iter().find(|e| e.id == id) {
            // Another pricing of the same id shares nothing.
            Some(e) if e.units != p => (p + s, false),
            Some(e) if e.holders > 0 => (s, true),
            Some(e) => (s + e.units, true),
            None if self.prefixes.len() < self.cfg.prefix_sharing.unwrap() => (p + s, true),
            None => (p + s, false),
        }
    }

    /// A new holder; returns the units it saved.
    fn prefix_hold(&mut self, (id, p, _): Split) -> u64 {
        if self.entry(id).is_none() {
            self.prefixes.push(MPrefix { id, units: p, holders: 0, waiters: 0 });
        }
        let e = self.entry(id).unwrap();
        let saved = if e.holders > 0 { e.units } else { 0 };
        e.holders += 1;
        saved
    }

    /// A holder let go: the prefix units to return if it was the last.
    fn prefix_release(&mut self, id: u8) -> u64 {
        let e = self.entry(id).unwrap();
        e.holders -= 1;
        if e.holders > 0 {
            return 0;
        }
        let units = e.units;
        if e.waiters == 0 {
            self.prefixes.retain(|e| e.id != id);
        }
        units
    }

    fn prefix_wait(&mut self, (id, p, _): Split) -> bool {
        if self.entry(id).is_some_and(|e| e.units != p) {
            return false;
        }
        if self.entry(id).is_none() {
            if self.prefixes.len() >= self.cfg.prefix_sharing.unwrap() {
                return false;
            }
            self.prefixes.push(MPrefix { id, units: p, holders: 0, waiters: 0 });
        }
        self.entry(id).unwrap().waiters += 1;
        true
    }

    fn prefix_waiter_need(&self, id: u8, own: u64) -> u64 {
        match self.prefixes.iter().find(|e| e.id == id) {
            Some(e) if e.holders == 0 => own + e.units,
            _ => own,
        }
    }

    fn prefix_stop_waiting(&mut self, id: u8, granted: bool) {
        let e = self.entry(id).unwrap();
        e.waiters -= 1;
        if granted {
            let saved = if e.holders > 0 { e.units } else { 0 };
            e.holders += 1;
            self.saved += saved;
        } else if e.holders == 0 && e.waiters == 0 {
            self.prefixes.retain(|e| e.id != id);
        }
    }

    fn prefix_units(&self, id: u8) -> u64 {
        self.prefixes.iter().find(|e| e.id == id).map_or(0, |e| e.units)
    }

    /// Returns what a holder holds: a slot, its own units, the prefix's if it was the last holder, its
    /// tenant's part (unparking), then a pass.
    fn release_held(&mut self, kv: u64, prefix: Option<u8>, tenant: Option<u8>) {
        let units = prefix.map_or(0, |id| self.prefix_release(id));
        self.kv_used -= units;
        self.give(kv, tenant);
    }

    fn weight(&self, key: FlowKey) -> u32 {
        key.map_or(1, |t| self.cfg.weights[usize::from(t)])
    }

    fn share_limit(&self) -> Option<u64> {
        self.cfg.tenant_share_pct.map(|pct| ((self.budget as f64) * (f64::from(pct) / 100.0)).floor().max(1.0) as u64)
    }

    /// KV the tenant's own capacity counts.
    fn tenant_kv(&self, kv: u64) -> u64 {
        if self.cfg.tenant_share_pct.is_some() { kv } else { 0 }
    }

    fn global_fits(&self, kv: u64) -> bool {
        self.in_flight < self.max_in_flight && self.kv_used + kv <= self.budget
    }

    fn tenant_fits(&self, t: u8, kv: u64) -> bool {
        let tenant = &self.tenants[usize::from(t)];
        let cap_ok = self.cfg.tenant_cap.is_none_or(|cap| tenant.in_flight < cap);
        let share_ok = self.share_limit().is_none_or(|limit| tenant.kv_used + kv <= limit);
        cap_ok && share_ok
    }

    fn held_back(&self, class: usize) -> bool {
        (class..3).any(|c| !self.classes[c].ring.is_empty())
    }

    fn tenant_parked_at_or_above(&self, t: u8, class: usize) -> bool {
        (class..3).any(|c| self.classes[c].flows.iter().any(|f| f.key == Some(t) && f.parked))
    }

    /// Takes a slot and `need` global units, and `kv` of the tenant's.
    fn take_split(&mut self, need: u64, kv: u64, tenant: Option<u8>) {
        self.in_flight += 1;
        self.kv_used += need;
        if let Some(t) = tenant {
            let tkv = self.tenant_kv(kv);
            let tenant = &mut self.tenants[usize::from(t)];
            tenant.in_flight += 1;
            tenant.kv_used += tkv;
        }
    }

    /// Returns capacity; a tenant with parked flows gets them back into their rings. Then a pass.
    fn give(&mut self, kv: u64, tenant: Option<u8>) {
        self.in_flight -= 1;
        self.kv_used -= kv;
        if let Some(t) = tenant {
            let tkv = self.tenant_kv(kv);
            let tenant = &mut self.tenants[usize::from(t)];
            tenant.in_flight -= 1;
            tenant.kv_used -= tkv;
            self.unpark(t);
        }
        self.pass();
    }

    fn unpark(&mut self, t: u8) {
        for class in 0..3 {
            if let Some(flow) = self.classes[class].flow(Some(t)) {
                if flow.parked {
                    flow.parked = false;
                    self.enter(class, Some(t));
                }
            }
        }
    }

    fn pass(&mut self) {
        if self.closed {
            return;
        }
        for class in (0..3).rev() {
            while let Some(key) = self.head(class) {
                let id = *self.classes[class].flow(key).unwrap().queue.front().unwrap();
                if self.waiters[id].deadline <= self.now_ms * MS {
                    // Past its deadline: never granted.
                    self.leave(id, WState::Ended("timed_out"));
                    continue;
                }
                let kv = self.waiters[id].kv;
                let prefix = self.waiters[id].prefix;
                let need = prefix.map_or(kv, |p| self.prefix_waiter_need(p, kv));
                if let Some(t) = key {
                    // Nobody overtakes a parked waiter of a higher class within its tenant.
                    if self.tenant_parked_at_or_above(t, class + 1) || !self.tenant_fits(t, self.tenant_kv(kv)) {
                        let c = &mut self.classes[class];
                        if c.ring.front() == Some(&key) {
                            c.served_in_turn = 0;
                        }
                        c.ring.retain(|k| *k != key);
                        c.flow(key).unwrap().parked = true;
                        continue;
                    }
                }
                if !self.global_fits(need) {
                    return;
                }
                self.take_split(need, kv, key);
                if let Some(p) = prefix {
                    self.prefix_stop_waiting(p, true);
                }
                self.waiters[id].state = WState::Granted;
                let req = self.waiters[id].req;
                self.count_grant(class, key, &req);
                let weight = self.weight(key);
                let tokens = self.cfg.fairness_tokens;
                let c = &mut self.classes[class];
                c.flow(key).unwrap().queue.pop_front();
                if c.flow(key).unwrap().queue.is_empty() {
                    c.remove_flow(key);
                } else if !tokens {
                    c.served_in_turn += 1;
                    if c.served_in_turn >= weight {
                        c.served_in_turn = 0;
                        if c.ring.len() > 1 {
                            let k = c.ring.pop_front().unwrap();
                            c.ring.push_back(k);
                        }
                    }
                }
            }
        }
    }

    /// Takes `id` out of its flow (it stops waiting).
    fn leave(&mut self, id: usize, to: WState) {
        if let Some(p) = self.waiters[id].prefix {
            self.prefix_stop_waiting(p, false);
        }
        let req = self.waiters[id].req;
        let class = &mut self.classes[req.class % 3];
        let flow = class.flow(req.tenant).unwrap();
        flow.queue.retain(|&w| w != id);
        if flow.queue.is_empty() {
            let was_parked = flow.parked;
            class.remove_flow(req.tenant);
            if let (true, Some(t)) = (was_parked, req.tenant) {
                // Its tenant's lower-class flows may have been parked behind it.
                self.unpark(t);
            }
        }
        self.waiters[id].state = to;
    }

    fn refund(&mut self, c: Charges, tenant: Option<u8>) {
        let now = self.now_ms;
        if c.request {
            self.requests.as_mut().unwrap().refund(1, now);
        }
        if c.tokens != 0 {
            self.tokens.as_mut().unwrap().refund(c.tokens, now);
        }
        if c.tenant_tokens != 0 {
            self.tenants[usize::from(tenant.unwrap())].tokens.as_mut().unwrap().refund(c.tenant_tokens, now);
        }
    }

    /// Charges every rate, all or nothing. A refusal's hint (`self.hint`) is promised: the k-th request
    /// refused by one pair of rates is told the moment they admit the k-th (see `promise`).
    fn charge(&mut self, req: &Req) -> Result<Charges, &'static str> {
        let (total, now) = (req.total(), self.now_ms);
        let now_ns = now * MS;
        let tenant_wait = |m: &Model| {
            req.tenant.and_then(|t| m.tenants[usize::from(t)].tokens.as_ref()).map_or(0, |b| b.wait_ns(total))
        };
        let mut c = Charges::default();
        if let Some(b) = &mut self.requests {
            if !b.take(1, now) {
                let per_ms = b.per_ms;
                let token_wait = self.tokens.as_ref().map_or(0, |t| t.wait_ns(total));
                let wait = self.requests.as_ref().unwrap().wait_ns(1).max(token_wait).max(1);
                let mut spacing = spacing_ns(1, per_ms);
                if let (true, Some(t)) = (token_wait != 0, &self.tokens) {
                    spacing = spacing.max(spacing_ns(total, t.per_ms));
                }
                let promised = promise(&mut self.promised, now_ns, wait, spacing);
                self.hint = Some(promised.max(tenant_wait(self)));
                return Err("rate_limited");
            }
            c.request = true;
        }
        let per_request = self.requests.as_ref().map_or(0, |b| spacing_ns(1, b.per_ms));
        if let Some(b) = &mut self.tokens {
            if !b.take(total, now) {
                let (wait, spacing) = (b.wait_ns(total), spacing_ns(total, b.per_ms).max(per_request));
                self.refund(c, None);
                let promised = promise(&mut self.promised, now_ns, wait, spacing);
                self.hint = Some(promised.max(tenant_wait(self)));
                return Err("rate_limited");
            }
            c.tokens = total;
        }
        if let Some(t) = req.tenant {
            let tenant = &mut self.tenants[usize::from(t)];
            if let Some(b) = &mut tenant.tokens {
                if !b.take(total, now) {
                    let (wait, spacing) = (b.wait_ns(total), spacing_ns(total, b.per_ms));
                    let promised = promise(&mut tenant.promised, now_ns, wait, spacing);
                    self.refund(c, None);
                    let global = self
                        .requests
                        .as_ref()
                        .map_or(0, |b| b.wait_ns(1))
                        .max(self.tokens.as_ref().map_or(0, |b| b.wait_ns(total)));
                    self.hint = Some(promised.max(global));
                    return Err("rate_limited");
                }
                c.tenant_tokens = total;
            }
        }
        Ok(c)
    }

    /// What waiting never changes.
    fn validate(&self, req: &Req) -> Result<u64, &'static str> {
        let total = req.total();
        if total == 0 {
            return Err("invalid");
        }
        if self.closed {
            return Err("closed");
        }
        if total > self.budget || self.tokens.as_ref().is_some_and(|b| total > b.burst) {
            return Err("too_large");
        }
        if req.tenant.is_some() {
            if self.share_limit().is_some_and(|limit| total > limit) {
                return Err("too_large");
            }
            if self.cfg.tenant_token_rate.is_some_and(|(_, burst)| total > burst) {
                return Err("too_large");
            }
        }
        Ok(total)
    }

    fn grant(&mut self, req: Req, kv: u64, prefix: Option<u8>, charges: Charges) -> usize {
        self.permits.push(MPermit { req, kv, prefix, charges, live: true });
        self.permits.len() - 1
    }

    /// `Ok(permit)`, `Err(Ok(waiter))` (queued), or `Err(Err(reason))`. `shed`: the real admission shed the
    /// request for its TTFT deadline (followed when it reaches the waiting path; an error otherwise).
    fn decide(&mut self, req: Req, may_wait: bool, shed: bool) -> Result<usize, Result<usize, &'static str>> {
        self.rate_refusal = false;
        let kv = self.validate(&req).map_err(Err)?;
        let class = req.class % 3;
        let split = self.split(&req);
        let (need, shared) = split.map_or((kv, false), |sp| self.prefix_need(sp));
        if self.held_back(class) || !self.global_fits(need) {
            if !self.held_back(class) && self.in_flight < self.max_in_flight && self.held_back(0) {
                // The real admission took a slot, found the KV budget short and gave the slot back while
                // waiters were held back: it runs a pass (which ends heads past their deadline).
                self.pass();
            }
            return if may_wait { self.queue(req, kv, split, "no_capacity", shed) } else { Err(Err("no_capacity")) };
        }
        // What the request holds itself: its suffix when it shares the prefix, else everything.
        let own = match split {
            Some((_, _, suffix)) if shared => suffix,
            _ => kv,
        };
        let prefix = split.filter(|_| shared).map(|(id, _, _)| id);
        if let Some(t) = req.tenant {
            if self.tenant_parked_at_or_above(t, class) || !self.tenant_fits(t, self.tenant_kv(own)) {
                let cap_ok = self.cfg.tenant_cap.is_none_or(|cap| self.tenants[usize::from(t)].in_flight < cap);
                // The real admission took global capacity first and gives it back now (a pass if waiters are
                // held back; a shared prefix was held, then let go).
                if let Some(sp) = split.filter(|_| shared) {
                    self.take_split(need, 0, None);
                    self.prefix_hold(sp);
                    self.release_held(own, prefix, None);
                } else {
                    self.pass();
                }
                if !self.tenant_parked_at_or_above(t, class) && cap_ok {
                    // The real admission took the tenant's slot, found its KV share short and gave the slot
                    // back; a parked flow of the tenant may have missed that slot, so it is unparked.
                    self.unpark(t);
                    self.pass();
                }
                return if may_wait {
                    self.queue(req, kv, split, "rate_limited", shed)
                } else {
                    Err(Err("rate_limited"))
                };
            }
        }
        match self.charge(&req) {
            Ok(charges) => {
                self.take_split(need, own, req.tenant);
                if let Some(sp) = split.filter(|_| shared) {
                    self.saved += self.prefix_hold(sp);
                }
                // The tenant has less room: its heads that no longer fit are parked (the real admission
                // runs that pass only when the tenant has waiters).
                let tenant_waits = req.tenant.is_some_and(|t| {
                    self.waiters.iter().any(|w| w.state == WState::Waiting && w.req.tenant == Some(t))
                });
                if tenant_waits {
                    self.pass();
                }
                if let (Some(t), true) = (req.tenant, self.cfg.fairness_tokens) {
                    // A grant that never waited charges its tenant's counter and raises the class's level.
                    let served_at = self.counters[usize::from(t)];
                    self.counters[usize::from(t)] += req.cost() * SCALE / u128::from(self.weight(req.tenant));
                    self.levels[class] = self.levels[class].max(served_at);
                }
                Ok(self.grant(req, own, prefix, charges))
            }
            Err(reason) => {
                self.rate_refusal = true;
                // The real admission took capacity before the rates and gives it back now (possibly
                // unparking its tenant's parked flows).
                self.take_split(need, own, req.tenant);
                if let Some(sp) = split.filter(|_| shared) {
                    self.prefix_hold(sp);
                }
                self.release_held(own, prefix, req.tenant);
                Err(Err(reason))
            }
        }
    }

    fn queue(
        &mut self,
        req: Req,
        kv: u64,
        split: Option<Split>,
        held_by: &'static str,
        shed: bool,
    ) -> Result<usize, Result<usize, &'static str>> {
        if self.cfg.queue_capacity == 0 {
            return Err(Err(held_by));
        }
        if shed {
            // Predicted to miss its TTFT deadline: refused before it is charged or queued.
            self.shed += 1;
            return Err(Err("no_capacity"));
        }
        let charges = self.charge(&req).map_err(|reason| {
            self.rate_refusal = true;
            Err(reason)
        })?;
        let wait = [req.max_wait_ms, self.cfg.max_queue_wait_ms, req.ttft_ms].into_iter().flatten().min();
        let deadline = wait.map_or(u64::MAX, |w| (self.now_ms + w) * MS);
        let now = self.now_ms * MS;
        let class = req.class % 3;
        let refused = if deadline <= now {
            Some("timed_out")
        } else if self.closed {
            Some("closed")
        } else if self.queued_in(class) >= self.cfg.queue_capacity {
            // Longest queue drop: the newest waiter of the longest flow (of equals, the smallest key) gives
            // its place to a flow with at least two fewer waiters.
            let c = &self.classes[class];
            let own = c.flows.iter().find(|f| f.key == req.tenant).map_or(0, |f| f.queue.len());
            let longest = c.flows.iter().max_by_key(|f| (f.queue.len(), std::cmp::Reverse(f.key)));
            match longest {
                Some(f) if f.queue.len() > own + 1 => {
                    let newest = *f.queue.back().unwrap();
                    self.leave(newest, WState::Ended("queue_full"));
                    None
                }
                _ => Some("queue_full"),
            }
        } else {
            None
        };
        if let Some(reason) = refused {
            self.refund(charges, req.tenant);
            return Err(Err(reason));
        }
        let (own, prefix) = match split {
            Some(sp) if self.prefix_wait(sp) => (sp.2, Some(sp.0)),
            _ => (kv, None),
        };
        let start_deadline = req.ttft_ms.is_some();
        self.waiters.push(MWaiter { start_deadline, req, kv: own, prefix, deadline, state: WState::Waiting, charges });
        let id = self.waiters.len() - 1;
        let c = &mut self.classes[class];
        match c.flow(req.tenant) {
            Some(flow) => flow.queue.push_back(id),
            None => {
                c.flows.push(MFlow { key: req.tenant, queue: VecDeque::from([id]), parked: false });
                self.enter(class, req.tenant);
            }
        }
        self.pass();
        if self.waiters[id].state == WState::Granted {
            self.waiters[id].state = WState::Gone;
            return Ok(self.grant(req, own, prefix, charges));
        }
        Err(Ok(id))
    }

    fn queued_in(&self, class: usize) -> usize {
        self.waiters.iter().filter(|w| w.state == WState::Waiting && w.req.class % 3 == class).count()
    }

    /// A waiter's owner looks (its ending is counted by the caller, with its hint).
    fn poll(&mut self, id: usize) -> Option<Result<usize, &'static str>> {
        self.rate_refusal = false;
        match self.waiters[id].state {
            WState::Waiting if self.now_ms * MS < self.waiters[id].deadline => None,
            WState::Waiting => {
                self.leave(id, WState::Gone);
                self.pass();
                let w = self.waiters[id].clone();
                self.refund(w.charges, w.req.tenant);
                Some(Err("timed_out"))
            }
            WState::Granted => {
                self.waiters[id].state = WState::Gone;
                let w = self.waiters[id].clone();
                Some(Ok(self.grant(w.req, w.kv, w.prefix, w.charges)))
            }
            WState::Ended(reason) => {
                self.waiters[id].state = WState::Gone;
                let w = self.waiters[id].clone();
                self.refund(w.charges, w.req.tenant);
                Some(Err(reason))
            }
            WState::Gone => unreachable!("polled after it resolved"),
        }
    }

    fn cancel(&mut self, id: usize) {
        let w = self.waiters[id].clone();
        match w.state {
            WState::Waiting => {
                self.leave(id, WState::Gone);
                self.pass();
            }
            WState::Granted => {
                self.waiters[id].state = WState::Gone;
                self.release_held(w.kv, w.prefix, w.req.tenant);
            }
            WState::Ended(reason) => {
                // Ended unseen by its owner: counted now, once.
                self.waiters[id].state = WState::Gone;
                self.count(reason);
            }
            WState::Gone => unreachable!("cancelled after it resolved"),
        }
        self.refund(w.charges, w.req.tenant);
    }

    fn drop_permit(&mut self, pid: usize) {
        let p = self.permits[pid].clone();
        self.permits[pid].live = false;
        self.release_held(p.kv, p.prefix, p.req.tenant);
    }

    fn complete(&mut self, pid: usize, output: u32) {
        let p = self.permits[pid].clone();
        let unused = u64::from(p.req.max_new.saturating_sub(output));
        if let (Some(t), true) = (p.req.tenant, self.cfg.fairness_tokens) {
            // The output it did not produce comes off its tenant's counter (output weight 2).
            let units = 2 * u128::from(unused) * SCALE / u128::from(self.weight(p.req.tenant));
            let counter = &mut self.counters[usize::from(t)];
            *counter = counter.saturating_sub(units);
        }
        let refund = Charges {
            request: false,
            tokens: p.charges.tokens.min(unused),
            tenant_tokens: p.charges.tenant_tokens.min(unused),
        };
        self.refund(refund, p.req.tenant);
        self.drop_permit(pid);
    }

    fn advance(&mut self, ms: u64, expire: bool, shed: &[usize]) {
        self.now_ms += ms;
        for b in self.requests.iter_mut().chain(self.tokens.iter_mut()) {
            b.advance(ms);
        }
        for t in &mut self.tenants {
            if let Some(b) = &mut t.tokens {
                b.advance(ms);
            }
        }
        if expire {
            let now = self.now_ms * MS;
            let expired: Vec<usize> = (0..self.waiters.len())
                .filter(|&i| self.waiters[i].state == WState::Waiting && self.waiters[i].deadline <= now)
                .collect();
            for id in expired {
                self.leave(id, WState::Ended("timed_out"));
            }
            // Start-deadline waiters the real expiry shed early (predicted to miss their deadline).
            for &id in shed {
                self.leave(id, WState::Ended("timed_out"));
                self.shed += 1;
            }
            self.pass();
        }
    }

    fn set_kv(&mut self, n: u64) {
        self.budget = n;
        let share = self.share_limit();
        let too_large: Vec<usize> = (0..self.waiters.len())
            .filter(|&i| {
                let w = &self.waiters[i];
                // The most it may need: its own units and the prefix's if nobody holds it then; its tenant
                // is charged its own units.
                let worst = w.kv + w.prefix.map_or(0, |p| self.prefix_units(p));
                w.state == WState::Waiting
                    && (worst > n || (w.req.tenant.is_some() && share.is_some_and(|limit| w.kv > limit)))
            })
            .collect();
        for id in too_large {
            self.leave(id, WState::Ended("too_large"));
        }
        // Shares follow the budget: every parked flow looks again, by class, then anonymous first and
        // tenants by id.
        for class in 0..3 {
            let mut parked: Vec<FlowKey> =
                self.classes[class].flows.iter().filter(|f| f.parked).map(|f| f.key).collect();
            parked.sort_unstable();
            for key in parked {
                self.classes[class].flow(key).unwrap().parked = false;
                self.enter(class, key);
            }
        }
        self.pass();
    }

    fn close(&mut self) {
        self.closed = true;
        let waiting: Vec<usize> =
            (0..self.waiters.len()).filter(|&i| self.waiters[i].state == WState::Waiting).collect();
        for id in waiting {
            self.leave(id, WState::Ended("closed"));
        }
    }
}

/// The real admission next to the model, with the live futures and permits of both.
pub struct Harness {
    pub clock: ManualClock,
    pub admission: Admission<ManualClock>,
    pub model: Model,
    /// (future, model waiter id)
    futures: Vec<(Admit, usize)>,
    /// (permit, model permit id)
    permits: Vec<(Permit, usize)>,
}

/// Polls a waiting admission once with a waker that does nothing (the tests poll again by hand).
pub fn poll_once(fut: &mut Admit) -> Poll<Result<Permit, Rejection>> {
    Pin::new(fut).poll(&mut Context::from_waker(Waker::noop()))
}

fn check_rejection(r: &Rejection) -> Result<(), String> {
    match r.retry_after() {
        Some(d) if d.is_zero() => Err(format!("zero retry hint in {r:?}")),
        _ => Ok(()),
    }
}

/// Every rejection's hint against the model (see the module docs), and its count.
fn check_hint(model: &mut Model, req: &Req, r: &Rejection, reason: &'static str) -> Result<(), String> {
    check_rejection(r)?;
    if let Some(hint) = r.retry_after() {
        let hint = u64::try_from(hint.as_nanos()).unwrap_or(u64::MAX);
        let rates = model.rate_wait_ns(req);
        if hint < rates {
            return Err(format!("{r:?} for {req:?}: its hint is earlier than the rates allow ({rates} ns)"));
        }
        if let (true, Some(promised)) = (model.rate_refusal, model.hint) {
            if hint != promised {
                return Err(format!("{r:?} for {req:?}: a rate refusal's hint is not the promised {promised} ns"));
            }
        }
    }
    model.count(reason);
    Ok(())
}

impl Harness {
    pub fn new(cfg: &Config) -> Self {
        let clock = ManualClock::new();
        let admission = cfg.build(&clock);
        Harness { admission, model: Model::new(cfg), clock, futures: Vec::new(), permits: Vec::new() }
    }

    /// Applies `op` to both and compares; `Err` describes the first difference.
    pub fn apply(&mut self, op: &Op) -> Result<(), String> {
        match op {
            Op::TryAdmit(req) => {
                let real = self.admission.try_admit(&req.request());
                let model = self.model.decide(*req, false, false);
                match (real, model) {
                    (Ok(p), Ok(pid)) => self.permits.push((p, pid)),
                    (Err(r), Err(Err(reason))) if r.reason() == reason => check_hint(&mut self.model, req, &r, reason)?,
                    (real, model) => return Err(format!("try_admit {req:?}: real {real:?}, model {model:?}")),
                }
            }
            Op::Admit(req) => {
                let shed_before = self.admission.snapshot().shed;
                let mut fut = self.admission.admit(&req.request());
                let real = poll_once(&mut fut);
                let shed = self.admission.snapshot().shed - shed_before;
                if shed > 0 && req.ttft_ms.is_none() {
                    return Err(format!("admit {req:?}: shed without a TTFT deadline"));
                }
                let model = self.model.decide(*req, true, shed > 0);
                match (real, model) {
                    (Poll::Ready(Ok(p)), Ok(pid)) => self.permits.push((p, pid)),
                    (Poll::Pending, Err(Ok(id))) => self.futures.push((fut, id)),
                    (Poll::Ready(Err(r)), Err(Err(reason))) if r.reason() == reason => {
                        check_hint(&mut self.model, req, &r, reason)?
                    }
                    (real, model) => return Err(format!("admit {req:?}: real {real:?}, model {model:?}")),
                }
            }
            Op::Poll(i) if !self.futures.is_empty() => {
                let i = i % self.futures.len();
                let real = poll_once(&mut self.futures[i].0);
                self.resolve(i, real)?;
            }
            Op::Cancel(i) if !self.futures.is_empty() => {
                let (fut, id) = self.futures.swap_remove(i % self.futures.len());
                drop(fut);
                self.model.cancel(id);
            }
            Op::DropPermit(i) if !self.permits.is_empty() => {
                let (permit, pid) = self.permits.swap_remove(i % self.permits.len());
                drop(permit);
                self.model.drop_permit(pid);
            }
            Op::Complete(i, output) if !self.permits.is_empty() => {
                let (permit, pid) = self.permits.swap_remove(i % self.permits.len());
                permit.complete(*output);
                self.model.complete(pid, *output);
            }
            Op::Advance { ms, expire } => {
                let shed_before = self.admission.snapshot().shed;
                self.clock.advance(Duration::from_millis(*ms));
                if *expire {
                    self.admission.expire_waiters();
                }
                let shed = self.admission.snapshot().shed - shed_before;
                // Which start-deadline waiters the expiry shed: polling them now changes nothing else (the
                // expiry ended every wait past its deadline), and collects what it did.
                let mut seen = Vec::new();
                let mut shed_ids = Vec::new();
                if shed > 0 {
                    let now_ms = self.model.now_ms + ms;
                    for (i, (fut, id)) in self.futures.iter_mut().enumerate() {
                        let w = &self.model.waiters[*id];
                        if !(w.start_deadline && w.state == WState::Waiting && now_ms * MS < w.deadline) {
                            continue;
                        }
                        let real = poll_once(fut);
                        if matches!(real, Poll::Ready(Err(Rejection::TimedOut))) {
                            shed_ids.push(*id);
                        }
                        seen.push((i, real));
                    }
                    if shed_ids.len() as u64 != shed {
                        return Err(format!(
                            "the expiry counted {shed} shed, {} start-deadline waiters ended",
                            shed_ids.len()
                        ));
                    }
                }
                self.model.advance(*ms, *expire, &shed_ids);
                for (i, real) in seen.into_iter().rev() {
                    self.resolve(i, real)?;
                }
            }
            Op::SetMaxInFlight(n) => {
                self.admission.set_max_in_flight(*n).map_err(|e| e.to_string())?;
                self.model.max_in_flight = *n;
                self.model.pass();
            }
            Op::SetKv(n) => {
                self.admission.set_kv_capacity(*n).map_err(|e| e.to_string())?;
                self.model.set_kv(*n);
            }
            Op::Close => {
                self.admission.close();
                self.model.close();
            }
            Op::Poll(_) | Op::Cancel(_) | Op::DropPermit(_) | Op::Complete(..) => {}
        }
        self.compare()
    }

    /// Compares the real outcome `real` of polling future `i` with the model's.
    fn resolve(&mut self, i: usize, real: Poll<Result<Permit, Rejection>>) -> Result<(), String> {
        let id = self.futures[i].1;
        let req = self.model.waiters[id].req;
        let model = self.model.poll(id);
        match (real, model) {
            (Poll::Pending, None) => {}
            (Poll::Ready(Ok(p)), Some(Ok(pid))) => {
                drop(self.futures.swap_remove(i));
                self.permits.push((p, pid));
            }
            (Poll::Ready(Err(r)), Some(Err(reason))) if r.reason() == reason => {
                check_hint(&mut self.model, &req, &r, reason)?;
                drop(self.futures.swap_remove(i));
            }
            (real, model) => return Err(format!("poll waiter {id}: real {real:?}, model {model:?}")),
        }
        Ok(())
    }

    /// Every gauge and bucket, global and per tenant; the counts, the rate bound and the fairness bound.
    pub fn compare(&mut self) -> Result<(), String> {
        let s = self.admission.snapshot();
        let real_counts: BTreeMap<&str, u64> = s.rejected.by_reason().into_iter().filter(|(_, n)| *n != 0).collect();
        if real_counts != self.model.counts || s.shed != self.model.shed {
            return Err(format!(
                "rejection counts (and shed): real {real_counts:?} ({}), model {:?} ({})",
                s.shed, self.model.counts, self.model.shed
            ));
        }
        let m = &self.model;
        for (what, bucket) in [("request rate", &m.requests), ("token rate", &m.tokens)] {
            if let Some(b) = bucket {
                b.check_window(what)?;
            }
        }
        for (t, tenant) in m.tenants.iter().enumerate() {
            if let Some(b) = &tenant.tokens {
                b.check_window(&format!("tenant {t} token rate"))?;
            }
        }
        self.model.check_fairness()?;
        let m = &self.model;
        let queued = m.waiters.iter().filter(|w| w.state == WState::Waiting).count();
        let real = (s.in_flight, s.kv_used, s.queued, s.kv_capacity, s.closed);
        let model = (m.in_flight, m.kv_used, queued, m.budget, m.closed);
        if real != model {
            return Err(format!("(in_flight, kv_used, queued, kv_capacity, closed): real {real:?}, model {model:?}"));
        }
        for (class, p) in CLASSES.iter().enumerate() {
            if self.admission.queued_in(*p) != m.queued_in(class) {
                return Err(format!(
                    "queued in class {class}: real {}, model {}",
                    self.admission.queued_in(*p),
                    m.queued_in(class)
                ));
            }
        }
        if (s.prefixes, s.kv_saved_by_prefixes) != (m.prefixes.len(), m.saved) {
            return Err(format!(
                "(prefixes, kv_saved_by_prefixes): real {:?}, model {:?}",
                (s.prefixes, s.kv_saved_by_prefixes),
                (m.prefixes.len(), m.saved)
            ));
        }
        let global = self.admission.rate_status(None);
        let level = |b: Option<kvgate::RateStatus>| b.map(|b| b.remaining);
        if level(global.requests) != m.requests.as_ref().map(|b| b.level)
            || level(global.tokens) != m.tokens.as_ref().map(|b| b.level)
        {
            return Err(format!("global buckets: real {global:?}, model {:?} {:?}", m.requests, m.tokens));
        }
        let busiest = self.admission.busiest_tenants(usize::from(TENANTS) + 1);
        for t in 0..TENANTS {
            let real_in_flight = busiest.iter().find(|(id, _)| *id == TenantId::from(u64::from(t))).map_or(0, |e| e.1);
            let tenant = &m.tenants[usize::from(t)];
            if real_in_flight as usize != tenant.in_flight {
                return Err(format!("tenant {t} in flight: real {real_in_flight}, model {}", tenant.in_flight));
            }
            if m.tokens.is_none() {
                let real = level(self.admission.rate_status(Some(u64::from(t).into())).tokens);
                if real != tenant.tokens.as_ref().map(|b| b.level) {
                    return Err(format!("tenant {t} token bucket: real {real:?}, model {:?}", tenant.tokens));
                }
            }
        }
        Ok(())
    }

    /// Polls every waiter until none resolves in a whole round, drops everything, and checks that all is
    /// back to zero.
    pub fn finish(mut self) -> Result<(), String> {
        loop {
            let before = self.futures.len();
            let mut i = 0;
            while i < self.futures.len() {
                let n = self.futures.len();
                self.apply(&Op::Poll(i))?;
                if self.futures.len() == n {
                    i += 1;
                }
            }
            if self.futures.len() == before {
                break;
            }
        }
        while !self.futures.is_empty() {
            self.apply(&Op::Cancel(0))?;
        }
        while !self.permits.is_empty() {
            self.apply(&Op::DropPermit(0))?;
        }
        let s = self.admission.snapshot();
        if (s.in_flight, s.kv_used, s.queued) != (0, 0, 0) {
            return Err(format!("left over after everything was dropped: {s:?}"));
        }
        self.compare()
    }
}
