//! [`LocalRedis`]: a throw-away `redis-server` on a free loopback port, in a temporary directory, for
//! tests and benchmarks (feature `local-server`). No persistence: a restart loses every key, as a
//! Redis without persistence does in production.

#![cfg_attr(docsrs, doc(cfg(feature = "local-server")))]

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A `redis-server` child process that this value owns: stopped (killed) and its directory removed on drop.
///
/// # Examples
///
/// ```no_run
/// use kvgate_redis::server::LocalRedis;
///
/// let Some(redis) = LocalRedis::for_test()? else { return Ok(()) }; // skipped: no redis-server
/// println!("{}", redis.url());
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct LocalRedis {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

/// The program started.
const PROGRAM: &str = "redis-server";

fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port())
}

fn temp_dir() -> io::Result<PathBuf> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "kvgate-redis-{}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        free_port()?
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Whether `redis-server` can be run.
pub fn available() -> bool {
    Command::new(PROGRAM)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The process id of the server answering on `port`, if one answers (so that a server of another test
/// that took the port first is never mistaken for ours).
fn server_pid(port: u16) -> Option<u32> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    stream.write_all(b"INFO server\r\n").ok()?;
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    while reply.len() < 64 * 1024 {
        let n = stream.read(&mut chunk).ok()?;
        if n == 0 {
            break;
        }
        reply.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&reply);
        if let Some(pid) = text.split("process_id:").nth(1).and_then(|rest| rest.split_whitespace().next()) {
            return pid.parse().ok();
        }
    }
    None
}

impl LocalRedis {
    /// Starts a server on a free loopback port.
    ///
    /// # Errors
    ///
    /// The I/O error when `redis-server` cannot be run or does not answer within 10 s.
    pub fn start() -> io::Result<Self> {
        let dir = temp_dir()?;
        let mut last = None;
        for _ in 0..5 {
            let port = free_port()?;
            let mut server = Self { child: None, port, dir: dir.clone() };
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(error) => {
                    // Keep the directory for the next try: the drop would remove it.
                    server.dir = PathBuf::new();
                    last = Some(error);
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        Err(last.unwrap_or_else(|| io::Error::other("redis-server did not start")))
    }

    /// For tests: starts a server, or returns `None` after printing that the test is skipped when
    /// `redis-server` is not installed — unless the environment variable `CI` is set, where a missing
    /// server is an error (CI installs it).
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start); and when `CI` is set and `redis-server` is missing.
    pub fn for_test() -> io::Result<Option<Self>> {
        if !available() {
            if std::env::var_os("CI").is_some() {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "redis-server is not installed but CI is set (apt-get install -y redis-server)",
                ));
            }
            eprintln!("skipped: redis-server is not installed (apt-get install -y redis-server)");
            return Ok(None);
        }
        Self::start().map(Some)
    }

    fn spawn(&mut self) -> io::Result<()> {
        let mut child = Command::new(PROGRAM)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--enable-debug-command", "yes", "--daemonize", "no", "--loglevel", "warning"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        for _ in 0..1000 {
            if server_pid(self.port) == Some(child.id()) {
                self.child = Some(child);
                return Ok(());
            }
            if let Some(status) = child.try_wait()? {
                return Err(io::Error::other(format!("redis-server exited with {status} (port {} taken?)", self.port)));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        Err(io::Error::new(io::ErrorKind::TimedOut, "redis-server did not answer PING within 10 s"))
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server (`SIGKILL`: no goodbye to clients), keeping the port for [`start_again`](Self::start_again).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty (nothing is persisted).
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start) (the port may have been taken meanwhile).
    pub fn start_again(&mut self) -> io::Result<()> {
        self.kill();
        self.spawn()
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        self.kill();
        if !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
