//! [`within`]: a time limit for calls that must return promptly.

use std::sync::mpsc;
use std::time::Duration;

/// Runs `f` on its own thread and returns its result, or fails the test if it does not return within
/// `limit` (a hang or an absurdly slow path) or panics. On failure the thread is left behind; the test
/// process ends anyway.
///
/// # Panics
///
/// When `f` takes longer than `limit` or panics, naming `what`.
pub fn within<T: Send + 'static>(limit: Duration, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(value) => value,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: no answer within {limit:?} (hung?)"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: panicked"),
    }
}
