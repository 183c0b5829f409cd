//! [`PermitStream`]: a token stream that holds its request's [`Permit`] for exactly as long as it runs.
//!
//! A streamed completion occupies a sequence slot and its KV reservation until the last token is sent —
//! or until the client goes away and the server drops the stream. Wrapping the stream ties the permit to
//! it: the permit is completed with the number of output tokens actually produced (so the unused part of
//! the token-rate reservation is refunded) when the stream ends, or when it is dropped before its end.
//!
//! The permit is any [`Complete`] type: [`Permit`] by default, or the permit of another admission built on
//! kvgate (limits shared by several replicas, a gateway dispatching over several servers) — the adapters
//! here and in `kvgate::http` and `kvgate::tower` only hold it and complete it once.

use crate::Permit;
use futures::stream::{FusedStream, Stream};
use pin_project::pin_project;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Counts the output tokens of a response as it passes: a stream's items or a body's data frames.
///
/// [`count`](OutputCounter::count) is called for every item and its results are summed;
/// [`total`](OutputCounter::total) turns that sum into what the permit is
/// [completed](Permit::complete) with. A counter that cannot tell how many tokens it saw answers `None`
/// there, and the permit is then dropped without a report (the learned reservation and the token-rate
/// refund see nothing) instead of being completed with a made-up number.
///
/// Implemented by [`OnePerItem`], [`Uncounted`], `kvgate::openai::OutputTokens` (feature `openai`), and
/// every `FnMut(&T) -> u32` closure or function (tokens per item, summed).
///
/// Prompt sizes are estimated by a different trait, `kvgate::openai::PromptEstimator`: this one only
/// counts what was generated.
pub trait OutputCounter<T: ?Sized> {
    /// Output tokens in `item`, added to the running sum.
    fn count(&mut self, item: &T) -> u32;

    /// The output tokens of the whole response so far, given the running sum of
    /// [`count`](OutputCounter::count); `None` when they cannot be told. The default is the sum.
    fn total(&self, summed: u32) -> Option<u32> {
        Some(summed)
    }
}

/// Counts one output token per item: right for streams that yield one token (or one SSE event per
/// token) at a time. The default of [`PermitStream`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OnePerItem;

impl<T: ?Sized> OutputCounter<T> for OnePerItem {
    #[inline]
    fn count(&mut self, _item: &T) -> u32 {
        1
    }
}

/// Counts nothing and reports nothing: the permit is returned without an output count. The default of
/// `http::PermitBody` (feature `http-body`), whose data frames are bytes, not tokens (a non-streamed
/// answer is one frame, however many tokens it holds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Uncounted;

impl<T: ?Sized> OutputCounter<T> for Uncounted {
    #[inline]
    fn count(&mut self, _item: &T) -> u32 {
        0
    }

    fn total(&self, _summed: u32) -> Option<u32> {
        None
    }
}

impl<T: ?Sized, F: FnMut(&T) -> u32> OutputCounter<T> for F {
    #[inline]
    fn count(&mut self, item: &T) -> u32 {
        self(item)
    }
}

/// A grant that is ended by reporting the output tokens its request produced: [`Permit::complete`], or
/// the permit of another admission (one shared by several replicas, a gateway's permit over several
/// servers). [`PermitStream`], `http::PermitBody` (feature `http-body`) and the tower layer hold any
/// `Complete` permit and end it exactly once: `complete` with the count when the counter knows it,
/// otherwise by dropping it.
///
/// Dropping a permit without `complete` must return its capacity too (it is how a request whose output
/// is unknown ends).
///
/// # Examples
///
/// ```
/// use kvgate::stream::{Complete, PermitStream};
/// use std::sync::atomic::{AtomicU32, Ordering};
///
/// /// A permit of an admission of one's own that records what its request produced.
/// struct Recorded<'a>(&'a AtomicU32);
///
/// impl Complete for Recorded<'_> {
///     fn complete(self, output_tokens: u32) {
///         self.0.store(output_tokens, Ordering::Relaxed);
///     }
/// }
///
/// let produced = AtomicU32::new(0);
/// let stream = PermitStream::new(futures::stream::iter(["a", "b", "c"]), Recorded(&produced));
/// futures::executor::block_on(futures::StreamExt::count(stream));
/// assert_eq!(produced.load(Ordering::Relaxed), 3);
/// ```
pub trait Complete {
    /// Ends the generation having produced `output_tokens`, and gives everything back.
    fn complete(self, output_tokens: u32);
}

impl Complete for Permit {
    #[inline]
    fn complete(self, output_tokens: u32) {
        Permit::complete(self, output_tokens);
    }
}

/// Holds a permit, a counter, the running sum of its counts and its latest total; completes the permit
/// exactly once — when told to, or when dropped — with that total, or drops it unreported when the
/// total is unknown.
pub(crate) struct Completion<F, P: Complete = Permit> {
    permit: Option<P>,
    counter: F,
    summed: u32,
    /// `counter.total(summed)`, refreshed after every item (the item type is known there, not in `Drop`).
    total: Option<u32>,
}

impl<F, P: Complete> Completion<F, P> {
    /// Holds `permit`, counting items of type `T` with `counter`.
    pub(crate) fn new<T: ?Sized>(permit: P, counter: F) -> Self
    where
        F: OutputCounter<T>,
    {
        let total = counter.total(0);
        Self { permit: Some(permit), counter, summed: 0, total }
    }

    /// The same permit, counted by `counter` from the start.
    pub(crate) fn recount<T: ?Sized, G: OutputCounter<T>>(mut self, counter: G) -> Completion<G, P> {
        let total = counter.total(0);
        Completion { permit: self.permit.take(), counter, summed: 0, total }
    }

    /// Passes `item` to the counter.
    #[inline]
    pub(crate) fn count<T: ?Sized>(&mut self, item: &T)
    where
        F: OutputCounter<T>,
    {
        let tokens = self.counter.count(item);
        self.summed = self.summed.saturating_add(tokens);
        self.total = self.counter.total(self.summed);
    }

    /// The output tokens counted so far, `None` if they cannot be told.
    pub(crate) fn tokens(&self) -> Option<u32> {
        self.total
    }

    pub(crate) fn permit(&self) -> Option<&P> {
        self.permit.as_ref()
    }

    pub(crate) fn is_done(&self) -> bool {
        self.permit.is_none()
    }

    /// Completes the permit with the total, or drops it unreported when the total is unknown; later
    /// calls do nothing.
    pub(crate) fn finish(&mut self) {
        if let Some(permit) = self.permit.take() {
            match self.total {
                Some(tokens) => permit.complete(tokens),
                None => drop(permit),
            }
        }
    }

    /// Takes the permit out without completing it.
    pub(crate) fn take(&mut self) -> Option<P> {
        self.permit.take()
    }
}

impl<F, P: Complete> Drop for Completion<F, P> {
    fn drop(&mut self) {
        self.finish();
    }
}

impl<F, P: Complete + fmt::Debug> fmt::Debug for Completion<F, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completion").field("permit", &self.permit).field("tokens", &self.total).finish()
    }
}

/// A [`Stream`] that holds a [`Permit`] until it ends or is dropped, counting its items as output tokens.
///
/// - At the stream's end (`poll_next` returns `Ready(None)`) the permit is
///   [completed](Permit::complete) with the tokens counted, releasing the capacity at once even if the
///   `PermitStream` itself lives on.
/// - Dropped before its end (the client disconnected, the handler panicked), the inner stream is dropped
///   first, then the permit is completed with the tokens counted so far.
///
/// Either way the permit is completed exactly once. Each item counts as one token unless a counter is
/// set with [`count_with`](PermitStream::count_with) (for items holding several tokens, or for
/// `Result` items that should not count errors); a counter whose total is unknown has the permit
/// dropped without a report. Counts saturate at `u32::MAX`.
///
/// # Examples
///
/// ```
/// use futures::{stream, StreamExt};
/// use kvgate::stream::PermitStream;
/// use kvgate::{Admission, Request};
///
/// let admission = Admission::builder().max_in_flight(1).build().unwrap();
/// let permit = admission.try_admit(&Request::new(10, 100)).unwrap();
/// let tokens = stream::iter(["Hello", ",", " world"]);
/// let mut guarded = PermitStream::new(tokens, permit);
/// futures::executor::block_on(async {
///     while let Some(token) = guarded.next().await {
///         let _ = token; // send it to the client
///         assert_eq!(admission.snapshot().in_flight, 1);
///     }
/// });
/// assert_eq!(guarded.tokens_so_far(), Some(3));
/// assert_eq!(admission.snapshot().in_flight, 0); // completed with 3 tokens at the end
/// ```
#[pin_project]
#[must_use = "streams do nothing unless polled"]
pub struct PermitStream<S, F = OnePerItem, P: Complete = Permit> {
    // Field order matters: the stream is dropped before the permit is completed.
    #[pin]
    inner: S,
    completion: Completion<F, P>,
}

impl<S: Stream, P: Complete> PermitStream<S, OnePerItem, P> {
    /// Wraps `stream`, holding `permit` (a [`Permit`], or any [`Complete`] grant), counting one output
    /// token per item.
    pub fn new(stream: S, permit: P) -> Self {
        Self { inner: stream, completion: Completion::new::<S::Item>(permit, OnePerItem) }
    }
}

impl<S: Stream, F, P: Complete> PermitStream<S, F, P> {
    /// Counts output tokens with `counter` instead (an [`OutputCounter`], or a function of each item),
    /// for example the tokens in a chunk, or 0 for keep-alive and error items. Call it before the first
    /// item: the count starts again from zero.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures::{stream, StreamExt};
    /// use kvgate::stream::PermitStream;
    /// use kvgate::{Admission, Request};
    ///
    /// let admission = Admission::builder().build().unwrap();
    /// let permit = admission.try_admit(&Request::new(10, 100)).unwrap();
    /// let chunks = stream::iter(vec![vec![1, 2, 3], vec![4, 5]]); // token ids per chunk
    /// let mut s = PermitStream::new(chunks, permit).count_with(|chunk: &Vec<u32>| chunk.len() as u32);
    /// futures::executor::block_on(async { while s.next().await.is_some() {} });
    /// assert_eq!(s.tokens_so_far(), Some(5));
    /// ```
    pub fn count_with<G>(self, counter: G) -> PermitStream<S, G, P>
    where
        G: OutputCounter<S::Item>,
    {
        let PermitStream { inner, completion } = self;
        PermitStream { inner, completion: completion.recount::<S::Item, G>(counter) }
    }
}

impl<S, F, P: Complete> PermitStream<S, F, P> {
    /// Output tokens counted so far; `None` when the counter cannot tell.
    pub fn tokens_so_far(&self) -> Option<u32> {
        self.completion.tokens()
    }

    /// The permit, while the stream has not ended; `None` after it ended (the permit was completed).
    pub fn permit(&self) -> Option<&P> {
        self.completion.permit()
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped stream, mutably (`Unpin` streams; pinned ones through [`get_pin_mut`](Self::get_pin_mut)).
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The wrapped stream, pinned.
    pub fn get_pin_mut(self: Pin<&mut Self>) -> Pin<&mut S> {
        self.project().inner
    }

    /// Unwraps into the inner stream, the permit (`None` if the stream already ended) **not** completed,
    /// and the tokens counted so far. The caller takes over completing the permit.
    pub fn into_inner(self) -> (S, Option<P>, Option<u32>) {
        let PermitStream { inner, mut completion } = self;
        let counted = completion.tokens();
        (inner, completion.take(), counted)
    }
}

impl<S: Stream, F: OutputCounter<S::Item>, P: Complete> Stream for PermitStream<S, F, P> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let this = self.project();
        if this.completion.is_done() {
            return Poll::Ready(None);
        }
        match this.inner.poll_next(cx) {
            Poll::Ready(Some(item)) => {
                this.completion.count(&item);
                Poll::Ready(Some(item))
            }
            Poll::Ready(None) => {
                this.completion.finish();
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.completion.is_done() { (0, Some(0)) } else { self.inner.size_hint() }
    }
}

impl<S: Stream, F: OutputCounter<S::Item>, P: Complete> FusedStream for PermitStream<S, F, P> {
    fn is_terminated(&self) -> bool {
        self.completion.is_done()
    }
}

impl<S, F, P: Complete + fmt::Debug> fmt::Debug for PermitStream<S, F, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermitStream")
            .field("permit", &self.completion.permit())
            .field("tokens_so_far", &self.completion.tokens())
            .finish_non_exhaustive()
    }
}
