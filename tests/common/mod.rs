//! Test harness: starts the real `gateway` binary on free ports with a temporary config, the
//! bundled mock provider, and (when `GATEWAY_TEST_DATABASE=postgres`) a fresh Postgres database
//! per test. Everything is torn down when the `Gateway` is dropped.

#![allow(dead_code)]

pub mod api;
pub mod config;
pub mod lots;
pub mod private_redis;
pub mod redis_cluster;
pub mod responses;
pub mod sdk;
pub mod site;
pub mod slow_relay;
pub mod smtp;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

pub const PEPPER: &str = "test-pepper-0123456789abcdef";
pub const SESSION_SECRET: &str = "test-session-secret-0123456789";
pub const WEBHOOK_SECRET: &str = "test-webhook-secret";

/// Reads the first stdout line starting with `prefix` within `timeout`.
pub fn wait_line(child: &mut Child, prefix: &str, timeout: Duration) -> String {
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    let prefix = prefix.to_string();
    std::thread::spawn(move || {
        let reader = BufReader::new(stdout);
        let mut sent = false;
        for line in reader.lines() {
            let Ok(line) = line else { break };
            if !sent && line.starts_with(&prefix) {
                let _ = tx.send(line);
                sent = true;
            }
        }
    });
    rx.recv_timeout(timeout)
        .unwrap_or_else(|_| panic!("process did not print {:?} in time", "ready line"))
}

/// The bundled mock provider, running as a child process.
pub struct Mock {
    child: Child,
    pub addr: String,
}

impl Mock {
    pub fn start(extra: &[&str]) -> Mock {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mock-provider"))
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mock-provider");
        let line = wait_line(&mut child, "LISTENING ", Duration::from_secs(20));
        let addr = line.trim_start_matches("LISTENING ").trim().to_string();
        Mock { child, addr }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn requests(&self) -> Vec<Value> {
        reqwest::get(format!("{}/__mock/requests", self.url()))
            .await
            .expect("mock requests")
            .json()
            .await
            .expect("mock json")
    }

    pub async fn clear(&self) {
        reqwest::Client::new()
            .delete(format!("{}/__mock/requests", self.url()))
            .send()
            .await
            .expect("mock clear");
    }

    pub async fn served(&self) -> u64 {
        self.stats().await["served"].as_u64().unwrap_or(0)
    }

    /// Connections the mock has accepted, this query's own included (each query is made on a
    /// fresh connection).
    pub async fn connections(&self) -> u64 {
        self.stats().await["connections"].as_u64().unwrap_or(0)
    }

    async fn stats(&self) -> Value {
        reqwest::get(format!("{}/__mock/stats", self.url()))
            .await
            .expect("mock stats")
            .json()
            .await
            .expect("mock stats json")
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Which database the suite runs on: SQLite unless `GATEWAY_TEST_DATABASE=postgres`.
pub fn database_url(dir: &Path) -> String {
    if std::env::var("GATEWAY_TEST_DATABASE").as_deref() == Ok("postgres") {
        postgres_database()
    } else {
        format!("sqlite://{}/gateway.db", dir.display())
    }
}

/// Drops a Postgres database that [`database_url`] created (nothing to do for SQLite, whose file
/// goes with its temporary directory).
pub fn drop_test_database(url: &str) {
    if !url.starts_with("postgres") {
        return;
    }
    if let Some((base, name)) = url.rsplit_once('/') {
        let admin = format!("{base}/test");
        let _ = Command::new("psql")
            .args([
                &admin,
                "-q",
                "-c",
                &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            ])
            .output();
    }
}

/// Drops its Postgres database when it goes out of scope, also when a test panics.
pub struct DropDatabase(pub String);

impl Drop for DropDatabase {
    fn drop(&mut self) {
        drop_test_database(&self.0);
    }
}

/// Creates a fresh database on the local server and returns its URL.
fn postgres_database() -> String {
    let admin = std::env::var("GATEWAY_TEST_PG_ADMIN")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let name = format!(
        "gw_test_{}_{}",
        std::process::id(),
        gateway_core::util::random_base62(10).to_ascii_lowercase()
    );
    let output = Command::new("psql")
        .args([&admin, "-q", "-c", &format!("CREATE DATABASE {name}")])
        .output()
        .expect("psql");
    assert!(
        output.status.success(),
        "create database: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
    format!("{base}/{name}")
}

/// Options for a test gateway.
pub struct Options {
    /// Appended to the generated config (extra providers, models, sections).
    pub extra_toml: String,
    pub pepper: bool,
    pub redis_url: Option<String>,
    /// Lines added to the harness's `[storage]` section (e.g. `redis_outage = "refuse"`).
    pub storage_toml: String,
    /// Use this database instead of a fresh one (multi-instance tests).
    pub database_url: Option<String>,
    pub env: Vec<(String, String)>,
    /// Replaces the harness's `server.site_origin` (e.g. an `https://` origin to get `Secure`
    /// cookies with the `__Host-` prefix).
    pub site_origin: Option<String>,
    /// Open the admin (metrics) listener on a free port.
    pub admin: bool,
    /// Replaces the body of the harness's `[mail]` section (`transport = "file"` writing to
    /// `<dir>/outbox`); an empty string leaves mail unconfigured.
    pub mail_toml: Option<String>,
    /// Extra keys of the `[server]` section (e.g. `max_body_bytes = 65536`).
    pub server_toml: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            extra_toml: String::new(),
            pepper: true,
            redis_url: None,
            storage_toml: String::new(),
            database_url: None,
            env: vec![],
            site_origin: None,
            admin: false,
            mail_toml: None,
            server_toml: String::new(),
        }
    }
}

/// Sleeps past the end of the minute if fewer than `margin` are left in it, so a test of a
/// per-minute window does not straddle two windows.
pub async fn inside_one_minute(margin: Duration) {
    let into = gateway_core::util::now_ms().rem_euclid(60_000) as u64;
    let left = Duration::from_millis(60_000 - into);
    if left < margin {
        tokio::time::sleep(left + Duration::from_millis(100)).await;
    }
}

/// A running gateway with its temporary directory and config.
pub struct Gateway {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub config_path: PathBuf,
    pub api: String,
    pub site: String,
    /// The admin (metrics) listener, when `Options::admin` asked for one.
    pub admin: Option<String>,
    pub database_url: String,
    /// Drop the Postgres database with the gateway (not when another gateway shares it).
    owns_database: bool,
    pub env: Vec<(String, String)>,
}

/// The standard test config: the mock as an OpenAI-style and an Anthropic-style provider.
pub fn base_config(mock: &Mock, database_url: &str, redis: Option<&str>, dir: &Path) -> String {
    format!(
        r#"
[server]
api_listen = "127.0.0.1:0"
site_listen = "127.0.0.1:0"
site_origin = "http://127.0.0.1:8081"
shutdown_drain_seconds = 5

[storage]
database_url = "{database_url}"
redis_url = "{redis}"
usage_flush_ms = 20

[secrets]
dev_generate = false
dir = "{dir}/data"

[mail]
transport = "file"
outbox_dir = "{dir}/outbox"

[[providers]]
name = "mock"
style = "openai"
base_url = "{mock}"
api_key_env = "MOCK_OPENAI_KEY"
cooldown_seconds = 2
first_byte_timeout_ms = 10000

[[providers]]
name = "mock-anthropic"
style = "anthropic"
base_url = "{mock}"
api_key_env = "MOCK_ANTHROPIC_KEY"
cooldown_seconds = 2
first_byte_timeout_ms = 10000

[[models]]
id = "mock-gpt"
provider = "mock"
context_window = 128000
max_output_tokens = 16384
default_output_tokens = 256

[[models]]
id = "mock-big"
provider = "mock"

[[models]]
id = "mock-tools"
provider = "mock"
upstream_model = "tools"

[[models]]
id = "claude-tools"
provider = "mock-anthropic"
upstream_model = "tools"

[[models]]
id = "claude-mock"
provider = "mock-anthropic"
context_window = 200000
max_output_tokens = 8192
default_output_tokens = 256
"#,
        mock = mock.url(),
        redis = redis.unwrap_or(""),
        dir = dir.display(),
    )
}

impl Gateway {
    pub fn start(mock: &Mock, opts: Options) -> Gateway {
        let dir = tempfile::tempdir().expect("tempdir");
        let database_url = opts
            .database_url
            .clone()
            .unwrap_or_else(|| database_url(dir.path()));
        let mut text = base_config(mock, &database_url, opts.redis_url.as_deref(), dir.path());
        if let Some(origin) = &opts.site_origin {
            text = text.replace(
                "site_origin = \"http://127.0.0.1:8081\"",
                &format!("site_origin = \"{origin}\""),
            );
        }
        if let Some(mail) = &opts.mail_toml {
            let default_mail = format!(
                "[mail]\ntransport = \"file\"\noutbox_dir = \"{}/outbox\"\n",
                dir.path().display()
            );
            text = text.replace(&default_mail, &format!("[mail]\n{mail}\n"));
        }
        if !opts.storage_toml.is_empty() {
            text = text.replace(
                "usage_flush_ms = 20\n",
                &format!("usage_flush_ms = 20\n{}\n", opts.storage_toml),
            );
        }
        if opts.admin {
            text = text.replace(
                "shutdown_drain_seconds = 5\n",
                "shutdown_drain_seconds = 5\nadmin_listen = \"127.0.0.1:0\"\n",
            );
        }
        if !opts.server_toml.is_empty() {
            text = text.replace(
                "shutdown_drain_seconds = 5\n",
                &format!("shutdown_drain_seconds = 5\n{}\n", opts.server_toml),
            );
        }
        text.push_str(&opts.extra_toml);
        let config_path = dir.path().join("gateway.toml");
        std::fs::write(&config_path, text).expect("write config");
        let mut env = vec![
            (
                "GATEWAY_SESSION_SECRET".to_string(),
                SESSION_SECRET.to_string(),
            ),
            (
                "GATEWAY_WEBHOOK_SECRET".to_string(),
                WEBHOOK_SECRET.to_string(),
            ),
            (
                "MOCK_OPENAI_KEY".to_string(),
                "provider-openai-secret".to_string(),
            ),
            (
                "MOCK_ANTHROPIC_KEY".to_string(),
                "provider-anthropic-secret".to_string(),
            ),
        ];
        if opts.pepper {
            env.push(("GATEWAY_KEY_PEPPER".to_string(), PEPPER.to_string()));
        }
        env.extend(opts.env.iter().cloned());
        let mut gw = Gateway {
            child: None,
            dir,
            config_path,
            api: String::new(),
            site: String::new(),
            admin: None,
            database_url,
            env,
            owns_database: opts.database_url.is_none(),
        };
        gw.spawn();
        gw
    }

    /// Starts (or restarts) the gateway process on this config.
    pub fn spawn(&mut self) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gateway"));
        cmd.arg("--config")
            .arg(&self.config_path)
            .arg("serve")
            .env_remove("GATEWAY_KEY_PEPPER")
            .env(
                "RUST_LOG",
                std::env::var("GATEWAY_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.log_path())
                    .expect("gateway log file"),
            ));
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start gateway");
        let line = wait_line(&mut child, "gateway listening", Duration::from_secs(60));
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .expect("listen address")
                .to_string()
        };
        self.api = format!("http://{}", field("api="));
        self.site = format!("http://{}", field("site="));
        self.admin = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("admin="))
            .map(|a| format!("http://{a}"));
        self.child = Some(child);
        // Each Pingora service binds on its own runtime: wait for both listeners.
        wait_ready(&self.api);
        wait_ready(&self.site);
    }

    /// The running process's id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends SIGTERM and waits for the process to exit; returns whether it exited cleanly.
    pub fn terminate(&mut self) -> bool {
        self.signal_and_wait("-TERM")
    }

    /// SIGKILL: no chance to flush or settle.
    pub fn kill(&mut self) {
        self.signal_and_wait("-KILL");
    }

    fn signal_and_wait(&mut self, sig: &str) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        let _ = Command::new("kill")
            .args([sig, &child.id().to_string()])
            .status();
        for _ in 0..300 {
            if let Ok(Some(status)) = child.try_wait() {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    /// Runs an admin command against this gateway's config; returns (exit ok, stdout JSON or
    /// stderr text).
    pub fn admin(&self, args: &[&str]) -> (bool, String) {
        let out = self.admin_output(args);
        if out.status.success() {
            (true, String::from_utf8_lossy(&out.stdout).to_string())
        } else {
            (false, String::from_utf8_lossy(&out.stderr).to_string())
        }
    }

    /// Runs an admin command against this gateway's config; returns its whole output (stdout,
    /// stderr and exit status), for commands that warn on stderr and still succeed.
    pub fn admin_output(&self, args: &[&str]) -> std::process::Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gateway"));
        cmd.arg("--config").arg(&self.config_path).args(args);
        cmd.env_remove("GATEWAY_KEY_PEPPER");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.output().expect("run admin command")
    }

    /// `admin` that must succeed and print JSON.
    pub fn admin_json(&self, args: &[&str]) -> Value {
        let (ok, out) = self.admin(args);
        assert!(ok, "admin {args:?} failed: {out}");
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
    }

    /// Creates a user and a key; returns the key's secret.
    pub fn user_with_key(&self, email: &str, key_args: &[&str]) -> String {
        self.admin_json(&["user", "create", "--email", email]);
        let mut args = vec!["key", "create", "--email", email];
        args.extend_from_slice(key_args);
        let key = self.admin_json(&args);
        key["secret"].as_str().expect("secret").to_string()
    }

    /// Creates a user and a key; returns the user's id and the key's secret.
    pub fn user_and_key(&self, email: &str) -> (String, String) {
        let user = self.admin_json(&["user", "create", "--email", email]);
        let user_id = user["id"].as_str().expect("user id").to_string();
        let key = self.admin_json(&["key", "create", "--email", email])["secret"]
            .as_str()
            .expect("secret")
            .to_string();
        (user_id, key)
    }

    /// The id of the account with `email`, from the database.
    pub async fn user_id(&self, email: &str) -> String {
        self.db()
            .await
            .users()
            .find_by_email(email)
            .await
            .expect("query")
            .expect("user")
            .id
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.api, path)
    }

    /// Opens the gateway's database (for assertions on what it recorded).
    pub async fn db(&self) -> gateway_core::storage::Db {
        gateway_core::storage::Db::connect(&self.database_url)
            .await
            .expect("open test database")
    }

    /// All usage events as JSON objects, oldest first.
    /// The value of one series on the admin listener, named as the exposition writes it
    /// (`name` or `name{labels}`); 0 when the series does not exist yet. Needs `admin: true`.
    pub async fn metric(&self, series: &str) -> f64 {
        let admin = self.admin.as_ref().expect("admin listener");
        let text = client()
            .get(format!("{admin}/metrics"))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text");
        let prefix = format!("{series} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(|v| v.trim().parse().expect("metric value"))
            .unwrap_or(0.0)
    }

    pub async fn usage_events(&self) -> Vec<Value> {
        use sqlx::Row;
        let db = self.db().await;
        let rows = sqlx::query(
            "SELECT id, user_id, key_id, model, endpoint, input_tokens, output_tokens, \
             cached_tokens, quota_charged, status, settlement, deployment, error_code, ttfb_ms \
             FROM usage_events ORDER BY created_at, id",
        )
        .fetch_all(&db.pool)
        .await
        .expect("usage events");
        rows.iter()
            .map(|r| {
                serde_json::json!({
                    "id": r.get::<String, _>("id"),
                    "user_id": r.get::<String, _>("user_id"),
                    "key_id": r.get::<String, _>("key_id"),
                    "model": r.get::<String, _>("model"),
                    "endpoint": r.get::<String, _>("endpoint"),
                    "input_tokens": r.get::<i64, _>("input_tokens"),
                    "output_tokens": r.get::<i64, _>("output_tokens"),
                    "cached_tokens": r.get::<i64, _>("cached_tokens"),
                    "quota_charged": r.get::<Option<i64>, _>("quota_charged"),
                    "status": r.get::<i64, _>("status"),
                    "settlement": r.get::<String, _>("settlement"),
                    "deployment": r.get::<Option<String>, _>("deployment"),
                    "error_code": r.get::<Option<String>, _>("error_code"),
                    "ttfb_ms": r.get::<Option<i64>, _>("ttfb_ms"),
                })
            })
            .collect()
    }

    /// Waits until at least `n` usage events are recorded (they are written in batches).
    pub async fn wait_usage(&self, n: usize) -> Vec<Value> {
        for _ in 0..200 {
            let ev = self.usage_events().await;
            if ev.len() >= n {
                return ev;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        self.usage_events().await
    }

    /// A URL on the site listener (website and account API).
    pub fn site_url(&self, path: &str) -> String {
        format!("{}{}", self.site, path)
    }

    /// Where the `file` mail transport of the harness config writes `.eml` files.
    pub fn outbox(&self) -> PathBuf {
        self.dir.path().join("outbox")
    }
}

impl Gateway {
    /// The gateway's stderr (logs, access log) is written here.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("gateway.log")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("--- gateway log (last lines) ---");
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
        if self.owns_database {
            drop_test_database(&self.database_url);
        }
    }
}

fn wait_ready(base: &str) {
    let url = format!("{base}/health");
    for _ in 0..200 {
        if probe_ok(&url) {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("gateway at {base} did not become ready");
}

/// A blocking `GET` that reports whether the answer was 200 (no async runtime needed).
fn probe_ok(url: &str) -> bool {
    use std::io::{Read, Write};
    let rest = url.trim_start_matches("http://");
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let Ok(mut s) = std::net::TcpStream::connect(host) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if write!(
        s,
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .is_err()
    {
        return false;
    }
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    buf.starts_with("HTTP/1.1 200")
}

/// An HTTP client for tests.
pub fn client() -> ::reqwest::Client {
    ::reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}
