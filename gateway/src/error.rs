//! The gateway's own error answers, in the OpenAI API's shape:
//! `{"error":{"message","type","param","code"}}`.

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, StatusCode};

/// An error the gateway answers itself (a body it cannot read, an unknown key, an upstream that failed).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What happened and what to do; never an upstream address or credential.
    pub message: String,
    /// Machine-readable code (also the `code` label of `kvgate_gateway_requests_invalid_total`).
    pub code: &'static str,
    /// Close the connection after answering (the rest of the request was not read).
    pub close: bool,
}

impl ApiError {
    /// An error with `status`.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), code, close: false }
    }

    /// Closes the connection after this answer.
    #[must_use]
    pub fn closing(mut self) -> Self {
        self.close = true;
        self
    }

    /// The OpenAI `type` of the error: `invalid_request_error` for 4xx, `upstream_error` for 502/504,
    /// `server_error` otherwise.
    pub fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            400..=499 => "invalid_request_error",
            502 | 504 => "upstream_error",
            _ => "server_error",
        }
    }

    /// The HTTP response.
    pub fn to_response(&self) -> http::Response<Bytes> {
        let mut response = kvgate::http::error_response(self.status, &self.message, self.kind(), self.code);
        if self.close {
            response.headers_mut().insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.to_response().map(axum::body::Body::from)
    }
}
