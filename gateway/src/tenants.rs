//! API keys → tenants: who a request counts against, its priority class and its limits.
//!
//! With no tenant configured the gateway asks for no key, and requests meet only the global limits.
//! With tenants, every request needs `Authorization: Bearer <key>` with a configured key (else 401), and
//! counts against the key's tenant: its own limits (or `[tenant_defaults]`) and fair queueing. The
//! client's key is never sent upstream then (`--upstream-api-key` is).
//!
//! The names are what operators see: in `/metrics` labels and in logs, never the 64-bit
//! [`kvgate::TenantId`] hash.

use kvgate::{Priority, TenantId, TenantLimits};
use serde::Deserialize;
use std::collections::HashMap;

/// Limits of one tenant (or the defaults), as in the config file. Every limit is optional.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantLimitsConfig {
    /// Requests in flight at once.
    pub max_in_flight: Option<usize>,
    /// Share of the KV budget, 0–1.
    pub kv_share: Option<f64>,
    /// Requests per second.
    pub request_rate: Option<f64>,
    /// Request-rate burst (default max(1, rate)).
    pub request_burst: Option<u32>,
    /// Tokens (prompt + max_tokens) per second.
    pub token_rate: Option<f64>,
    /// Token-rate burst (default 10 × rate).
    pub token_burst: Option<u64>,
    /// Weight in fair queueing (default 1).
    pub weight: Option<u32>,
}

impl TenantLimitsConfig {
    /// The admission's form.
    pub fn to_limits(&self) -> TenantLimits {
        let mut limits = TenantLimits::new();
        if let Some(n) = self.max_in_flight {
            limits = limits.max_in_flight(n);
        }
        if let Some(share) = self.kv_share {
            limits = limits.kv_share(share);
        }
        if let Some(rate) = self.request_rate {
            let burst = self.request_burst.unwrap_or((rate.ceil().max(1.0)).min(f64::from(u32::MAX)) as u32);
            limits = limits.request_rate(rate, burst);
        }
        if let Some(rate) = self.token_rate {
            let burst = self.token_burst.unwrap_or((rate * 10.0).ceil().min(u64::MAX as f64) as u64);
            limits = limits.token_rate(rate, burst);
        }
        if let Some(weight) = self.weight {
            limits = limits.weight(weight);
        }
        limits
    }
}

/// The priority class of a tenant's requests, as in the config file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PriorityConfig {
    /// [`Priority::Batch`].
    Batch,
    /// [`Priority::Normal`].
    #[default]
    Normal,
    /// [`Priority::Interactive`].
    Interactive,
}

impl From<PriorityConfig> for Priority {
    fn from(p: PriorityConfig) -> Self {
        match p {
            PriorityConfig::Batch => Priority::Batch,
            PriorityConfig::Normal => Priority::Normal,
            PriorityConfig::Interactive => Priority::Interactive,
        }
    }
}

/// One tenant: its name, its API keys, its priority and limits (`[[tenants]]` in the config file).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// The name, as in metrics and logs.
    pub name: String,
    /// API keys that count against this tenant.
    pub keys: Vec<String>,
    /// Priority class of its requests.
    #[serde(default)]
    pub priority: PriorityConfig,
    /// Its own limits (the defaults where unset).
    #[serde(flatten)]
    pub limits: TenantLimitsConfig,
}

/// A resolved caller: the tenant's name, id and priority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The tenant's name.
    pub name: std::sync::Arc<str>,
    /// Its admission id.
    pub id: TenantId,
    /// Its priority class.
    pub priority: Priority,
}

/// Key lookup: from a bearer token to its tenant.
#[derive(Debug, Default)]
pub struct Keys {
    by_key: HashMap<String, Caller>,
}

/// Why a request has no caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyError {
    /// No `Authorization: Bearer` header.
    Missing,
    /// A key that is not configured.
    Unknown,
}

impl Keys {
    /// The lookup for `tenants`.
    ///
    /// # Errors
    ///
    /// A message for a tenant without a name or keys, or a key given to two tenants.
    pub fn new(tenants: &[TenantConfig]) -> Result<Self, String> {
        let mut by_key = HashMap::new();
        for tenant in tenants {
            if tenant.name.is_empty() || tenant.keys.is_empty() {
                return Err(format!("tenant {:?}: every tenant needs a name and at least one key", tenant.name));
            }
            let caller = Caller {
                name: tenant.name.as_str().into(),
                id: TenantId::from(tenant.name.as_str()),
                priority: tenant.priority.into(),
            };
            for key in &tenant.keys {
                if by_key.insert(key.clone(), caller.clone()).is_some() {
                    return Err(format!("tenant {:?}: a key is given to two tenants", tenant.name));
                }
            }
        }
        Ok(Self { by_key })
    }

    /// Whether keys are required (some tenant is configured).
    pub fn required(&self) -> bool {
        !self.by_key.is_empty()
    }

    /// The caller of a request with these headers: `None` when no keys are configured.
    ///
    /// # Errors
    ///
    /// [`KeyError`] when keys are configured and the request has none, or an unknown one.
    pub fn caller(&self, headers: &http::HeaderMap) -> Result<Option<&Caller>, KeyError> {
        if !self.required() {
            return Ok(None);
        }
        let key = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim)
            .ok_or(KeyError::Missing)?;
        self.by_key.get(key).map(Some).ok_or(KeyError::Unknown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_resolve_to_tenants() {
        let tenants = [TenantConfig {
            name: "alice".into(),
            keys: vec!["sk-a".into(), "sk-b".into()],
            priority: PriorityConfig::Interactive,
            limits: TenantLimitsConfig::default(),
        }];
        let keys = Keys::new(&tenants).unwrap();
        let mut headers = http::HeaderMap::new();
        assert_eq!(keys.caller(&headers), Err(KeyError::Missing));
        headers.insert(http::header::AUTHORIZATION, "Bearer sk-b".parse().unwrap());
        let caller = keys.caller(&headers).unwrap().unwrap();
        assert_eq!((&*caller.name, caller.priority), ("alice", Priority::Interactive));
        headers.insert(http::header::AUTHORIZATION, "Bearer sk-x".parse().unwrap());
        assert_eq!(keys.caller(&headers), Err(KeyError::Unknown));
        assert_eq!(Keys::new(&[]).unwrap().caller(&headers), Ok(None));
        let twice = [tenants[0].clone(), TenantConfig { name: "bob".into(), ..tenants[0].clone() }];
        assert!(Keys::new(&twice).is_err());
    }
}

#[cfg(all(test, feature = "cli"))]
mod file_tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct File {
        tenants: Vec<TenantConfig>,
    }

    #[test]
    fn a_misspelled_tenant_key_is_an_error() {
        let ok = toml::from_str::<File>("[[tenants]]\nname = \"a\"\nkeys = [\"k\"]\nmax_in_flight = 2\n");
        assert_eq!(ok.unwrap().tenants[0].limits.max_in_flight, Some(2));
        let typo = toml::from_str::<File>("[[tenants]]\nname = \"a\"\nkeys = [\"k\"]\nmax_inflight = 2\n");
        assert!(typo.is_err(), "a misspelled limit was ignored");
    }
}
