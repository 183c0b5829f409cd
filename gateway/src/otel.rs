//! An OpenTelemetry exporter (feature `otel`, flag `--otlp-endpoint URL`): one span per completion
//! request, sent to an OpenTelemetry collector over OTLP/HTTP with the JSON encoding
//! (`POST <endpoint>/v1/traces`, the protocol's standard path), in batches.
//!
//! The span is the gateway's part of the request's trace: its trace id and span id are the ones sent
//! upstream in `traceparent` (so the engine's spans, if it exports any, hang under it), its parent the
//! client's span when the client sent a `traceparent`. Kind `SERVER`, named after the route; its
//! attributes are the fields of the request's log line (`kvgate.request_id`, `kvgate.tenant`,
//! `kvgate.priority`, `kvgate.decision`, `http.response.status_code`, `kvgate.queue_wait_ms`,
//! `kvgate.upstream`, `kvgate.upstream_status`, `kvgate.ttft_ms`, `kvgate.tokens_in`,
//! `kvgate.tokens_out`); the resource is `service.name = kvgate-gateway`. Keys, prompts and answers are
//! never exported.
//!
//! Spans wait in a bounded buffer ([`MAX_BUFFERED`]; more are dropped and counted in
//! `kvgate_gateway_otel_spans_dropped_total`) and are sent every second, or as soon as [`BATCH`] are
//! waiting; a collector that does not answer within two seconds costs the batch, never a request.

use crate::trace::LogLine;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use std::time::Duration;
use tokio::sync::mpsc;

/// Spans sent at once.
pub const BATCH: usize = 512;
/// Spans waiting at most; more are dropped.
pub const MAX_BUFFERED: usize = 8192;

/// One finished request, as exported.
#[derive(Debug, Clone)]
struct Span {
    line: LogLine,
    start_unix_nanos: u64,
    end_unix_nanos: u64,
}

/// The exporter's handle: hands spans to its background task.
#[derive(Debug, Clone)]
pub struct Exporter {
    spans: mpsc::Sender<Span>,
}

impl Exporter {
    /// Starts the exporter's task (on the current Tokio runtime) sending to `endpoint`
    /// (`http://collector:4318`).
    ///
    /// # Errors
    ///
    /// A message when the endpoint is not a plain `http://` URL, or there is no runtime.
    pub fn start(endpoint: &str) -> Result<Self, String> {
        let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
        match url.parse::<http::Uri>() {
            Ok(uri) if uri.scheme_str() == Some("http") && uri.host().is_some() => {}
            _ => return Err(format!("--otlp-endpoint {}: not a valid http:// URL", crate::proxy::redact(endpoint))),
        }
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| "--otlp-endpoint: no Tokio runtime".to_owned())?;
        let (spans, receiver) = mpsc::channel(MAX_BUFFERED);
        runtime.spawn(send_batches(url, receiver));
        Ok(Self { spans })
    }

    /// Queues the span of a finished request (`line`, its log line), which ran `duration_nanos` until now.
    pub fn export(&self, line: &LogLine, duration_nanos: u64) {
        let end = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let span =
            Span { line: line.clone(), start_unix_nanos: end.saturating_sub(duration_nanos), end_unix_nanos: end };
        if self.spans.try_send(span).is_err() {
            metrics::counter!("kvgate_gateway_otel_spans_dropped_total").increment(1);
        }
    }
}

async fn send_batches(url: String, mut receiver: mpsc::Receiver<Span>) {
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let flush = tokio::time::sleep(Duration::from_secs(1));
        tokio::pin!(flush);
        loop {
            tokio::select! {
                span = receiver.recv() => match span {
                    Some(span) => {
                        batch.push(span);
                        if batch.len() >= BATCH {
                            break;
                        }
                    }
                    None => {
                        if !batch.is_empty() {
                            send(&client, &url, std::mem::take(&mut batch)).await;
                        }
                        return;
                    }
                },
                () = &mut flush => break,
            }
        }
        if !batch.is_empty() {
            send(&client, &url, std::mem::take(&mut batch)).await;
        }
    }
}

async fn send(client: &Client<HttpConnector, Full<Bytes>>, url: &str, spans: Vec<Span>) {
    let body = serde_json::to_vec(&request(&spans)).expect("JSON values serialize");
    let request = http::Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("a valid request");
    let sent = tokio::time::timeout(Duration::from_secs(2), client.request(request)).await;
    if !matches!(&sent, Ok(Ok(response)) if response.status().is_success()) {
        metrics::counter!("kvgate_gateway_otel_spans_dropped_total").increment(spans.len() as u64);
    }
}

fn attribute(key: &str, value: Value) -> Option<Value> {
    let value = match value {
        Value::Null => return None,
        Value::String(s) => json!({ "stringValue": s }),
        Value::Number(n) if n.is_u64() || n.is_i64() => json!({ "intValue": n.to_string() }),
        Value::Number(n) => json!({ "doubleValue": n }),
        other => json!({ "stringValue": other.to_string() }),
    };
    Some(json!({ "key": key, "value": value }))
}

/// The OTLP/JSON `ExportTraceServiceRequest` of `spans`.
fn request(spans: &[Span]) -> Value {
    let spans: Vec<Value> = spans
        .iter()
        .map(|span| {
            let l = &span.line;
            let attributes: Vec<Value> = [
                ("kvgate.request_id", json!(l.request_id)),
                ("kvgate.tenant", json!(l.tenant)),
                ("kvgate.priority", json!(l.priority)),
                ("kvgate.decision", json!(l.decision)),
                ("http.response.status_code", json!(l.status)),
                ("kvgate.queue_wait_ms", json!(l.queue_wait_ms)),
                ("kvgate.upstream", json!(l.upstream)),
                ("kvgate.upstream_status", json!(l.upstream_status)),
                ("kvgate.ttft_ms", json!(l.ttft_ms)),
                ("kvgate.tokens_in", json!(l.tokens_in)),
                ("kvgate.tokens_out", json!(l.tokens_out)),
            ]
            .into_iter()
            .filter_map(|(k, v)| attribute(k, v))
            .collect();
            json!({
                "traceId": l.trace_id,
                "spanId": l.span_id,
                "parentSpanId": l.parent_span_id.clone().unwrap_or_default(),
                "name": "POST completion",
                "kind": 2,
                "startTimeUnixNano": span.start_unix_nanos.to_string(),
                "endTimeUnixNano": span.end_unix_nanos.to_string(),
                "attributes": attributes,
                "status": { "code": if l.status >= 500 { 2 } else { 0 } },
            })
        })
        .collect();
    json!({
        "resourceSpans": [{
            "resource": { "attributes": [{ "key": "service.name", "value": { "stringValue": "kvgate-gateway" } }] },
            "scopeSpans": [{ "scope": { "name": "kvgate-gateway", "version": env!("CARGO_PKG_VERSION") }, "spans": spans }],
        }]
    })
}
