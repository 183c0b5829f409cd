//! Helpers shared by kvgate's integration tests (`tests/*.rs`), fuzz targets (`fuzz/fuzz_targets/*.rs`) and
//! benches: one home for each, so that a test and a fuzz target of the same API check the same thing.
//!
//! | module | holds | used by |
//! |---|---|---|
//! | [`bucket`] | the exact sequential model of a token bucket and a harness that steps a real bucket with it | `bucket_proptest`, fuzz `bucket_ops` |
//! | [`admission`] | the exact sequential model of an admission, its harness, [`assert_idle`](admission::assert_idle) | `admission_model`, `bad_inputs`, `fault_injection`, fuzz `admission_ops` |
//! | [`hf`] | the Hugging Face `config.json` vocabulary the parser reads (keys, model types, layer types) | `kv_hf_config_proptest`, fuzz `hf_config_json` |
//! | [`kv`] | [`check_spec`](kv::check_spec): every size function of a parsed spec is total and consistent | `kv_hf_config_proptest`, fuzz `hf_config_bytes` and `hf_config_json` |
//! | [`vllm_blocks`] | a block-by-block simulation of requests sharing a cached prefix under vLLM's allocator | `kv_proptest`, `kv_engine` |
//! | [`within`] | a watchdog: a call that hangs fails the test instead | `bad_inputs`, `fault_injection`, `admission_review` |
//! | [`quiet_panics`] | silence for the panics a test injects on purpose (`injected ...`) | `admission_review`, `fault_injection` |
//! | [`proptest_config`] | case counts (`PROPTEST_CASES`, fewer under miri) | every `*_proptest` and model test |
//! | [`time_on_two_threads`] | the timing loop of a contended bench | benches `bucket`, `admission` |
//!
//! Seeded random numbers come from the crate's own generator, [`kvgate::retry::SplitMix64`].
//!
//! Everything here returns a mismatch as `Err(String)` where a property test and a fuzz target both call
//! it (proptest turns it into a failed case, a fuzz target panics with it), and panics where only tests do.

pub mod admission;
pub mod bucket;
pub mod hf;
pub mod kv;
mod panics;
mod threads;
pub mod vllm_blocks;
mod watchdog;

#[cfg(feature = "proptest")]
mod cases;

#[cfg(feature = "proptest")]
pub use cases::proptest_config;
pub use panics::quiet_panics;
pub use threads::time_on_two_threads;
pub use watchdog::within;
