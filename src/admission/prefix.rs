//! Shared prefixes: the KV-cache blocks of a prompt prefix that many requests share (at a company, the same
//! system prompt opens almost every chat) are charged once while any request using it holds a permit.
//!
//! Engines with prefix caching (vLLM, SGLang) keep one copy of a prefix's whole blocks for every sequence
//! that starts with it. With [`prefix_sharing`](crate::AdmissionBuilder::prefix_sharing) on, a request that
//! names its prefix ([`Request::prefix`](crate::Request::prefix)) reserves only what it adds beyond the
//! prefix when the prefix is already held; the first request (and the first after the prefix was
//! released) also reserves the prefix. The prefix's reservation is returned when the last permit holding
//! it is dropped.
//!
//! # Invariants (under the waiting room's lock, where the table lives)
//! 1. An entry is *charged* (its prefix units are part of the global KV in use) exactly while `holders > 0`.
//! 2. An entry exists while it has holders or waiters referring to it; at most `max_entries` exist, so
//!    invented ids cannot grow memory: a request whose prefix finds the table full is charged in full and
//!    shares nothing.
//! 3. A waiter that refers to an entry reserves only its suffix while waiting; whether the prefix must
//!    be charged too is decided at the moment it is granted.
//! 4. Every request referring to an entry takes the same cache hit at the same price: a request naming
//!    the same id with another length (or a prompt too short for the whole prefix) shares nothing and is
//!    charged as if it named no prefix, so the units charged for an entry cover what each of its holders
//!    leaves out.

use std::collections::HashMap;
use std::collections::hash_map::Entry::{Occupied, Vacant};
use std::hash::BuildHasherDefault;

use super::hasher::KeyHasher;

/// The id of a cacheable prompt prefix (for example a hash of the system prompt). Cheap to copy.
///
/// # Examples
///
/// ```
/// use kvgate::PrefixId;
///
/// assert_eq!(PrefixId::from("You are a helpful assistant."), PrefixId::from("You are a helpful assistant."));
/// assert_eq!(PrefixId::from(7u64).get(), 7);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PrefixId(u64);

impl PrefixId {
    /// The id as a number.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl From<u64> for PrefixId {
    fn from(id: u64) -> Self {
        Self(id)
    }
}

impl From<&str> for PrefixId {
    /// FNV-1a over the bytes, like [`TenantId`](crate::TenantId): stable across runs and platforms.
    fn from(text: &str) -> Self {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in text.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        Self(hash)
    }
}

/// A request's cacheable prefix: its id and its length in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Prefix {
    /// Which prefix.
    pub id: PrefixId,
    /// Its length in tokens (at most the request's prompt less one token; longer counts as that).
    pub tokens: u32,
}

/// A request's KV cost split around its shared prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Split {
    pub(crate) id: PrefixId,
    /// Tokens of the prefix a request takes from the engine's cache (whole blocks of every cache group):
    /// requests share an entry only with the same.
    pub(crate) hit: u64,
    /// KV units of the prefix's cached blocks, charged once for all holders.
    pub(crate) prefix: u64,
    /// KV units the request adds beyond the prefix.
    pub(crate) suffix: u64,
    /// KV units of the request when it shares nothing (its cost without a prefix).
    pub(crate) alone: u64,
}

impl Split {
    /// What the request holds when it brings the prefix in: the prefix and its suffix, counted apart (at
    /// least [`alone`](Self::alone); more where a sliding window is counted in both).
    pub(crate) fn whole(&self) -> u64 {
        self.prefix.saturating_add(self.suffix)
    }

    /// What the request does not reserve when it finds the prefix held: its cost without a prefix less
    /// its suffix (the prefix's units where every layer keeps every token; less with sliding windows,
    /// whose suffix keeps a window of its own).
    pub(crate) fn saving(&self) -> u64 {
        self.alone.saturating_sub(self.suffix)
    }
}

#[derive(Debug)]
struct Entry {
    /// The cache hit every request referring to it takes (see [`Split::hit`]).
    hit: u64,
    /// KV units of the prefix (as priced when the entry was made).
    units: u64,
    holders: u32,
    waiters: u32,
}

impl Entry {
    fn new(split: &Split) -> Self {
        Self { hit: split.hit, units: split.prefix, holders: 0, waiters: 0 }
    }

    /// Whether `split` takes the same cached blocks, at the same price.
    fn prices(&self, split: &Split) -> bool {
        self.hit == split.hit && self.units == split.prefix
    }
}

/// How a request refers to the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sharing {
    /// It has an entry: it holds (or will hold) only its suffix, and the prefix is counted once.
    Shared(PrefixId),
    /// The table was full: it holds its whole cost itself.
    Alone,
}

/// The bounded table of prefixes in use.
#[derive(Debug)]
pub(crate) struct PrefixTable {
    entries: HashMap<PrefixId, Entry, BuildHasherDefault<KeyHasher>>,
    max_entries: usize,
}

impl PrefixTable {
    pub(crate) fn new(max_entries: usize) -> Self {
        Self { entries: HashMap::default(), max_entries }
    }

    /// Entries in the table.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The KV units a holder of `split` must take now: its suffix, plus the prefix if nobody holds it.
    /// `Alone` when the table has no room for a new prefix, or when the entry of its id prices the prefix
    /// differently (another length of it, or one cut to a shorter prompt).
    pub(crate) fn need(&self, split: &Split) -> (u64, Sharing) {
        match self.entries.get(&split.id) {
            Some(entry) if !entry.prices(split) => (split.alone, Sharing::Alone),
            Some(entry) if entry.holders > 0 => (split.suffix, Sharing::Shared(split.id)),
            Some(entry) => (split.suffix.saturating_add(entry.units), Sharing::Shared(split.id)),
            None if self.entries.len() < self.max_entries => (split.whole(), Sharing::Shared(split.id)),
            None => (split.alone, Sharing::Alone),
        }
    }

    /// Records a new holder of `split` (after its `need` was taken and said `Shared`). Returns the KV units
    /// it did not have to take because the prefix was held already ([`Split::saving`]; 0 when it brought
    /// the prefix in).
    pub(crate) fn hold(&mut self, split: &Split) -> u64 {
        let entry = self.entries.entry(split.id).or_insert_with(|| Entry::new(split));
        debug_assert!(entry.prices(split), "`need` shares an entry only with the same pricing");
        let saved = if entry.holders > 0 { split.saving() } else { 0 };
        entry.holders += 1;
        saved
    }

    /// A holder let go. Returns the prefix's KV units to give back when it was the last holder.
    pub(crate) fn release(&mut self, id: PrefixId) -> u64 {
        let Some(entry) = self.entries.get_mut(&id) else { return 0 };
        entry.holders -= 1;
        if entry.holders > 0 {
            return 0;
        }
        let units = entry.units;
        if entry.waiters == 0 {
            self.entries.remove(&id);
        }
        units
    }

    /// A waiter of `split` starts waiting: `Shared` if the table has (or makes) its entry with the same
    /// prefix units; `Alone` as in [`need`](Self::need).
    pub(crate) fn wait(&mut self, split: &Split) -> Sharing {
        let full = self.entries.len() >= self.max_entries;
        match self.entries.entry(split.id) {
            Occupied(entry) if !entry.get().prices(split) => Sharing::Alone,
            Occupied(mut entry) => {
                entry.get_mut().waiters += 1;
                Sharing::Shared(split.id)
            }
            Vacant(_) if full => Sharing::Alone,
            Vacant(slot) => {
                slot.insert(Entry { waiters: 1, ..Entry::new(split) });
                Sharing::Shared(split.id)
            }
        }
    }

    /// The KV units a waiter of `id` with `suffix` must take when granted.
    pub(crate) fn waiter_need(&self, id: PrefixId, suffix: u64) -> u64 {
        match self.entries.get(&id) {
            Some(entry) if entry.holders == 0 => suffix.saturating_add(entry.units),
            _ => suffix,
        }
    }

    /// A waiter of `id` stopped waiting: granted (it becomes a holder) or not. Returns whether a granted
    /// waiter found the prefix held already (it saved what sharing saves, [`Split::saving`]).
    pub(crate) fn stop_waiting(&mut self, id: PrefixId, granted: bool) -> bool {
        let Some(entry) = self.entries.get_mut(&id) else { return false };
        entry.waiters -= 1;
        if granted {
            let held = entry.holders > 0;
            entry.holders += 1;
            return held;
        }
        if entry.holders == 0 && entry.waiters == 0 {
            self.entries.remove(&id);
        }
        false
    }

    /// The prefix units of `id` (0 if unknown).
    pub(crate) fn units(&self, id: PrefixId) -> u64 {
        self.entries.get(&id).map_or(0, |e| e.units)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A split in tokens: the hit and the units are the prefix's tokens.
    fn split(id: u64, prefix: u64, suffix: u64) -> Split {
        Split { id: PrefixId::from(id), hit: prefix, prefix, suffix, alone: prefix + suffix }
    }

    #[test]
    fn a_prefix_is_charged_once_while_held_and_the_table_is_bounded() {
        let mut table = PrefixTable::new(1);
        let a = split(1, 100, 10);
        let b = split(2, 50, 5);
        assert_eq!(table.need(&a), (110, Sharing::Shared(a.id)));
        assert_eq!(table.hold(&a), 0);
        assert_eq!(table.need(&a), (10, Sharing::Shared(a.id)));
        assert_eq!(table.hold(&a), 100);
        // Full: another prefix shares nothing.
        assert_eq!(table.need(&b), (55, Sharing::Alone));
        assert_eq!(table.wait(&b), Sharing::Alone);
        assert_eq!(table.release(a.id), 0);
        assert_eq!(table.release(a.id), 100);
        assert_eq!(table.len(), 0);
    }

    #[test]
    fn a_request_pricing_the_prefix_differently_shares_nothing() {
        let mut table = PrefixTable::new(4);
        let short = split(1, 6, 10);
        let long = split(1, 250, 20);
        assert_eq!(table.need(&short), (16, Sharing::Shared(short.id)));
        assert_eq!(table.hold(&short), 0);
        assert_eq!(table.need(&long), (270, Sharing::Alone));
        assert_eq!(table.wait(&long), Sharing::Alone);
        assert_eq!(table.release(short.id), 6);
        assert_eq!(table.len(), 0);
        // Once the entry is gone, the long prefix makes its own.
        assert_eq!(table.need(&long), (270, Sharing::Shared(long.id)));
    }

    #[test]
    fn waiters_keep_their_entry_and_pay_the_prefix_only_if_nobody_holds_it() {
        let mut table = PrefixTable::new(4);
        let a = split(1, 100, 10);
        assert_eq!(table.wait(&a), Sharing::Shared(a.id));
        assert_eq!(table.waiter_need(a.id, 10), 110);
        table.hold(&a);
        assert_eq!(table.waiter_need(a.id, 10), 10);
        assert!(table.stop_waiting(a.id, true));
        assert_eq!(table.release(a.id), 0);
        assert_eq!(table.release(a.id), 100);
        assert_eq!(table.len(), 0);
        table.wait(&a);
        table.stop_waiting(a.id, false);
        assert_eq!(table.len(), 0);
    }
}
