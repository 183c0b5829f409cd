//! [`Limiter`]: the admission one set of limits is kept by — an in-process [`kvgate::Admission`], or,
//! with `--redis`, a [`kvgate_redis::SharedAdmission`] whose limits every gateway replica shares — and
//! [`LimiterPermit`], its grant, which the adapters hold as a [`Complete`] permit.

use kvgate::stream::Complete;
use kvgate::{Admission, Permit, Rejection, Request};

/// Where one set of limits is kept.
#[derive(Debug, Clone)]
pub enum Limiter {
    /// In this process.
    Local(Admission),
    /// In Redis, shared by every replica (with this process's admission in front of it).
    #[cfg(feature = "redis")]
    Shared(kvgate_redis::SharedAdmission),
}

/// A grant of a [`Limiter`].
#[derive(Debug)]
pub enum LimiterPermit {
    /// Of an in-process admission.
    Local(Permit),
    /// Of a shared admission (boxed: it is three times the size of a local one).
    #[cfg(feature = "redis")]
    Shared(Box<kvgate_redis::SharedPermit>),
}

impl Complete for LimiterPermit {
    fn complete(self, output_tokens: u32) {
        match self {
            LimiterPermit::Local(permit) => permit.complete(output_tokens),
            #[cfg(feature = "redis")]
            LimiterPermit::Shared(permit) => (*permit).complete(output_tokens),
        }
    }
}

impl Limiter {
    /// The in-process admission (the whole limiter, or the local part of a shared one).
    pub fn local(&self) -> &Admission {
        match self {
            Limiter::Local(admission) => admission,
            #[cfg(feature = "redis")]
            Limiter::Shared(shared) => shared.local(),
        }
    }

    /// Whether its limits are shared through Redis (capacity freed by another replica is not announced
    /// to this process: whoever waits for it polls).
    pub fn is_shared(&self) -> bool {
        !matches!(self, Limiter::Local(_))
    }

    /// Admits now or refuses.
    ///
    /// # Errors
    ///
    /// The [`Rejection`]; the request holds nothing then.
    pub async fn try_admit(&self, request: &Request) -> Result<LimiterPermit, Rejection> {
        match self {
            Limiter::Local(admission) => admission.try_admit(request).map(LimiterPermit::Local),
            #[cfg(feature = "redis")]
            Limiter::Shared(shared) => shared.try_admit(request).await.map(|p| LimiterPermit::Shared(Box::new(p))),
        }
    }

    /// Admits, waiting as the admission is configured.
    ///
    /// # Errors
    ///
    /// The [`Rejection`]; the request holds nothing then.
    pub async fn admit(&self, request: &Request) -> Result<LimiterPermit, Rejection> {
        match self {
            Limiter::Local(admission) => admission.admit(request).await.map(LimiterPermit::Local),
            #[cfg(feature = "redis")]
            Limiter::Shared(shared) => shared.admit(request).await.map(|p| LimiterPermit::Shared(Box::new(p))),
        }
    }

    /// Stops admitting; waiters get [`Rejection::Closed`].
    pub fn close(&self) {
        match self {
            Limiter::Local(admission) => admission.close(),
            #[cfg(feature = "redis")]
            Limiter::Shared(shared) => shared.close(),
        }
    }
}
