//! A bounded window of samples and its quantiles.
//!
//! # Invariants
//! - The window never holds more than its capacity: once full, a new sample overwrites the oldest, so
//!   memory is fixed when the window is built and [`SampleWindow::push`] never allocates.
//! - [`quantile`] is the nearest-rank quantile of the values given, found by selection (linear time)
//!   in a scratch buffer the caller keeps, so a decision allocates nothing after the first.

/// A ring of at most `capacity` samples.
#[derive(Debug, Clone)]
pub(crate) struct SampleWindow<T> {
    samples: Vec<T>,
    capacity: usize,
    /// Where the next sample goes once the window is full.
    next: usize,
}

impl<T: Copy> SampleWindow<T> {
    /// An empty window of `capacity` (at least 1) samples, its memory reserved.
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self { samples: Vec::with_capacity(capacity), capacity, next: 0 }
    }

    /// Adds a sample, overwriting the oldest when full.
    #[inline]
    pub(crate) fn push(&mut self, sample: T) {
        if self.samples.len() < self.capacity {
            self.samples.push(sample);
        } else {
            self.samples[self.next] = sample;
            self.next = (self.next + 1) % self.capacity;
        }
    }

    /// The samples, in no particular order.
    pub(crate) fn samples(&self) -> &[T] {
        &self.samples
    }

    pub(crate) fn len(&self) -> usize {
        self.samples.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Forgets every sample (keeps the memory).
    pub(crate) fn clear(&mut self) {
        self.samples.clear();
        self.next = 0;
    }
}

/// The nearest-rank `q`-quantile (`q` in `(0, 1]`) of `values`, reordering them; `None` when empty.
/// NaN sorts above every number (it never comes from the controller, which measures durations).
pub(crate) fn quantile(values: &mut [f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    let (_, value, _) = values.select_nth_unstable_by(rank - 1, f64::total_cmp);
    Some(*value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_window_overwrites_the_oldest() {
        let mut window = SampleWindow::new(3);
        for v in 1..=5 {
            window.push(v);
        }
        let mut kept = window.samples().to_vec();
        kept.sort_unstable();
        assert_eq!(kept, [3, 4, 5]);
        assert_eq!(window.len(), 3);
        window.clear();
        assert!(window.is_empty());
        window.push(9);
        assert_eq!(window.samples(), [9]);
    }

    #[test]
    fn quantiles_use_nearest_rank() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(quantile(&mut v, 0.9), Some(90.0));
        assert_eq!(quantile(&mut v, 1.0), Some(100.0));
        assert_eq!(quantile(&mut v, 0.001), Some(1.0));
        assert_eq!(quantile(&mut [], 0.5), None);
        assert_eq!(quantile(&mut [7.0], 0.5), Some(7.0));
    }
}
