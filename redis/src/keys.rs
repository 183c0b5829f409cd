//! The Redis keys of one set of shared limits, all under `kvgate:{name}:` (the braces put them in one
//! Redis Cluster slot, which a multi-key script needs).
//!
//! | key | type | holds | lives |
//! |---|---|---|---|
//! | `gen` | string | the generation: when Redis lost its state, it is missing | a day after its last use |
//! | `recovery` | string | end of the recovery window after a lost state | the window |
//! | `leases` | sorted set | lease id -> expiry (µs) | twice the lease time after the last write |
//! | `units` | hash | lease id -> `slots:kv` | as `leases` |
//! | `used` | hash | `slots`, `kv`: the sums over the leases | as `leases` |
//! | `rate:req`, `rate:tok` | string | global buckets, `tat_us:frac` | until the bucket is full again |
//! | `t:<id>:req`, `t:<id>:tok` | string | a tenant's buckets | until the bucket is full again |
//! | `freed` | pub/sub channel | announces released capacity | — |

use kvgate::TenantId;

/// Key names for one set of limits.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    pub(crate) fn new(name: &str) -> Self {
        Self { prefix: format!("kvgate:{{{name}}}:") }
    }

    fn key(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.prefix)
    }

    pub(crate) fn generation(&self) -> String {
        self.key("gen")
    }

    pub(crate) fn recovery(&self) -> String {
        self.key("recovery")
    }

    pub(crate) fn leases(&self) -> String {
        self.key("leases")
    }

    pub(crate) fn units(&self) -> String {
        self.key("units")
    }

    pub(crate) fn used(&self) -> String {
        self.key("used")
    }

    pub(crate) fn freed(&self) -> String {
        self.key("freed")
    }

    pub(crate) fn requests(&self, tenant: Option<TenantId>) -> String {
        match tenant {
            None => self.key("rate:req"),
            Some(id) => format!("{}t:{:016x}:req", self.prefix, id.get()),
        }
    }

    pub(crate) fn tokens(&self, tenant: Option<TenantId>) -> String {
        match tenant {
            None => self.key("rate:tok"),
            Some(id) => format!("{}t:{:016x}:tok", self.prefix, id.get()),
        }
    }
}
