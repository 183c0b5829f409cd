//! `AdmissionLayer` on tokio with `tower::service_fn` inner services: admission in the call's future,
//! permits held by response bodies, rejections as HTTP responses.
#![cfg(all(feature = "tower", not(loom)))]

use bytes::Bytes;
use futures::FutureExt;
use http::{HeaderValue, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use kvgate::clock::ManualClock;
use kvgate::tower::{AdmissionBody, AdmissionLayer, Refusal};
use kvgate::{Admission, Request};
use std::convert::Infallible;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tower::{Layer, Service, ServiceExt, service_fn};

type HttpRequest = http::Request<String>;

/// Reads the request size from `x-prompt-tokens` / `x-max-tokens`; refuses a request without them.
fn to_request(req: &HttpRequest) -> Result<Request, Refusal> {
    let header = |name| req.headers().get(name).and_then(|v: &HeaderValue| v.to_str().ok()?.parse::<u32>().ok());
    match (header("x-prompt-tokens"), header("x-max-tokens")) {
        (Some(prompt), Some(max)) => Ok(Request::new(prompt, max)),
        _ => Err(kvgate::http::error_response(
            StatusCode::BAD_REQUEST,
            "x-prompt-tokens and x-max-tokens are required",
            "invalid_request_error",
            "missing_size",
        )
        .into()),
    }
}

fn request(prompt: u32, max: u32) -> HttpRequest {
    http::Request::builder().header("x-prompt-tokens", prompt).header("x-max-tokens", max).body(String::new()).unwrap()
}

/// An inner service answering "hello", counting its calls and checking it sees the admitted request.
fn hello(
    calls: Arc<AtomicUsize>,
) -> impl Service<HttpRequest, Response = http::Response<Full<Bytes>>, Error = Infallible, Future: Send> + Clone {
    service_fn(move |req: HttpRequest| {
        calls.fetch_add(1, Ordering::SeqCst);
        let admitted = req.extensions().get::<Request>().copied();
        async move {
            assert!(admitted.is_some(), "the admitted kvgate::Request is in the extensions");
            Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"hello"))))
        }
    })
}

async fn body_text<B>(body: B) -> String
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    String::from_utf8(body.collect().await.unwrap().to_bytes().to_vec()).unwrap()
}

fn header(res: &http::Response<impl Sized>, name: &str) -> Option<String> {
    res.headers().get(name).map(|v| v.to_str().unwrap().to_owned())
}

#[tokio::test]
async fn admitted_request_holds_the_permit_until_the_body_is_done() {
    let a = Admission::builder().max_in_flight(2).build().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = AdmissionLayer::new(a.clone(), to_request).layer(hello(calls.clone()));
    let res = svc.clone().oneshot(request(10, 20)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(a.snapshot().in_flight, 1, "the body holds the permit");
    let mut body = res.into_body();
    assert!(!body.is_refusal() && body.permit_body().unwrap().permit().is_some());
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "hello");
    assert_eq!(a.snapshot().in_flight, 1);
    assert!(body.frame().await.is_none());
    assert_eq!(a.snapshot().in_flight, 0, "released at the end of the body");
    assert_eq!(body.permit_body().unwrap().tokens_so_far(), None, "bytes are not tokens: no count by default");

    // Dropped unread (the client went away): released too.
    let res = svc.oneshot(request(10, 20)).await.unwrap();
    assert_eq!(a.snapshot().in_flight, 1);
    drop(res);
    assert_eq!(a.snapshot().in_flight, 0);
}

#[tokio::test]
async fn at_capacity_without_a_queue_is_a_503_with_retry_hints() {
    let a = Admission::builder().max_in_flight(1).queue_capacity(0).build().unwrap();
    let _held = a.try_admit(&Request::new(1, 1)).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = AdmissionLayer::new(a.clone(), to_request).layer(hello(calls.clone()));
    let res = svc.oneshot(request(10, 20)).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let secs: u64 = header(&res, "retry-after").unwrap().parse().unwrap();
    let millis: u64 = header(&res, "retry-after-ms").unwrap().parse().unwrap();
    assert!(secs >= 1 && millis >= 1 && secs * 1000 >= millis);
    assert_eq!(kvgate::http::retry_after(res.headers()), Some(Duration::from_millis(millis)));
    assert_eq!(header(&res, "content-type").as_deref(), Some("application/json"));
    let body = body_text(res.into_body()).await;
    assert!(body.starts_with(r#"{"error":{"message":"no capacity"#), "{body}");
    assert!(body.contains(r#""type":"service_unavailable_error""#), "{body}");
    assert!(body.ends_with(r#""param":null,"code":"no_capacity"}}"#), "{body}");
    assert_eq!(a.snapshot().rejected.no_capacity, 1);
}

#[tokio::test]
async fn over_the_rate_is_a_429() {
    let a = Admission::builder().request_rate(1.0, 1).clock(ManualClock::new()).build().unwrap();
    let svc = AdmissionLayer::new(a.clone(), to_request).layer(hello(Arc::default()));
    let first = svc.clone().oneshot(request(1, 1)).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let res = svc.oneshot(request(1, 1)).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "retry-after").as_deref(), Some("1"));
    let body = body_text(res.into_body()).await;
    assert!(body.contains(r#""type":"rate_limit_error""#) && body.contains(r#""code":"rate_limited""#), "{body}");
}

#[tokio::test]
async fn too_large_is_a_413_without_retry_after() {
    let a = Admission::builder().kv_capacity_tokens(100).build().unwrap();
    let svc = AdmissionLayer::new(a.clone(), to_request).all_rejections_as_429(true).layer(hello(Arc::default()));
    let res = svc.oneshot(request(100, 100)).await.unwrap();
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE, "never fits: stays 413 even as-429");
    assert!(header(&res, "retry-after").is_none() && header(&res, "retry-after-ms").is_none());
    let body = body_text(res.into_body()).await;
    assert!(body.contains(r#""code":"too_large""#) && body.contains("invalid_request_error"), "{body}");
}

#[tokio::test]
async fn mapper_refusal_passes_through_untouched() {
    let a = Admission::builder().max_in_flight(1).build().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = AdmissionLayer::new(a.clone(), to_request).layer(hello(calls.clone()));
    let res = svc.oneshot(http::Request::new(String::from("{}"))).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert!(res.body().is_refusal());
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let body = body_text(res.into_body()).await;
    assert!(body.contains(r#""code":"missing_size""#), "{body}");
    let s = a.snapshot();
    assert_eq!((s.in_flight, s.admitted, s.rejected.total()), (0, 0, 0), "admission never consulted");
}

#[tokio::test]
async fn poll_ready_reserves_nothing() {
    let a = Admission::builder().max_in_flight(1).build().unwrap();
    let svc = AdmissionLayer::new(a.clone(), to_request).layer(hello(Arc::default()));
    // 100 "keep-alive connections", each driven to readiness and left idle.
    let mut idle = Vec::new();
    for _ in 0..100 {
        let mut conn = svc.clone();
        for _ in 0..3 {
            ServiceExt::<HttpRequest>::ready(&mut conn).await.unwrap();
        }
        idle.push(conn);
    }
    assert_eq!(a.snapshot().in_flight, 0);
    assert_eq!(a.snapshot().admitted, 0);
    // The only slot goes to the connection that actually sends a request.
    let res = idle[57].call(request(1, 1)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(a.snapshot().in_flight, 1);
}

#[tokio::test]
async fn all_rejections_as_429() {
    let a = Admission::builder().max_in_flight(1).queue_capacity(0).build().unwrap();
    let _held = a.try_admit(&Request::new(1, 1)).unwrap();
    let svc = AdmissionLayer::new(a.clone(), to_request).all_rejections_as_429(true).layer(hello(Arc::default()));
    let res = svc.oneshot(request(1, 1)).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(header(&res, "retry-after").is_some());
    let body = body_text(res.into_body()).await;
    assert!(body.contains(r#""code":"no_capacity""#), "the reason is kept: {body}");
}

#[tokio::test]
async fn queued_requests_wait_and_dropping_the_future_leaves_the_queue() {
    let a = Admission::builder().max_in_flight(1).queue_capacity(4).build().unwrap();
    let held = a.try_admit(&Request::new(1, 1)).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut svc = AdmissionLayer::new(a.clone(), to_request).layer(hello(calls.clone()));

    let mut abandoned = Box::pin(svc.ready().await.unwrap().call(request(1, 1)));
    assert!((&mut abandoned).now_or_never().is_none());
    let mut waiting = Box::pin(svc.ready().await.unwrap().call(request(1, 1)));
    assert!((&mut waiting).now_or_never().is_none());
    assert_eq!(a.snapshot().queued, 2);
    assert!(format!("{waiting:?}").contains("waiting"));
    drop(abandoned); // the client hung up while queued
    assert_eq!(a.snapshot().queued, 1);

    let waiting = tokio::spawn(waiting);
    tokio::task::yield_now().await;
    drop(held);
    let res = tokio::time::timeout(Duration::from_secs(10), waiting).await.unwrap().unwrap().unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "only the request that stayed was served");
    let s = a.snapshot();
    assert_eq!((s.queued, s.in_flight), (0, 1));
    drop(res);
    assert_eq!(a.snapshot().in_flight, 0);

    // Dropped for good while queued: nothing left behind.
    let held = a.try_admit(&Request::new(1, 1)).unwrap();
    let mut gone = Box::pin(svc.ready().await.unwrap().call(request(1, 1)));
    assert!((&mut gone).now_or_never().is_none());
    drop(gone);
    drop(held);
    let s = a.snapshot();
    assert_eq!((s.queued, s.in_flight), (0, 0));
}

#[tokio::test]
async fn wait_false_never_queues() {
    let a = Admission::builder().max_in_flight(1).queue_capacity(4).build().unwrap();
    let _held = a.try_admit(&Request::new(1, 1)).unwrap();
    let svc = AdmissionLayer::new(a.clone(), to_request).wait(false).layer(hello(Arc::default()));
    let res = svc.oneshot(request(1, 1)).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.snapshot().queued, 0);
}

#[tokio::test]
async fn inner_errors_and_panics_release_the_permit() {
    let a = Admission::builder().max_in_flight(1).build().unwrap();
    let failing = service_fn(|_req: HttpRequest| async { Err::<http::Response<Full<Bytes>>, _>("backend down") });
    let svc = AdmissionLayer::new(a.clone(), to_request).layer(failing);
    assert_eq!(svc.oneshot(request(1, 1)).await.unwrap_err(), "backend down");
    assert_eq!(a.snapshot().in_flight, 0);

    let panicking = service_fn(|_req: HttpRequest| async {
        if true {
            panic!("handler bug");
        }
        Ok::<http::Response<Full<Bytes>>, Infallible>(http::Response::new(Full::default()))
    });
    let svc = AdmissionLayer::new(a.clone(), to_request).layer(panicking);
    let outcome = AssertUnwindSafe(svc.oneshot(request(1, 1))).catch_unwind().await;
    assert!(outcome.is_err());
    assert_eq!(a.snapshot().in_flight, 0);
    assert!(a.try_admit(&Request::new(1, 1)).is_ok());
}

#[tokio::test]
async fn streamed_body_counts_sse_events_and_refunds_unused_tokens() {
    // Token rate on a clock that never moves: only refunds bring tokens back.
    let a = Admission::builder().token_rate(1.0, 100).clock(ManualClock::new()).build().unwrap();
    let (tx, rx) = futures::channel::mpsc::unbounded::<Result<http_body::Frame<Bytes>, Infallible>>();
    let rx = Arc::new(std::sync::Mutex::new(Some(rx)));
    let streaming = service_fn(move |_req: HttpRequest| {
        let rx = rx.lock().unwrap().take().unwrap();
        async move { Ok::<_, Infallible>(http::Response::new(StreamBody::new(rx))) }
    });
    let sse_events =
        |chunk: &Bytes| chunk.split(|b| *b == b'\n').filter(|line| line.starts_with(b"data:")).count() as u32;
    let svc = AdmissionLayer::new(a.clone(), to_request).count_with(sse_events).layer(streaming);
    let res = svc.oneshot(request(10, 90)).await.unwrap();
    let mut body: AdmissionBody<_, _> = res.into_body();
    tx.unbounded_send(Ok(http_body::Frame::data(Bytes::from("data: a\n\ndata: b\n\n")))).unwrap();
    tx.unbounded_send(Ok(http_body::Frame::data(Bytes::from("data: c\n\n")))).unwrap();
    body.frame().await.unwrap().unwrap();
    body.frame().await.unwrap().unwrap();
    assert_eq!(body.permit_body().unwrap().tokens_so_far(), Some(3));
    assert!((&mut body.frame()).now_or_never().is_none(), "the generation is still running");
    drop(body); // client disconnect mid-stream: complete(3)
    drop(tx);
    // 87 of the 90 reserved output tokens came back.
    assert!(a.try_admit(&Request::new(0, 88)).is_err());
    assert!(a.try_admit(&Request::new(0, 87)).is_ok());
}

/// A learned reservation behind the layer with the default counter: 40 non-streamed answers (one
/// frame each, hundreds of tokens) must not teach it that outputs are 1 token long.
#[tokio::test]
async fn one_frame_answers_do_not_collapse_the_learned_reservation() {
    let a = Admission::builder().reservation(kvgate::Reservation::learned()).build().unwrap();
    let svc = AdmissionLayer::new(a.clone(), to_request).layer(hello(Arc::default()));
    for _ in 0..40 {
        let res = svc.clone().oneshot(request(10, 1000)).await.unwrap();
        body_text(res.into_body()).await; // one frame: "hello"
    }
    assert_eq!(a.output_estimate(), 1.0, "nothing was reported, nothing was learned");
}

/// The layer answers a wait that timed out with a `Retry-After`, like every retryable rejection.
#[tokio::test]
async fn a_timed_out_wait_carries_retry_after() {
    let a = Admission::builder()
        .max_in_flight(1)
        .queue_capacity(4)
        .max_queue_wait(Duration::from_millis(20))
        .build()
        .unwrap();
    let _held = a.try_admit(&Request::new(1, 1)).unwrap();
    let svc = AdmissionLayer::new(a.clone(), to_request).layer(hello(Arc::default()));
    let res = tokio::time::timeout(Duration::from_secs(10), svc.oneshot(request(1, 1))).await.unwrap().unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body = body_text(res.into_body()).await;
    assert!(body.contains(r#""code":"timed_out""#), "{body}");
    let a2 = a.clone();
    let res = {
        let svc = AdmissionLayer::new(a2, to_request).layer(hello(Arc::default()));
        tokio::time::timeout(Duration::from_secs(10), svc.oneshot(request(1, 1))).await.unwrap().unwrap()
    };
    let secs: u64 = header(&res, "retry-after").expect("TimedOut without Retry-After").parse().unwrap();
    assert!(secs >= 1);
    assert!(header(&res, "retry-after-ms").is_some());
}

/// Answers carry OpenAI's rate-limit headers, from the tenant's buckets when it has tighter ones.
#[tokio::test]
async fn answers_carry_rate_limit_headers() {
    let a = Admission::builder()
        .request_rate(100.0, 50)
        .token_rate(1_000.0, 10_000)
        .tenant_defaults(kvgate::TenantLimits::new().request_rate(1.0, 5))
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let svc = AdmissionLayer::new(a.clone(), to_request).layer(hello(Arc::default()));
    let res = svc.clone().oneshot(request(100, 100)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "x-ratelimit-limit-requests").as_deref(), Some("50"));
    assert_eq!(header(&res, "x-ratelimit-remaining-requests").as_deref(), Some("49"));
    assert_eq!(header(&res, "x-ratelimit-limit-tokens").as_deref(), Some("10000"));
    assert_eq!(header(&res, "x-ratelimit-remaining-tokens").as_deref(), Some("9800"));
    assert!(header(&res, "x-ratelimit-reset-tokens").is_some());
    drop(res);

    let tenant = |req: &HttpRequest| to_request(req).map(|r| r.tenant("alice"));
    let svc = AdmissionLayer::new(a.clone(), tenant).layer(hello(Arc::default()));
    let res = svc.clone().oneshot(request(1, 1)).await.unwrap();
    assert_eq!(header(&res, "x-ratelimit-limit-requests").as_deref(), Some("5"), "the tenant's bucket is tighter");
    assert_eq!(header(&res, "x-ratelimit-remaining-requests").as_deref(), Some("4"));
    // Rejections carry them too.
    for _ in 0..4 {
        drop(svc.clone().oneshot(request(1, 1)).await.unwrap());
    }
    let refused = svc.oneshot(request(1, 1)).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&refused, "x-ratelimit-remaining-requests").as_deref(), Some("0"));
    assert_eq!(header(&refused, "x-ratelimit-reset-requests").as_deref(), Some("5s"));

    // And none when switched off or when no rate is configured.
    let plain = Admission::builder().build().unwrap();
    let res = AdmissionLayer::new(plain, to_request).layer(hello(Arc::default())).oneshot(request(1, 1)).await.unwrap();
    assert!(header(&res, "x-ratelimit-limit-requests").is_none());
    let res = AdmissionLayer::new(a.clone(), to_request)
        .rate_limit_headers(false)
        .layer(hello(Arc::default()))
        .oneshot(request(1, 1))
        .await
        .unwrap();
    assert!(header(&res, "x-ratelimit-limit-requests").is_none());
}

/// `new_async`: the mapping owns the request, reads its body, and passes a new body on; a refusal
/// from it reserves nothing.
#[tokio::test]
async fn an_async_mapping_reads_the_body() {
    use kvgate::openai::{Endpoint, OutputTokens, Parser};
    let a = Admission::builder().kv_capacity_tokens(10_000).build().unwrap();
    let parser = Parser::new().default_max_tokens(64);
    let read = move |req: http::Request<Full<Bytes>>| {
        let parser = parser.clone();
        async move {
            let (parts, body) = req.into_parts();
            let bytes = body.collect().await.unwrap().to_bytes();
            let chat = parser.parse(Endpoint::Chat, bytes).map_err(|e| e.to_response())?;
            Ok::<_, http::Response<Bytes>>((chat.request(), http::Request::from_parts(parts, chat.into_forward_body())))
        }
    };
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let engine = service_fn(move |req: http::Request<Bytes>| {
        seen2.lock().unwrap().push(req.body().clone());
        async {
            let answer = r#"{"choices":[{"message":{"content":"hi"}}],"usage":{"completion_tokens":7}}"#;
            Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(answer))))
        }
    });
    let svc = AdmissionLayer::new_async(a.clone(), read).count_with(OutputTokens::new()).layer(engine);
    let chat = r#"{"messages":[{"role":"user","content":"Hello there!"}]}"#;
    let res = svc.clone().oneshot(http::Request::new(Full::new(Bytes::from(chat)))).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(a.snapshot().kv_used, 11 + 64);
    let mut body = res.into_body();
    while body.frame().await.is_some() {}
    assert_eq!(body.permit_body().unwrap().tokens_so_far(), Some(7));
    let forwarded: serde_json::Value = serde_json::from_slice(&seen.lock().unwrap()[0]).unwrap();
    assert_eq!(forwarded["max_tokens"], 64, "the default reservation is written into the forwarded body");

    let res = svc.oneshot(http::Request::new(Full::new(Bytes::from("{not json")))).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let s = a.snapshot();
    assert_eq!((s.in_flight, s.admitted), (0, 1));
}
