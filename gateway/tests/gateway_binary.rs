//! The `kvgate-gateway` binary as an operator runs it: a config file with hashed keys, `SIGHUP` reloads
//! it (a broken file is refused and the old configuration runs on), `SIGTERM` stops accepting, lets the
//! running stream finish and exits. Every wait is bounded.
#![cfg(unix)]

use kvgate_gateway::keys::KeyHash;
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const CAP: Duration = Duration::from_secs(30);

struct Gateway {
    child: Child,
    url: String,
    lines: mpsc::Receiver<String>,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(config: &std::path::Path) -> Gateway {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvgate-gateway"))
        .args(["--listen", "127.0.0.1:0", "--request-log", "/dev/null", "--config-file"])
        .arg(config)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let (send, lines) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                return;
            }
        }
    });
    let first = lines.recv_timeout(CAP).expect("the gateway printed nothing");
    let url = first.split_whitespace().find(|w| w.starts_with("http://")).expect(&first).to_owned();
    Gateway { child, url, lines }
}

impl Gateway {
    fn signal(&self, name: &str) {
        let status = Command::new("kill").args([&format!("-{name}"), &self.child.id().to_string()]).status().unwrap();
        assert!(status.success());
    }

    /// Waits for a line of standard error that contains `text`.
    fn expect_line(&self, text: &str) -> String {
        let deadline = Instant::now() + CAP;
        while let Ok(line) = self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            if line.contains(text) {
                return line;
            }
        }
        panic!("the gateway never said {text:?}");
    }
}

fn config(keys: &[&str], max_in_flight: usize) -> String {
    let keys: Vec<String> = keys.iter().map(|k| format!("\"{}\"", KeyHash::of(k))).collect();
    format!(
        "max_in_flight = {max_in_flight}\nkv_tokens = 50000\nsim_tokens_per_sec = 40.0\nshutdown_grace = \"20s\"\n\n\
         [[tenants]]\nname = \"team\"\nkeys = [{}]\n",
        keys.join(", ")
    )
}

async fn status(http: &reqwest::Client, url: &str, key: &str) -> u16 {
    let body = json!({"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]});
    let response = http.post(format!("{url}/v1/chat/completions")).bearer_auth(key).json(&body).send().await.unwrap();
    response.status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_keys_and_sigterm_drains_the_running_stream() {
    let dir = std::env::temp_dir().join(format!("kvgate-binary-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("gateway.toml");
    std::fs::write(&path, config(&["sk-one"], 4)).unwrap();
    let gateway = start(&path);
    let http = reqwest::Client::builder().no_proxy().timeout(CAP).build().unwrap();
    assert_eq!(status(&http, &gateway.url, "sk-one").await, 200);
    assert_eq!(status(&http, &gateway.url, "sk-two").await, 401);

    std::fs::write(&path, config(&["sk-one", "sk-two"], 4)).unwrap();
    gateway.signal("HUP");
    gateway.expect_line("configuration reloaded (SIGHUP)");
    assert_eq!(status(&http, &gateway.url, "sk-two").await, 200, "the new key works after SIGHUP");

    std::fs::write(&path, "max_in_flight = \"many\"\n").unwrap();
    gateway.signal("HUP");
    let refused = gateway.expect_line("reload refused");
    assert!(refused.contains("gateway.toml"), "the message names the file: {refused}");
    assert_eq!(status(&http, &gateway.url, "sk-two").await, 200, "the old configuration runs on");

    // A stream of 40 tokens at 40 tokens/s is running when SIGTERM comes.
    let body = json!({"stream": true, "max_tokens": 40, "messages": [{"role": "user", "content": "hi"}]});
    let response = http
        .post(format!("{}/v1/chat/completions", gateway.url))
        .bearer_auth("sk-one")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let stream = tokio::spawn(response.text());
    tokio::time::sleep(Duration::from_millis(200)).await;
    gateway.signal("TERM");
    gateway.expect_line("shutting down");
    let text = tokio::time::timeout(CAP, stream).await.unwrap().unwrap().unwrap();
    assert!(text.contains("data: [DONE]"), "the running stream finished: {text}");
    let mut gateway = gateway;
    let deadline = Instant::now() + CAP;
    let exit = loop {
        if let Some(exit) = gateway.child.try_wait().unwrap() {
            break exit;
        }
        assert!(Instant::now() < deadline, "the gateway did not exit after draining");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exit.success(), "{exit:?}");
    let addr = gateway.url.trim_start_matches("http://").to_owned();
    assert!(std::net::TcpStream::connect(addr).is_err(), "nothing listens after the exit");
    std::fs::remove_dir_all(&dir).unwrap();
}
