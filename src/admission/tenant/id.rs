//! Tenant keys.

use std::fmt;

/// A tenant's key: a user, a team or an API key, hashed to 64 bits. Cheap to copy.
///
/// # Examples
///
/// ```
/// use kvgate::TenantId;
///
/// assert_eq!(TenantId::from("alice"), TenantId::from("alice"));
/// assert_ne!(TenantId::from("alice"), TenantId::from("bob"));
/// assert_eq!(TenantId::from(42u64).get(), 42);
/// assert_eq!(TenantId::from(42u64).to_string(), "tenant-000000000000002a");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TenantId(u64);

impl TenantId {
    /// The key as a number.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl From<u64> for TenantId {
    fn from(id: u64) -> Self {
        Self(id)
    }
}

impl From<&str> for TenantId {
    /// FNV-1a over the bytes: stable across runs and platforms.
    fn from(name: &str) -> Self {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in name.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        Self(hash)
    }
}

impl From<&String> for TenantId {
    fn from(name: &String) -> Self {
        Self::from(name.as_str())
    }
}

impl fmt::Display for TenantId {
    /// `tenant-` and the key in 16 hex digits: the label of a tenant configured without a name.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tenant-{:016x}", self.0)
    }
}

/// Whose fair queue a waiter joins: requests without a tenant share one flow, each tracked tenant has its
/// own, and the shared overflow tenant has one. Distinct even where the numbers coincide (`TenantId(0)` is
/// not "no tenant").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum FlowKey {
    /// Requests that named no tenant.
    Anonymous,
    /// A tracked tenant.
    Tenant(TenantId),
    /// Tenants crowded out of the registry, sharing the overflow state.
    Overflow,
}

impl std::hash::Hash for FlowKey {
    /// One `u64` per key (the fair queue's hasher mixes it with one multiply); the two special keys may
    /// collide with a tenant's hash, which only costs an equality check.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(match self {
            FlowKey::Anonymous => 0x9e37_79b9_7f4a_7c15,
            FlowKey::Tenant(id) => id.get(),
            FlowKey::Overflow => 0xc2b2_ae3d_27d4_eb4f,
        });
    }
}
