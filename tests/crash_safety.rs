//! Crash safety of metering: a gateway killed with SIGKILL under load leaves exactly one usage
//! event per admitted request once it starts again (the usage journal), requests that were
//! still in flight are recorded as `counted:interrupted` and charged what they reserved, and a
//! journal is only ever replayed into the database it was written for.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

fn options() -> Options {
    Options {
        redis_url: std::env::var("GATEWAY_TEST_REDIS").ok(),
        admin: true,
        ..Options::default()
    }
}

/// Waits until no request holds a reservation: an answer reaches the client just before its
/// settlement is journaled, and a kill in between charges the reservation instead.
async fn settled(gw: &Gateway) {
    for _ in 0..100 {
        if gw.metric("gateway_reservations_in_flight").await == 0.0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("reservations still held after 5 s");
}

/// Rewrites the config so the usage writer holds events for a minute: without the journal a
/// kill loses every one of them.
fn hold_events_in_memory(gw: &Gateway) {
    let text = std::fs::read_to_string(&gw.config_path).unwrap();
    let text = text.replace("usage_flush_ms = 20", "usage_flush_ms = 60000");
    std::fs::write(&gw.config_path, text).unwrap();
}

fn chat(stream: bool) -> Value {
    json!({"model": "mock-gpt", "stream": stream,
           "messages": [{"role": "user", "content": "hello there"}]})
}

/// Tokens the database's balance records as spent (allowance and lots), all accounts.
async fn spent_tokens(gw: &Gateway) -> i64 {
    let db = gw.db().await;
    let spent: Option<i64> = sqlx::query_scalar(
        "SELECT CAST(SUM(allowance_tokens + lot_tokens) AS BIGINT) FROM quota_spend",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    spent.unwrap_or(0)
}

fn journal_segments(gw: &Gateway) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(gw.dir.path().join("data"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("usage.journal.") && !n.ends_with(".lock"))
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn kill_9_under_load_then_restart_records_every_admitted_request_once() {
    // Streams pace their deltas so some are mid-flight when the process dies.
    let mock = Mock::start(&["--chunk-delay-ms", "150"]);
    let mut gw = Gateway::start(&mock, options());
    let key = gw.user_with_key("crash@example.com", &[]);
    gw.kill();
    hold_events_in_memory(&gw);
    gw.spawn();

    let c = client();
    let finished: Vec<_> = (0..40)
        .map(|_| {
            let c = c.clone();
            let url = gw.url("/v1/chat/completions");
            let key = key.clone();
            tokio::spawn(async move {
                let r = c
                    .post(url)
                    .bearer_auth(key)
                    .json(&chat(false))
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                r.bytes().await.unwrap();
                status
            })
        })
        .collect();
    let mut ok = 0;
    for t in finished {
        if t.await.unwrap() == 200 {
            ok += 1;
        }
    }
    assert_eq!(ok, 40);
    settled(&gw).await;

    // Streams that have started delivering when the process is killed.
    let mut streams = Vec::new();
    for _ in 0..5 {
        let mut r = c
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(&key)
            .json(&chat(true))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let first = r.chunk().await.unwrap().expect("a first chunk");
        assert!(!first.is_empty());
        streams.push(r);
    }
    assert!(
        gw.usage_events().await.is_empty(),
        "the usage writer held its batch (else this test proves nothing)"
    );
    gw.kill();
    for mut r in streams {
        // Cut: the stream ends early or errors.
        while let Ok(Some(_)) = r.chunk().await {}
    }
    let served = mock.served().await;
    assert_eq!(served, 45, "the mock served every admitted request");

    gw.spawn();
    let events = gw.usage_events().await;
    assert_eq!(
        events.len(),
        45,
        "one event per admitted request: {events:#?}"
    );
    let ids: HashSet<&str> = events.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 45, "each exactly once");
    let complete = events
        .iter()
        .filter(|e| e["settlement"] == "provider:complete" && e["status"] == 200)
        .count();
    let interrupted: Vec<&Value> = events
        .iter()
        .filter(|e| e["settlement"] == "counted:interrupted")
        .collect();
    assert_eq!(complete, 40, "{events:#?}");
    assert_eq!(interrupted.len(), 5, "{events:#?}");
    for e in &interrupted {
        assert_eq!(e["error_code"], "interrupted");
        assert_eq!(e["model"], "mock-gpt");
        assert_eq!(e["endpoint"], "chat_completions");
        // What was known at admission: the input estimate.
        let input = e["input_tokens"].as_i64().unwrap();
        assert!(input > 0, "{e}");
        // Charged what admission reserved: the input estimate and the model's default output
        // (256 for mock-gpt), never nothing.
        assert_eq!(e["quota_charged"].as_i64(), Some(input + 256), "{e}");
    }
    // The balance paid exactly what the events were charged, the interrupted ones included.
    let charged: i64 = events
        .iter()
        .map(|e| e["quota_charged"].as_i64().unwrap())
        .sum();
    assert_eq!(spent_tokens(&gw).await, charged);
    // The replayed segments are gone; one fresh segment is open.
    assert_eq!(
        journal_segments(&gw).len(),
        1,
        "{:?}",
        journal_segments(&gw)
    );

    // A clean stop and another start add nothing (replay is idempotent), and new requests
    // are recorded once.
    let r = c
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&chat(false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    gw.kill();
    gw.spawn();
    assert!(gw.terminate());
    gw.spawn();
    let after = gw.usage_events().await;
    assert_eq!(after.len(), 46, "{after:#?}");
}

/// Two processes on one journal path (a graceful upgrade's old and new process) keep their own
/// segments; what one left when it was killed is recorded by the other within seconds, without
/// a restart.
#[tokio::test]
async fn a_live_process_records_what_a_killed_one_left_in_the_journal() {
    let mock = Mock::start(&[]);
    let mut gw = Gateway::start(&mock, options());
    let key = gw.user_with_key("pair@example.com", &[]);
    gw.kill();
    hold_events_in_memory(&gw);
    gw.spawn();
    let first_api = gw.api.clone();
    let first = gw.pid().unwrap();

    // A second process on the same config and journal path (its own pid file and upgrade
    // socket: two live instances never share those).
    let second_config = gw.dir.path().join("second.toml");
    let text = std::fs::read_to_string(&gw.config_path).unwrap().replace(
        "shutdown_drain_seconds = 5\n",
        &format!(
            "shutdown_drain_seconds = 5\npid_file = \"{0}/second.pid\"\nupgrade_sock = \"{0}/second.sock\"\n",
            gw.dir.path().display()
        ),
    );
    assert!(text.contains("second.pid"));
    std::fs::write(&second_config, text).unwrap();
    let mut second = std::process::Command::new(env!("CARGO_BIN_EXE_gateway"))
        .arg("--config")
        .arg(&second_config)
        .arg("serve")
        .envs(gw.env.iter().map(|(k, v)| (k, v)))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(second.stdout.take().unwrap()).lines();
    let ready = lines.next().unwrap().unwrap();
    let second_api = ready
        .split_whitespace()
        .find_map(|w| w.strip_prefix("api="))
        .map(|a| format!("http://{a}"))
        .unwrap();
    let c = client();
    for api in [&first_api, &second_api] {
        let r = c
            .post(format!("{api}/v1/chat/completions"))
            .bearer_auth(&key)
            .json(&chat(false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    // Each holds its events in memory; the second dies. The settlement line is appended just
    // after the answer's last byte leaves, so give it a moment (a kill inside that moment
    // records the request as interrupted instead, which the kill -9 test covers).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &second.id().to_string()])
        .status();
    let _ = second.wait();
    assert_eq!(gw.pid(), Some(first));
    let mut events = Vec::new();
    for _ in 0..80 {
        events = gw.usage_events().await;
        if !events.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert_eq!(events.len(), 1, "the killed process's request: {events:#?}");
    assert_eq!(events[0]["settlement"], "provider:complete");
    // The live process's own event is still only in its memory and journal; a kill and a
    // start record it too, once.
    gw.kill();
    gw.spawn();
    let events = gw.usage_events().await;
    assert_eq!(events.len(), 2, "{events:#?}");
}

/// Serves `n` whole chat requests and returns once each has its answer.
async fn serve(gw: &Gateway, key: &str, n: usize) {
    let c = client();
    for _ in 0..n {
        let r = c
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(key)
            .json(&chat(false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    // The settlement line is appended just after the answer's last byte leaves.
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// Two deployments started from one directory (the default journal path `data/usage.journal`
/// is the same for both) each with its own database: what one leaves in the journal when it is
/// killed is never recorded into the other's database; each records its own when it restarts.
#[tokio::test]
async fn two_deployments_sharing_a_data_directory_keep_their_own_journals() {
    let mock = Mock::start(&[]);
    let mut a = Gateway::start(&mock, options());
    let data = a.dir.path().join("data");
    // B: another database, the same data directory (journal and secrets), its own pid file
    // and upgrade socket.
    let mut b = Gateway::start(
        &mock,
        Options {
            server_toml: format!(
                "pid_file = \"{0}/b.pid\"\nupgrade_sock = \"{0}/b.sock\"",
                data.display()
            ),
            ..options()
        },
    );
    b.kill();
    let text = std::fs::read_to_string(&b.config_path).unwrap();
    let b_data = format!("dir = \"{}/data\"", b.dir.path().display());
    assert!(text.contains(&b_data), "{text}");
    std::fs::write(
        &b.config_path,
        text.replace(&b_data, &format!("dir = \"{}\"", data.display())),
    )
    .unwrap();
    assert_ne!(a.database_url, b.database_url);

    let key_a = a.user_with_key("a@example.com", &[]);
    let key_b = b.user_with_key("b@example.com", &[]);
    a.kill();
    hold_events_in_memory(&a);
    hold_events_in_memory(&b);

    // A serves and is killed with every event still in memory and journal.
    a.spawn();
    serve(&a, &key_a, 6).await;
    assert!(a.usage_events().await.is_empty());
    a.kill();

    // B starts in the same directory: A's segments are not B's to record.
    b.spawn();
    serve(&b, &key_b, 3).await;
    let mut warned = false;
    for _ in 0..80 {
        warned = b.log().contains("left alone");
        if warned {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(warned, "B names the foreign segments: {}", b.log());
    let log = b.log();
    let line = log.lines().find(|l| l.contains("left alone")).unwrap();
    // The warning names both databases (credentials hidden).
    let location = |url: &str| gateway_core::storage::redact_url(url);
    assert!(line.contains(&location(&a.database_url)), "{line}");
    assert!(line.contains(&location(&b.database_url)), "{line}");
    b.kill();
    assert!(
        b.usage_events().await.is_empty(),
        "nothing of A's in B's database"
    );

    // A restarts: its own six, none of B's three.
    a.spawn();
    let events = a.wait_usage(6).await;
    assert_eq!(events.len(), 6, "{events:#?}");
    assert!(events
        .iter()
        .all(|e| e["settlement"] == "provider:complete"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(a.usage_events().await.len(), 6);

    // B restarts: its own three.
    b.spawn();
    let events = b.wait_usage(3).await;
    assert_eq!(events.len(), 3, "{events:#?}");
    let b_user = b.user_id("b@example.com").await;
    assert!(events.iter().all(|e| e["user_id"] == b_user.as_str()));
    assert_eq!(a.usage_events().await.len(), 6);
}

/// One usage event per request id, whatever path records it: the settled event, the same id
/// replayed as interrupted under another time (a journal's admission line), and a retried
/// batch all meet the id's unique index, and only the first record counts (event, rollup and
/// quota breakdown).
#[tokio::test]
async fn a_request_id_is_recorded_once_however_often_it_is_written() {
    use gateway_core::domain::Breakdown;
    use gateway_core::storage::UsageEvent;
    let dir = tempfile::tempdir().unwrap();
    let url = database_url(dir.path());
    let db = gateway_core::storage::Db::connect(&url).await.expect("db");
    let t = 1_700_000_000_000i64;
    let event = |at: i64, settlement: &'static str, output: u64| UsageEvent {
        id: "evt_once".into(),
        user_id: "usr_once".into(),
        key_id: "key_once".into(),
        model: "alpha".into(),
        endpoint: "/v1/chat/completions",
        input_tokens: 10,
        output_tokens: output,
        quota_charged: 10 + output,
        status: 200,
        latency_ms: 4,
        settlement,
        created_at: at,
        breakdown: Some(Breakdown {
            user_id: "usr_once".into(),
            at_ms: at,
            allowance_tokens: 10 + output,
            allowance_requests: 1,
            lots: vec![],
        }),
        ..UsageEvent::default()
    };
    let usage = db.usage();
    usage
        .insert_batch(&[event(t, "provider", 5)])
        .await
        .expect("first record");
    // The same id under another time (an admission replayed as interrupted), alone and in a
    // batch with a new event, then the very same record again (a retried batch).
    usage
        .insert_batch(&[event(t + 1, "counted:interrupted", 100)])
        .await
        .expect("replayed record");
    let mut other = event(t + 2, "provider", 7);
    other.id = "evt_other".into();
    usage
        .insert_batch(&[event(t + 3, "counted:interrupted", 100), other])
        .await
        .expect("batch with a repeated id");
    usage
        .insert_batch(&[event(t, "provider", 5)])
        .await
        .expect("retried record");

    let rows: Vec<(String, i64, String)> =
        sqlx::query_as("SELECT id, created_at, settlement FROM usage_events ORDER BY created_at")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        rows,
        vec![
            ("evt_once".to_string(), t, "provider".to_string()),
            ("evt_other".to_string(), t + 2, "provider".to_string()),
        ]
    );
    let spent: Option<i64> = sqlx::query_scalar(
        "SELECT CAST(SUM(allowance_tokens) AS BIGINT) FROM quota_spend WHERE user_id = 'usr_once'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(spent, Some(15 + 17), "each id's breakdown paid once");
    let requests: Option<i64> = sqlx::query_scalar(
        "SELECT CAST(SUM(requests) AS BIGINT) FROM usage_rollup WHERE user_id = 'usr_once'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(requests, Some(2), "each id counted once in the rollup");
    db.pool.close().await;
    drop_test_database(&url);
}
