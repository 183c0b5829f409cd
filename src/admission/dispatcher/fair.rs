//! The waiting room of one priority class: waiters grouped in *flows* (one per tenant, one for requests
//! without a tenant), served round-robin across flows (weighted), first-in first-out within a flow.
//!
//! Policy (weighted round-robin, a deficit round-robin whose cost unit is one request): eligible flows
//! form a ring; the flow at the front may be granted up to `weight` requests in its turn, then the ring
//! rotates. A flow whose head its own tenant cannot take (the tenant's in-flight cap or KV share is full)
//! is *parked*: it leaves the ring until that tenant frees room, so it blocks nobody else. A head that
//! does not fit the *global* capacity stops the pass: nobody passes it, in this class or below (except,
//! under controlled delay while the class stands, an older waiter of the same tenant-less flow that fits:
//! see `wait_policy.rs`).
//!
//! Guarantee: with `n` flows eligible in a class and weights `w_i`, each of flow `i`'s waiters is granted
//! after at most `sum_j w_j / w_i` grants per waiter ahead of it in its own flow — a tenant with 500
//! queued requests delays another tenant's request by at most its weight per round, not by 500.
//!
//! With [`Fairness::Tokens`](crate::Fairness::Tokens) the order among eligible flows is by virtual token
//! counter instead (smallest first, ties in ring order; see `Fairness` for the policy and its bound).
//! Counters live with the tenants (a completion refunds its unused output there, without the lock), so
//! the next flow is found by a scan of the eligible flows reading their current counters: O(eligible
//! flows) per grant — exact, and a few microseconds even with thousands of tenants waiting.
//!
//! # Layout
//! Waiters live in the waiting room's slab; a flow links its waiters through their `prev`/`next`
//! indices, and the ring links flows through theirs, so joining, leaving from anywhere (cancellation),
//! parking and rotating are all O(1), and nothing is allocated per waiter. Flow entries are reused.
//! Only the holder of the waiting room's lock touches a `FairQueue`.

use super::waiter::Slab;
use crate::admission::fairness::Fairness;
use crate::admission::hasher::KeyHasher;
use crate::admission::tenant::{FlowKey, TenantHandle};
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

/// One tenant's (or the anonymous) waiters in one class.
#[derive(Debug)]
pub(crate) struct Flow {
    pub(crate) key: FlowKey,
    /// The tenant whose own limits its waiters also need.
    pub(crate) tenant: Option<Arc<dyn TenantHandle>>,
    weight: u32,
    /// Oldest and newest waiter.
    head: Option<u32>,
    tail: Option<u32>,
    len: usize,
    /// Neighbours in the ring (only while in it).
    ring_prev: Option<u32>,
    ring_next: Option<u32>,
    in_ring: bool,
    /// Out of the ring until its tenant frees room.
    pub(crate) parked: bool,
}

/// What removing a waiter did to its flow.
#[derive(Debug)]
pub(crate) struct Left {
    /// The flow had no more waiters and was freed.
    pub(crate) emptied: bool,
    /// The flow was parked (its tenant's parked bit for this class must be cleared if it emptied).
    pub(crate) was_parked: bool,
}

/// Waiters of one priority class, by flow.
#[derive(Debug, Default)]
pub(crate) struct FairQueue {
    /// Order by virtual token counter (else weighted round-robin by requests).
    tokens: bool,
    /// The counter level of the last grant: the floor for a flow that comes back from idle.
    clock: u64,
    /// The counter of requests without a tenant.
    anonymous_counter: u64,
    flows: Vec<Option<Flow>>,
    free: Vec<u32>,
    by_key: HashMap<FlowKey, u32, BuildHasherDefault<KeyHasher>>,
    ring_head: Option<u32>,
    ring_tail: Option<u32>,
    /// Grants made to the front flow in its current turn.
    served_in_turn: u32,
}

impl FairQueue {
    /// A queue ordered by virtual token counters when `tokens`, else by weighted round-robin.
    pub(crate) fn new(tokens: bool) -> Self {
        Self { tokens, ..Self::default() }
    }

    fn flow(&self, id: u32) -> &Flow {
        self.flows[id as usize].as_ref().expect("a live flow id")
    }

    fn flow_mut(&mut self, id: u32) -> &mut Flow {
        self.flows[id as usize].as_mut().expect("a live flow id")
    }

    /// The tenant of flow `id`.
    pub(crate) fn tenant(&self, id: u32) -> Option<&Arc<dyn TenantHandle>> {
        self.flow(id).tenant.as_ref()
    }

    /// The flow of `key`, if it has waiters.
    pub(crate) fn find(&self, key: FlowKey) -> Option<u32> {
        self.by_key.get(&key).copied()
    }

    /// Whether no flow is eligible (every waiter, if any, is parked).
    pub(crate) fn ring_is_empty(&self) -> bool {
        self.ring_head.is_none()
    }

    /// Appends waiter `index` behind the earlier waiters of its flow, creating the flow if needed; sets
    /// the waiter's `flow`. Returns true if the flow just entered the ring (the class has a newly eligible
    /// flow: the caller marks the class held back *before* trying to grant). `level` is the class's
    /// service level from grants that never waited (see [`enter`](Self::enter)).
    pub(crate) fn push(
        &mut self,
        slab: &mut Slab,
        index: u32,
        key: FlowKey,
        tenant: Option<&Arc<dyn TenantHandle>>,
        level: u64,
    ) -> bool {
        let (id, created) = match self.by_key.get(&key) {
            Some(&id) => (id, false),
            None => {
                let flow = Flow {
                    key,
                    tenant: tenant.cloned(),
                    weight: tenant.map_or(1, |t| t.core().weight),
                    head: None,
                    tail: None,
                    len: 0,
                    ring_prev: None,
                    ring_next: None,
                    in_ring: false,
                    parked: false,
                };
                let id = match self.free.pop() {
                    Some(id) => {
                        self.flows[id as usize] = Some(flow);
                        id
                    }
                    None => {
                        self.flows.push(Some(flow));
                        u32::try_from(self.flows.len() - 1).expect("fewer than 2^32 flows")
                    }
                };
                self.by_key.insert(key, id);
                (id, true)
            }
        };
        let tail = self.flow(id).tail;
        {
            let waiter = slab.get_mut(index);
            waiter.flow = id;
            waiter.prev = tail;
            waiter.next = None;
        }
        if let Some(tail) = tail {
            slab.get_mut(tail).next = Some(index);
        }
        let flow = self.flow_mut(id);
        flow.tail = Some(index);
        if flow.head.is_none() {
            flow.head = Some(index);
        }
        flow.len += 1;
        if created {
            self.enter(id, level);
            true
        } else {
            false
        }
    }

    /// A flow becomes eligible: into the ring, and (token fairness) its counter lifted to the smallest of
    /// the flows still waiting — or, when none waits, to the class's service level: the highest counter a
    /// grant was made at, through this queue or directly (`direct`, from `try_admit`) — so that it cannot
    /// spend credit it banked while it was away, nor claim the service others were given directly.
    fn enter(&mut self, id: u32, direct: u64) {
        if self.tokens {
            let floor = self.min_counter().map_or(self.clock.max(direct), |(_, c)| c);
            if self.counter(id) < floor {
                self.set_counter(id, floor);
            }
        }
        self.ring_push_back(id);
    }

    /// The current virtual counter of flow `id`: its tenant's, or the anonymous one.
    fn counter(&self, id: u32) -> u64 {
        self.flow(id).tenant.as_ref().map_or(self.anonymous_counter, |t| t.core().virtual_tokens())
    }

    fn set_counter(&mut self, id: u32, counter: u64) {
        match &self.flow(id).tenant {
            Some(tenant) => tenant.core().set_virtual_tokens(counter),
            None => self.anonymous_counter = counter,
        }
    }

    /// The eligible flow with the smallest counter (the first in ring order among equals), and the counter.
    fn min_counter(&self) -> Option<(u32, u64)> {
        let mut best: Option<(u32, u64)> = None;
        let mut next = self.ring_head;
        while let Some(id) = next {
            let counter = self.counter(id);
            if best.is_none_or(|(_, c)| counter < c) {
                best = Some((id, counter));
            }
            next = self.flow(id).ring_next;
        }
        best
    }

    /// The next waiter to serve: `(flow, waiter index)` of the next flow — the ring's front, or (token
    /// fairness) the eligible flow with the smallest counter — and its oldest waiter, or its newest when
    /// `newest_first` (controlled delay, while the queue stands).
    pub(crate) fn head(&self, newest_first: bool) -> Option<(u32, u32)> {
        let id = if self.tokens { self.min_counter()?.0 } else { self.ring_head? };
        let flow = self.flow(id);
        Some((id, if newest_first { flow.tail } else { flow.head }.expect("a flow in the ring has waiters")))
    }

    /// Flow ids in use are below this (for a scan of every flow).
    pub(crate) fn flow_slots(&self) -> u32 {
        self.flows.len() as u32
    }

    /// Whether flow slot `id` holds a parked flow.
    pub(crate) fn is_parked(&self, id: u32) -> bool {
        self.flows.get(id as usize).and_then(Option::as_ref).is_some_and(|f| f.parked)
    }

    /// The oldest waiter of flow slot `id`, if a flow with waiters lives there (parked or not).
    pub(crate) fn oldest(&self, id: u32) -> Option<u32> {
        self.flows.get(id as usize)?.as_ref()?.head
    }

    /// Unlinks waiter `index` (granted, cancelled, timed out, closed, too large) from its flow. Frees the
    /// flow if it emptied.
    pub(crate) fn remove(&mut self, slab: &mut Slab, index: u32) -> Left {
        let (id, prev, next) = {
            let w = slab.get(index);
            (w.flow, w.prev, w.next)
        };
        match prev {
            Some(p) => slab.get_mut(p).next = next,
            None => self.flow_mut(id).head = next,
        }
        match next {
            Some(n) => slab.get_mut(n).prev = prev,
            None => self.flow_mut(id).tail = prev,
        }
        let waiter = slab.get_mut(index);
        waiter.prev = None;
        waiter.next = None;
        let flow = self.flow_mut(id);
        flow.len -= 1;
        let was_parked = flow.parked;
        let emptied = flow.len == 0;
        if emptied {
            if self.flow(id).in_ring {
                if self.ring_head == Some(id) {
                    self.served_in_turn = 0;
                }
                self.ring_unlink(id);
            }
            let key = self.flow(id).key;
            self.by_key.remove(&key);
            self.flows[id as usize] = None;
            self.free.push(id);
        }
        Left { emptied, was_parked }
    }

    /// Counts a grant of weighted token cost `cost` to `flow`, the flow [`head`](Self::head) returned,
    /// before its head is removed: round-robin ends the flow's turn once it had `weight` grants; token
    /// fairness advances its counter (and its tenant's) and re-files it.
    pub(crate) fn count_grant(&mut self, flow: u32, cost: u64) {
        if self.tokens {
            let served_at = self.counter(flow);
            self.clock = self.clock.max(served_at);
            let units = Fairness::counter_units(cost, self.flow(flow).weight);
            match &self.flow(flow).tenant {
                Some(tenant) => {
                    tenant.core().charge_virtual_tokens(units);
                }
                None => self.anonymous_counter = self.anonymous_counter.saturating_add(units),
            }
            return;
        }
        if self.ring_head != Some(flow) {
            return;
        }
        self.served_in_turn += 1;
        if self.served_in_turn >= self.flow(flow).weight {
            self.rotate();
        }
    }

    /// `flow` (the one [`head`](Self::head) returned) has a head its own tenant cannot take: it leaves the
    /// ring until the tenant frees room.
    pub(crate) fn park(&mut self, flow: u32) {
        if self.ring_head == Some(flow) {
            self.served_in_turn = 0;
        }
        self.ring_unlink(flow);
        self.flow_mut(flow).parked = true;
    }

    /// Waiters of the flow of `key`.
    pub(crate) fn len_of(&self, key: FlowKey) -> usize {
        self.find(key).map_or(0, |id| self.flow(id).len)
    }

    /// The flow with the most waiters (parked or not; of equals, the one with the smallest key): its length
    /// and its newest waiter. A scan of the flows, run only when a class's waiting room is full.
    pub(crate) fn longest(&self) -> Option<(usize, u32)> {
        self.flows
            .iter()
            .flatten()
            .max_by_key(|f| (f.len, std::cmp::Reverse(f.key)))
            .map(|f| (f.len, f.tail.expect("a live flow has waiters")))
    }

    /// Of the flows not parked (a parked flow waits for its own tenant, not for the server) with the most
    /// waiters, the one whose oldest waiter queued first (of equals, the smallest key): its length and that
    /// waiter. A scan of the flows, run only when a standing class is full.
    pub(crate) fn longest_oldest_eligible(&self, slab: &Slab) -> Option<(usize, u32)> {
        self.flows
            .iter()
            .flatten()
            .filter(|f| !f.parked)
            .map(|f| (f, f.head.expect("a live flow has waiters")))
            .max_by_key(|(f, head)| (f.len, std::cmp::Reverse((slab.get(*head).queued_at, f.key))))
            .map(|(f, head)| (f.len, head))
    }

    /// The flows parked now, by key (anonymous first, then tenants by id): the order they go back into
    /// the ring when every one of them is unparked.
    pub(crate) fn parked_flows(&self) -> Vec<u32> {
        let mut parked: Vec<(FlowKey, u32)> = (0..self.flows.len() as u32)
            .filter_map(|id| self.flows[id as usize].as_ref().filter(|f| f.parked).map(|f| (f.key, id)))
            .collect();
        parked.sort_unstable();
        parked.into_iter().map(|(_, id)| id).collect()
    }

    /// Puts a parked flow back at the end of the ring; true if it was parked. `level` as for
    /// [`push`](Self::push).
    pub(crate) fn unpark(&mut self, id: u32, level: u64) -> bool {
        if !self.flow(id).parked {
            return false;
        }
        self.flow_mut(id).parked = false;
        self.enter(id, level);
        true
    }

    /// Ends the front flow's turn.
    fn rotate(&mut self) {
        self.served_in_turn = 0;
        if let Some(id) = self.ring_head {
            if self.ring_tail != Some(id) {
                self.ring_unlink(id);
                self.ring_push_back(id);
            }
        }
    }

    fn ring_push_back(&mut self, id: u32) {
        let tail = self.ring_tail;
        {
            let flow = self.flow_mut(id);
            flow.ring_prev = tail;
            flow.ring_next = None;
            flow.in_ring = true;
        }
        match tail {
            Some(t) => self.flow_mut(t).ring_next = Some(id),
            None => self.ring_head = Some(id),
        }
        self.ring_tail = Some(id);
    }

    fn ring_unlink(&mut self, id: u32) {
        let (prev, next) = {
            let flow = self.flow_mut(id);
            flow.in_ring = false;
            (flow.ring_prev.take(), flow.ring_next.take())
        };
        match prev {
            Some(p) => self.flow_mut(p).ring_next = next,
            None => self.ring_head = next,
        }
        match next {
            Some(n) => self.flow_mut(n).ring_prev = prev,
            None => self.ring_tail = prev,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::super::waiter::{Notify, Waiter};
    use super::*;
    use crate::TenantId;

    fn waiter(slab: &mut Slab) -> u32 {
        slab.insert(Waiter::new(1, 1, u64::MAX, Notify::Task(None))).index()
    }

    #[test]
    fn round_robin_across_flows_fifo_within() {
        let mut slab = Slab::default();
        let mut q = FairQueue::default();
        let a = FlowKey::Tenant(TenantId::from(1));
        let b = FlowKey::Anonymous;
        let a1 = waiter(&mut slab);
        let a2 = waiter(&mut slab);
        let b1 = waiter(&mut slab);
        assert!(q.push(&mut slab, a1, a, None, 0));
        assert!(!q.push(&mut slab, a2, a, None, 0));
        assert!(q.push(&mut slab, b1, b, None, 0));
        let mut order = Vec::new();
        while let Some((flow, index)) = q.head(false) {
            order.push(index);
            q.count_grant(flow, 0);
            q.remove(&mut slab, index);
        }
        assert_eq!(order, [a1, b1, a2]);
        assert!(q.ring_is_empty());
    }

    #[test]
    fn parked_flows_leave_the_ring_and_come_back_at_its_end() {
        let mut slab = Slab::default();
        let mut q = FairQueue::default();
        let (a, b) = (FlowKey::Tenant(TenantId::from(0)), FlowKey::Anonymous);
        let a1 = waiter(&mut slab);
        let b1 = waiter(&mut slab);
        q.push(&mut slab, a1, a, None, 0);
        q.push(&mut slab, b1, b, None, 0);
        let front = q.head(false).unwrap().0;
        q.park(front);
        assert_eq!(q.head(false).map(|h| h.1), Some(b1));
        let left = q.remove(&mut slab, b1);
        assert!(left.emptied && !left.was_parked);
        assert!(q.ring_is_empty());
        let id = q.find(a).unwrap();
        assert!(q.unpark(id, 0));
        assert!(!q.unpark(id, 0));
        assert_eq!(q.head(false).map(|h| h.1), Some(a1));
        // TenantId(0) and "no tenant" are different flows.
        assert_ne!(q.find(a), q.find(b));
    }

    #[test]
    fn cancelling_from_the_middle_keeps_order() {
        let mut slab = Slab::default();
        let mut q = FairQueue::default();
        let k = FlowKey::Anonymous;
        let w: Vec<u32> = (0..4).map(|_| waiter(&mut slab)).collect();
        for &i in &w {
            q.push(&mut slab, i, k, None, 0);
        }
        q.remove(&mut slab, w[1]);
        q.remove(&mut slab, w[3]);
        let mut order = Vec::new();
        while let Some((flow, index)) = q.head(false) {
            order.push(index);
            q.count_grant(flow, 0);
            q.remove(&mut slab, index);
        }
        assert_eq!(order, [w[0], w[2]]);
    }
}
