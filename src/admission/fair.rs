//! The dispatcher's view of one priority class: waiters grouped by tenant, served round-robin across
//! tenants (weighted), first-in first-out within a tenant.
//!
//! Policy (weighted round-robin, a deficit round-robin whose cost unit is one request): tenants with
//! waiters form a ring; the tenant at the front may be granted up to `weight` requests in its turn, then
//! the ring rotates. A tenant whose head cannot be granted because of its *own* limits (its in-flight
//! cap or KV share) is skipped for the rest of the pass; a head that does not fit the *global* capacity
//! stops the pass (nobody overtakes it: strict FIFO within the class across the ring's order).
//!
//! Guarantee: with `n` tenants waiting in a class, weights `w_i`, each of tenant `i`'s waiters is
//! granted after at most `sum_j w_j / w_i` grants per waiter ahead of it in its own queue — a tenant with
//! 500 queued requests delays another tenant's request by at most its weight per round, not by 500.
//! Requests without a tenant share one default tenant.
//!
//! Only the dispatch runner touches a `FairQueue` (it lives behind the dispatcher's uncontended mutex).

use super::waiter::{WAITING, Waiter};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

/// Tenant keys are already hashes (or small ids): one multiply spreads them, no SipHash needed on the
/// dispatcher's path.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(byte)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, key: u64) {
        self.0 = (self.0 ^ key).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type ByTenant = HashMap<u64, VecDeque<Arc<Waiter>>, BuildHasherDefault<KeyHasher>>;

/// Waiters of one priority class, by tenant.
#[derive(Debug, Default)]
pub(crate) struct FairQueue {
    by_tenant: ByTenant,
    /// Tenants with entries, in service order; the front is being served.
    ring: VecDeque<u64>,
    /// Grants made to the front tenant in its current turn.
    served_in_turn: u32,
    /// Entries held, including waiters that no longer wait (dropped when they reach a front).
    len: usize,
}

impl FairQueue {
    /// Appends a waiter behind the earlier waiters of its tenant.
    pub(crate) fn push(&mut self, waiter: Arc<Waiter>) {
        let key = waiter.tenant_key;
        let queue = self.by_tenant.entry(key).or_default();
        if queue.is_empty() {
            self.ring.push_back(key);
        }
        queue.push_back(waiter);
        self.len += 1;
    }

    /// Number of tenants with entries.
    pub(crate) fn tenants(&self) -> usize {
        self.ring.len()
    }

    /// The next waiter to serve: the front tenant's oldest live waiter. Drops finished waiters and
    /// empty tenants on the way.
    pub(crate) fn head(&mut self) -> Option<Arc<Waiter>> {
        while let Some(&key) = self.ring.front() {
            let queue = self.by_tenant.get_mut(&key).expect("ring and map agree");
            while queue.front().is_some_and(|w| w.state() != WAITING) {
                queue.pop_front();
                self.len -= 1;
            }
            if let Some(head) = queue.front() {
                return Some(Arc::clone(head));
            }
            // Keep the empty queue (and its buffer) for the tenant's next waiter; `shrink` drops idle ones.
            self.ring.pop_front();
            self.served_in_turn = 0;
        }
        None
    }

    /// Removes the head returned by [`head`](FairQueue::head) after it was granted (or found finished),
    /// and ends the front tenant's turn once it had `weight` grants.
    pub(crate) fn pop_head(&mut self, granted: bool) {
        let Some(&key) = self.ring.front() else { return };
        let queue = self.by_tenant.get_mut(&key).expect("ring and map agree");
        let Some(waiter) = queue.pop_front() else { return };
        self.len -= 1;
        if granted {
            self.served_in_turn += 1;
        }
        if queue.is_empty() {
            self.ring.pop_front();
            self.served_in_turn = 0;
        } else if self.served_in_turn >= waiter.weight.max(1) {
            self.rotate();
        }
    }

    /// Ends the front tenant's turn without serving it (its own limits are full).
    pub(crate) fn rotate(&mut self) {
        if let Some(key) = self.ring.pop_front() {
            self.ring.push_back(key);
        }
        self.served_in_turn = 0;
    }

    /// Takes every entry out, in no particular order (closing).
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = Arc<Waiter>> + '_ {
        self.ring.clear();
        self.served_in_turn = 0;
        self.len = 0;
        self.by_tenant.drain().flat_map(|(_, queue)| queue)
    }

    /// Drops finished waiters, and the queues of tenants that no longer wait, when they make up most of
    /// what is held, so memory stays proportional to live waiters (`live` is the class's exact waiting
    /// count) and waiting tenants.
    pub(crate) fn shrink(&mut self, live: usize) {
        if self.len <= 2 * live + 64 && self.by_tenant.len() <= 2 * self.ring.len() + 64 {
            return;
        }
        for queue in self.by_tenant.values_mut() {
            queue.retain(|w| w.state() == WAITING);
        }
        self.by_tenant.retain(|_, queue| !queue.is_empty());
        let by_tenant = &self.by_tenant;
        self.ring.retain(|key| by_tenant.contains_key(key));
        self.len = self.by_tenant.values().map(VecDeque::len).sum();
        self.served_in_turn = 0;
    }
}
