//! A [`tower`](https://docs.rs/tower) middleware that admits HTTP requests: [`AdmissionLayer`].
//!
//! Requires the `tower` feature (`tower-layer`, `tower-service`, and the `http-body` feature).
//!
//! For every request the layer asks a user function for the [`Request`] to admit (prompt tokens,
//! `max_tokens`, priority — or a 400/413 of its own for malformed input), waits for or refuses admission,
//! and then either calls the inner service, wrapping its response body in a [`PermitBody`] that holds the
//! permit until the body is finished or dropped, or answers the [`Rejection`] itself (see
//! [`rejection_response`](crate::http::rejection_response)).
//!
//! The inner service finds the admitted [`Request`] in the HTTP request's extensions
//! (`req.extensions().get::<kvgate::Request>()`).
//!
//! # Reserving in the call, not in `poll_ready`
//!
//! [`Service::poll_ready`] only asks the inner service. Capacity is reserved in the future returned by
//! [`Service::call`], when the request is known. Reserving in `poll_ready` — as tower's
//! `ConcurrencyLimit` does with its semaphore permit — would hold capacity for a connection before it
//! has a request: hyper drives `poll_ready` for every keep-alive connection, so idle connections would
//! sit on KV budget and in-flight slots that real requests wait for, and the cost of a request (its
//! tokens) is unknown there anyway.
//!
//! Put this layer *outside* layers that hold resources from `poll_ready` on (a `ConcurrencyLimit`, a
//! `Buffer` slot): the inner service is driven to readiness before the request waits for admission, and
//! keeps that readiness while it waits.
//!
//! # Reading the prompt size
//!
//! [`AdmissionLayer::new`] takes a function that sees the request's head, extensions and body by
//! reference — enough when the size is in a header or the extensions. When it is in the body (a
//! chat/completions JSON), [`AdmissionLayer::new_async`] takes an `async` function that owns the request:
//! it reads the body (with a size limit and a deadline of its choosing), returns the [`Request`] to
//! admit, and hands the inner service an HTTP request with whatever body it should forward — no
//! buffering middleware needed. Either way, the function's refusals (a 400, a 413) are answered
//! without touching capacity.
//!
//! # Answers
//!
//! Rejections become [`rejection_response`](crate::http::rejection_response)s: every retryable one carries `Retry-After` and
//! `retry-after-ms` (a [`TimedOut`](crate::Rejection::TimedOut) wait the admission's current
//! [capacity estimate](Admission::capacity_retry_after)). Every answer — admitted or not — carries
//! OpenAI's `x-ratelimit-*` headers for the rates the request meets (its tenant's or the global ones),
//! unless [`rate_limit_headers(false)`](AdmissionLayer::rate_limit_headers).
//!
//! # Other admissions
//!
//! The layer drives any [`AdmissionControl`]: an [`Admission`] (the default), or an admission built on
//! kvgate elsewhere — limits shared by several replicas through a store, a gateway that picks one of
//! several inference servers per request. Its permits only need to be [`Complete`].

#![cfg_attr(docsrs, doc(cfg(feature = "tower")))]

use crate::clock::Clock;
use crate::http::{PermitBody, insert_rate_limit_headers, rejection_response_with_hint};
use crate::stream::{Complete, OutputCounter, Uncounted};
use crate::{Admission, Admit, Permit, RateLimitStatus, Rejection, Request, TenantId};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project::pin_project;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tower_layer::Layer;
use tower_service::Service;

/// What [`AdmissionLayer`] admits through: an [`Admission`], or another admission with the same contract
/// (all or nothing, a [`Rejection`] with honest hints, a permit that gives everything back once).
///
/// Both admitting methods return futures, so that an admission that asks a remote store (limits
/// shared by replicas) or waits in a queue of its own fits; the in-process [`Admission`] answers
/// [`try_admit`](AdmissionControl::try_admit) at once (a ready future).
///
/// # Examples
///
/// An admission that refuses requests over a prompt size before asking an [`Admission`], driven by the
/// layer like the admission itself:
///
/// ```
/// use kvgate::tower::{AdmissionControl, AdmissionLayer};
/// use kvgate::{Admission, Permit, RateLimitStatus, Rejection, Request, TenantId};
/// use std::future::{Ready, ready};
/// use std::time::Duration;
///
/// #[derive(Clone)]
/// struct ShortPrompts(Admission);
///
/// impl AdmissionControl for ShortPrompts {
///     type Permit = Permit;
///     type TryAdmit = Ready<Result<Permit, Rejection>>;
///     type Admit = Ready<Result<Permit, Rejection>>;
///
///     fn try_admit(&self, request: &Request) -> Self::TryAdmit {
///         if request.prompt_tokens > 4_096 {
///             return ready(Err(Rejection::Invalid { reason: "prompts over 4096 tokens are not served here" }));
///         }
///         ready(self.0.try_admit(request))
///     }
///     fn admit(&self, request: &Request) -> Self::Admit {
///         self.try_admit(request)
///     }
///     fn capacity_retry_after(&self) -> Duration {
///         self.0.capacity_retry_after()
///     }
///     fn rate_status(&self, tenant: Option<TenantId>) -> RateLimitStatus {
///         self.0.rate_status(tenant)
///     }
/// }
///
/// let admission = ShortPrompts(Admission::builder().max_in_flight(4).build().unwrap());
/// let layer = AdmissionLayer::new(admission, |_req: &http::Request<()>| Ok::<_, kvgate::tower::Refusal>(Request::new(10_000, 10)));
/// # let _ = layer;
/// ```
pub trait AdmissionControl {
    /// What a granted request holds until its answer ends.
    type Permit: Complete;
    /// The future of [`try_admit`](AdmissionControl::try_admit).
    type TryAdmit: Future<Output = Result<Self::Permit, Rejection>>;
    /// The future of [`admit`](AdmissionControl::admit).
    type Admit: Future<Output = Result<Self::Permit, Rejection>>;

    /// Admits `request` now or refuses it, without waiting for capacity (the layer's
    /// [`wait(false)`](AdmissionLayer::wait)). A refused request holds nothing.
    fn try_admit(&self, request: &Request) -> Self::TryAdmit;

    /// Admits `request`, waiting for capacity as the admission is configured. Dropping the future gives
    /// back whatever it holds.
    fn admit(&self, request: &Request) -> Self::Admit;

    /// The current estimate of how long a request that waited now would wait for capacity: the
    /// `Retry-After` of a [`Rejection::TimedOut`] answer (see [`Admission::capacity_retry_after`]).
    fn capacity_retry_after(&self) -> Duration;

    /// The rates a request of `tenant` meets now, for the `x-ratelimit-*` headers (see
    /// [`Admission::rate_status`]).
    fn rate_status(&self, tenant: Option<TenantId>) -> RateLimitStatus;

    /// Called once a request is granted, before the inner service gets it: puts what the inner service
    /// must know about the grant (the server it was granted on, say) into the request's extensions. The
    /// default does nothing.
    fn on_grant(&self, permit: &Self::Permit, extensions: &mut ::http::Extensions) {
        let _ = (permit, extensions);
    }
}

impl<C: Clock> AdmissionControl for Admission<C> {
    type Permit = Permit;
    type TryAdmit = std::future::Ready<Result<Permit, Rejection>>;
    type Admit = Admit;

    #[inline]
    fn try_admit(&self, request: &Request) -> Self::TryAdmit {
        std::future::ready(Admission::try_admit(self, request))
    }

    fn admit(&self, request: &Request) -> Self::Admit {
        Admission::admit(self, request)
    }

    fn capacity_retry_after(&self) -> Duration {
        Admission::capacity_retry_after(self)
    }

    fn rate_status(&self, tenant: Option<TenantId>) -> RateLimitStatus {
        Admission::rate_status(self, tenant)
    }
}

/// Turns an HTTP request into the [`Request`] to admit and the HTTP request the inner service gets —
/// or into a refusal. Made by [`AdmissionLayer::new`] (a function of the request by reference) and
/// [`AdmissionLayer::new_async`] (an `async` function that owns it and may read its body).
pub trait MapRequest<ReqBody> {
    /// The body of the HTTP request passed on to the inner service.
    type Body;
    /// The mapping's future.
    type Future: Future<Output = Result<(Request, ::http::Request<Self::Body>), Refusal>>;

    /// Maps one request.
    fn map_request(&self, request: ::http::Request<ReqBody>) -> Self::Future;
}

/// [`MapRequest`] from a function of the request by reference (see [`AdmissionLayer::new`]).
#[derive(Clone, Copy)]
pub struct MapRef<F>(F);

/// [`MapRequest`] from an `async` function that owns the request (see [`AdmissionLayer::new_async`]).
#[derive(Clone, Copy)]
pub struct MapAsync<F>(F);

impl<F> fmt::Debug for MapRef<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MapRef")
    }
}

impl<F> fmt::Debug for MapAsync<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MapAsync")
    }
}

impl<F, E, ReqBody> MapRequest<ReqBody> for MapRef<F>
where
    F: Fn(&::http::Request<ReqBody>) -> Result<Request, E>,
    E: Into<Refusal>,
{
    type Body = ReqBody;
    type Future = std::future::Ready<Result<(Request, ::http::Request<ReqBody>), Refusal>>;

    fn map_request(&self, request: ::http::Request<ReqBody>) -> Self::Future {
        std::future::ready(match (self.0)(&request) {
            Ok(admit) => Ok((admit, request)),
            Err(refusal) => Err(refusal.into()),
        })
    }
}

impl<F, Fut, E, ReqBody, Body2> MapRequest<ReqBody> for MapAsync<F>
where
    F: Fn(::http::Request<ReqBody>) -> Fut,
    Fut: Future<Output = Result<(Request, ::http::Request<Body2>), E>>,
    E: Into<Refusal>,
{
    type Body = Body2;
    type Future = IntoRefusal<Fut>;

    fn map_request(&self, request: ::http::Request<ReqBody>) -> Self::Future {
        IntoRefusal { future: (self.0)(request) }
    }
}

/// The future of a [`MapAsync`]: the function's future with its error turned into a [`Refusal`].
#[pin_project]
#[must_use = "futures do nothing unless polled"]
pub struct IntoRefusal<Fut> {
    #[pin]
    future: Fut,
}

impl<Fut> fmt::Debug for IntoRefusal<Fut> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("IntoRefusal")
    }
}

impl<Fut, T, E: Into<Refusal>> Future for IntoRefusal<Fut>
where
    Fut: Future<Output = Result<T, E>>,
{
    type Output = Result<T, Refusal>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().future.poll(cx).map(|result| result.map_err(Into::into))
    }
}

/// Settings shared by the layer and its services.
#[derive(Debug, Clone, Copy)]
struct Settings {
    wait: bool,
    all_as_429: bool,
    rate_limit_headers: bool,
}

/// Applies [`AdmissionService`]: admits each HTTP request through an [`Admission`] (or any
/// [`AdmissionControl`], `A`) before the inner service sees it. See the [module docs](self).
///
/// `M` maps an `http::Request<ReqBody>` to the [`Request`] to admit, or to a response that refuses it
/// (any error that converts into a [`Refusal`] — an `http::Response<Bytes>`, for example from
/// [`error_response`](crate::http::error_response), or a boxed one, or a `Refusal`): see
/// [`new`](AdmissionLayer::new) and [`new_async`](AdmissionLayer::new_async).
/// `K` counts the output tokens in the response body's data frames ([`Uncounted`] by default: bytes
/// are not tokens, so nothing is reported; see [`count_with`](AdmissionLayer::count_with)).
///
/// # Examples
///
/// ```
/// use bytes::Bytes;
/// use http::{Request as HttpRequest, Response, StatusCode};
/// use http_body_util::Full;
/// use kvgate::tower::AdmissionLayer;
/// use kvgate::{Admission, Request};
/// use tower::{ServiceBuilder, ServiceExt};
///
/// let admission = Admission::builder().max_in_flight(64).kv_capacity_tokens(200_000).build().unwrap();
/// let to_request = |req: &HttpRequest<Full<Bytes>>| {
///     let max_tokens = req.headers().get("x-max-tokens").and_then(|v| v.to_str().ok()?.parse().ok());
///     match max_tokens {
///         Some(max_tokens) => Ok(Request::new(1_000, max_tokens)),
///         None => Err(kvgate::http::error_response(
///             StatusCode::BAD_REQUEST, "x-max-tokens is required", "invalid_request_error", "missing_max_tokens")),
///     }
/// };
/// let service = ServiceBuilder::new()
///     .layer(AdmissionLayer::new(admission.clone(), to_request))
///     .service_fn(|_req: HttpRequest<Full<Bytes>>| async {
///         Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from("data: hi\n\n"))))
///     });
///
/// let request = HttpRequest::builder().header("x-max-tokens", "256").body(Full::default()).unwrap();
/// let response = futures::executor::block_on(service.oneshot(request)).unwrap();
/// assert_eq!(response.status(), 200);
/// assert_eq!(admission.snapshot().in_flight, 1); // held by the response body
/// drop(response);
/// assert_eq!(admission.snapshot().in_flight, 0);
/// ```
pub struct AdmissionLayer<M, A = Admission, K = Uncounted> {
    admission: A,
    map: Arc<M>,
    settings: Settings,
    counter: K,
}

impl<F, A: AdmissionControl> AdmissionLayer<MapRef<F>, A> {
    /// A layer admitting through `admission`, with `to_request` turning each HTTP request (by reference)
    /// into the [`Request`] to admit or into a refusal. Requests wait as the admission is configured
    /// ([`Admission::admit`]), bodies report no output count, rejections keep their own status.
    pub fn new(admission: A, to_request: F) -> Self {
        Self::with_map(admission, MapRef(to_request))
    }
}

impl<F, A: AdmissionControl> AdmissionLayer<MapAsync<F>, A> {
    /// A layer admitting through `admission`, with an `async` function that owns each HTTP request, may
    /// read its body, and returns the [`Request`] to admit with the HTTP request to pass on (its body
    /// replaced as it likes) — or a refusal. Nothing is reserved until it returns.
    ///
    /// # Examples
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http_body_util::{BodyExt, Full, Limited};
    /// use kvgate::tower::{AdmissionLayer, Refusal};
    /// use kvgate::{Admission, Request};
    /// use tower::{ServiceBuilder, ServiceExt};
    ///
    /// /// Reads up to 64 KiB of body and prices it at one token per 4 bytes.
    /// async fn read(req: http::Request<Full<Bytes>>) -> Result<(Request, http::Request<Bytes>), Refusal> {
    ///     let (parts, body) = req.into_parts();
    ///     let too_large = || kvgate::http::error_response(http::StatusCode::PAYLOAD_TOO_LARGE, "body over 64 KiB", "invalid_request_error", "body_too_large");
    ///     let bytes = Limited::new(body, 64 << 10).collect().await.map_err(|_| too_large())?.to_bytes();
    ///     let admit = Request::new((bytes.len() as u32).div_ceil(4).max(1), 256);
    ///     Ok((admit, http::Request::from_parts(parts, bytes)))
    /// }
    ///
    /// let admission = Admission::builder().kv_capacity_tokens(10_000).build().unwrap();
    /// let service = ServiceBuilder::new()
    ///     .layer(AdmissionLayer::new_async(admission.clone(), read))
    ///     .service_fn(|req: http::Request<Bytes>| async move {
    ///         let admitted = *req.extensions().get::<Request>().unwrap();
    ///         Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from(format!("{admitted:?}")))))
    ///     });
    /// let response = futures::executor::block_on(service.oneshot(http::Request::new(Full::new(Bytes::from("x".repeat(400)))))).unwrap();
    /// assert_eq!(response.status(), 200);
    /// assert_eq!(admission.snapshot().kv_used, 100 + 256);
    /// ```
    pub fn new_async(admission: A, read: F) -> Self {
        Self::with_map(admission, MapAsync(read))
    }
}

impl<M, A: AdmissionControl> AdmissionLayer<M, A> {
    /// A layer with any [`MapRequest`].
    pub fn with_map(admission: A, map: M) -> Self {
        let settings = Settings { wait: true, all_as_429: false, rate_limit_headers: true };
        Self { admission, map: Arc::new(map), settings, counter: Uncounted }
    }
}

impl<M, A, K> AdmissionLayer<M, A, K> {
    /// `true` (the default): wait in the admission's queue ([`Admission::admit`]); `false`: never wait,
    /// answer at once ([`Admission::try_admit`]).
    #[must_use]
    pub fn wait(mut self, wait: bool) -> Self {
        self.settings.wait = wait;
        self
    }

    /// `true`: answer every retryable rejection (capacity, queue, rate, wait timeout) with `429 Too Many
    /// Requests`, for clients that retry only on 429. `TooLarge`, `Invalid` and `Closed` keep their
    /// status. Default `false` (see [`Rejection::http_status`](crate::Rejection::http_status)).
    #[must_use]
    pub fn all_rejections_as_429(mut self, yes: bool) -> Self {
        self.settings.all_as_429 = yes;
        self
    }

    /// `true` (the default): every answer to a mapped request carries OpenAI's `x-ratelimit-*` headers
    /// for the rates it meets (see [`insert_rate_limit_headers`]); none when no rate is configured.
    #[must_use]
    pub fn rate_limit_headers(mut self, yes: bool) -> Self {
        self.settings.rate_limit_headers = yes;
        self
    }

    /// Counts output tokens in each response data frame with `counter` (cloned for every request): an
    /// [`OutputCounter`] such as `kvgate::openai::OutputTokens`, or a function of each frame.
    #[must_use]
    pub fn count_with<K2: Clone>(self, counter: K2) -> AdmissionLayer<M, A, K2> {
        let AdmissionLayer { admission, map, settings, counter: _ } = self;
        AdmissionLayer { admission, map, settings, counter }
    }
}

impl<M, A: Clone, K: Clone> Clone for AdmissionLayer<M, A, K> {
    fn clone(&self) -> Self {
        Self {
            admission: self.admission.clone(),
            map: Arc::clone(&self.map),
            settings: self.settings,
            counter: self.counter.clone(),
        }
    }
}

impl<M, A: fmt::Debug, K> fmt::Debug for AdmissionLayer<M, A, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionLayer")
            .field("admission", &self.admission)
            .field("wait", &self.settings.wait)
            .field("all_rejections_as_429", &self.settings.all_as_429)
            .field("rate_limit_headers", &self.settings.rate_limit_headers)
            .finish_non_exhaustive()
    }
}

impl<S, M, A: Clone, K: Clone> Layer<S> for AdmissionLayer<M, A, K> {
    type Service = AdmissionService<S, M, A, K>;

    fn layer(&self, inner: S) -> Self::Service {
        AdmissionService {
            inner,
            admission: self.admission.clone(),
            map: Arc::clone(&self.map),
            settings: self.settings,
            counter: self.counter.clone(),
        }
    }
}

/// The service made by [`AdmissionLayer`]: maps each request, admits it, then calls `S`.
///
/// # Errors
///
/// The inner service's errors, unchanged. Rejections and refusals are not errors: they are responses.
///
/// # Cancel safety
///
/// Dropping the response future while the mapping runs drops the request; while it waits in the queue
/// gives the place up (see [`Admit`]); while the inner service runs, or an inner error or panic, drops
/// the permit, returning the capacity. Nothing is ever reserved by `poll_ready`.
pub struct AdmissionService<S, M, A = Admission, K = Uncounted> {
    inner: S,
    admission: A,
    map: Arc<M>,
    settings: Settings,
    counter: K,
}

impl<S, M, A, K> AdmissionService<S, M, A, K> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The admission requests go through.
    pub fn admission(&self) -> &A {
        &self.admission
    }
}

impl<S: Clone, M, A: Clone, K: Clone> Clone for AdmissionService<S, M, A, K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            admission: self.admission.clone(),
            map: Arc::clone(&self.map),
            settings: self.settings,
            counter: self.counter.clone(),
        }
    }
}

impl<S: fmt::Debug, M, A: fmt::Debug, K> fmt::Debug for AdmissionService<S, M, A, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionService")
            .field("inner", &self.inner)
            .field("admission", &self.admission)
            .field("wait", &self.settings.wait)
            .field("all_rejections_as_429", &self.settings.all_as_429)
            .finish_non_exhaustive()
    }
}

impl<S, M, A, K, ReqBody, ResBody> Service<::http::Request<ReqBody>> for AdmissionService<S, M, A, K>
where
    M: MapRequest<ReqBody>,
    S: Service<::http::Request<M::Body>, Response = ::http::Response<ResBody>> + Clone,
    A: AdmissionControl + Clone,
    K: OutputCounter<ResBody::Data> + Clone,
    ResBody: Body,
    ResBody::Data: From<Bytes>,
{
    type Response = ::http::Response<AdmissionBody<ResBody, K, A::Permit>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, M, ReqBody, A, K>;

    /// Delegates to the inner service and reserves nothing (see the [module docs](self)).
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: ::http::Request<ReqBody>) -> Self::Future {
        // The service made ready by `poll_ready` goes with this request; a clone stays for the next.
        let clone = self.inner.clone();
        let service = std::mem::replace(&mut self.inner, clone);
        ResponseFuture {
            state: State::Mapping { future: self.map.map_request(request), service: Some(service) },
            admission: self.admission.clone(),
            settings: self.settings,
            counter: Some(self.counter.clone()),
            tenant: None,
            rates: None,
        }
    }
}

/// A request mapper's answer to a request it will not admit: the response to send instead (a 400 for
/// malformed input, a 413 for a prompt over the context length, ...).
///
/// Boxed, so that a mapper's `Result<Request, Refusal>` stays small. Built from an
/// `http::Response<Bytes>` (or a boxed one) with `.into()`.
///
/// # Examples
///
/// ```
/// use http::StatusCode;
/// use kvgate::tower::Refusal;
///
/// let refusal: Refusal = kvgate::http::error_response(StatusCode::PAYLOAD_TOO_LARGE, "prompt too long", "invalid_request_error", "context_length_exceeded").into();
/// assert_eq!(refusal.into_response().status(), 413);
/// ```
#[derive(Debug)]
pub struct Refusal(Box<::http::Response<Bytes>>);

impl Refusal {
    /// The response to send.
    pub fn into_response(self) -> ::http::Response<Bytes> {
        *self.0
    }
}

impl From<::http::Response<Bytes>> for Refusal {
    fn from(response: ::http::Response<Bytes>) -> Self {
        Self(Box::new(response))
    }
}

impl From<Box<::http::Response<Bytes>>> for Refusal {
    fn from(response: Box<::http::Response<Bytes>>) -> Self {
        Self(response)
    }
}

/// The admission's future: a wait (boxed: it may be large, and it is not the fast path) or a try.
#[pin_project(project = AdmittingProj)]
enum Admitting<W, T> {
    Wait(Pin<Box<W>>),
    Try(#[pin] T),
}

#[pin_project(project = StateProj)]
enum State<S, M, ReqBody, A>
where
    M: MapRequest<ReqBody>,
    S: Service<::http::Request<M::Body>>,
    A: AdmissionControl,
{
    /// The mapping function runs.
    Mapping {
        #[pin]
        future: M::Future,
        service: Option<S>,
    },
    /// Answer without calling the inner service (a refusal or a rejection).
    Answer { response: Option<::http::Response<Bytes>> },
    /// Waiting for (or trying) admission.
    Admitting {
        #[pin]
        admitting: Admitting<A::Admit, A::TryAdmit>,
        service: Option<S>,
        request: Option<::http::Request<M::Body>>,
    },
    /// Admitted; the inner service runs.
    Calling {
        #[pin]
        future: S::Future,
        permit: Option<A::Permit>,
    },
}

/// The future of [`AdmissionService::call`]: mapping, admission, then the inner service's response with
/// the permit attached to its body.
///
/// # Cancel safety
///
/// Dropping it while mapping drops the request; while queued gives the place in the queue up; while the
/// inner service runs, drops the permit. Nothing is leaked.
#[pin_project]
#[must_use = "futures do nothing unless polled"]
pub struct ResponseFuture<S, M, ReqBody, A, K>
where
    M: MapRequest<ReqBody>,
    S: Service<::http::Request<M::Body>>,
    A: AdmissionControl,
{
    #[pin]
    state: State<S, M, ReqBody, A>,
    admission: A,
    settings: Settings,
    counter: Option<K>,
    /// The mapped request's tenant, for the rate-limit headers (`None` before mapping or without one).
    tenant: Option<Option<crate::TenantId>>,
    /// The rates as admission left them: read when the request was admitted or refused, so that the
    /// headers say what remains after this request, not what refilled while it ran.
    rates: Option<crate::RateLimitStatus>,
}

impl<S, M, ReqBody, A, K, ResBody> Future for ResponseFuture<S, M, ReqBody, A, K>
where
    M: MapRequest<ReqBody>,
    S: Service<::http::Request<M::Body>, Response = ::http::Response<ResBody>>,
    A: AdmissionControl,
    K: OutputCounter<ResBody::Data>,
    ResBody: Body,
    ResBody::Data: From<Bytes>,
{
    type Output = Result<::http::Response<AdmissionBody<ResBody, K, A::Permit>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        const DONE: &str = "`ResponseFuture` polled after it completed";
        let mut this = self.project();
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::Mapping { future, service } => match ready!(future.poll(cx)) {
                    Ok((admit_request, mut request)) => {
                        *this.tenant = Some(admit_request.tenant);
                        request.extensions_mut().insert(admit_request);
                        let admitting = if this.settings.wait {
                            Admitting::Wait(Box::pin(this.admission.admit(&admit_request)))
                        } else {
                            Admitting::Try(this.admission.try_admit(&admit_request))
                        };
                        State::Admitting { admitting, service: service.take(), request: Some(request) }
                    }
                    Err(refusal) => State::Answer { response: Some(refusal.into_response()) },
                },
                StateProj::Answer { response } => {
                    let mut response = response.take().expect(DONE);
                    add_rate_limit_headers(
                        this.admission,
                        this.settings,
                        *this.tenant,
                        *this.rates,
                        response.headers_mut(),
                    );
                    return Poll::Ready(Ok(response.map(AdmissionBody::full)));
                }
                StateProj::Admitting { admitting, service, request } => {
                    let admitted = match admitting.project() {
                        AdmittingProj::Wait(admit) => ready!(admit.as_mut().poll(cx)),
                        AdmittingProj::Try(admit) => ready!(admit.poll(cx)),
                    };
                    if let (true, Some(tenant)) = (this.settings.rate_limit_headers, *this.tenant) {
                        *this.rates = Some(this.admission.rate_status(tenant));
                    }
                    match admitted {
                        Ok(permit) => {
                            let mut service = service.take().expect(DONE);
                            let mut request = request.take().expect(DONE);
                            this.admission.on_grant(&permit, request.extensions_mut());
                            // A panic in `call` unwinds through `permit`, which returns the capacity.
                            let future = service.call(request);
                            State::Calling { future, permit: Some(permit) }
                        }
                        Err(rejection) => {
                            // A timed-out wait carries no hint of its own: the admission's current estimate.
                            let hint =
                                matches!(rejection, Rejection::TimedOut).then(|| this.admission.capacity_retry_after());
                            State::Answer {
                                response: Some(rejection_response_with_hint(
                                    &rejection,
                                    hint,
                                    this.settings.all_as_429,
                                )),
                            }
                        }
                    }
                }
                StateProj::Calling { future, permit } => {
                    let result = ready!(future.poll(cx));
                    let permit = permit.take().expect(DONE);
                    return Poll::Ready(match result {
                        Ok(mut response) => {
                            let counter = this.counter.take().expect(DONE);
                            add_rate_limit_headers(
                                this.admission,
                                this.settings,
                                *this.tenant,
                                *this.rates,
                                response.headers_mut(),
                            );
                            Ok(response
                                .map(|body| AdmissionBody::admitted(PermitBody::new(body, permit).count_with(counter))))
                        }
                        Err(err) => {
                            drop(permit);
                            Err(err)
                        }
                    });
                }
            };
            this.state.set(next);
        }
    }
}

/// Adds the `x-ratelimit-*` headers of a mapped request's rates (as read at admission, else now), if
/// the layer adds them.
fn add_rate_limit_headers<A: AdmissionControl>(
    admission: &A,
    settings: &Settings,
    tenant: Option<Option<crate::TenantId>>,
    rates: Option<crate::RateLimitStatus>,
    headers: &mut ::http::HeaderMap,
) {
    if let (true, Some(tenant)) = (settings.rate_limit_headers, tenant) {
        insert_rate_limit_headers(headers, &rates.unwrap_or_else(|| admission.rate_status(tenant)));
    }
}

impl<S, M, ReqBody, A, K> fmt::Debug for ResponseFuture<S, M, ReqBody, A, K>
where
    M: MapRequest<ReqBody>,
    S: Service<::http::Request<M::Body>>,
    A: AdmissionControl,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Mapping { .. } => "mapping",
            State::Answer { .. } => "answer",
            State::Admitting { admitting: Admitting::Wait(_), .. } => "waiting",
            State::Admitting { .. } => "admitting",
            State::Calling { .. } => "calling",
        };
        f.debug_struct("ResponseFuture").field("state", &state).finish_non_exhaustive()
    }
}

#[pin_project(project = KindProj)]
enum Kind<B, K, P: Complete> {
    Admitted(#[pin] PermitBody<B, K, P>),
    Full(Option<Bytes>),
}

/// The response body of [`AdmissionService`]: the inner service's body holding the permit
/// ([`PermitBody`]), or the body of a response the layer answered itself (a rejection or a refusal).
#[pin_project]
pub struct AdmissionBody<B, K = Uncounted, P: Complete = Permit> {
    #[pin]
    kind: Kind<B, K, P>,
}

impl<B, K, P: Complete> AdmissionBody<B, K, P> {
    fn admitted(body: PermitBody<B, K, P>) -> Self {
        Self { kind: Kind::Admitted(body) }
    }

    fn full(bytes: Bytes) -> Self {
        Self { kind: Kind::Full((!bytes.is_empty()).then_some(bytes)) }
    }

    /// The inner body with its permit, if the request was admitted.
    pub fn permit_body(&self) -> Option<&PermitBody<B, K, P>> {
        match &self.kind {
            Kind::Admitted(body) => Some(body),
            Kind::Full(_) => None,
        }
    }

    /// Whether the layer answered this response itself (a rejection or a refusal).
    pub fn is_refusal(&self) -> bool {
        matches!(self.kind, Kind::Full(_))
    }
}

impl<B, K, P> Body for AdmissionBody<B, K, P>
where
    B: Body,
    B::Data: From<Bytes>,
    K: OutputCounter<B::Data>,
    P: Complete,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Admitted(body) => body.poll_frame(cx),
            KindProj::Full(bytes) => Poll::Ready(bytes.take().map(|bytes| Ok(Frame::data(B::Data::from(bytes))))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Admitted(body) => body.is_end_stream(),
            Kind::Full(bytes) => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Admitted(body) => body.size_hint(),
            Kind::Full(bytes) => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
        }
    }
}

impl<B, K, P: Complete + fmt::Debug> fmt::Debug for AdmissionBody<B, K, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Admitted(body) => f.debug_tuple("AdmissionBody::Admitted").field(body).finish(),
            Kind::Full(bytes) => f.debug_tuple("AdmissionBody::Full").field(bytes).finish(),
        }
    }
}
