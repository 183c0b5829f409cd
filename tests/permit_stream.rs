//! `PermitStream`: the permit lives exactly as long as the stream, and is completed once with the tokens
//! counted — at the end, or on drop mid-stream.
#![cfg(not(loom))]

use futures::FutureExt;
use futures::executor::block_on;
use futures::stream::{self, FusedStream, Stream, StreamExt};
use kvgate::clock::ManualClock;
use kvgate::stream::PermitStream;
use kvgate::{Admission, Rejection, Request};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// A token rate whose clock never moves, so refunds are the only way tokens come back. Burst 100; a
/// `Request::new(10, 90)` takes all of it.
fn token_limited() -> Admission<ManualClock> {
    Admission::builder().max_in_flight(4).token_rate(1.0, 100).clock(ManualClock::new()).build().unwrap()
}

/// Asserts exactly `tokens` are available in the token bucket (and takes them).
fn assert_available(a: &Admission<ManualClock>, tokens: u32) {
    assert!(
        matches!(a.try_admit(&Request::new(0, tokens + 1)), Err(Rejection::RateLimited { .. })),
        "more than {tokens} tokens available"
    );
    // Dropped without `complete`: the slot comes back, the tokens stay spent.
    drop(a.try_admit(&Request::new(0, tokens)).expect("fewer tokens available than expected"));
}

#[test]
fn held_while_streaming_and_completed_at_the_end() {
    let a = token_limited();
    let permit = a.try_admit(&Request::new(10, 90)).unwrap();
    let mut s = PermitStream::new(stream::iter(0..5), permit);
    assert_eq!(s.size_hint(), (5, Some(5)));
    block_on(async {
        for expected in 0..5 {
            assert_eq!(s.next().await, Some(expected));
            assert_eq!(a.snapshot().in_flight, 1);
            assert!(s.permit().is_some());
        }
        assert_eq!(s.next().await, None);
    });
    // Released at the end, while `s` still exists.
    assert_eq!(a.snapshot().in_flight, 0);
    assert_eq!(a.snapshot().kv_used, 0);
    assert!(s.permit().is_none() && s.is_terminated());
    assert_eq!(s.tokens_so_far(), Some(5));
    assert_eq!(s.size_hint(), (0, Some(0)));
    assert_eq!(block_on(s.next()), None, "fused");
    drop(s);
    // complete(5): 85 of the 90 reserved output tokens came back, exactly once.
    assert_available(&a, 85);
}

#[test]
fn dropped_mid_stream_completes_with_what_was_counted() {
    let a = token_limited();
    let permit = a.try_admit(&Request::new(10, 90)).unwrap();
    let mut s = PermitStream::new(stream::iter(0..50), permit);
    block_on(async {
        s.next().await;
        s.next().await;
    });
    assert_eq!(a.snapshot().in_flight, 1);
    drop(s); // the client disconnected
    assert_eq!(a.snapshot().in_flight, 0);
    assert_available(&a, 88);
}

#[test]
fn dropped_while_pending_releases() {
    let a = Admission::builder().max_in_flight(1).build().unwrap();
    let (tx, rx) = futures::channel::mpsc::unbounded::<&str>();
    let mut s = PermitStream::new(rx, a.try_admit(&Request::new(1, 10)).unwrap());
    tx.unbounded_send("tok").unwrap();
    assert_eq!(s.next().now_or_never(), Some(Some("tok")));
    assert_eq!(s.next().now_or_never(), None, "pending");
    assert_eq!(a.snapshot().in_flight, 1);
    drop(s);
    assert_eq!(a.snapshot().in_flight, 0);
    drop(tx);
}

#[test]
fn counting_function_is_used() {
    let a = token_limited();
    let permit = a.try_admit(&Request::new(10, 90)).unwrap();
    let chunks = stream::iter(vec!["one two", "three", "", "four five six"]);
    let mut s = PermitStream::new(chunks, permit).count_with(|chunk: &&str| chunk.split_whitespace().count() as u32);
    block_on(async { while s.next().await.is_some() {} });
    assert_eq!(s.tokens_so_far(), Some(6));
    assert_available(&a, 84);
}

#[test]
fn a_panicking_stream_still_releases() {
    let a = Admission::builder().max_in_flight(1).build().unwrap();
    let panicking = stream::iter(0..3).map(|i| if i == 1 { panic!("generation failed") } else { i });
    let mut s = PermitStream::new(panicking, a.try_admit(&Request::new(1, 10)).unwrap());
    let outcome = catch_unwind(AssertUnwindSafe(|| block_on(async { while s.next().await.is_some() {} })));
    assert!(outcome.is_err());
    assert_eq!(a.snapshot().in_flight, 1, "still owned by the stream");
    drop(s);
    assert_eq!(a.snapshot().in_flight, 0);
}

#[test]
fn into_inner_hands_the_permit_over() {
    let a = Admission::builder().max_in_flight(1).build().unwrap();
    let mut s = PermitStream::new(stream::iter(0..3), a.try_admit(&Request::new(1, 10)).unwrap());
    block_on(s.next());
    let (rest, permit, counted) = s.into_inner();
    assert_eq!(counted, Some(1));
    assert_eq!(a.snapshot().in_flight, 1);
    assert_eq!(block_on(rest.collect::<Vec<_>>()), [1, 2]);
    permit.unwrap().complete(3);
    assert_eq!(a.snapshot().in_flight, 0);
}

#[test]
fn debug_shows_the_count() {
    let a = Admission::builder().build().unwrap();
    let s = PermitStream::new(stream::iter(0..1), a.try_admit(&Request::new(1, 1)).unwrap());
    assert!(format!("{s:?}").contains("tokens_so_far: Some(0)"));
}

#[test]
fn a_counter_that_cannot_count_reports_nothing() {
    // `Uncounted`: the permit is dropped, not completed, so the token-rate reservation stays spent and the
    // learned reservation learns nothing.
    let a = token_limited();
    let permit = a.try_admit(&Request::new(10, 90)).unwrap();
    let mut s = PermitStream::new(stream::iter(0..3), permit).count_with(kvgate::stream::Uncounted);
    block_on(async { while s.next().await.is_some() {} });
    assert_eq!(s.tokens_so_far(), None);
    assert_eq!(a.snapshot().in_flight, 0);
    assert!(a.try_admit(&Request::new(0, 1)).is_err(), "nothing refunded");
}
