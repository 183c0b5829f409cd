//! The demo behind the README's main command, `cargo run --release --example demo`: the kvgate gateway
//! (`kvgate-gateway`, simulated engine) in this process, and a company's worth of employees sending it
//! chat requests over real HTTP. See `examples/demo.rs`.
//!
//! This crate has no library API; it exists so that the demo compiles only what it runs.
