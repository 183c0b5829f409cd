//! The discrete-event loop: virtual time, events in a heap, the real admission polled by hand.
//!
//! # How time moves
//! Events sit in a binary heap ordered by `(time, insertion number)`, so two events at the same
//! nanosecond run in the order they were scheduled: the run is a pure function of the scenario. Before
//! each event the lab sets the shared [`ManualClock`] to the event's time; the admission reads only that
//! clock and was built with `deadline_timer(false)`, so every state change happens on this thread, in
//! event order.
//!
//! # How the admission is driven
//! A try that must wait holds the [`Admit`](crate::Admit) future returned by the gate. The lab polls it
//! with a waker that records the try's key in a list; when a permit is dropped, the admission's
//! dispatcher grants the next waiter and wakes it, and after the current event the lab polls every woken
//! future. A waiter whose deadline passes is polled at that time and resolves to `TimedOut`.
//!
//! # Keys and stale events
//! A live request occupies a slot. Each slot has an epoch, bumped whenever a try of it ends (granted
//! work finishing, a refusal, a client timeout) or the slot is freed. Events and wake-ups carry
//! `(slot, epoch)` and are ignored when the epoch moved on, so a client timeout that races a refusal,
//! or a wake-up for a cancelled wait, does nothing.
//!
//! # Conservation
//! Every request that arrives is, at the end, exactly one of: completed, failed (shed, timed out,
//! refused) or still in the system — `Report::arrived == completed + failed.total() + in_system`.

use super::client::ClientPolicy;
use super::dist;
use super::engine::{Engine, EngineEvent, EngineRefusal, SeqId};
use super::gate::{Entry, Gate, GateContext};
use super::report::{
    ClassReport, DeadlineReport, Failures, Percentiles, Report, TenantReport, TimeSeries, jain_index, nearest_rank,
};
use super::scenario::Scenario;
use super::workload::{Arrivals, HEAVY_USER_TENANT, PoissonArrivals, Profile, Workload};
use crate::adaptive::Observation;
use crate::clock::ManualClock;
use crate::error::ConfigError;
use crate::retry::{RetryHint, SplitMix64};
use crate::{Admit, Permit, Rejection, Request};
use parking_lot::Mutex;
use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

/// The least time between two requests of one scripted worker: a network round trip (1 ms).
const SCRIPT_MIN_GAP_NANOS: u64 = 1_000_000;

/// Independent random streams derived from the scenario's seed.
const WORKLOAD_STREAM: u64 = 0x5745_4c4c_4f41_4400;
const CLIENT_STREAM: u64 = 0x434c_4945_4e54_5300;
const POISSON_STREAM: u64 = 0x504f_4953_534f_4e00;

/// Who sent a request: decides its tenant and what happens after it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Poisson,
    Employee(u32),
    /// The workload's heavy user.
    Heavy,
    /// One of the workload's further scripts, by index.
    Script(u32),
}

/// A try of a live request: its slot and the slot's epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key {
    slot: u32,
    epoch: u32,
}

impl Key {
    fn tag(self) -> u64 {
        (u64::from(self.slot) << 32) | u64::from(self.epoch)
    }

    fn from_tag(tag: u64) -> Self {
        Self { slot: (tag >> 32) as u32, epoch: tag as u32 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EventKind {
    PoissonArrival,
    UserArrival(Source),
    Try(Key),
    StepDone,
    WaitDeadline(Key),
    ClientTimeout(Key),
    Sample,
    Control,
}

#[derive(Debug, PartialEq, Eq)]
struct Event {
    at: u64,
    order: u64,
    kind: EventKind,
}

impl Ord for Event {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.order).cmp(&(other.at, other.order))
    }
}

impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Where a live request is.
#[derive(Debug)]
enum Phase {
    /// Between tries.
    Backoff,
    /// Waiting in the gate.
    Waiting(Admit),
    /// In the engine, holding the gate's permit if any.
    Engine { seq: SeqId, permit: Option<Permit> },
}

/// How a try ended badly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TryEnd {
    /// Refused; `retryable` false for a request that can never run.
    Refused { hint: Option<Duration>, retryable: bool },
    /// No first token in time.
    TimedOut,
}

#[derive(Debug)]
struct Live {
    /// The request's number, in the order of arrival.
    id: u64,
    source: Source,
    tenant: u64,
    human: bool,
    prompt: u32,
    output: u32,
    first_try: u64,
    tries: u32,
    first_token: Option<u64>,
    /// When the current try entered the engine (what the gate sees as its admission).
    entered: u64,
    phase: Phase,
    /// When its TTFT deadline ends (lab time), if it carries one.
    deadline: Option<u64>,
    /// The current try's number (tries are numbered in the order they start).
    try_number: u64,
    /// When the current try's wait in the gate ends at the latest: its `max_wait` or its start deadline.
    wait_until: Option<u64>,
    /// When the current try must start to meet its deadline (its deadline less the gate's allowance),
    /// if the gate sheds by deadline.
    start_by: Option<u64>,
    /// Whether a try was granted while it carried a deadline (counted in `DeadlineReport::admitted`), and
    /// whether that try was judged (met or missed) yet.
    admitted: bool,
    judged: bool,
}

#[derive(Debug, Default)]
struct Slot {
    epoch: u32,
    live: Option<Live>,
}

/// A shed try replayed against the drain that follows it: had it waited, it would have started once
/// every try ahead of it was gone and the capacity freed since — what the admission has free, plus what
/// it granted to tries that came after it, which first come, first served would have given it first —
/// covered its own.
#[derive(Debug, Clone, Copy)]
struct Replay {
    /// The request it was a try of.
    request: u64,
    /// When it had to start (its start deadline).
    start_by: u64,
    /// Its KV units in the admission.
    kv: u64,
    /// Slots and KV units granted since to tries that came after it.
    granted: u64,
    granted_kv: u64,
}

/// Records a woken waiter's key.
#[derive(Debug)]
struct TagWaker {
    tag: u64,
    woken: Arc<Mutex<Vec<u64>>>,
}

impl Wake for TagWaker {
    fn wake(self: Arc<Self>) {
        self.woken.lock().push(self.tag);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.lock().push(self.tag);
    }
}

/// Counters that become the report.
#[derive(Debug, Default)]
struct Tally {
    arrived: u64,
    completed: u64,
    good: u64,
    failed: Failures,
    tries: u64,
    finished_tries: u64,
    tries_histogram: Vec<u64>,
    humans: ClassReport,
    scripted: ClassReport,
    ttft: Vec<f64>,
    /// TTFT of the employees' completed requests, then of the scripted users'.
    class_ttft: [Vec<f64>; 2],
    e2e: Vec<f64>,
    tenants: BTreeMap<u64, TenantReport>,
    deadlines: DeadlineReport,
    /// Shed tries not yet replayed, by try number.
    shed_pending: BTreeMap<u64, Replay>,
    /// Requests with a shed try that replayed in time, and requests with a deadline that ended without
    /// a grant (their intersection is `DeadlineReport::lost_in_time`).
    shed_in_time_requests: BTreeSet<u64>,
    never_admitted: BTreeSet<u64>,
    series: TimeSeries,
    interval_ttft: Vec<f64>,
    interval_good: u64,
}

/// Runs `scenario` on `engine` behind the gate `make_gate` builds.
pub(crate) fn run(
    scenario: &Scenario,
    engine: Engine,
    make_gate: impl FnOnce(&GateContext<'_>) -> Result<Box<dyn Gate>, ConfigError>,
) -> Result<Report, ConfigError> {
    let clock = ManualClock::new();
    let gate = make_gate(&GateContext { clock: &clock, engine: &engine })?;
    let poisson = match scenario.workload.arrivals {
        Arrivals::Poisson { rate, profile, .. } => {
            Some(PoissonArrivals::new(rate, profile, scenario.seed ^ POISSON_STREAM)?)
        }
        Arrivals::Employees { .. } => None,
    };
    let arrivals_end = nanos(scenario.duration);
    let lab = Lab {
        scenario,
        client: scenario.client,
        clock,
        now: 0,
        arrivals_end,
        stop: arrivals_end.saturating_add(nanos(scenario.drain)),
        events: BinaryHeap::new(),
        order: 0,
        engine,
        stepping: false,
        engine_events: Vec::new(),
        max_wait: gate.max_wait().map(nanos),
        allowance: gate.deadline_shedding().map(nanos),
        control_every: gate.control_interval().filter(|d| !d.is_zero()).map(nanos),
        gate,
        work_rng: SplitMix64::new(scenario.seed ^ WORKLOAD_STREAM),
        client_rng: SplitMix64::new(scenario.seed ^ CLIENT_STREAM),
        poisson,
        slots: Vec::new(),
        free: Vec::new(),
        live: 0,
        woken: Arc::new(Mutex::new(Vec::new())),
        tally: Tally {
            series: TimeSeries { interval: scenario.sample_every, ..TimeSeries::default() },
            ..Tally::default()
        },
    };
    Ok(lab.run())
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn secs(nanos: u64) -> f64 {
    nanos as f64 / 1e9
}

struct Lab<'s> {
    scenario: &'s Scenario,
    client: ClientPolicy,
    clock: ManualClock,
    now: u64,
    arrivals_end: u64,
    stop: u64,
    events: BinaryHeap<Reverse<Event>>,
    order: u64,
    engine: Engine,
    stepping: bool,
    engine_events: Vec<EngineEvent>,
    gate: Box<dyn Gate>,
    max_wait: Option<u64>,
    /// The gate's allowance when it sheds by deadline.
    allowance: Option<u64>,
    control_every: Option<u64>,
    work_rng: SplitMix64,
    client_rng: SplitMix64,
    poisson: Option<PoissonArrivals>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    live: u64,
    woken: Arc<Mutex<Vec<u64>>>,
    tally: Tally,
}

impl Lab<'_> {
    fn run(mut self) -> Report {
        self.schedule_first_arrivals();
        self.push(0, EventKind::Sample);
        if let Some(every) = self.control_every {
            self.push(every, EventKind::Control);
        }
        while let Some(Reverse(event)) = self.events.pop() {
            if event.at > self.stop {
                break;
            }
            self.now = event.at;
            self.clock.set_nanos(event.at);
            match event.kind {
                EventKind::PoissonArrival => {
                    self.arrive(Source::Poisson);
                    self.schedule_poisson();
                }
                EventKind::UserArrival(source) => self.arrive(source),
                EventKind::Try(key) => {
                    if matches!(self.live_at(key), Some(Live { phase: Phase::Backoff, .. })) {
                        self.start_try(key.slot);
                    }
                }
                EventKind::StepDone => self.step_done(),
                EventKind::WaitDeadline(key) => self.poll_waiting(key),
                EventKind::ClientTimeout(key) => self.client_timeout(key),
                EventKind::Sample => self.sample(),
                EventKind::Control => self.control(),
            }
            self.poll_woken();
            self.kick_engine();
        }
        self.report()
    }

    fn push(&mut self, at: u64, kind: EventKind) {
        self.order += 1;
        self.events.push(Reverse(Event { at, order: self.order, kind }));
    }

    fn live_at(&mut self, key: Key) -> Option<&mut Live> {
        let slot = self.slots.get_mut(key.slot as usize)?;
        if slot.epoch == key.epoch { slot.live.as_mut() } else { None }
    }

    fn schedule_first_arrivals(&mut self) {
        match self.scenario.workload.arrivals {
            Arrivals::Poisson { .. } => self.schedule_poisson(),
            Arrivals::Employees { count, think_time, profile } => {
                for employee in 0..count {
                    let at = match profile {
                        Profile::Flat | Profile::Step { .. } | Profile::Bursts { .. } => {
                            (dist::unit(&mut self.work_rng) * think_time.as_nanos() as f64) as u64
                        }
                        Profile::MorningRush { peak_at, spread, .. } => self.rush_start(peak_at, spread),
                    };
                    if at < self.arrivals_end {
                        self.push(at, EventKind::UserArrival(Source::Employee(employee)));
                    }
                }
            }
        }
        let workload = &self.scenario.workload;
        let heavy = workload.heavy_user.iter().map(|heavy| (Source::Heavy, *heavy));
        let scripts = workload.scripts.iter().enumerate().map(|(i, script)| (Source::Script(i as u32), *script));
        let starts: Vec<_> =
            heavy.chain(scripts).map(|(source, user)| (source, nanos(user.start), user.streams)).collect();
        for (source, start, streams) in starts {
            if start < self.arrivals_end {
                for _ in 0..streams {
                    self.push(start, EventKind::UserArrival(source));
                }
            }
        }
    }

    /// An employee's arrival at work: normal around the peak, redrawn until inside the period.
    fn rush_start(&mut self, peak_at: Duration, spread: Duration) -> u64 {
        let end = secs(self.arrivals_end);
        let mut at = peak_at.as_secs_f64();
        for _ in 0..64 {
            at = peak_at.as_secs_f64() + spread.as_secs_f64() * dist::standard_normal(&mut self.work_rng);
            if (0.0..end).contains(&at) {
                break;
            }
        }
        (at.clamp(0.0, end) * 1e9) as u64
    }

    fn schedule_poisson(&mut self) {
        let next = self.poisson.as_mut().and_then(Iterator::next).map(nanos);
        if let Some(at) = next.filter(|&at| at < self.arrivals_end) {
            self.push(at.max(self.now), EventKind::PoissonArrival);
        }
    }

    /// A new request from `source`, and its first try.
    fn arrive(&mut self, source: Source) {
        let workload = &self.scenario.workload;
        let script = match source {
            Source::Heavy => workload.heavy_user.map(|user| (HEAVY_USER_TENANT, user)),
            Source::Script(i) => {
                workload.scripts.get(i as usize).map(|user| (Workload::script_tenant(i as usize), *user))
            }
            Source::Poisson | Source::Employee(_) => None,
        };
        let (tenant, human, prompt_dist, output_dist) = match (source, script) {
            (_, Some((tenant, user))) => (tenant, false, user.prompt_tokens, user.output_tokens),
            (Source::Employee(employee), _) => {
                let (prompt, output) = workload.lengths_at(Duration::from_nanos(self.now));
                (u64::from(employee), true, prompt, output)
            }
            _ => {
                let tenants = match workload.arrivals {
                    Arrivals::Poisson { tenants, .. } => u64::from(tenants),
                    Arrivals::Employees { count, .. } => u64::from(count),
                };
                let (prompt, output) = workload.lengths_at(Duration::from_nanos(self.now));
                (dist::below(&mut self.work_rng, tenants), true, prompt, output)
            }
        };
        let prompt = prompt_dist.sample(&mut self.work_rng);
        let output = output_dist.sample(&mut self.work_rng).min(workload.max_new_tokens);
        let deadline = workload.ttft_deadline.filter(|_| human).map(|d| self.now.saturating_add(nanos(d)));
        let live = Live {
            id: self.tally.arrived,
            source,
            tenant,
            human,
            prompt,
            output,
            first_try: self.now,
            tries: 0,
            first_token: None,
            entered: 0,
            phase: Phase::Backoff,
            deadline,
            try_number: 0,
            wait_until: None,
            start_by: None,
            admitted: false,
            judged: false,
        };
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(Slot::default());
                (self.slots.len() - 1) as u32
            }
        };
        self.slots[slot as usize].live = Some(live);
        self.live += 1;
        self.tally.arrived += 1;
        self.class(human).arrived += 1;
        self.tally.tenants.entry(tenant).or_insert(TenantReport { tenant, ..TenantReport::default() });
        self.start_try(slot);
    }

    fn class(&mut self, human: bool) -> &mut ClassReport {
        if human { &mut self.tally.humans } else { &mut self.tally.scripted }
    }

    /// Bumps the slot's epoch (ending the current try's events) and returns the new key.
    fn next_epoch(&mut self, slot: u32) -> Key {
        let s = &mut self.slots[slot as usize];
        s.epoch = s.epoch.wrapping_add(1);
        Key { slot, epoch: s.epoch }
    }

    fn start_try(&mut self, slot: u32) {
        let key = self.next_epoch(slot);
        let (now, max_new, max_wait, allowance) =
            (self.now, self.scenario.workload.max_new_tokens, self.max_wait, self.allowance);
        let try_number = self.tally.tries;
        let Some(live) = self.live_at(key) else { return };
        live.tries += 1;
        let mut request = Request::new(live.prompt, max_new).tenant(live.tenant);
        // What is left of the deadline; the gate passes it on less its allowance, or ignores it.
        if let Some(deadline) = live.deadline {
            request = request.ttft_deadline(Duration::from_nanos(deadline.saturating_sub(now)));
        }
        live.try_number = try_number;
        live.start_by = allowance.zip(live.deadline).map(|(allowance, deadline)| deadline.saturating_sub(allowance));
        live.wait_until = [max_wait.map(|w| now.saturating_add(w)), live.start_by].into_iter().flatten().min();
        let wait_until = live.wait_until;
        let give_up = live.first_try.saturating_add(nanos(self.client.give_up_after));
        self.tally.tries += 1;
        let timeout = self.now.saturating_add(nanos(self.client.first_token_timeout)).min(give_up);
        self.push(timeout, EventKind::ClientTimeout(key));
        let shed_before = self.shed_count();
        match self.gate.enter(&request) {
            Entry::Pass(permit) => self.enter_engine(key, permit),
            Entry::Refuse(rejection) => {
                if self.shed_count() > shed_before {
                    self.deadline_shed(key);
                }
                self.try_failed(
                    key,
                    TryEnd::Refused { hint: rejection.retry_after(), retryable: rejection.is_retryable() },
                );
            }
            Entry::Wait(admit) => {
                if let Some(live) = self.live_at(key) {
                    live.phase = Phase::Waiting(admit);
                }
                self.poll_waiting(key);
                let still_waiting = matches!(self.live_at(key), Some(Live { phase: Phase::Waiting(_), .. }));
                if let (true, Some(at)) = (still_waiting, wait_until) {
                    self.push(at.max(self.now), EventKind::WaitDeadline(key));
                }
            }
        }
    }

    /// The gate shed the try of `key` by its deadline (at once, or ended its wait early): counted, and
    /// kept for the replay against the drain that follows (see [`DeadlineReport`]).
    fn deadline_shed(&mut self, key: Key) {
        let max_new = self.scenario.workload.max_new_tokens;
        let Some(live) = self.live_at(key) else { return };
        let (request, try_number, start_by, prompt) = (live.id, live.try_number, live.start_by, live.prompt);
        self.tally.deadlines.shed += 1;
        let kv = self.gate.admission().map_or(0, |a| a.kv_cost(&Request::new(prompt, max_new)));
        if let Some(start_by) = start_by {
            self.tally.shed_pending.insert(try_number, Replay { request, start_by, kv, granted: 0, granted_kv: 0 });
        }
    }

    /// Requests the gate's admission shed by deadline so far.
    fn shed_count(&self) -> u64 {
        self.gate.admission().map_or(0, |a| a.snapshot().shed)
    }

    /// A try of `try_number` needing `kv` units was granted: every shed try that entered before it was
    /// ahead of it, and would have started by now had it waited if the capacity free and what was
    /// granted to later tries cover its own. A replayed try that did not start by its start deadline
    /// would have missed it.
    fn replay_shed(&mut self, try_number: u64, kv: u64) {
        let tally = &mut self.tally;
        if tally.shed_pending.first_key_value().is_none_or(|(&first, _)| first >= try_number) {
            return;
        }
        let Some(snapshot) = self.gate.admission().map(|a| a.snapshot()) else { return };
        let free_slots = snapshot.max_in_flight.saturating_sub(snapshot.in_flight) as u64;
        let free_kv = snapshot.kv_capacity.saturating_sub(snapshot.kv_used);
        let now = self.now;
        let mut ended = Vec::new();
        // What the shed tries replayed to a start at this grant take, first come, first served: a later
        // shed try gets only what the earlier ones left.
        let (mut taken_slots, mut taken_kv) = (0u64, 0u64);
        for (&number, replay) in tally.shed_pending.range_mut(..try_number) {
            replay.granted += 1;
            replay.granted_kv = replay.granted_kv.saturating_add(kv);
            let started = free_slots + replay.granted > taken_slots
                && free_kv.saturating_add(replay.granted_kv) >= taken_kv.saturating_add(replay.kv);
            if started {
                taken_slots += 1;
                taken_kv = taken_kv.saturating_add(replay.kv);
            }
            if started || now > replay.start_by {
                if started && now <= replay.start_by {
                    tally.deadlines.shed_in_time += 1;
                    tally.shed_in_time_requests.insert(replay.request);
                }
                ended.push(number);
            }
        }
        for number in ended {
            tally.shed_pending.remove(&number);
        }
    }

    /// Polls a waiting try; hands a grant to the engine, a refusal to the client.
    fn poll_waiting(&mut self, key: Key) {
        let (woken, now, shed_before) = (Arc::clone(&self.woken), self.now, self.shed_count());
        let Some(live) = self.live_at(key) else { return };
        let Phase::Waiting(admit) = &mut live.phase else { return };
        let waker = Waker::from(Arc::new(TagWaker { tag: key.tag(), woken }));
        let result = match Pin::new(admit).poll(&mut Context::from_waker(&waker)) {
            Poll::Pending => return,
            Poll::Ready(result) => result,
        };
        live.phase = Phase::Backoff;
        // A wait ended before its own deadlines: the admission saw it could no longer start in time (the
        // shed count moved when the gate let it go, in `control`).
        let left_early = matches!(result, Err(Rejection::TimedOut))
            && live.start_by.is_some()
            && live.wait_until.is_some_and(|until| now < until);
        // A wait that reached its start deadline: predicted to start in time when it queued, it did not.
        let expired = matches!(result, Err(Rejection::TimedOut))
            && live.start_by.is_some_and(|by| now >= by)
            && live.wait_until == live.start_by;
        match result {
            Ok(permit) => self.enter_engine(key, Some(permit)),
            Err(rejection) => {
                // Refused on entering the queue, predicted to miss its start deadline.
                let shed_at_once = matches!(rejection, Rejection::NoCapacity { .. }) && self.shed_count() > shed_before;
                if left_early || shed_at_once {
                    self.deadline_shed(key);
                }
                self.tally.deadlines.expired += u64::from(expired);
                self.try_failed(
                    key,
                    TryEnd::Refused { hint: rejection.retry_after(), retryable: rejection.is_retryable() },
                );
            }
        }
    }

    fn enter_engine(&mut self, key: Key, permit: Option<Permit>) {
        let max_new = self.scenario.workload.max_new_tokens;
        let now = self.now;
        let Some(live) = self.live_at(key) else { return };
        let (prompt, output) = (live.prompt, live.output);
        match self.engine.submit(key.tag(), prompt, max_new, output) {
            Ok(seq) => {
                let Some(live) = self.live_at(key) else { return };
                live.entered = now;
                live.phase = Phase::Engine { seq, permit };
                let try_number = live.try_number;
                if live.deadline.is_some() && !live.admitted {
                    live.admitted = true;
                    self.tally.deadlines.admitted += 1;
                }
                if !self.tally.shed_pending.is_empty() {
                    let kv = self.gate.admission().map_or(0, |a| a.kv_cost(&Request::new(prompt, max_new)));
                    self.replay_shed(try_number, kv);
                }
            }
            Err(refusal) => {
                drop(permit);
                let retryable = matches!(refusal, EngineRefusal::QueueFull);
                self.try_failed(key, TryEnd::Refused { hint: None, retryable });
            }
        }
    }

    fn client_timeout(&mut self, key: Key) {
        let now = self.now;
        let Some(live) = self.live_at(key) else { return };
        if live.first_token.is_some() {
            return;
        }
        let (prompt, entered) = (live.prompt, live.entered);
        let phase = std::mem::replace(&mut live.phase, Phase::Backoff);
        if matches!(phase, Phase::Engine { .. }) && live.admitted && !live.judged {
            // Admitted, but no first token before the client gave up: a miss.
            live.judged = true;
            self.tally.deadlines.missed += 1;
        }
        match phase {
            Phase::Backoff => {}
            Phase::Waiting(admit) => drop(admit),
            Phase::Engine { seq, permit } => {
                self.engine.abort(seq);
                self.gate.served(&Observation::Abandoned {
                    prompt_tokens: prompt,
                    admitted_at: Duration::from_nanos(entered),
                    at: Duration::from_nanos(now),
                });
                drop(permit);
            }
        }
        self.try_failed(key, TryEnd::TimedOut);
    }

    /// A try ended without a first token: retry after the policy's delay, or give up.
    fn try_failed(&mut self, key: Key, end: TryEnd) {
        let next = self.next_epoch(key.slot);
        let Some(live) = self.slots[key.slot as usize].live.as_mut() else { return };
        live.phase = Phase::Backoff;
        let tries = live.tries;
        // No try starts after the user gave up, nor after the request's deadline passed.
        let give_up =
            live.first_try.saturating_add(nanos(self.client.give_up_after)).min(live.deadline.unwrap_or(u64::MAX));
        let (hint, retryable) = match end {
            TryEnd::Refused { hint, retryable } => (hint, retryable),
            TryEnd::TimedOut => (None, true),
        };
        let delay = if retryable { self.client.delay(tries, hint, &mut self.client_rng) } else { None };
        let retry_at = delay.map(|delay| self.now.saturating_add(nanos(delay))).filter(|&at| at < give_up);
        match retry_at {
            Some(at) => self.push(at, EventKind::Try(next)),
            None => {
                let failed = &mut self.tally.failed;
                match end {
                    TryEnd::Refused { retryable: false, .. } => failed.refused += 1,
                    TryEnd::Refused { .. } => failed.shed += 1,
                    TryEnd::TimedOut => failed.timed_out += 1,
                }
                self.finish(key.slot);
            }
        }
    }

    fn step_done(&mut self) {
        self.stepping = false;
        let mut events = std::mem::take(&mut self.engine_events);
        self.engine.complete_step(&mut events);
        for event in events.drain(..) {
            match event {
                EngineEvent::FirstToken { tag } => {
                    let now = self.now;
                    if let Some(live) = self.live_at(Key::from_tag(tag)) {
                        let (first_try, prompt, entered) = (live.first_try, live.prompt, live.entered);
                        live.first_token.get_or_insert(now);
                        if let (Some(deadline), true, false) = (live.deadline, live.admitted, live.judged) {
                            live.judged = true;
                            let deadlines = &mut self.tally.deadlines;
                            if now <= deadline {
                                deadlines.met += 1;
                            } else {
                                deadlines.missed += 1;
                            }
                        }
                        self.tally.interval_ttft.push(secs(now - first_try));
                        self.gate.served(&Observation::FirstToken {
                            prompt_tokens: prompt,
                            admitted_at: Duration::from_nanos(entered),
                            at: Duration::from_nanos(now),
                        });
                    }
                }
                EngineEvent::Finished { tag, output_tokens } => self.completed(Key::from_tag(tag), output_tokens),
            }
        }
        self.engine_events = events;
    }

    fn completed(&mut self, key: Key, output_tokens: u32) {
        let now = self.now;
        let slo = self.scenario.slo;
        let Some(live) = self.live_at(key) else { return };
        if let Phase::Engine { permit: Some(permit), .. } = std::mem::replace(&mut live.phase, Phase::Backoff) {
            permit.complete(output_tokens);
        }
        let first_token = live.first_token.unwrap_or(now);
        let ttft = first_token - live.first_try;
        let e2e = now - live.first_try;
        let (human, tenant, prompt) = (live.human, live.tenant, live.prompt);
        let good = ttft <= nanos(slo.ttft) && e2e <= nanos(slo.e2e);
        self.gate.served(&Observation::Finished {
            output_tokens,
            first_token_at: Duration::from_nanos(first_token),
            at: Duration::from_nanos(now),
        });
        let tally = &mut self.tally;
        tally.completed += 1;
        tally.good += u64::from(good);
        tally.interval_good += u64::from(good);
        tally.ttft.push(secs(ttft));
        tally.class_ttft[usize::from(!human)].push(secs(ttft));
        tally.e2e.push(secs(e2e));
        let served = tally.tenants.entry(tenant).or_insert(TenantReport { tenant, ..TenantReport::default() });
        served.completed += 1;
        served.prompt_tokens += u64::from(prompt);
        served.output_tokens += u64::from(output_tokens);
        let class = self.class(human);
        class.completed += 1;
        class.good += u64::from(good);
        class.tokens += u64::from(output_tokens);
        self.finish(key.slot);
    }

    /// Frees a finished request's slot and lets its source send the next one.
    fn finish(&mut self, slot: u32) {
        self.next_epoch(slot);
        let Some(live) = self.slots[slot as usize].live.take() else { return };
        self.free.push(slot);
        self.live -= 1;
        let tally = &mut self.tally;
        if live.deadline.is_some() && !live.admitted {
            tally.deadlines.never_admitted += 1;
            tally.never_admitted.insert(live.id);
        }
        tally.finished_tries += u64::from(live.tries);
        let bucket = live.tries.max(1) as usize - 1;
        if tally.tries_histogram.len() <= bucket {
            tally.tries_histogram.resize(bucket + 1, 0);
        }
        tally.tries_histogram[bucket] += 1;
        let next = match live.source {
            Source::Poisson => return,
            // A script's loop takes at least a network round trip per request, so a request refused at once
            // (too large, say) cannot make it spin at one instant of virtual time.
            Source::Heavy | Source::Script(_) => self.now.saturating_add(SCRIPT_MIN_GAP_NANOS),
            Source::Employee(_) => match self.scenario.workload.arrivals {
                Arrivals::Employees { think_time, .. } => {
                    self.now.saturating_add(dist::exponential(&mut self.work_rng, think_time.as_nanos() as f64) as u64)
                }
                Arrivals::Poisson { .. } => return,
            },
        };
        if next < self.arrivals_end {
            self.push(next, EventKind::UserArrival(live.source));
        }
    }

    /// Polls every waiter the admission woke, until no more wake-ups come.
    fn poll_woken(&mut self) {
        loop {
            let woken = std::mem::take(&mut *self.woken.lock());
            if woken.is_empty() {
                return;
            }
            for tag in woken {
                self.poll_waiting(Key::from_tag(tag));
            }
        }
    }

    fn kick_engine(&mut self) {
        if !self.stepping {
            if let Some(step) = self.engine.schedule() {
                self.stepping = true;
                self.push(self.now.saturating_add(nanos(step)), EventKind::StepDone);
            }
        }
    }

    fn sample(&mut self) {
        let status = self.engine.status();
        let queued = self.gate.queued();
        let series = &mut self.tally.series;
        series.t.push(secs(self.now));
        series.waiting.push((queued + status.waiting) as f64);
        series.running.push(status.running as f64);
        series.kv_percent.push(100.0 * status.kv_used_bytes as f64 / status.kv_pool_bytes as f64);
        let interval = &mut self.tally.interval_ttft;
        interval.sort_by(f64::total_cmp);
        series.ttft_p90.push(if interval.is_empty() { f64::NAN } else { nearest_rank(interval, 0.9) });
        interval.clear();
        series.goodput.push(self.tally.interval_good as f64 / self.scenario.sample_every.as_secs_f64());
        self.tally.interval_good = 0;
        series.max_in_flight.push(self.gate.max_in_flight().map_or(f64::NAN, |n| n as f64));
        // The budget over the tensor-parallel group, against the engine's pool counted the same way.
        let group_pool = status.kv_pool_bytes as f64 * f64::from(self.engine.plan().tensor_parallel());
        series.kv_budget_percent.push(self.gate.kv_budget().map_or(f64::NAN, |b| 100.0 * b as f64 / group_pool));
        self.gate.observe(Duration::from_nanos(self.now), &status);
        let next = self.now.saturating_add(nanos(self.scenario.sample_every));
        if (self.now < self.arrivals_end || self.live > 0) && next <= self.stop {
            self.push(next, EventKind::Sample);
        }
    }

    /// Lets the gate adjust its limits from the engine's state, and schedules the next control event
    /// (while the run goes on, like samples).
    fn control(&mut self) {
        let status = self.engine.status();
        self.gate.control(Duration::from_nanos(self.now), &status);
        if let Some(every) = self.control_every {
            let next = self.now.saturating_add(every);
            if (self.now < self.arrivals_end || self.live > 0) && next <= self.stop {
                self.push(next, EventKind::Control);
            }
        }
    }

    fn report(mut self) -> Report {
        let status = self.engine.status();
        let tally = &mut self.tally;
        tally.ttft.sort_by(f64::total_cmp);
        tally.e2e.sort_by(f64::total_cmp);
        let duration = secs(self.arrivals_end);
        for (class, ttft) in [&mut tally.humans, &mut tally.scripted].into_iter().zip(&mut tally.class_ttft) {
            class.goodput = class.good as f64 / duration;
            ttft.sort_by(f64::total_cmp);
            class.ttft = Percentiles::of_sorted(ttft);
        }
        let finished = tally.completed + tally.failed.total();
        tally.deadlines.lost_in_time = tally.never_admitted.intersection(&tally.shed_in_time_requests).count() as u64;
        let shares: Vec<f64> = tally.tenants.values().map(|t| t.output_tokens as f64).collect();
        let tally = std::mem::take(&mut self.tally);
        Report {
            scenario: self.scenario.name.clone(),
            gate: self.gate.name().to_owned(),
            retry: self.client.retry.label().to_owned(),
            duration: self.scenario.duration,
            arrived: tally.arrived,
            completed: tally.completed,
            good: tally.good,
            failed: tally.failed,
            in_system: self.live,
            goodput: tally.good as f64 / duration,
            ttft: Percentiles::of_sorted(&tally.ttft),
            e2e: Percentiles::of_sorted(&tally.e2e),
            tries: tally.tries,
            tries_per_request: if finished == 0 { 0.0 } else { tally.finished_tries as f64 / finished as f64 },
            preemptions: status.preemptions,
            peak_kv_percent: 100.0 * status.peak_kv_bytes as f64 / status.kv_pool_bytes as f64,
            peak_running: status.peak_running,
            fairness: jain_index(&shares),
            tenants: tally.tenants.into_values().collect(),
            deadlines: tally.deadlines,
            humans: tally.humans,
            scripted: tally.scripted,
            series: tally.series,
            ttft_sorted: tally.ttft,
            tries_histogram: tally.tries_histogram,
        }
    }
}
