//! Process plumbing shared by the examples that drive a real gateway (`soak`, `pgo_train`):
//! finding the sibling binaries, starting the mock provider and the gateway on port 0 and
//! learning their addresses from their ready lines, and running admin commands.

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// A binary built beside the running example: `target/release/examples/x` → `target/release/<name>`.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("exe");
    exe.parent()
        .and_then(Path::parent)
        .map(|p| p.join(name))
        .expect("target dir")
}

/// The first stdout line of `child` that starts with `prefix` (waits up to a minute). The rest
/// of its stdout is read and dropped, so the child never blocks on a full pipe.
pub fn read_line(child: &mut Child, prefix: &str) -> String {
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    let prefix = prefix.to_string();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if !sent && line.starts_with(&prefix) {
                let _ = tx.send(line);
                sent = true;
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("ready line")
}

/// The bundled mock provider on a free port, with `args` added; returns it and its address.
pub fn start_mock(args: &[&str]) -> (Child, String) {
    let mut mock = Command::new(bin("mock-provider"))
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("mock-provider");
    let addr = read_line(&mut mock, "LISTENING ")
        .trim_start_matches("LISTENING ")
        .to_string();
    (mock, addr)
}

/// A running gateway and its listeners' base URLs.
pub struct Gw {
    pub child: Child,
    pub api: String,
    pub site: String,
    pub admin: String,
}

/// Starts `binary serve` on `config` with `env` set, stderr appended to `log`, and waits for
/// its ready line.
pub fn start_gateway(binary: &Path, config: &Path, log: &Path, env: &[(&str, &str)]) -> Gw {
    let mut child = Command::new(binary)
        .args(["--config", config.to_str().expect("cfg"), "serve"])
        .envs(env.iter().copied())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .expect("log"),
        ))
        .spawn()
        .expect("gateway");
    let line = read_line(&mut child, "gateway listening");
    let field = |n: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(n))
            .expect("addr")
            .to_string()
    };
    Gw {
        api: format!("http://{}", field("api=")),
        site: format!("http://{}", field("site=")),
        admin: format!("http://{}", field("admin=")),
        child,
    }
}

/// Runs an admin command (`binary --config <config> <args>`) and returns its JSON output.
pub fn admin(binary: &Path, config: &Path, env: &[(&str, &str)], args: &[&str]) -> Value {
    let out = Command::new(binary)
        .args(["--config", config.to_str().expect("cfg")])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("admin");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

/// Sends `child` a signal (`"-INT"`, `"-TERM"`: both a graceful stop for the gateway) and
/// waits for it to exit.
pub fn stop(child: &mut Child, signal: &str) -> std::process::ExitStatus {
    let _ = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status();
    child.wait().expect("wait")
}

/// `clients` concurrent loops, each calling `request(n)` until `deadline`, with `n` numbering
/// the requests across all loops (so a mix can be picked by `n`). Returns the loops and the
/// count of requests started.
pub fn spawn_clients<F, Fut>(
    clients: u64,
    deadline: Instant,
    request: F,
) -> (Vec<tokio::task::JoinHandle<()>>, Arc<AtomicU64>)
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let counter = Arc::new(AtomicU64::new(0));
    let tasks = (0..clients)
        .map(|_| {
            let (request, counter) = (request.clone(), counter.clone());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    request(counter.fetch_add(1, Ordering::Relaxed)).await;
                }
            })
        })
        .collect();
    (tasks, counter)
}
