//! The Lua scripts, each sent as `EVALSHA` (one round trip; redis-rs loads a script again by itself
//! when Redis answers `NOSCRIPT`, as after a restart). `lua/common.lua` is prepended to each, so every
//! helper is written once.

use redis::Script;

/// The four scripts.
#[derive(Debug)]
pub(crate) struct Scripts {
    /// One admission decision (lease and rates), or an allowance batch.
    pub(crate) admit: Script,
    /// Gives back leases and unused tokens.
    pub(crate) release: Script,
    /// Renews held leases; registers unleased ones that fit.
    pub(crate) renew: Script,
    /// Reads the shared capacity in use.
    pub(crate) usage: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Self {
            admit: Script::new(concat!(include_str!("lua/common.lua"), include_str!("lua/admit.lua"))),
            release: Script::new(concat!(include_str!("lua/common.lua"), include_str!("lua/release.lua"))),
            renew: Script::new(concat!(include_str!("lua/common.lua"), include_str!("lua/renew.lua"))),
            usage: Script::new(concat!(include_str!("lua/common.lua"), include_str!("lua/usage.lua"))),
        }
    }
}
