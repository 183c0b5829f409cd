//! Serving connections so that hostile or broken clients cannot hold the gateway's resources:
//!
//! - **a connection cap** (`--max-connections`): at the cap, the listener stops accepting, and new
//!   connections wait in the kernel's backlog;
//! - **a header deadline** (`--header-timeout`): a request's headers must arrive within it (a client
//!   trickling them a byte a second gets `408 Request Timeout` and the connection is closed), and an idle
//!   keep-alive connection is closed after it;
//! - **a send deadline** (`--send-timeout`): a write to the client that stays blocked that long (the
//!   client stopped reading, its window is full) fails, the connection is closed, and the response body —
//!   with the permit inside — is dropped, returning the capacity. Without it, a client that never reads
//!   pins its slot for as long as it keeps the connection open;
//! - **graceful shutdown**: when the shutdown future resolves, the listener closes, idle connections
//!   close, and running answers get `--shutdown-grace` to finish.
//!
//! The body deadline (`--body-timeout`, also 408) is enforced where the body is read (`server.rs`).

use crate::metrics;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::Sleep;

/// How connections are served.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// Longest time to receive a request's headers, and longest keep-alive idle time.
    pub header_timeout: Duration,
    /// Longest time a write to the client may stay blocked.
    pub send_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
    /// After shutdown starts, how long running answers may take.
    pub shutdown_grace: Duration,
}

/// The answer to a request whose headers did not arrive in time (then the connection is closed).
const REQUEST_TIMEOUT: &[u8] = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 134\r\n\r\n{\"error\":{\"message\":\"the request headers did not arrive in time\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":\"header_timeout\"}}";

/// Serves `service` on `listener` until `shutdown` resolves, then lets running answers finish for up to
/// `shutdown_grace`.
///
/// # Errors
///
/// None so far: accept errors (out of file descriptors) are logged and retried after a pause.
pub async fn serve(
    listener: TcpListener,
    service: axum::Router,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(options.max_connections));
    let open = Arc::new(AtomicUsize::new(0));
    let (closing, closing_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => slot.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // EMFILE and friends: wait for descriptors to come back instead of spinning.
                    eprintln!("kvgate-gateway: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = service.clone();
        let mut closing = closing_rx.clone();
        let open = Arc::clone(&open);
        metrics::connections(open.fetch_add(1, Ordering::Relaxed) + 1);
        tokio::spawn(async move {
            connection(stream, service, options, &mut closing).await;
            metrics::connections(open.fetch_sub(1, Ordering::Relaxed) - 1);
            drop(slot);
        });
    }
    drop(listener);
    let _ = closing.send(true);
    // Every connection holds a slot until it ends: all slots back means all connections done.
    let all = u32::try_from(options.max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(options.shutdown_grace, slots.acquire_many(all)).await.is_err() {
        eprintln!(
            "kvgate-gateway: {} connections still open after the shutdown grace period",
            open.load(Ordering::Relaxed)
        );
    }
    Ok(())
}

/// Serves one connection until it ends, fails a deadline, or shutdown closes it.
async fn connection(
    stream: TcpStream,
    service: axum::Router,
    options: ServeOptions,
    closing: &mut watch::Receiver<bool>,
) {
    let io = ClientIo::new(stream, options.send_timeout);
    let service = TowerToHyperService::new(service);
    let mut conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_timeout)
        .serve_connection(TokioIo::new(io), service);
    let result = tokio::select! {
        result = &mut conn => result,
        _ = closing.changed() => {
            Pin::new(&mut conn).graceful_shutdown();
            (&mut conn).await
        }
    };
    let Err(error) = result else { return };
    if is_send_timeout(&error) {
        metrics::connection_closed("send_timeout");
    } else if error.is_timeout() {
        metrics::connection_closed("header_timeout");
        // Bytes hyper read but could not parse yet are a request cut short (also one pipelined behind an
        // answered one); an idle keep-alive connection has none but, at most, the empty lines a client may
        // send between requests (RFC 9112, 2.2). Best effort: tell the client why.
        let parts = conn.into_parts();
        if parts.read_buf.iter().any(|b| !matches!(b, b'\r' | b'\n')) {
            let _ = parts.io.into_inner().stream.try_write(REQUEST_TIMEOUT);
        }
    }
}

/// Whether the send deadline is why the connection failed (it is among `error`'s sources).
fn is_send_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(e) = source {
        let inner = e.downcast_ref::<io::Error>().and_then(io::Error::get_ref);
        if e.is::<SendTimedOut>() || inner.is_some_and(|inner| inner.is::<SendTimedOut>()) {
            return true;
        }
        source = e.source();
    }
    false
}

/// A write to the client stayed blocked for the send deadline.
#[derive(Debug, thiserror::Error)]
#[error("the client has read nothing for {0:?}: closing the connection")]
pub struct SendTimedOut(Duration);

/// The client's socket as hyper sees it: reads as they come, writes that fail once one stays blocked
/// for the send deadline. Reads and writes are the socket's own (`TcpStream`'s readiness handling: a
/// short read clears readiness without another system call; vectored writes send headers and body in
/// one call).
struct ClientIo {
    stream: TcpStream,
    send_timeout: Duration,
    /// Running while a write is blocked.
    blocked: Option<Pin<Box<Sleep>>>,
}

impl ClientIo {
    fn new(stream: TcpStream, send_timeout: Duration) -> Self {
        Self { stream, send_timeout, blocked: None }
    }

    /// The outcome of a write: a write that made progress ends the blocked period; one that is blocked
    /// starts it (or fails once it has lasted the send deadline).
    fn written(&mut self, cx: &mut Context<'_>, polled: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        match polled {
            Poll::Ready(Ok(n)) => {
                self.blocked = None;
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                let timeout = self.send_timeout;
                let blocked = self.blocked.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                if blocked.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, SendTimedOut(timeout))));
                }
                Poll::Pending
            }
        }
    }
}

impl AsyncRead for ClientIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for ClientIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.written(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.written(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Writes go straight to the socket: nothing is buffered here.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = socket2::SockRef::from(&self.stream).shutdown(std::net::Shutdown::Write);
        Poll::Ready(match result {
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
            other => other,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_408_answer_says_its_length() {
        let text = std::str::from_utf8(REQUEST_TIMEOUT).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())), "{head}");
        serde_json::from_str::<serde_json::Value>(body).unwrap();
    }
}
