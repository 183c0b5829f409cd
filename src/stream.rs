//! [`PermitStream`]: a token stream that holds its request's [`Permit`] for exactly as long as it runs.
//!
//! A streamed completion occupies a sequence slot and its KV reservation until the last token is sent —
//! or until the client goes away and the server drops the stream. Wrapping the stream ties the permit to
//! it: the permit is completed with the number of output tokens actually produced (so the unused part of
//! the token-rate reservation is refunded) when the stream ends, or when it is dropped before its end.

use crate::Permit;
use futures::stream::{FusedStream, Stream};
use pin_project::pin_project;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Counts the output tokens an item (a stream item, a body's data frame) stands for.
///
/// Implemented by [`OnePerItem`] and by every `FnMut(&T) -> u32` closure or function.
pub trait TokenCounter<T: ?Sized> {
    /// Output tokens in `item`.
    fn count(&mut self, item: &T) -> u32;
}

/// Counts one output token per item: right for streams that yield one token (or one SSE event per
/// token) at a time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OnePerItem;

impl<T: ?Sized> TokenCounter<T> for OnePerItem {
    #[inline]
    fn count(&mut self, _item: &T) -> u32 {
        1
    }
}

impl<T: ?Sized, F: FnMut(&T) -> u32> TokenCounter<T> for F {
    #[inline]
    fn count(&mut self, item: &T) -> u32 {
        self(item)
    }
}

/// Holds a permit and the tokens counted so far; completes the permit exactly once — when told to, or
/// when dropped.
pub(crate) struct Completion {
    permit: Option<Permit>,
    counted: u32,
}

impl Completion {
    pub(crate) fn new(permit: Permit) -> Self {
        Self { permit: Some(permit), counted: 0 }
    }

    #[inline]
    pub(crate) fn add(&mut self, tokens: u32) {
        self.counted = self.counted.saturating_add(tokens);
    }

    pub(crate) fn counted(&self) -> u32 {
        self.counted
    }

    pub(crate) fn permit(&self) -> Option<&Permit> {
        self.permit.as_ref()
    }

    pub(crate) fn is_done(&self) -> bool {
        self.permit.is_none()
    }

    /// Completes the permit with the count so far; later calls do nothing.
    pub(crate) fn finish(&mut self) {
        if let Some(permit) = self.permit.take() {
            permit.complete(self.counted);
        }
    }

    /// Takes the permit out without completing it.
    pub(crate) fn take(&mut self) -> Option<Permit> {
        self.permit.take()
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        self.finish();
    }
}

impl fmt::Debug for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completion").field("permit", &self.permit).field("counted", &self.counted).finish()
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
/// `Result` items that should not count errors). Counts saturate at `u32::MAX`.
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
/// assert_eq!(guarded.tokens_so_far(), 3);
/// assert_eq!(admission.snapshot().in_flight, 0); // completed with 3 tokens at the end
/// ```
#[pin_project]
#[must_use = "streams do nothing unless polled"]
pub struct PermitStream<S, F = OnePerItem> {
    // Field order matters: the stream is dropped before the permit is completed.
    #[pin]
    inner: S,
    counter: F,
    completion: Completion,
}

impl<S: Stream> PermitStream<S> {
    /// Wraps `stream`, holding `permit`, counting one output token per item.
    pub fn new(stream: S, permit: Permit) -> Self {
        Self { inner: stream, counter: OnePerItem, completion: Completion::new(permit) }
    }
}

impl<S: Stream, F> PermitStream<S, F> {
    /// Counts output tokens with `counter` instead (a function of each item), for example the tokens in a
    /// chunk, or 0 for keep-alive and error items.
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
    /// assert_eq!(s.tokens_so_far(), 5);
    /// ```
    pub fn count_with<G>(self, counter: G) -> PermitStream<S, G>
    where
        G: TokenCounter<S::Item>,
    {
        let PermitStream { inner, counter: _, completion } = self;
        PermitStream { inner, counter, completion }
    }
}

impl<S, F> PermitStream<S, F> {
    /// Output tokens counted so far.
    pub fn tokens_so_far(&self) -> u32 {
        self.completion.counted()
    }

    /// The permit, while the stream has not ended; `None` after it ended (the permit was completed).
    pub fn permit(&self) -> Option<&Permit> {
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
    pub fn into_inner(self) -> (S, Option<Permit>, u32) {
        let PermitStream { inner, counter: _, mut completion } = self;
        let counted = completion.counted();
        (inner, completion.take(), counted)
    }
}

impl<S: Stream, F: TokenCounter<S::Item>> Stream for PermitStream<S, F> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let this = self.project();
        if this.completion.is_done() {
            return Poll::Ready(None);
        }
        match this.inner.poll_next(cx) {
            Poll::Ready(Some(item)) => {
                let tokens = this.counter.count(&item);
                this.completion.add(tokens);
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

impl<S: Stream, F: TokenCounter<S::Item>> FusedStream for PermitStream<S, F> {
    fn is_terminated(&self) -> bool {
        self.completion.is_done()
    }
}

impl<S, F> fmt::Debug for PermitStream<S, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermitStream")
            .field("permit", &self.completion.permit())
            .field("tokens_so_far", &self.completion.counted())
            .finish_non_exhaustive()
    }
}
