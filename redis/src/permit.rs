//! [`SharedPermit`]: the local permit, the shared lease and the shared rate charges of one request,
//! given back together, exactly once.

use crate::core::{Core, Work};
use crate::fallback::FallbackPermit;
use crate::leases::LeaseSignal;
use crate::store::Charge;
use kvgate::Permit;
use std::fmt;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;

/// What a permit charged to the shared token buckets, so that `complete` refunds exactly the unused part.
#[derive(Debug, Default)]
pub(crate) struct TokenCharges {
    /// Charges made in Redis (global and the tenant's token buckets).
    pub(crate) redis: Vec<Charge>,
    /// Tokens taken from the local allowance (refunds return there).
    pub(crate) allowance: u64,
}

/// The lease a permit holds in Redis.
#[derive(Debug)]
pub(crate) struct HeldLease {
    pub(crate) seq: u64,
    pub(crate) signal: Arc<LeaseSignal>,
}

/// Capacity granted to one request by the local admission and the shared limits. Dropping it gives
/// everything back, once.
///
/// It holds the local [`kvgate::Permit`] (or, while Redis was down under
/// [`FailPolicy::Open`](crate::FailPolicy::Open), the fail-open one) and the lease of its shared slot
/// and KV units. Drop cannot wait for Redis: the lease id goes to the replica's background task, which
/// gives it back in the next batch (within one round trip when Redis answers); if that never happens —
/// the process is killed, Redis is unreachable — the lease expires within the lease time.
///
/// Move it into the response stream, as for the local permit, so that it lives exactly as long as the
/// generation. `Send + Sync + 'static`.
pub struct SharedPermit {
    pub(crate) local: Option<Permit>,
    pub(crate) fallback: Option<FallbackPermit>,
    pub(crate) lease: Option<HeldLease>,
    pub(crate) tokens: TokenCharges,
    pub(crate) max_new_tokens: u32,
    pub(crate) kv: u64,
    pub(crate) refunds: Vec<Charge>,
    pub(crate) core: Arc<Core>,
    pub(crate) work: UnboundedSender<Work>,
}

impl SharedPermit {
    /// Ends the generation having produced `output_tokens`: refunds the unused part of the token
    /// reservation (`max_new_tokens - output_tokens`) to every token bucket charged — the local
    /// admission's, the shared global and tenant buckets in Redis (in the background), the local
    /// allowance — then drops the permit.
    pub fn complete(mut self, output_tokens: u32) {
        let unused = u64::from(self.max_new_tokens.saturating_sub(output_tokens));
        if let Some(local) = self.local.take() {
            local.complete(output_tokens);
        }
        if let Some(fallback) = &mut self.fallback {
            fallback.complete(output_tokens);
        }
        if unused > 0 {
            if let Some(pool) = &self.core.allowance {
                pool.refund(self.tokens.allowance.min(unused));
            }
            self.refunds = std::mem::take(&mut self.tokens.redis)
                .into_iter()
                .map(|mut charge| {
                    charge.n = charge.n.min(unused);
                    charge
                })
                .collect();
        }
    }

    /// KV units this permit holds in the shared budget (and in the local one).
    pub fn kv_reserved(&self) -> u64 {
        self.kv
    }

    /// Whether the shared slot and KV units are leased in Redis, as of this replica's last renewal.
    ///
    /// `false` for a permit of the fail-open policy until the renewal registered it, for one whose lease
    /// was found gone (Redis lost its state, or this replica was cut off for longer than the lease time)
    /// and did not fit the budget again, and for requests that lease nothing (no shared capacity).
    pub fn is_leased(&self) -> bool {
        self.lease.as_ref().is_some_and(|l| {
            !l.signal.is_lost() && self.core.leases.state(l.seq) == Some(crate::leases::LeaseState::Held)
        })
    }

    /// Whether this permit was granted by the fail-open policy while Redis did not answer.
    pub fn is_fallback(&self) -> bool {
        self.fallback.is_some()
    }

    /// Resolves when this permit's lease is lost: a renewal found it gone and the budget had no room to
    /// register it again, so other replicas may be using its capacity. An application that must never
    /// overcommit the engine can stop the generation then (`tokio::select!` on it next to the stream).
    /// Pending for ever for a permit that holds no lease.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future loses nothing; a new call resolves at once if the lease is lost.
    pub async fn lease_lost(&self) {
        match &self.lease {
            Some(lease) => lease.signal.lost().await,
            None => std::future::pending().await,
        }
    }

    /// The local permit, if the local admission granted this request (always, except for permits of
    /// the fail-open policy, which hold the fail-open admission's).
    pub fn local(&self) -> Option<&Permit> {
        self.local.as_ref().or(self.fallback.as_ref().and_then(FallbackPermit::permit))
    }
}

impl Drop for SharedPermit {
    fn drop(&mut self) {
        let lease = self.lease.take().filter(|l| self.core.leases.remove(l.seq)).map(|l| self.core.leases.id(l.seq));
        let refunds = std::mem::take(&mut self.refunds);
        if lease.is_some() || !refunds.is_empty() {
            // If the background task is gone (the admission and every other permit were dropped), the
            // lease expires on its own.
            let _ = self.work.send(Work::Release { lease, refunds });
        }
    }
}

impl fmt::Debug for SharedPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedPermit")
            .field("kv", &self.kv)
            .field("leased", &self.is_leased())
            .field("fallback", &self.is_fallback())
            .finish_non_exhaustive()
    }
}
