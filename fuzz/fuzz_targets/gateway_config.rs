//! The gateway's config file: arbitrary text through the TOML reader, the checks that make a `Config`,
//! and the building of a gateway from it (admissions, upstreams, keys, tenants, budgets).
//!
//! It never panics or hangs: text is refused with a message, or makes a configuration that builds a
//! gateway or is refused with a `ConfigError`. A refused configuration's message is never empty, and
//! never shows a configured key. Paths the text names are not read or written: the state file, the
//! request log and a model's config.json are cleared before the gateway is built.
#![no_main]

use kvgate_gateway::settings::Settings;
use kvgate_gateway::{Config, Gateway};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap())
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let settings = match Settings::from_toml(text) {
        Ok(settings) => settings,
        Err(message) => {
            assert!(!message.is_empty());
            return;
        }
    };
    let keys: Vec<String> = settings
        .tenants
        .iter()
        .flat_map(|t| t.keys.iter())
        .map(|k| k.key().trim().to_owned())
        .filter(|k| k.len() >= 8)
        .collect();
    let config: Config = match settings.into_config() {
        Ok(config) => config,
        Err(error) => {
            assert!(!error.to_string().is_empty());
            return;
        }
    };
    let config = Config { state_file: None, request_log: None, model_config: None, redis: None, ..config };
    let built = runtime().block_on(async { Gateway::new(config) });
    if let Err(error) = built {
        let message = error.to_string();
        assert!(!message.is_empty());
        for key in &keys {
            assert!(!message.contains(key.as_str()), "a refusal shows a key: {message}");
        }
    }
});
