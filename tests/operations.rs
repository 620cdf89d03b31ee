//! Operations: metrics on the admin listener only, the access log, live config reload, and a
//! graceful stop that lets streams finish and loses no usage record.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test]
async fn metrics_only_on_the_admin_listener_and_an_access_log_line() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(
        &mock,
        Options {
            admin: true,
            ..Options::default()
        },
    );
    let key = gw.user_with_key("metrics@example.com", &[]);
    let c = client();
    let r = c
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&chat("mock-gpt"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let request_id = r.headers()["x-request-id"].to_str().unwrap().to_string();
    r.text().await.unwrap();
    let _ = c
        .post(gw.url("/v1/chat/completions"))
        .json(&chat("mock-gpt"))
        .send()
        .await
        .unwrap();

    // A refused sign-in attempt (no terms accepted) is counted by step and outcome.
    let _ = c
        .post(gw.site_url("/api/auth/request-code"))
        .header("origin", "http://127.0.0.1:8081")
        .json(&json!({"email": "a@example.com"}))
        .send()
        .await
        .unwrap();
    let admin = gw.admin.clone().expect("admin listener");
    let text = c
        .get(format!("{admin}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains(r#"gateway_requests_total{code="",model="mock-gpt",route="chat_completions",status="200"} 1"#), "{text}");
    assert!(text.contains(r#"code="missing_api_key""#), "{text}");
    assert!(text.contains("gateway_request_duration_seconds_bucket"));
    assert!(
        text.contains(r#"gateway_tokens_total{direction="input",model="mock-gpt"} 25"#),
        "{text}"
    );
    assert!(
        text.contains("gateway_upstream_first_byte_seconds_count{deployment=\"mock/mock-gpt\"} 1"),
        "{text}"
    );
    assert!(text.contains("gateway_reservations_in_flight 0"));
    assert!(
        text.contains(r#"gateway_signin_attempts_total{outcome="rejected",step="request-code"} 1"#),
        "{text}"
    );

    // Never on the public listeners.
    let r = c.get(gw.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let r = c.get(gw.site_url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 404);

    // One JSON access line for the request, with ids and no secret (lines are buffered for a
    // few tens of milliseconds).
    let mut log = gw.log();
    for _ in 0..100 {
        if log.contains(&request_id) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        log = gw.log();
    }
    let line = log
        .lines()
        .find(|l| l.contains(&request_id))
        .unwrap_or_else(|| panic!("no access line in {log}"));
    let json_part = &line[line.find('{').unwrap()..];
    let v: Value = serde_json::from_str(json_part).unwrap();
    assert_eq!(v["status"], 200);
    assert_eq!(v["route"], "chat_completions");
    assert_eq!(v["deployment"], "mock/mock-gpt");
    assert!(v["key_id"].as_str().unwrap().starts_with("key_"));
    assert!(!log.contains(&key), "the API key must never be logged");
    assert!(!log.contains("provider-openai-secret"));
}

#[tokio::test]
async fn live_reload_swaps_whole_configs_and_refuses_broken_ones() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, Options::default());
    let key = gw.user_with_key("reload@example.com", &[]);
    let c = client();
    let status = |model: &'static str| {
        let c = c.clone();
        let url = gw.url("/v1/chat/completions");
        let key = key.clone();
        async move {
            c.post(url)
                .bearer_auth(key)
                .json(&chat(model))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(status("hot-model").await, 404);

    let original = std::fs::read_to_string(&gw.config_path).unwrap();
    let added = format!("{original}\n[[models]]\nid = \"hot-model\"\nprovider = \"mock\"\nupstream_model = \"mock-gpt\"\n");
    std::fs::write(&gw.config_path, &added).unwrap();
    let mut live = false;
    for _ in 0..60 {
        if status("hot-model").await == 200 {
            live = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(live, "the new model never became routable");

    // A broken file is refused; the running config stays.
    std::fs::write(
        &gw.config_path,
        format!("{added}\n[[models]]\nid = \"x\"\nprovider = \"nope\"\n"),
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(status("hot-model").await, 200);
    assert!(
        gw.log().contains("models["),
        "the refusal names the key: {}",
        gw.log()
    );

    // Restart-only settings are reported, not applied; SIGHUP reloads too.
    let moved = added
        .replace(
            "api_listen = \"127.0.0.1:0\"",
            "api_listen = \"127.0.0.1:1\"",
        )
        .replace("hot-model", "hup-model");
    std::fs::write(&gw.config_path, &moved).unwrap();
    let pid = std::process::Command::new("pgrep")
        .args(["-f", gw.config_path.to_str().unwrap()])
        .output()
        .unwrap();
    let pid = String::from_utf8_lossy(&pid.stdout)
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    let _ = std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status();
    let mut live = false;
    for _ in 0..60 {
        if status("hup-model").await == 200 {
            live = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(live);
    assert!(
        gw.log().contains("server.api_listen changed"),
        "{}",
        gw.log()
    );
}

#[tokio::test]
async fn sigterm_drains_streams_and_flushes_usage() {
    let mock = Mock::start(&["--chunks", "15", "--chunk-delay-ms", "100"]);
    let mut gw = Gateway::start(&mock, Options::default());
    let key = gw.user_with_key("drain@example.com", &[]);
    let mut s = chat("mock-gpt");
    s["stream"] = json!(true);
    let c = client();
    let stream = tokio::spawn({
        let url = gw.url("/v1/chat/completions");
        let key = key.clone();
        async move {
            c.post(url)
                .bearer_auth(key)
                .json(&s)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    let clean = tokio::task::spawn_blocking(move || {
        let ok = gw.terminate();
        (ok, gw)
    });
    let text = stream.await.unwrap();
    assert!(
        text.trim_end().ends_with("data: [DONE]"),
        "the stream finished: {text}"
    );
    let (ok, gw) = clean.await.unwrap();
    assert!(ok, "clean exit");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "stopped once drained, not after the whole grace period"
    );
    // The usage record was flushed before exit.
    let events = gw.usage_events().await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["output_tokens"], 24);
}

#[tokio::test]
async fn idle_gateway_stops_at_once() {
    let mock = Mock::start(&[]);
    let mut gw = Gateway::start(&mock, Options::default());
    let t = std::time::Instant::now();
    assert!(gw.terminate());
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

/// Pingora's graceful upgrade: a new process takes both listeners over (SIGQUIT to the old one),
/// the old one finishes its streams and exits; no request is refused.
#[tokio::test]
async fn graceful_upgrade_hands_over_both_listeners() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let mock = Mock::start(&["--chunks", "10", "--chunk-delay-ms", "100"]);
    let mut old = Gateway::start(&mock, Options::default());
    let key = old.user_with_key("upgrade@example.com", &[]);
    // The new process must bind the very same addresses.
    let text = std::fs::read_to_string(&old.config_path).unwrap();
    let text = text
        .replace(
            "api_listen = \"127.0.0.1:0\"",
            &format!("api_listen = \"{}\"", old.api.trim_start_matches("http://")),
        )
        .replace(
            "site_listen = \"127.0.0.1:0\"",
            &format!(
                "site_listen = \"{}\"",
                old.site.trim_start_matches("http://")
            ),
        );
    std::fs::write(&old.config_path, text).unwrap();

    let mut s = chat("mock-gpt");
    s["stream"] = json!(true);
    let stream = tokio::spawn({
        let url = old.url("/v1/chat/completions");
        let key = key.clone();
        async move {
            client()
                .post(url)
                .bearer_auth(key)
                .json(&s)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gateway"));
    cmd.arg("--config")
        .arg(&old.config_path)
        .arg("serve")
        .env("GATEWAY_UPGRADE", "1")
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::from(
            std::fs::File::create(old.dir.path().join("new.log")).unwrap(),
        ));
    for (k, v) in &old.env {
        cmd.env(k, v);
    }
    let mut new = cmd.spawn().unwrap();
    let out = new.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if line.starts_with("gateway listening") {
                let _ = tx.send(line);
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let old_pid = std::process::Command::new("pgrep")
        .args(["-f", "-o", old.config_path.to_str().unwrap()])
        .output()
        .unwrap();
    let old_pid = String::from_utf8_lossy(&old_pid.stdout).trim().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-QUIT", &old_pid])
        .status()
        .unwrap()
        .success());
    let line = rx
        .recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|e| {
            panic!(
                "new process did not take over ({e}): {}",
                std::fs::read_to_string(old.dir.path().join("new.log")).unwrap_or_default()
            )
        });
    assert!(
        line.contains(old.api.trim_start_matches("http://")),
        "{line}"
    );

    // The in-flight stream on the old process completes.
    let text = stream.await.unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    // New requests are served (by the new process) on the same addresses, both listeners.
    for _ in 0..5 {
        let r = client()
            .post(old.url("/v1/chat/completions"))
            .bearer_auth(&key)
            .json(&chat("mock-gpt"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let r = client()
        .get(old.site_url("/api/auth/config"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // The old process exits by itself once drained.
    let exited = tokio::task::spawn_blocking(move || {
        let ok = old.terminate();
        (ok, old)
    })
    .await
    .unwrap();
    let _ = exited;
    let _ = new.kill();
    let _ = new.wait();
}
