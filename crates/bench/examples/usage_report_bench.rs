//! The usage-report benchmark (`scripts/bench_usage`): one account with a million usage events,
//! then the timing of its report, `GET /api/account/usage`.
//!
//! Starts the real gateway on a fresh database, signs in through the email-code flow, writes the
//! events through `UsageStore::insert_batch` (the production write path, which also maintains
//! the hourly rollup) in batches of 2,000 spread evenly over `BENCH_DAYS` days, then for each
//! period (1h, 24h, 7d, 30d) times 50 calls (after 5 warm-ups) of the report's queries alone
//! (`UsageStore::report`) and of the whole endpoint over HTTP (edge, session, quota, JSON), and
//! prints p50/p95. It fails when the endpoint's p50 is 50 ms or more.
//!
//! Run: `target/release/examples/usage_report_bench [sqlite|postgres]`, with `gateway` and
//! `mock-provider` built beside it. `BENCH_EVENTS` (default 1,000,000) and `BENCH_DAYS`
//! (default 30) size the run; Postgres databases are created (and dropped) through
//! `GATEWAY_TEST_PG_ADMIN` (default `postgres://postgres@127.0.0.1:5432/test`).

use gateway_bench as support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use gateway_core::storage::{Db, UsageEvent};
use gateway_core::util::now_ms;
use serde_json::{json, Value};

/// The site origin the configuration names; mutations must come from it.
const ORIGIN: &str = "http://127.0.0.1:8081";

const ENV: [(&str, &str); 4] = [
    ("GATEWAY_KEY_PEPPER", "bench-usage-pepper-0123456789"),
    (
        "GATEWAY_SESSION_SECRET",
        "bench-usage-session-secret-0123456789",
    ),
    ("GATEWAY_WEBHOOK_SECRET", "bench-usage-webhook-secret"),
    ("MOCK_OPENAI_KEY", "bench-usage-provider-key"),
];

const EMAIL: &str = "heavy@example.com";

fn env_number<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A fresh database: a file in `dir`, or a new Postgres database (dropped by [`drop_database`]).
fn create_database(backend: &str, dir: &Path) -> String {
    if backend == "sqlite" {
        return format!("sqlite://{}/gateway.db", dir.display());
    }
    let admin = std::env::var("GATEWAY_TEST_PG_ADMIN")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let name = format!("gw_bench_usage_{}", std::process::id());
    let out = Command::new("psql")
        .args([&admin, "-q", "-c", &format!("CREATE DATABASE {name}")])
        .output()
        .expect("psql");
    assert!(
        out.status.success(),
        "create database: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
    format!("{base}/{name}")
}

fn drop_database(url: &str) {
    let Some((base, name)) = url.rsplit_once('/').filter(|_| url.starts_with("postgres")) else {
        return;
    };
    let _ = Command::new("psql")
        .args([
            &format!("{base}/test"),
            "-q",
            "-c",
            &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        ])
        .output();
}

/// The processes and the database of a run, stopped and dropped also when the run fails.
struct Running {
    gateway: std::process::Child,
    mock: std::process::Child,
    database_url: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        support::stop(&mut self.gateway, "-TERM");
        let _ = self.mock.kill();
        let _ = self.mock.wait();
        drop_database(&self.database_url);
    }
}

fn config_text(dir: &Path, mock: &str, database_url: &str) -> String {
    format!(
        r#"
[server]
api_listen = "127.0.0.1:0"
site_listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
site_origin = "{ORIGIN}"
access_log = false
[storage]
database_url = "{database_url}"
[secrets]
dev_generate = false
dir = "{dir}/data"
[mail]
transport = "file"
outbox_dir = "{dir}/outbox"
[[providers]]
name = "mock"
style = "openai"
base_url = "http://{mock}"
api_key_env = "MOCK_OPENAI_KEY"
[[models]]
id = "mock-gpt"
provider = "mock"
"#,
        dir = dir.display(),
    )
}

/// A signed-in session on the site: its cookies and CSRF token.
struct Browser {
    client: reqwest::Client,
    site: String,
    cookies: Vec<String>,
    csrf: Option<String>,
}

impl Browser {
    async fn send(&mut self, mut req: reqwest::RequestBuilder) -> (u16, Value) {
        if !self.cookies.is_empty() {
            req = req.header("cookie", self.cookies.join("; "));
        }
        let resp = req.send().await.expect("send");
        let status = resp.status().as_u16();
        for c in resp.headers().get_all("set-cookie") {
            let pair = c.to_str().expect("ascii").split(';').next().unwrap_or("");
            let name = pair.split('=').next().unwrap_or("");
            self.cookies.retain(|k| !k.starts_with(&format!("{name}=")));
            self.cookies.push(pair.to_string());
        }
        let body = resp.json().await.unwrap_or(Value::Null);
        (status, body)
    }

    async fn get(&mut self, path: &str) -> Value {
        let req = self.client.get(format!("{}{path}", self.site));
        let (status, body) = self.send(req).await;
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }

    /// A mutation: from the site's origin, with the session's CSRF token once known.
    async fn post(&mut self, path: &str, body: &Value) -> Value {
        let mut req = self
            .client
            .post(format!("{}{path}", self.site))
            .header("origin", ORIGIN)
            .json(body);
        if let Some(csrf) = &self.csrf {
            req = req.header("x-csrf-token", csrf);
        }
        let (status, answer) = self.send(req).await;
        assert_eq!(status, 200, "POST {path}: {answer}");
        answer
    }

    /// Signs in with the code the gateway mailed to its outbox.
    async fn sign_in(client: reqwest::Client, site: String, outbox: &Path) -> Browser {
        let mut b = Browser {
            client,
            site,
            cookies: Vec::new(),
            csrf: None,
        };
        b.post(
            "/api/auth/request-code",
            &json!({ "email": EMAIL, "acceptedTerms": true }),
        )
        .await;
        let code = mailed_code(outbox);
        b.post(
            "/api/auth/verify-code",
            &json!({ "email": EMAIL, "code": code }),
        )
        .await;
        let session = b.get("/api/auth/session").await;
        b.csrf = session["csrfToken"].as_str().map(str::to_string);
        b
    }
}

/// The six-digit code of the sign-in mail in `outbox`.
fn mailed_code(outbox: &Path) -> String {
    std::fs::read_dir(outbox)
        .expect("outbox")
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .find_map(|raw| {
            raw.split("\r\n")
                .map(str::trim)
                .find(|l| l.len() == 6 && l.bytes().all(|b| b.is_ascii_digit()))
                .map(str::to_string)
        })
        .expect("a sign-in mail with a code")
}

/// `total` events for `user_id`, spread evenly over the last `days` days, written in batches.
async fn write_events(db: &Db, user_id: &str, total: u64, days: i64) {
    let models = [
        "gpt-4o-mini",
        "gpt-4o",
        "claude-sonnet",
        "claude-haiku",
        "o3-mini",
    ];
    let now = now_ms();
    let span = days * 86_400_000;
    let step = span / total.max(1) as i64;
    let batch = 2_000u64;
    let mut written = 0u64;
    while written < total {
        let n = batch.min(total - written);
        let chunk: Vec<UsageEvent> = (written..written + n)
            .map(|k| UsageEvent {
                id: format!("evt_b{k:019}"),
                user_id: user_id.to_string(),
                key_id: "key_bench".into(),
                model: models[(k % models.len() as u64) as usize].into(),
                endpoint: "/v1/chat/completions",
                reasoning_effort: k.is_multiple_of(7).then(|| "medium".to_string()),
                input_tokens: 100 + k % 900,
                output_tokens: 10 + k % 300,
                cached_tokens: 0,
                quota_charged: 110 + k % 900 + k % 300,
                status: 200,
                latency_ms: 300,
                ttfb_ms: Some(80),
                settlement: "provider",
                deployment: None,
                error_code: None,
                created_at: now - span + k as i64 * step,
                breakdown: None,
            })
            .collect();
        db.usage().insert_batch(&chunk).await.expect("insert batch");
        written += n;
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Milliseconds of 55 runs of `f`, the first 5 (warm-ups) left out, sorted.
async fn timed<F, Fut, T>(mut f: F) -> (Vec<f64>, T)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let mut ms = Vec::with_capacity(55);
    let mut last = None;
    for _ in 0..55 {
        let t = Instant::now();
        last = Some(f().await);
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let mut ms: Vec<f64> = ms.into_iter().skip(5).collect();
    ms.sort_by(f64::total_cmp);
    (ms, last.expect("ran"))
}

/// The report's timing for each period, store level and over HTTP.
async fn measure(db: &Db, browser: &mut Browser, user_id: &str, backend: &str, total: u64) {
    for (period, span) in [
        ("1h", 3_600_000),
        ("24h", 86_400_000),
        ("7d", 7 * 86_400_000),
        ("30d", 30 * 86_400_000),
    ] {
        // Store level: the queries alone.
        let (q, report_requests) = timed(move || async move {
            let now = now_ms();
            let r = db
                .usage()
                .report(user_id, now - span, now, 50)
                .await
                .expect("report");
            r.summary().requests
        })
        .await;
        // End to end: through the edge, session lookup and quota included.
        let path = format!("/api/account/usage?period={period}");
        let mut h = Vec::with_capacity(55);
        let mut answered = Value::Null;
        for _ in 0..55 {
            let t = Instant::now();
            answered = browser.get(&path).await;
            h.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let mut h: Vec<f64> = h.into_iter().skip(5).collect();
        h.sort_by(f64::total_cmp);
        // The window slid a little between the two measurements.
        let answered_requests = answered["summary"]["requests"].as_u64().expect("requests");
        assert!(answered_requests.abs_diff(report_requests) <= total / 1000 + 2);
        assert_eq!(
            answered["recentRequests"].as_array().map(Vec::len),
            Some(report_requests.min(50) as usize)
        );
        println!(
            "[{backend}] period {period:>3}: {report_requests:>7} requests in window | queries p50 {:.2} ms p95 {:.2} ms | HTTP GET /api/account/usage p50 {:.2} ms p95 {:.2} ms (50 calls)",
            percentile(&q, 0.5),
            percentile(&q, 0.95),
            percentile(&h, 0.5),
            percentile(&h, 0.95),
        );
        assert!(
            percentile(&h, 0.5) < 50.0,
            "usage endpoint p50 over 50 ms on {backend}"
        );
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let backend = std::env::args().nth(1).unwrap_or_else(|| "sqlite".into());
    assert!(
        matches!(backend.as_str(), "sqlite" | "postgres"),
        "usage: usage_report_bench [sqlite|postgres]"
    );
    let total: u64 = env_number("BENCH_EVENTS", 1_000_000);
    let days: i64 = env_number("BENCH_DAYS", 30);

    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let database_url = create_database(&backend, d);
    let (mock, mock_addr) = support::start_mock(&["--no-record"]);
    let config = d.join("gateway.toml");
    std::fs::write(&config, config_text(d, &mock_addr, &database_url)).expect("config");
    let gw = support::start_gateway(
        &support::bin("gateway"),
        &config,
        &d.join("gateway.log"),
        &ENV,
    );
    let site = gw.site.clone();
    let _running = Running {
        gateway: gw.child,
        mock,
        database_url: database_url.clone(),
    };
    // The site listener answers once its runtime is up.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    for _ in 0..200 {
        let health = client.get(format!("{site}/health")).send().await;
        if health.is_ok_and(|r| r.status().is_success()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    let mut browser = Browser::sign_in(client, site, &d.join("outbox")).await;
    let user_id = browser.get("/api/account/profile").await["user"]["id"]
        .as_str()
        .expect("id")
        .to_string();
    let db = Db::connect(&database_url).await.expect("open database");

    let started = Instant::now();
    write_events(&db, &user_id, total, days).await;
    let insert_secs = started.elapsed().as_secs_f64();
    let analyze = match backend.as_str() {
        "postgres" => "ANALYZE usage_events; ANALYZE usage_rollup;",
        _ => "ANALYZE;",
    };
    sqlx::raw_sql(analyze)
        .execute(&db.pool)
        .await
        .expect("analyze");
    let count = db.usage().count_for_user(&user_id).await.expect("count");
    assert_eq!(count as u64, total);
    println!(
        "[{backend}] inserted {total} events over {days} days via insert_batch in {insert_secs:.1} s ({:.0} events/s)",
        total as f64 / insert_secs
    );

    measure(&db, &mut browser, &user_id, &backend, total).await;
    db.pool.close().await;
}
