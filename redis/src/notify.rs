//! Listens for released capacity (`PUBLISH` by the release, renewal and admission scripts when they
//! free a lease) and wakes the head of this replica's line.
//!
//! Pub/sub delivers at most once: a message lost while the connection is down is covered by the line's
//! poll interval, and every reconnection wakes the head once, since something may have been freed
//! meanwhile.

use crate::core::Core;
use futures::StreamExt;
use std::sync::Weak;
use std::time::Duration;
use tokio::sync::watch;

/// Runs until `shutdown` is dropped or the core is gone.
pub(crate) async fn listen(
    core: Weak<Core>,
    client: redis::Client,
    channel: String,
    mut shutdown: watch::Receiver<()>,
    retry: Duration,
) {
    loop {
        let connect = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        let connected = tokio::select! {
            connected = tokio::time::timeout(retry.max(Duration::from_millis(100)), connect) => connected,
            _ = shutdown.changed() => return,
        };
        if let Ok(Ok(mut pubsub)) = connected {
            match core.upgrade() {
                Some(core) => core.line.wake_head(),
                None => return,
            }
            let mut messages = pubsub.on_message();
            loop {
                tokio::select! {
                    message = messages.next() => match (message, core.upgrade()) {
                        (Some(_), Some(core)) => core.line.wake_head(),
                        (None, Some(_)) => break,
                        (_, None) => return,
                    },
                    _ = shutdown.changed() => return,
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(retry) => {}
            _ = shutdown.changed() => return,
        }
    }
}
