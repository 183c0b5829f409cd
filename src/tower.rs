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
//! The mapping function sees the request's head, extensions and body by reference. To count prompt
//! tokens from a JSON body, buffer it first (an outer layer or the framework's extractor turns `ReqBody`
//! into `Bytes`), or have an outer layer put a precomputed [`Request`] into the extensions.

#![cfg_attr(docsrs, doc(cfg(feature = "tower")))]

use crate::clock::{Clock, MonotonicClock};
use crate::http::{PermitBody, rejection_response};
use crate::stream::{OnePerItem, TokenCounter};
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

/// Applies [`AdmissionService`]: admits each HTTP request through an [`Admission`] before the inner
/// service sees it. See the [module docs](self).
///
/// `M` maps an `http::Request<ReqBody>` to the [`Request`] to admit, or to a response that refuses it
/// (`Err(_)`: anything that converts into a [`Refusal`] — an `http::Response<Bytes>`, for example from
/// [`error_response`](crate::http::error_response), or a boxed one, or a `Refusal`).
/// `K` counts the output tokens in each data frame of the response body ([`OnePerItem`] by default: one
/// per frame, right for token-by-token SSE streams).
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
pub struct AdmissionLayer<M, C: Clock = MonotonicClock, K = OnePerItem> {
    admission: Admission<C>,
    to_request: Arc<M>,
    wait: bool,
    all_as_429: bool,
    counter: K,
}

impl<M, C: Clock> AdmissionLayer<M, C> {
    /// A layer admitting through `admission`, with `to_request` turning each HTTP request into the
    /// [`Request`] to admit (or into a refusal response). Requests wait as the admission is configured
    /// ([`Admission::admit`]), bodies count one token per data frame, rejections keep their own status.
    pub fn new(admission: Admission<C>, to_request: M) -> Self {
        Self { admission, to_request: Arc::new(to_request), wait: true, all_as_429: false, counter: OnePerItem }
    }
}

impl<M, C: Clock, K> AdmissionLayer<M, C, K> {
    /// `true` (the default): wait in the admission's queue ([`Admission::admit`]); `false`: never wait,
    /// answer at once ([`Admission::try_admit`]).
    #[must_use]
    pub fn wait(mut self, wait: bool) -> Self {
        self.wait = wait;
        self
    }

    /// `true`: answer every retryable rejection (capacity, queue, rate, wait timeout) with `429 Too Many
    /// Requests`, for clients that retry only on 429. `TooLarge`, `Invalid` and `Closed` keep their
    /// status. Default `false` (see [`Rejection::http_status`](crate::Rejection::http_status)).
    #[must_use]
    pub fn all_rejections_as_429(mut self, yes: bool) -> Self {
        self.all_as_429 = yes;
        self
    }

    /// Counts output tokens in each response data frame with `counter` (cloned for every request).
    #[must_use]
    pub fn count_with<K2: Clone>(self, counter: K2) -> AdmissionLayer<M, C, K2> {
        let AdmissionLayer { admission, to_request, wait, all_as_429, counter: _ } = self;
        AdmissionLayer { admission, to_request, wait, all_as_429, counter }
    }
}

impl<M, C: Clock, K: Clone> Clone for AdmissionLayer<M, C, K> {
    fn clone(&self) -> Self {
        Self {
            admission: self.admission.clone(),
            to_request: Arc::clone(&self.to_request),
            wait: self.wait,
            all_as_429: self.all_as_429,
            counter: self.counter.clone(),
        }
    }
}

impl<M, C: Clock, K> fmt::Debug for AdmissionLayer<M, C, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionLayer")
            .field("admission", &self.admission)
            .field("wait", &self.wait)
            .field("all_rejections_as_429", &self.all_as_429)
            .finish_non_exhaustive()
    }
}

impl<S, M, C: Clock, K: Clone> Layer<S> for AdmissionLayer<M, C, K> {
    type Service = AdmissionService<S, M, C, K>;

    fn layer(&self, inner: S) -> Self::Service {
        AdmissionService {
            inner,
            admission: self.admission.clone(),
            to_request: Arc::clone(&self.to_request),
            wait: self.wait,
            all_as_429: self.all_as_429,
            counter: self.counter.clone(),
        }
    }
}

/// The service made by [`AdmissionLayer`]: admits each request, then calls `S`.
///
/// # Errors
///
/// The inner service's errors, unchanged. Rejections and refusals are not errors: they are responses.
///
/// # Cancel safety
///
/// Dropping the response future while it waits in the queue gives the place up (see [`Admit`]); dropping
/// it while the inner service runs, or an inner error or panic, drops the permit, returning the capacity.
/// Nothing is ever reserved by `poll_ready`.
pub struct AdmissionService<S, M, C: Clock = MonotonicClock, K = OnePerItem> {
    inner: S,
    admission: Admission<C>,
    to_request: Arc<M>,
    wait: bool,
    all_as_429: bool,
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
            to_request: Arc::clone(&self.to_request),
            wait: self.wait,
            all_as_429: self.all_as_429,
            counter: self.counter.clone(),
        }
    }
}

impl<S: fmt::Debug, M, C: Clock, K> fmt::Debug for AdmissionService<S, M, C, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionService")
            .field("inner", &self.inner)
            .field("admission", &self.admission)
            .field("wait", &self.wait)
            .field("all_rejections_as_429", &self.all_as_429)
            .finish_non_exhaustive()
    }
}

impl<S, M, E, C, K, ReqBody, ResBody> Service<::http::Request<ReqBody>> for AdmissionService<S, M, C, K>
where
    S: Service<::http::Request<ReqBody>, Response = ::http::Response<ResBody>> + Clone,
    M: Fn(&::http::Request<ReqBody>) -> Result<Request, E>,
    E: Into<Refusal>,
    C: Clock,
    K: TokenCounter<ResBody::Data> + Clone,
    ResBody: Body,
    ResBody::Data: From<Bytes>,
{
    type Response = ::http::Response<AdmissionBody<ResBody, K>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, C, K>;

    /// Delegates to the inner service and reserves nothing (see the [module docs](self)).
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: ::http::Request<ReqBody>) -> Self::Future {
        let all_as_429 = self.all_as_429;
        let admit_request = match (self.to_request)(&request) {
            Ok(admit_request) => admit_request,
            Err(refusal) => {
                return ResponseFuture {
                    state: State::Answer { response: Some(refusal.into().into_response()) },
                    counter: None,
                    all_as_429,
                };
            }
        };
        request.extensions_mut().insert(admit_request);
        // The service made ready by `poll_ready` goes with this request; a clone stays for the next.
        let clone = self.inner.clone();
        let service = std::mem::replace(&mut self.inner, clone);
        let admitting = if self.wait {
            Admitting::Wait(self.admission.admit(&admit_request))
        } else {
            Admitting::Try(self.admission.clone(), admit_request)
        };
        ResponseFuture {
            state: State::Admitting { admitting, service: Some(service), request: Some(request) },
            counter: Some(self.counter.clone()),
            all_as_429,
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

enum Admitting<C: Clock> {
    Wait(Admit),
    Try(Admission<C>, Request),
}

#[pin_project(project = StateProj)]
enum State<S, ReqBody, C>
where
    S: Service<::http::Request<ReqBody>>,
    C: Clock,
{
    /// Answer without calling the inner service (a refusal or a rejection).
    Answer { response: Option<::http::Response<Bytes>> },
    /// Waiting for (or trying) admission.
    Admitting { admitting: Admitting<C>, service: Option<S>, request: Option<::http::Request<ReqBody>> },
    /// Admitted; the inner service runs.
    Calling {
        #[pin]
        future: S::Future,
        permit: Option<Permit>,
    },
}

/// The future of [`AdmissionService::call`]: admission, then the inner service's response with the
/// permit attached to its body.
///
/// # Cancel safety
///
/// Dropping it while queued gives the place in the queue up; while the inner service runs, drops the
/// permit. Nothing is leaked.
#[pin_project]
#[must_use = "futures do nothing unless polled"]
pub struct ResponseFuture<S, ReqBody, C, K>
where
    S: Service<::http::Request<ReqBody>>,
    C: Clock,
{
    #[pin]
    state: State<S, ReqBody, C>,
    counter: Option<K>,
    all_as_429: bool,
}

impl<S, ReqBody, C, K, ResBody> Future for ResponseFuture<S, ReqBody, C, K>
where
    S: Service<::http::Request<ReqBody>, Response = ::http::Response<ResBody>>,
    C: Clock,
    K: TokenCounter<ResBody::Data>,
    ResBody: Body,
    ResBody::Data: From<Bytes>,
{
    type Output = Result<::http::Response<AdmissionBody<ResBody, K>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::Answer { response } => {
                    let response = response.take().expect("`ResponseFuture` polled after it completed");
                    return Poll::Ready(Ok(response.map(AdmissionBody::full)));
                }
                StateProj::Admitting { admitting, service, request } => {
                    let admitted = match admitting {
                        Admitting::Wait(admit) => ready!(Pin::new(admit).poll(cx)),
                        Admitting::Try(admission, admit_request) => admission.try_admit(admit_request),
                    };
                    match admitted {
                        Ok(permit) => {
                            let mut service = service.take().expect("`ResponseFuture` polled after it completed");
                            let request = request.take().expect("`ResponseFuture` polled after it completed");
                            // A panic in `call` unwinds through `permit`, which returns the capacity.
                            let future = service.call(request);
                            State::Calling { future, permit: Some(permit) }
                        }
                        Err(rejection) => {
                            State::Answer { response: Some(rejection_response(&rejection, *this.all_as_429)) }
                        }
                    }
                }
                StateProj::Calling { future, permit } => {
                    let result = ready!(future.poll(cx));
                    let permit = permit.take().expect("`ResponseFuture` polled after it completed");
                    return Poll::Ready(match result {
                        Ok(response) => {
                            let counter = this.counter.take().expect("`ResponseFuture` polled after it completed");
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

impl<S, ReqBody, C, K> fmt::Debug for ResponseFuture<S, ReqBody, C, K>
where
    S: Service<::http::Request<ReqBody>>,
    C: Clock,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
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
pub struct AdmissionBody<B, K = OnePerItem> {
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
    K: TokenCounter<B::Data>,
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
