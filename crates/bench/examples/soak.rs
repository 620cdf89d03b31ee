//! Load and fault soak (issue "Operations"): sustained mixed traffic through the real gateway,
//! with clients that disconnect mid-stream, upstreams that fail, time out or cut streams, a
//! Redis restart and a gateway SIGTERM + restart during the run. Loopback only, bounded in time.
//!
//! Afterwards it checks and reports: usage records == model requests the mock served, no
//! reservation left open, balances add up (spend == recorded usage, lots == amount − spend),
//! and the gateway's memory did not grow.
//!
//! Run: `scripts/soak [SECONDS]` (builds release binaries, then runs this example).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use gateway_bench as support;

use support::{bin, Gw};

const REDIS_PORT: u16 = 6391;

fn start_redis(dir: &Path) -> Child {
    let child = Command::new("redis-server")
        .args([
            "--port",
            &REDIS_PORT.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            dir.to_str().expect("dir"),
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server");
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", REDIS_PORT)).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// The soak's own pepper and Redis prefix, for the gateway and its admin commands.
const ENV: [(&str, &str); 2] = [
    ("GATEWAY_KEY_PEPPER", "soak-pepper"),
    ("GATEWAY_REDIS_PREFIX", "soak:"),
];

fn start_gateway(config: &Path, log: &Path) -> Gw {
    support::start_gateway(&bin("gateway"), config, log, &ENV)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

fn admin(config: &Path, args: &[&str]) -> Value {
    support::admin(&bin("gateway"), config, &ENV, args)
}

#[derive(Default)]
struct Tally {
    sent: AtomicU64,
    ok: AtomicU64,
    disconnects: AtomicU64,
    errors: AtomicU64,
    transport: AtomicU64,
}

/// One client request of a random kind. Returns quietly whatever happens: faults are the point.
async fn one(c: &reqwest::Client, api: &str, key: &str, n: u64, tally: &Tally) {
    tally.sent.fetch_add(1, Ordering::Relaxed);
    let (path, body, disconnect) = match n % 10 {
        0..=2 => (
            "/v1/chat/completions",
            json!({"model": "soak-gpt", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 64}),
            false,
        ),
        3..=4 => (
            "/v1/chat/completions",
            json!({"model": "soak-gpt", "stream": true, "messages": [{"role": "user", "content": "stream"}], "max_tokens": 64}),
            false,
        ),
        5 => (
            "/v1/messages",
            json!({"model": "soak-claude", "stream": true, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}),
            false,
        ),
        6 => (
            "/v1/chat/completions",
            json!({"model": "soak-gpt", "stream": true, "messages": [{"role": "user", "content": "leave"}], "max_tokens": 64}),
            true,
        ),
        7 => (
            "/v1/chat/completions",
            json!({"model": "soak-cut", "stream": true, "messages": [{"role": "user", "content": "cut"}], "max_tokens": 64}),
            false,
        ),
        8 => (
            "/v1/chat/completions",
            json!({"model": "soak-fail", "messages": [{"role": "user", "content": "fail"}], "max_tokens": 64}),
            false,
        ),
        _ => (
            "/v1/chat/completions",
            json!({"model": "soak-slow", "messages": [{"role": "user", "content": "slow"}], "max_tokens": 64}),
            false,
        ),
    };
    let r = c
        .post(format!("{api}{path}"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await;
    match r {
        Ok(mut r) => {
            if r.status().is_success() {
                tally.ok.fetch_add(1, Ordering::Relaxed);
            } else {
                tally.errors.fetch_add(1, Ordering::Relaxed);
            }
            if disconnect {
                let _ = r.chunk().await;
                tally.disconnects.fetch_add(1, Ordering::Relaxed);
                return;
            }
            while let Ok(Some(_)) = r.chunk().await {}
        }
        Err(_) => {
            tally.transport.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::main]
async fn main() {
    let secs: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let workers: u64 = std::env::var("SOAK_WORKERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(24);
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    println!("soak: {secs} s, {workers} clients, scratch {}", d.display());

    let (mut mock, mock_addr) =
        support::start_mock(&["--no-record", "--chunks", "12", "--chunk-delay-ms", "15"]);
    let mut redis = start_redis(d);

    let config = d.join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[server]
api_listen = "127.0.0.1:0"
site_listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
shutdown_drain_seconds = 10
access_log = false
[storage]
database_url = "sqlite://{d}/soak.db"
redis_url = "redis://127.0.0.1:{REDIS_PORT}"
[secrets]
dir = "{d}/data"
[quota]
reservation_timeout_seconds = 30
[quota.tiers.beginner]
weekly_tokens = 50000
requests_per_minute = 0
input_tokens_per_minute = 0
output_tokens_per_minute = 0
[[providers]]
name = "mock"
style = "openai"
base_url = "http://{mock_addr}"
first_byte_timeout_ms = 1000
cooldown_seconds = 1
[[providers]]
name = "mock-a"
style = "anthropic"
base_url = "http://{mock_addr}"
[[models]]
id = "soak-gpt"
provider = "mock"
upstream_model = "mock-gpt"
[[models]]
id = "soak-claude"
provider = "mock-a"
upstream_model = "claude-mock"
[[models]]
id = "soak-cut"
provider = "mock"
upstream_model = "cut"
[[models]]
id = "soak-fail"
provider = "mock"
upstream_model = "fail500"
[[models]]
id = "soak-slow"
provider = "mock"
upstream_model = "slow"
"#,
            d = d.display()
        ),
    )
    .expect("config");

    let log = d.join("gateway.log");
    admin(&config, &["user", "create", "--email", "soak@example.com"]);
    let key = admin(&config, &["key", "create", "--email", "soak@example.com"])["secret"]
        .as_str()
        .expect("secret")
        .to_string();
    let lot_amount: u64 = 1_000_000_000;
    admin(
        &config,
        &[
            "lot",
            "grant",
            "--email",
            "soak@example.com",
            "--type",
            "token",
            "--amount",
            &lot_amount.to_string(),
        ],
    );

    let mut gw = start_gateway(&config, &log);
    let api = Arc::new(std::sync::Mutex::new(gw.api.clone()));
    let tally = Arc::new(Tally::default());
    let deadline = Instant::now() + Duration::from_secs(secs);
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client");
    let (request_client, request_key, request_tally, request_api) =
        (c.clone(), key.clone(), tally.clone(), api.clone());
    let (tasks, _) = support::spawn_clients(workers, deadline, move |n| {
        let (c, key, tally, api) = (
            request_client.clone(),
            request_key.clone(),
            request_tally.clone(),
            request_api.clone(),
        );
        async move {
            let base = api.lock().map(|a| a.clone()).unwrap_or_default();
            one(&c, &base, &key, n, &tally).await;
        }
    });

    // Warm up, then sample memory; fault schedule at 1/3 (Redis) and 1/2 (gateway restart).
    tokio::time::sleep(Duration::from_secs(secs / 6)).await;
    let rss_start_1 = rss_kib(gw.child.id());
    tokio::time::sleep(Duration::from_secs(secs / 6)).await;
    let rss_end_1 = rss_kib(gw.child.id());
    println!("soak: restarting Redis");
    let _ = redis.kill();
    let _ = redis.wait();
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis = start_redis(d);
    tokio::time::sleep(Duration::from_secs(secs / 6)).await;
    println!("soak: SIGTERM to the gateway, then restart");
    let t = Instant::now();
    let status = support::stop(&mut gw.child, "-TERM");
    println!("soak: gateway exited {status} after {:?}", t.elapsed());
    gw = start_gateway(&config, &log);
    if let Ok(mut a) = api.lock() {
        *a = gw.api.clone();
    }
    tokio::time::sleep(Duration::from_secs(secs / 6)).await;
    let rss_start_2 = rss_kib(gw.child.id());
    for t in tasks {
        let _ = t.await;
    }
    let rss_end_2 = rss_kib(gw.child.id());

    // Let settlements land, then stop the gateway gracefully (it flushes usage).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let metrics = c
        .get(format!("{}/metrics", gw.admin))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .unwrap_or_default();
    let in_flight = metrics
        .lines()
        .find(|l| l.starts_with("gateway_reservations_in_flight"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("?")
        .to_string();
    let served: Value = c
        .get(format!("http://{mock_addr}/__mock/stats"))
        .send()
        .await
        .expect("stats")
        .json()
        .await
        .expect("json");
    support::stop(&mut gw.child, "-TERM");

    // Redis: nothing reserved.
    let redis_c = redis::Client::open(format!("redis://127.0.0.1:{REDIS_PORT}")).expect("redis");
    let mut rc = redis_c
        .get_multiplexed_async_connection()
        .await
        .expect("redis conn");
    let res_keys: Vec<String> = redis::cmd("KEYS")
        .arg("soak:q:*:res")
        .query_async(&mut rc)
        .await
        .unwrap_or_default();
    let mut open_res = 0usize;
    for k in &res_keys {
        let n: usize = redis::cmd("HLEN")
            .arg(k)
            .query_async(&mut rc)
            .await
            .unwrap_or(0);
        open_res += n;
    }

    let db = gateway_core::storage::Db::connect(&format!("sqlite://{}/soak.db", d.display()))
        .await
        .expect("db");
    use sqlx::Row;
    let row = sqlx::query("SELECT CAST(COUNT(*) AS BIGINT) AS n, CAST(COALESCE(SUM(input_tokens + output_tokens), 0) AS BIGINT) AS t FROM usage_events WHERE endpoint <> 'count_tokens'")
        .fetch_one(&db.pool).await.expect("count");
    let all_events: i64 = row.get("n");
    let used: i64 = row.get("t");
    // Requests no provider answered (connect errors, first-byte timeouts) are recorded too, as
    // `unrouted` with zero tokens; the mock does not count them as served.
    let row = sqlx::query("SELECT CAST(COUNT(*) AS BIGINT) AS n FROM usage_events WHERE endpoint <> 'count_tokens' AND settlement NOT LIKE '%unrouted'")
        .fetch_one(&db.pool).await.expect("count");
    let events: i64 = row.get("n");
    let row = sqlx::query("SELECT CAST(COALESCE(SUM(allowance_tokens + lot_tokens), 0) AS BIGINT) AS s, CAST(COALESCE(SUM(lot_tokens), 0) AS BIGINT) AS l FROM quota_spend")
        .fetch_one(&db.pool).await.expect("spend");
    let spent: i64 = row.get("s");
    let lot_spent: i64 = row.get("l");
    let row = sqlx::query("SELECT CAST(SUM(remaining) AS BIGINT) AS r FROM quota_lots")
        .fetch_one(&db.pool)
        .await
        .expect("lots");
    let remaining: i64 = row.get("r");
    let by_reason = sqlx::query("SELECT settlement, CAST(COUNT(*) AS BIGINT) AS n FROM usage_events GROUP BY settlement ORDER BY settlement")
        .fetch_all(&db.pool).await.expect("reasons");

    let mock_served = served["served"].as_u64().unwrap_or(0);
    println!("\n## soak results ({secs} s, {workers} clients)");
    println!("| figure | value |\n|---|---|");
    println!(
        "| client requests sent | {} |",
        tally.sent.load(Ordering::Relaxed)
    );
    println!(
        "| 2xx / non-2xx / transport errors | {} / {} / {} |",
        tally.ok.load(Ordering::Relaxed),
        tally.errors.load(Ordering::Relaxed),
        tally.transport.load(Ordering::Relaxed)
    );
    println!(
        "| client disconnects mid-stream | {} |",
        tally.disconnects.load(Ordering::Relaxed)
    );
    println!("| model requests the mock served | {mock_served} |");
    println!("| usage records (all / answered by a provider) | {all_events} / {events} |");
    println!("| reservations open (metrics / Redis) | {in_flight} / {open_res} |");
    println!("| tokens recorded / tokens spent (quota_spend) | {used} / {spent} |");
    println!("| lot: amount − spent from lots = remaining | {lot_amount} − {lot_spent} = {} (db: {remaining}) |", lot_amount as i64 - lot_spent);
    println!(
        "| gateway RSS first life: after warm-up → 1/3 | {rss_start_1} KiB → {rss_end_1} KiB |"
    );
    println!("| gateway RSS second life: start → end | {rss_start_2} KiB → {rss_end_2} KiB |");
    for r in &by_reason {
        println!(
            "| settlement `{}` | {} |",
            r.get::<String, _>("settlement"),
            r.get::<i64, _>("n")
        );
    }
    let mut failures = Vec::new();
    if events as u64 != mock_served {
        failures.push(format!(
            "usage records {events} != mock served {mock_served}"
        ));
    }
    if open_res != 0 || (in_flight != "0" && in_flight != "?") {
        failures.push(format!(
            "open reservations: metrics {in_flight}, redis {open_res}"
        ));
    }
    if used != spent {
        failures.push(format!("recorded {used} != spent {spent}"));
    }
    if lot_amount as i64 - lot_spent != remaining {
        failures.push(format!(
            "lot balance {remaining} != {}",
            lot_amount as i64 - lot_spent
        ));
    }
    if rss_end_2 > rss_start_2 * 3 / 2 + 8192 {
        failures.push(format!("memory grew {rss_start_2} -> {rss_end_2} KiB"));
    }
    let _ = redis.kill();
    let _ = mock.kill();
    if failures.is_empty() {
        println!("\nsoak: all invariants hold");
    } else {
        for f in &failures {
            println!("soak FAILED: {f}");
        }
        std::process::exit(1);
    }
}
