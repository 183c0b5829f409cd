//! `Window`: how many events were stamped in each of the last [`SLICES`] slices of time, in `SLICES`
//! atomic words — bounded memory, however many events.
//!
//! # The words
//!
//! Slice `s` (the clock's nanoseconds divided by the slice length) is counted in word `s % SLICES`, whose
//! 64 bits hold
//!
//! ```text
//! bits 63..32: the lap tag   (s / SLICES) mod 2^32   which of the slices s, s ± SLICES, s ± 2·SLICES, ... the count is for
//! bits 31..0:  the count     events stamped in that slice, saturating at u32::MAX
//! ```
//!
//! **Invariant:** a word's count is the number of events recorded for the slice its tag names (since the
//! word was last restarted for it). A word whose tag is not the lap of the slice a reader asks for holds
//! another slice, which for that reader counts 0; a writer that finds a tag other than its own slice's
//! lap restarts the word at `(its lap, 1)`. Words therefore never need clearing: an expired slice is
//! simply read as 0 and overwritten by the next slice that maps to the same word.
//!
//! Each word changes only by a compare-and-swap of the whole word, so the tag and the count always change
//! together: a `fetch_add` could add an event of slice `s` to slice `s + SLICES` after another thread
//! restarted the word for it, or carry a full count into the tag.
//!
//! **The one approximation:** the tag keeps 32 bits of the lap, so a word left untouched for exactly a
//! multiple of 2^32 laps (2^32 · ttl: 136 years at the shortest ttl of 1 s) would be read as current.
//! A [`MonotonicClock`](crate::clock::MonotonicClock) starts at 0 when it is created, so a budget would
//! have to live that long; a [`ManualClock`](crate::clock::ManualClock) reaches it only when set that far.
//!
//! **Writers out of date.** A writer whose clock reading is older than the word's slice (a thread
//! preempted between reading the clock and its CAS, a clock stepping back a whole lap or more) restarts
//! the word at its own lap: the newer slice's events are lost and count 0 — fewer events, never more.
//! The budget uses that only for first tries (losing some makes it stricter); retries are recorded under
//! the withdrawal lock with stamps that never go back, so no retry is ever lost.
//!
//! # Orderings
//!
//! Every access is `Relaxed`. A word publishes no other memory, and each decision depends only on the
//! values read: any value a load returns is a count of events that were recorded. The budget orders
//! the retry counts by holding its withdrawal lock around every read-and-record of them.

use super::terms::SLICES;
use crate::sync::{AtomicU64, Ordering};

/// Event counts of the last [`SLICES`] slices (see the module docs for the word layout).
#[derive(Debug)]
pub(super) struct Window {
    words: [AtomicU64; SLICES as usize],
}

impl Window {
    /// A window with no events.
    pub(super) fn new() -> Self {
        Self { words: std::array::from_fn(|_| AtomicU64::new(0)) }
    }

    /// Records one event stamped in `slice`. `false` if it was not counted: the slice already holds
    /// `u32::MAX` events.
    #[inline]
    pub(super) fn record(&self, slice: u64) -> bool {
        let word = &self.words[index(slice)];
        let tag = lap_tag(slice);
        let mut current = word.load(Ordering::Relaxed);
        loop {
            let next = if current >> 32 == tag {
                if current as u32 == u32::MAX {
                    return false;
                }
                current + 1
            } else {
                (tag << 32) | 1
            };
            match word.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }

    /// The events recorded in the window ending at `slice`: slices `slice - SLICES + 1 ..= slice` (those
    /// before slice 0 do not exist). At most `SLICES · u32::MAX`.
    #[inline]
    pub(super) fn total(&self, slice: u64) -> u64 {
        (0..SLICES.min(slice.saturating_add(1)))
            .map(|back| {
                let s = slice - back;
                let word = self.words[index(s)].load(Ordering::Relaxed);
                if word >> 32 == lap_tag(s) { word & u64::from(u32::MAX) } else { 0 }
            })
            .sum()
    }
}

/// The word that counts `slice`.
#[inline]
fn index(slice: u64) -> usize {
    // The remainder is below SLICES = 10.
    (slice % SLICES) as usize
}

/// The tag of `slice`'s lap: its low 32 bits.
#[inline]
fn lap_tag(slice: u64) -> u64 {
    (slice / SLICES) & u64::from(u32::MAX)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_slice_counts_until_its_word_is_reused() {
        let w = Window::new();
        assert!(w.record(3) && w.record(3) && w.record(5));
        assert_eq!(w.total(5), 3);
        assert_eq!(w.total(12), 3); // slices 3..=12
        assert_eq!(w.total(13), 1); // slice 3 has left the window
        assert_eq!(w.total(14), 1);
        assert_eq!(w.total(15), 0);
        // Slice 13 reuses slice 3's word: the old count is gone, not added.
        assert!(w.record(13));
        assert_eq!(w.total(13), 2);
        // A reader behind the writer no longer sees slice 3, whose word now holds slice 13.
        assert_eq!(w.total(5), 1);
    }

    #[test]
    fn a_full_slice_refuses_and_the_next_one_starts_afresh() {
        let w = Window::new();
        w.words[index(7)].store((lap_tag(7) << 32) | u64::from(u32::MAX - 1), Ordering::Relaxed);
        assert!(w.record(7));
        assert!(!w.record(7));
        assert_eq!(w.total(7), u64::from(u32::MAX));
        assert!(w.record(8));
        assert_eq!(w.total(8), u64::from(u32::MAX) + 1);
    }

    #[test]
    fn the_first_and_last_slices_are_safe() {
        let w = Window::new();
        assert_eq!(w.total(0), 0);
        assert!(w.record(u64::MAX));
        assert_eq!(w.total(u64::MAX), 1);
        assert!(w.record(0));
        assert_eq!(w.total(0), 1);
    }
}
