//! [`proptest_config`]: how many cases a property test runs.

use proptest::test_runner::Config;

/// A proptest configuration with `default` cases, or `PROPTEST_CASES` when set (for longer runs:
/// `PROPTEST_CASES=10000 cargo test --release --test bucket_proptest`). Under miri: at most 4 cases and no
/// regression file (miri's isolation forbids it).
pub fn proptest_config(default: u32) -> Config {
    let default = if cfg!(miri) { default.min(4) } else { default };
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(default);
    Config {
        cases,
        failure_persistence: if cfg!(miri) { None } else { Config::default().failure_persistence },
        ..Config::default()
    }
}
