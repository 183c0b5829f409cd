//! The deployment example: `deploy/gateway.toml` parses, builds a gateway, and is the example printed in
//! the gateway's README word for word.

use kvgate_gateway::{Config, Gateway};

fn repository() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

#[test]
fn the_example_config_builds_a_gateway() {
    let path = repository().join("deploy/gateway.toml");
    let config = Config::from_args(["kvgate-gateway", "--config-file", path.to_str().unwrap()]).unwrap();
    assert_eq!(config.upstreams.len(), 2);
    assert_eq!(config.tenants.len(), 4);
    assert!(config.admin_listen.unwrap().ip().is_loopback());
    let gateway = Gateway::new(config).unwrap();
    let (a, b) = (&gateway.upstreams()[0], &gateway.upstreams()[1]);
    let (a, b) = (a.limiter.local().snapshot(), b.limiter.local().snapshot());
    assert!(a.kv_capacity > b.kv_capacity, "an H100 holds more KV than an L4");
    assert_eq!(gateway.admission().snapshot().kv_capacity, a.kv_capacity + b.kv_capacity);
    assert_eq!(gateway.admission().snapshot().max_in_flight, 128 + 32);
}

#[test]
fn the_readme_prints_the_example_config() {
    let readme = std::fs::read_to_string(repository().join("gateway/README.md")).unwrap();
    let example = std::fs::read_to_string(repository().join("deploy/gateway.toml")).unwrap();
    let section = readme.split("## Deploy the gateway").nth(1).expect("a Deploy the gateway section");
    let block = section.split("```toml\n").nth(1).and_then(|b| b.split("```").next()).expect("a toml block");
    assert_eq!(block, example, "gateway/README.md and deploy/gateway.toml differ");
}

#[test]
fn the_readme_documents_every_flag() {
    use clap::CommandFactory;
    let readme = std::fs::read_to_string(repository().join("gateway/README.md")).unwrap();
    let settings =
        readme.split("## Settings").nth(1).and_then(|s| s.split("\n## ").next()).expect("a Settings section");
    let command = kvgate_gateway::settings::Settings::command();
    let flags: Vec<_> = command.get_arguments().filter_map(|a| a.get_long()).filter(|f| *f != "help").collect();
    assert!(flags.len() > 30, "{flags:?}");
    let missing: Vec<_> = flags.iter().filter(|f| !settings.contains(&format!("`--{f}"))).collect();
    assert!(missing.is_empty(), "the Settings table of gateway/README.md lacks {missing:?}");
}
