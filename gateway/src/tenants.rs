//! API keys → tenants: who a request counts against, its priority class and its limits.
//!
//! With no key configured the gateway asks for none: requests meet the global limits, or count against a
//! tenant named by a header (`--tenant-header`) or the OpenAI `user` field (`--tenant-from-user`). With
//! keys, every request needs `Authorization: Bearer <key>` with a configured key (else 401), and counts
//! against the key's tenant: its own limits (or `[tenant_defaults]`), budgets, fair queueing and
//! priority. The client's key is never sent upstream then (`--upstream-api-key` is).
//!
//! The names are what operators see: in `/metrics` labels and in logs, never the 64-bit
//! [`kvgate::TenantId`] hash.

use crate::keys::{KeyHash, KeyTable};
use kvgate::{Priority, TenantId, TenantLimits};
use serde::Deserialize;

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
    /// These limits, each unset one taken from `defaults` (a tenant's own limits over
    /// `[tenant_defaults]`).
    pub fn or(&self, defaults: Option<&TenantLimitsConfig>) -> TenantLimitsConfig {
        let Some(d) = defaults else { return self.clone() };
        TenantLimitsConfig {
            max_in_flight: self.max_in_flight.or(d.max_in_flight),
            kv_share: self.kv_share.or(d.kv_share),
            request_rate: self.request_rate.or(d.request_rate),
            request_burst: if self.request_rate.is_some() {
                self.request_burst
            } else {
                self.request_burst.or(d.request_burst)
            },
            token_rate: self.token_rate.or(d.token_rate),
            token_burst: if self.token_rate.is_some() { self.token_burst } else { self.token_burst.or(d.token_burst) },
            weight: self.weight.or(d.weight),
        }
    }

    /// The request rate and its burst (default `max(1, rate)`), if a rate is set.
    pub fn request_rate_and_burst(&self) -> Option<(f64, u32)> {
        let rate = self.request_rate?;
        Some((rate, self.request_burst.unwrap_or((rate.ceil().max(1.0)).min(f64::from(u32::MAX)) as u32)))
    }

    /// The token rate and its burst (default `10 × rate`), if a rate is set.
    pub fn token_rate_and_burst(&self) -> Option<(f64, u64)> {
        let rate = self.token_rate?;
        Some((rate, self.token_burst.unwrap_or((rate * 10.0).ceil().min(u64::MAX as f64) as u64)))
    }

    /// The admission's form.
    pub fn to_limits(&self) -> TenantLimits {
        let mut limits = TenantLimits::new();
        if let Some(n) = self.max_in_flight {
            limits = limits.max_in_flight(n);
        }
        if let Some(share) = self.kv_share {
            limits = limits.kv_share(share);
        }
        if let Some((rate, burst)) = self.request_rate_and_burst() {
            limits = limits.request_rate(rate, burst);
        }
        if let Some((rate, burst)) = self.token_rate_and_burst() {
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

/// One configured API key: the key (`sha256:<hex>` or plain) and, optionally, a priority class of its
/// own (a batch-jobs key of an interactive tenant, say).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum KeyConfig {
    /// `"sha256:..."` or a plain key: the tenant's priority.
    Key(String),
    /// `{ key = "sha256:...", priority = "batch" }`.
    WithPriority {
        /// `sha256:<hex>` or a plain key.
        key: String,
        /// The class of requests made with this key (default: the tenant's).
        priority: Option<PriorityConfig>,
    },
}

impl KeyConfig {
    /// The key as configured (`sha256:...` or plain).
    pub fn key(&self) -> &str {
        match self {
            KeyConfig::Key(key) | KeyConfig::WithPriority { key, .. } => key,
        }
    }
}

impl From<&str> for KeyConfig {
    fn from(key: &str) -> Self {
        KeyConfig::Key(key.to_owned())
    }
}

/// One tenant: its name, its API keys, its priority, limits and budgets (`[[tenants]]` in the config
/// file).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// The name, as in metrics and logs.
    pub name: String,
    /// API keys that count against this tenant (`sha256:<hex>`, or plain keys hashed when read).
    #[serde(default)]
    pub keys: Vec<KeyConfig>,
    /// Priority class of its requests.
    #[serde(default)]
    pub priority: PriorityConfig,
    /// Prompt + output tokens it may use per day (UTC), if limited.
    #[serde(default)]
    pub daily_tokens: Option<u64>,
    /// Prompt + output tokens it may use per calendar month (UTC), if limited.
    #[serde(default)]
    pub monthly_tokens: Option<u64>,
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
    /// Its priority class (the key's, else the tenant's).
    pub priority: Priority,
}

impl Caller {
    /// A caller named by a header or the OpenAI `user` field (no key): the normal class.
    pub fn named(name: &str) -> Self {
        Self { name: name.into(), id: TenantId::from(name), priority: Priority::Normal }
    }
}

pub use crate::keys::KeyError;

/// Key lookup: from a bearer token to its tenant.
#[derive(Debug, Default)]
pub struct Keys {
    table: KeyTable<Caller>,
}

impl Keys {
    /// The lookup for `tenants`.
    ///
    /// # Errors
    ///
    /// A message for a tenant without a name, two tenants of one name, a malformed key, or a key given
    /// twice.
    pub fn new(tenants: &[TenantConfig]) -> Result<Self, String> {
        let mut table = KeyTable::default();
        let mut names = std::collections::HashSet::new();
        for tenant in tenants {
            if tenant.name.is_empty()
                || tenant.name.len() > MAX_TENANT_NAME
                || tenant.name.chars().any(char::is_control)
            {
                return Err(format!(
                    "tenant {:?}: every tenant needs a name of 1 to {MAX_TENANT_NAME} printable characters",
                    tenant.name
                ));
            }
            if !names.insert(tenant.name.as_str()) {
                return Err(format!("tenant {:?} is configured twice", tenant.name));
            }
            for key in &tenant.keys {
                let hash = KeyHash::parse(key.key()).map_err(|e| format!("tenant {:?}: {e}", tenant.name))?;
                let priority = match key {
                    KeyConfig::WithPriority { priority: Some(p), .. } => *p,
                    _ => tenant.priority,
                };
                let caller = Caller {
                    name: tenant.name.as_str().into(),
                    id: TenantId::from(tenant.name.as_str()),
                    priority: priority.into(),
                };
                if !table.insert(hash, caller) {
                    return Err(format!("tenant {:?}: a key is configured twice", tenant.name));
                }
            }
        }
        Ok(Self { table })
    }

    /// Whether keys are required (some key is configured).
    pub fn required(&self) -> bool {
        !self.table.is_empty()
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
        self.table.resolve(headers).map(Some)
    }
}

/// The longest tenant name (config, header or `user` field).
pub const MAX_TENANT_NAME: usize = 128;

/// The header a request may lower its priority with (`batch`, `normal`, `interactive`).
pub const PRIORITY_HEADER: &str = "x-kvgate-priority";
const PRIORITY: http::HeaderName = http::HeaderName::from_static(PRIORITY_HEADER);

/// The priority of a request: its caller's, lowered (never raised) by [`PRIORITY_HEADER`].
///
/// # Errors
///
/// A message when the header is not one of the classes.
///
/// # Examples
///
/// ```
/// use kvgate::Priority;
/// use kvgate_gateway::tenants::request_priority;
///
/// let mut headers = http::HeaderMap::new();
/// headers.insert("x-kvgate-priority", "batch".parse().unwrap());
/// assert_eq!(request_priority(Priority::Interactive, &headers), Ok(Priority::Batch));
/// headers.insert("x-kvgate-priority", "interactive".parse().unwrap());
/// assert_eq!(request_priority(Priority::Normal, &headers), Ok(Priority::Normal)); // only lowers
/// ```
pub fn request_priority(caller: Priority, headers: &http::HeaderMap) -> Result<Priority, String> {
    let Some(value) = headers.get(PRIORITY) else { return Ok(caller) };
    let asked = match value.to_str().map(str::trim) {
        Ok("batch") => Priority::Batch,
        Ok("normal") => Priority::Normal,
        Ok("interactive") => Priority::Interactive,
        _ => return Err(format!("{PRIORITY_HEADER} must be batch, normal or interactive")),
    };
    Ok(asked.min(caller))
}

/// A tenant name from a header or the `user` field: trimmed, 1 to [`MAX_TENANT_NAME`] bytes, no
/// control characters; `None` otherwise.
pub fn tenant_name(value: &str) -> Option<&str> {
    let value = value.trim();
    (!value.is_empty() && value.len() <= MAX_TENANT_NAME && !value.chars().any(char::is_control)).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_resolve_to_tenants() {
        let tenants = [TenantConfig {
            name: "alice".into(),
            keys: vec![
                "sk-a".into(),
                KeyConfig::Key(KeyHash::of("sk-b").to_string()),
                KeyConfig::WithPriority { key: "sk-c".into(), priority: Some(PriorityConfig::Batch) },
            ],
            priority: PriorityConfig::Interactive,
            ..TenantConfig::default()
        }];
        let keys = Keys::new(&tenants).unwrap();
        let mut headers = http::HeaderMap::new();
        assert_eq!(keys.caller(&headers), Err(KeyError::Missing));
        headers.insert(http::header::AUTHORIZATION, "Bearer sk-b".parse().unwrap());
        let caller = keys.caller(&headers).unwrap().unwrap();
        assert_eq!((&*caller.name, caller.priority), ("alice", Priority::Interactive));
        headers.insert(http::header::AUTHORIZATION, "Bearer sk-c".parse().unwrap());
        assert_eq!(keys.caller(&headers).unwrap().unwrap().priority, Priority::Batch, "the key's own class");
        headers.insert(http::header::AUTHORIZATION, "Bearer sk-x".parse().unwrap());
        assert_eq!(keys.caller(&headers), Err(KeyError::Unknown));
        assert_eq!(Keys::new(&[]).unwrap().caller(&headers), Ok(None));
        let twice = [tenants[0].clone(), TenantConfig { name: "bob".into(), ..tenants[0].clone() }];
        assert!(Keys::new(&twice).is_err());
        let same_name = [tenants[0].clone(), TenantConfig { keys: vec!["sk-z".into()], ..tenants[0].clone() }];
        assert!(Keys::new(&same_name).unwrap_err().contains("twice"));
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
        let keyed = toml::from_str::<File>(
            "[[tenants]]\nname = \"a\"\ndaily_tokens = 5\nkeys = [\"k\", { key = \"j\", priority = \"batch\" }]\n",
        )
        .unwrap();
        assert_eq!(keyed.tenants[0].daily_tokens, Some(5));
        assert_eq!(
            keyed.tenants[0].keys[1],
            KeyConfig::WithPriority { key: "j".into(), priority: Some(PriorityConfig::Batch) }
        );
    }
}

#[cfg(test)]
mod defaults_tests {
    use super::*;

    #[test]
    fn a_tenants_own_limits_go_over_the_defaults() {
        let defaults = TenantLimitsConfig {
            max_in_flight: Some(4),
            request_rate: Some(2.0),
            request_burst: Some(9),
            ..Default::default()
        };
        let own = TenantLimitsConfig { request_rate: Some(5.0), weight: Some(3), ..Default::default() };
        let merged = own.or(Some(&defaults));
        assert_eq!((merged.max_in_flight, merged.request_rate, merged.weight), (Some(4), Some(5.0), Some(3)));
        assert_eq!(merged.request_burst, None, "a burst goes with its own rate");
        assert_eq!(TenantLimitsConfig::default().or(Some(&defaults)), defaults);
    }
}
