//! Cost of one reservation plus its settlement, in-process and through Redis (issue "Quota":
//! under 100 µs median in-process, at most two Redis round trips per request).
//!
//! Run: `cargo run --release --example quota_bench [N]` (Redis at 127.0.0.1:6379 for the
//! second half; skipped when unreachable).

use std::sync::Arc;
use std::time::Instant;

use gateway_core::config::Config;
use gateway_core::domain::LimitMode;
use gateway_core::identity::Identity;
use gateway_core::quota::{local::Local, shared::Shared, Backend, Engine, Used};
use gateway_core::storage::{Db, NewKey};

fn percentile(sorted: &[u128], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

async fn run(name: &str, engine: Arc<Engine>, cfg: &Config, who: &Identity, n: usize) {
    // Warm-up loads the account into the engine.
    for _ in 0..200 {
        if let Ok(r) = engine
            .reserve(&cfg.quota, who, 30, 100, Default::default())
            .await
        {
            let _ = engine
                .settle(
                    &r.ticket,
                    Used {
                        input_tokens: 25,
                        output_tokens: 24,
                        cached_input_tokens: 0,
                    },
                )
                .await;
        }
    }
    let mut reserve = Vec::with_capacity(n);
    let mut both = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        let r = engine
            .reserve(&cfg.quota, who, 30, 100, Default::default())
            .await
            .expect("reserve");
        let t1 = Instant::now();
        let _ = engine
            .settle(
                &r.ticket,
                Used {
                    input_tokens: 25,
                    output_tokens: 24,
                    cached_input_tokens: 0,
                },
            )
            .await;
        let t2 = Instant::now();
        reserve.push((t1 - t0).as_nanos());
        both.push((t2 - t0).as_nanos());
    }
    reserve.sort_unstable();
    both.sort_unstable();
    println!(
        "| {name} | {n} | {:.1} | {:.1} | {:.1} | {:.1} |",
        percentile(&reserve, 0.5),
        percentile(&both, 0.5),
        percentile(&both, 0.9),
        percentile(&both, 0.99)
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = Config::from_str(
        std::path::Path::new("bench.toml"),
        "[quota.tiers.beginner]\nweekly_tokens = 1000000000000\nrequests_per_minute = 100000000\ninput_tokens_per_minute = 1000000000000\noutput_tokens_per_minute = 1000000000000\n",
    )
    .expect("config");
    let db = Db::connect(&format!("sqlite://{}/q.db", dir.path().display()))
        .await
        .expect("db");
    let user = db
        .users()
        .create(
            "bench@example.com",
            gateway_core::domain::Tier::Beginner,
            false,
        )
        .await
        .expect("user");
    let key = db
        .keys()
        .create(&NewKey {
            scopes: vec!["*".into()],
            limit_mode: LimitMode::AccountPool,
            ..NewKey::plain(&user.id, "bench", "h")
        })
        .await
        .expect("key");
    let who = Identity {
        key: Arc::new(key),
        user: Arc::new(user),
    };
    println!("| engine | iterations | reserve p50 (µs) | reserve+settle p50 (µs) | p90 | p99 |");
    println!("|---|---|---|---|---|---|");
    run(
        "in-process",
        Engine::new(
            Backend::Local(Local::new(std::time::Duration::from_secs(2))),
            db.clone(),
        ),
        &cfg,
        &who,
        n,
    )
    .await;
    let prefix = format!("qbench:{}:", gateway_core::util::random_base62(8));
    let settings = gateway_core::quota::shared::Settings {
        timeout: std::time::Duration::from_millis(50),
        outage: gateway_core::config::RedisOutage::Refuse,
        db_timeout: std::time::Duration::from_secs(2),
        usage: None,
    };
    let target =
        gateway_core::quota::redis_conn::RedisTarget::Single("redis://127.0.0.1:6379".into());
    match Shared::connect(&target, &prefix, settings).await {
        Ok(s) => {
            run(
                "redis (2 scripts = 2 round trips)",
                Engine::new(Backend::Shared(Box::new(s)), db.clone()),
                &cfg,
                &who,
                n / 4,
            )
            .await
        }
        Err(e) => println!("redis skipped: {e}"),
    }
}
