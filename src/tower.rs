//! A [`tower`](https://docs.rs/tower) middleware that admits HTTP requests: [`AdmissionLayer`].
//!
//! Requires the `tower` feature (`tower-layer`, `tower-service`, and the `http-body` feature).
//!
//! For every request the layer asks a user function for the [`Request`] to admit (prompt tokens,
//! `max_tokens`, priority — or a 400/413 of its own for malformed input), waits for or refuses admission,
//! and then either calls the inner service, wrapping its response body in a [`PermitBody`] that holds the
//! permit until the body is finished or dropped, or answers the [`Rejection`](crate::Rejection) itself (see
//! [`rejection_response`]).
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
//! Rejections become [`rejection_response`]s: every retryable one carries `Retry-After` and
//! `retry-after-ms` (a [`TimedOut`](crate::Rejection::TimedOut) wait the admission's current
//! [capacity estimate](Admission::capacity_retry_after)). Every answer — admitted or not — carries
//! OpenAI's `x-ratelimit-*` headers for the rates the request meets (its tenant's or the global ones),
//! unless [`rate_limit_headers(false)`](AdmissionLayer::rate_limit_headers).

#![cfg_attr(docsrs, doc(cfg(feature = "tower")))]

use crate::clock::{Clock, MonotonicClock};
use crate::http::{PermitBody, insert_rate_limit_headers, rejection_response};
use crate::stream::{OutputCounter, Uncounted};
use crate::{Admission, Admit, Permit, Request};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project::pin_project;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use tower_layer::Layer;
use tower_service::Service;

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

/// Applies [`AdmissionService`]: admits each HTTP request through an [`Admission`] before the inner
/// service sees it. See the [module docs](self).
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
pub struct AdmissionLayer<M, C: Clock = MonotonicClock, K = Uncounted> {
    admission: Admission<C>,
    map: Arc<M>,
    settings: Settings,
    counter: K,
}

impl<F, C: Clock> AdmissionLayer<MapRef<F>, C> {
    /// A layer admitting through `admission`, with `to_request` turning each HTTP request (by reference)
    /// into the [`Request`] to admit or into a refusal. Requests wait as the admission is configured
    /// ([`Admission::admit`]), bodies report no output count, rejections keep their own status.
    pub fn new(admission: Admission<C>, to_request: F) -> Self {
        Self::with_map(admission, MapRef(to_request))
    }
}

impl<F, C: Clock> AdmissionLayer<MapAsync<F>, C> {
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
    pub fn new_async(admission: Admission<C>, read: F) -> Self {
        Self::with_map(admission, MapAsync(read))
    }
}

impl<M, C: Clock> AdmissionLayer<M, C> {
    /// A layer with any [`MapRequest`].
    pub fn with_map(admission: Admission<C>, map: M) -> Self {
        let settings = Settings { wait: true, all_as_429: false, rate_limit_headers: true };
        Self { admission, map: Arc::new(map), settings, counter: Uncounted }
    }
}

impl<M, C: Clock, K> AdmissionLayer<M, C, K> {
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
    pub fn count_with<K2: Clone>(self, counter: K2) -> AdmissionLayer<M, C, K2> {
        let AdmissionLayer { admission, map, settings, counter: _ } = self;
        AdmissionLayer { admission, map, settings, counter }
    }
}

impl<M, C: Clock, K: Clone> Clone for AdmissionLayer<M, C, K> {
    fn clone(&self) -> Self {
        Self {
            admission: self.admission.clone(),
            map: Arc::clone(&self.map),
            settings: self.settings,
            counter: self.counter.clone(),
        }
    }
}

impl<M, C: Clock, K> fmt::Debug for AdmissionLayer<M, C, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionLayer")
            .field("admission", &self.admission)
            .field("wait", &self.settings.wait)
            .field("all_rejections_as_429", &self.settings.all_as_429)
            .field("rate_limit_headers", &self.settings.rate_limit_headers)
            .finish_non_exhaustive()
    }
}

impl<S, M, C: Clock, K: Clone> Layer<S> for AdmissionLayer<M, C, K> {
    type Service = AdmissionService<S, M, C, K>;

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
pub struct AdmissionService<S, M, C: Clock = MonotonicClock, K = Uncounted> {
    inner: S,
    admission: Admission<C>,
    map: Arc<M>,
    settings: Settings,
    counter: K,
}

impl<S, M, C: Clock, K> AdmissionService<S, M, C, K> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The admission requests go through.
    pub fn admission(&self) -> &Admission<C> {
        &self.admission
    }
}

impl<S: Clone, M, C: Clock, K: Clone> Clone for AdmissionService<S, M, C, K> {
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

impl<S: fmt::Debug, M, C: Clock, K> fmt::Debug for AdmissionService<S, M, C, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionService")
            .field("inner", &self.inner)
            .field("admission", &self.admission)
            .field("wait", &self.settings.wait)
            .field("all_rejections_as_429", &self.settings.all_as_429)
            .finish_non_exhaustive()
    }
}

impl<S, M, C, K, ReqBody, ResBody> Service<::http::Request<ReqBody>> for AdmissionService<S, M, C, K>
where
    M: MapRequest<ReqBody>,
    S: Service<::http::Request<M::Body>, Response = ::http::Response<ResBody>> + Clone,
    C: Clock,
    K: OutputCounter<ResBody::Data> + Clone,
    ResBody: Body,
    ResBody::Data: From<Bytes>,
{
    type Response = ::http::Response<AdmissionBody<ResBody, K>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, M, ReqBody, C, K>;

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

enum Admitting {
    Wait(Box<Admit>),
    Try(Request),
}

#[pin_project(project = StateProj)]
enum State<S, M, ReqBody>
where
    M: MapRequest<ReqBody>,
    S: Service<::http::Request<M::Body>>,
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
    Admitting { admitting: Admitting, service: Option<S>, request: Option<::http::Request<M::Body>> },
    /// Admitted; the inner service runs.
    Calling {
        #[pin]
        future: S::Future,
        permit: Option<Permit>,
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
pub struct ResponseFuture<S, M, ReqBody, C, K>
where
    M: MapRequest<ReqBody>,
    S: Service<::http::Request<M::Body>>,
    C: Clock,
{
    #[pin]
    state: State<S, M, ReqBody>,
    admission: Admission<C>,
    settings: Settings,
    counter: Option<K>,
    /// The mapped request's tenant, for the rate-limit headers (`None` before mapping or without one).
    tenant: Option<Option<crate::TenantId>>,
    /// The rates as admission left them: read when the request was admitted or refused, so that the
    /// headers say what remains after this request, not what refilled while it ran.
    rates: Option<crate::RateLimitStatus>,
}

impl<S, M, ReqBody, C, K, ResBody> Future for ResponseFuture<S, M, ReqBody, C, K>
where
    M: MapRequest<ReqBody>,
    S: Service<::http::Request<M::Body>, Response = ::http::Response<ResBody>>,
    C: Clock,
    K: OutputCounter<ResBody::Data>,
    ResBody: Body,
    ResBody::Data: From<Bytes>,
{
    type Output = Result<::http::Response<AdmissionBody<ResBody, K>>, S::Error>;

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
                            Admitting::Wait(Box::new(this.admission.admit(&admit_request)))
                        } else {
                            Admitting::Try(admit_request)
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
                    let admitted = match admitting {
                        Admitting::Wait(admit) => ready!(Pin::new(admit).poll(cx)),
                        Admitting::Try(admit_request) => this.admission.try_admit(admit_request),
                    };
                    if let (true, Some(tenant)) = (this.settings.rate_limit_headers, *this.tenant) {
                        *this.rates = Some(this.admission.rate_status(tenant));
                    }
                    match admitted {
                        Ok(permit) => {
                            let mut service = service.take().expect(DONE);
                            let request = request.take().expect(DONE);
                            // A panic in `call` unwinds through `permit`, which returns the capacity.
                            let future = service.call(request);
                            State::Calling { future, permit: Some(permit) }
                        }
                        Err(rejection) => State::Answer {
                            response: Some(rejection_response(&rejection, this.admission, this.settings.all_as_429)),
                        },
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
fn add_rate_limit_headers<C: Clock>(
    admission: &Admission<C>,
    settings: &Settings,
    tenant: Option<Option<crate::TenantId>>,
    rates: Option<crate::RateLimitStatus>,
    headers: &mut ::http::HeaderMap,
) {
    if let (true, Some(tenant)) = (settings.rate_limit_headers, tenant) {
        insert_rate_limit_headers(headers, &rates.unwrap_or_else(|| admission.rate_status(tenant)));
    }
}

impl<S, M, ReqBody, C, K> fmt::Debug for ResponseFuture<S, M, ReqBody, C, K>
where
    M: MapRequest<ReqBody>,
    S: Service<::http::Request<M::Body>>,
    C: Clock,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Mapping { .. } => "mapping",
            State::Answer { .. } => "answer",
            State::Admitting { admitting: Admitting::Wait(admit), .. } if admit.is_queued() => "queued",
            State::Admitting { .. } => "admitting",
            State::Calling { .. } => "calling",
        };
        f.debug_struct("ResponseFuture").field("state", &state).finish_non_exhaustive()
    }
}

#[pin_project(project = KindProj)]
enum Kind<B, K> {
    Admitted(#[pin] PermitBody<B, K>),
    Full(Option<Bytes>),
}

/// The response body of [`AdmissionService`]: the inner service's body holding the permit
/// ([`PermitBody`]), or the body of a response the layer answered itself (a rejection or a refusal).
#[pin_project]
pub struct AdmissionBody<B, K = Uncounted> {
    #[pin]
    kind: Kind<B, K>,
}

impl<B, K> AdmissionBody<B, K> {
    fn admitted(body: PermitBody<B, K>) -> Self {
        Self { kind: Kind::Admitted(body) }
    }

    fn full(bytes: Bytes) -> Self {
        Self { kind: Kind::Full((!bytes.is_empty()).then_some(bytes)) }
    }

    /// The inner body with its permit, if the request was admitted.
    pub fn permit_body(&self) -> Option<&PermitBody<B, K>> {
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

impl<B, K> Body for AdmissionBody<B, K>
where
    B: Body,
    B::Data: From<Bytes>,
    K: OutputCounter<B::Data>,
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

impl<B, K> fmt::Debug for AdmissionBody<B, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Admitted(body) => f.debug_tuple("AdmissionBody::Admitted").field(body).finish(),
            Kind::Full(bytes) => f.debug_tuple("AdmissionBody::Full").field(bytes).finish(),
        }
    }
}
