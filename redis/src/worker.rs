//! The background task of one replica: gives back released leases and refunds (in batches), renews
//! leases, keeps the local allowance filled, and probes Redis while it is down.
//!
//! Every release and every renewal runs on this one task, one call at a time, so a release queued after
//! a lease left the table always reaches Redis after any renewal that still listed it (see
//! `leases.rs`, invariant 1). The task ends when the last sender of work is gone — the shared admission
//! and every permit — after one last try to give back what is pending; what it could not give back
//! expires with its leases.

use crate::allowance::Pool;
use crate::core::{Core, Work};
use crate::store::{Charge, RenewAnswer};
use kvgate::clock::{Clock, MonotonicClock};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::MissedTickBehavior;

/// Most lease ids given back in one call.
const RELEASE_BATCH: usize = 512;
/// Most leases renewed in one call.
const RENEW_BATCH: usize = 1024;
/// Releases kept for retry while Redis is down (beyond it, the oldest are dropped: their leases expire).
const MAX_PENDING: usize = 65_536;

#[derive(Debug, Default)]
struct Pending {
    ids: Vec<String>,
    refunds: Vec<Charge>,
    /// Flushes to answer after the next call.
    flushed: Vec<tokio::sync::oneshot::Sender<()>>,
    /// Renewals asked for, to run after the releases queued before them.
    renewals: Vec<tokio::sync::oneshot::Sender<()>>,
}

impl Pending {
    fn push(&mut self, work: Work) {
        match work {
            Work::Release { lease, refunds } => {
                self.ids.extend(lease);
                self.refunds.extend(refunds);
            }
            Work::Flush(done) => self.flushed.push(done),
            Work::Renew(done) => self.renewals.push(done),
        }
        if self.ids.len() > MAX_PENDING {
            let excess = self.ids.len() - MAX_PENDING;
            self.ids.drain(..excess);
        }
        if self.refunds.len() > MAX_PENDING {
            let excess = self.refunds.len() - MAX_PENDING;
            self.refunds.drain(..excess);
        }
    }

    fn is_empty(&self) -> bool {
        self.ids.is_empty() && self.refunds.is_empty()
    }
}

/// Runs the background task (see the module docs).
pub(crate) async fn run(core: Arc<Core>, mut work: UnboundedReceiver<Work>, retry_interval: Duration) {
    let clock = MonotonicClock::new();
    let mut renew = tokio::time::interval(core.limits.renew_interval);
    renew.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut probe = tokio::time::interval(retry_interval);
    probe.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut pending = Pending::default();
    loop {
        tokio::select! {
            received = work.recv() => match received {
                Some(first) => {
                    pending.push(first);
                    while pending.ids.len() < RELEASE_BATCH && pending.renewals.is_empty() {
                        match work.try_recv() {
                            Ok(more) => pending.push(more),
                            Err(_) => break,
                        }
                    }
                    flush(&core, &mut pending).await;
                    if !pending.renewals.is_empty() {
                        renew_all(&core).await;
                        for done in pending.renewals.drain(..) {
                            let _ = done.send(());
                        }
                    }
                }
                None => {
                    flush(&core, &mut pending).await;
                    return;
                }
            },
            _ = renew.tick() => {
                renew_all(&core).await;
                give_back_idle_allowance(&core, &clock, &mut pending);
                flush(&core, &mut pending).await;
            }
            _ = core.renew_now.notified() => renew_all(&core).await,
            _ = probe.tick(), if !core.store.is_up() => {
                renew_all(&core).await;
                flush(&core, &mut pending).await;
            }
            _ = wanted(&core) => refill(&core, &clock).await,
        }
    }
}

/// Gives back what is pending, in batches; keeps it if Redis does not answer.
async fn flush(core: &Core, pending: &mut Pending) {
    while !pending.is_empty() && core.store.available() {
        let ids: Vec<String> = pending.ids.iter().take(RELEASE_BATCH).cloned().collect();
        let refunds: Vec<Charge> = pending.refunds.iter().take(RELEASE_BATCH).cloned().collect();
        if core.store.release(&ids, &refunds).await.is_err() {
            break;
        }
        pending.ids.drain(..ids.len());
        pending.refunds.drain(..refunds.len());
    }
    for done in pending.flushed.drain(..) {
        let _ = done.send(());
    }
}

/// Renews every lease in the table, and registers those not held in Redis if they fit now.
async fn renew_all(core: &Core) {
    let items = core.leases.to_renew();
    if items.is_empty() {
        // Still a probe, and it learns the generation.
        if let Ok((generation, _)) = core.store.renew(&[], core.generation()).await {
            core.saw_generation(generation);
        }
        return;
    }
    for chunk in items.chunks(RENEW_BATCH) {
        let asks: Vec<(String, u64, u64)> = chunk.iter().map(|i| (i.id.clone(), i.slots, i.kv)).collect();
        let Ok((generation, answers)) = core.store.renew(&asks, core.generation()).await else { return };
        core.saw_generation(generation);
        for (item, answer) in chunk.iter().zip(answers) {
            let held = answer != RenewAnswer::DoesNotFit;
            match core.leases.renewed(item.seq, held) {
                // Left the table meanwhile: its release is queued and runs after this call.
                None => {}
                Some(before) => {
                    if answer == RenewAnswer::Registered {
                        core.stats.lease_registered();
                    }
                    if !held && before == crate::leases::LeaseState::Held {
                        core.stats.lease_lost();
                    }
                }
            }
        }
    }
}

/// Resolves when the allowance asks for a refill (never without an allowance).
async fn wanted(core: &Core) {
    match &core.allowance {
        Some(pool) => pool.wanted.notified().await,
        None => std::future::pending().await,
    }
}

/// Takes the allowance's missing part from Redis (up to what the buckets hold).
async fn refill(core: &Core, clock: &MonotonicClock) {
    let Some(pool) = &core.allowance else { return };
    if !core.store.available() {
        return;
    }
    let missing = pool.missing();
    let mut charges = Vec::with_capacity(2);
    if let Some(spec) = core.limits.requests.filter(|_| missing.requests > 0) {
        charges.push(Charge { key: core.store.keys.requests(None), spec, n: missing.requests, refundable: false });
    }
    if let Some(spec) = core.limits.tokens.filter(|_| missing.tokens > 0) {
        charges.push(Charge { key: core.store.keys.tokens(None), spec, n: missing.tokens, refundable: true });
    }
    if charges.is_empty() {
        return;
    }
    if let Ok(crate::store::Decision::Granted { taken, .. }) =
        core.store.decide(None, &charges, true, core.generation()).await
    {
        let mut got = Pool::default();
        for (charge, n) in charges.iter().zip(taken) {
            if charge.refundable {
                got.tokens = n;
            } else {
                got.requests = n;
            }
        }
        pool.add(got, clock.now_nanos());
    }
}

/// Queues the refund of an allowance that sat unused for its idle time.
fn give_back_idle_allowance(core: &Core, clock: &MonotonicClock, pending: &mut Pending) {
    let Some(pool) = &core.allowance else { return };
    let idle = u64::try_from(pool.config.idle.as_nanos()).unwrap_or(u64::MAX);
    let back = pool.drain_if_idle(clock.now_nanos(), idle);
    let mut refunds = Vec::new();
    if let Some(spec) = core.limits.requests.filter(|_| back.requests > 0) {
        refunds.push(Charge { key: core.store.keys.requests(None), spec, n: back.requests, refundable: false });
    }
    if let Some(spec) = core.limits.tokens.filter(|_| back.tokens > 0) {
        refunds.push(Charge { key: core.store.keys.tokens(None), spec, n: back.tokens, refundable: true });
    }
    if !refunds.is_empty() {
        pending.push(Work::Release { lease: None, refunds });
    }
}
