//! Provider resilience through the real server: passive health per deployment (ejection after
//! consecutive failures, `retry-after`, recovery), panic routing, load-aware choice, bounded
//! failover, per-provider timeouts answered in the client's style, and the metrics and log lines
//! that show it.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

async fn post(gw: &Gateway, path: &str, key: &str, body: Value) -> reqwest::Response {
    client()
        .post(gw.url(path))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .expect("request")
}

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hello"}]})
}

fn messages(model: &str) -> Value {
    json!({"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]})
}

fn request_id(r: &reqwest::Response) -> String {
    r.headers()["x-request-id"]
        .to_str()
        .expect("request id")
        .to_string()
}

/// Makes the mock answer its next `count` model requests with `status`.
async fn script(mock: &Mock, status: u16, count: u64, retry_after: Option<u64>) {
    let r = client()
        .post(format!("{}/__mock/fail", mock.url()))
        .json(&json!({"status": status, "count": count, "retry_after": retry_after}))
        .send()
        .await
        .expect("script the mock");
    assert_eq!(r.status(), 200);
}

/// A loopback port nothing listens on: connections to it are refused.
fn refused_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// The value of one series on the admin listener (0 when the series does not exist yet).
async fn metric(gw: &Gateway, name: &str, labels: &str) -> f64 {
    gw.metric(&format!("{name}{{{labels}}}")).await
}

/// The test's config, the admin listener (metrics) and info-level logs (recoveries); Redis when
/// the run has one (health is per instance, and must not depend on it either way).
fn options(extra: &str) -> Options {
    Options {
        extra_toml: extra.into(),
        admin: true,
        env: vec![("RUST_LOG".into(), "info".into())],
        redis_url: std::env::var("GATEWAY_TEST_REDIS").ok(),
        ..Options::default()
    }
}

#[tokio::test]
async fn one_provider_500_does_not_take_a_single_deployment_model_offline() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, options(""));
    let key = gw.user_with_key("one500@example.com", &[]);
    script(&mock, 500, 1, None).await;
    let r = post(&gw, "/v1/chat/completions", &key, chat("mock-gpt")).await;
    assert_eq!(r.status(), 500, "the provider's error is passed on");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["message"], "mock status 500");
    for _ in 0..3 {
        let r = post(&gw, "/v1/chat/completions", &key, chat("mock-gpt")).await;
        assert_eq!(r.status(), 200, "one failure ejects nothing");
    }
    assert_eq!(
        mock.requests().await.len(),
        4,
        "every request reached the provider"
    );
    let d = r#"deployment="mock/mock-gpt""#;
    assert_eq!(metric(&gw, "gateway_deployment_healthy", d).await, 1.0);
    assert_eq!(
        metric(
            &gw,
            "gateway_upstream_attempts_total",
            &format!(r#"{d},outcome="server_error""#)
        )
        .await,
        1.0
    );
    assert_eq!(
        metric(
            &gw,
            "gateway_upstream_attempts_total",
            &format!(r#"{d},outcome="ok""#)
        )
        .await,
        3.0
    );
    assert!(!gw.log().contains("ejected"), "{}", gw.log());
}

#[tokio::test]
async fn three_failures_eject_and_a_later_success_recovers() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, options(""));
    let key = gw.user_with_key("eject@example.com", &[]);
    let d = r#"deployment="mock/mock-gpt""#;
    let ejections = format!(r#"{d},reason="server_error""#);
    script(&mock, 503, 3, None).await;
    for _ in 0..2 {
        let r = post(&gw, "/v1/chat/completions", &key, chat("mock-gpt")).await;
        assert_eq!(r.status(), 503);
    }
    assert_eq!(metric(&gw, "gateway_deployment_healthy", d).await, 1.0);
    assert_eq!(
        metric(&gw, "gateway_deployment_ejections_total", &ejections).await,
        0.0
    );
    let third = post(&gw, "/v1/chat/completions", &key, chat("mock-gpt")).await;
    assert_eq!(third.status(), 503);
    let third_id = request_id(&third);
    assert_eq!(metric(&gw, "gateway_deployment_healthy", d).await, 0.0);
    assert_eq!(
        metric(&gw, "gateway_deployment_ejections_total", &ejections).await,
        1.0
    );

    // Ejected, but the only deployment: it is still asked (panic routing), and its success
    // ends the ejection at once.
    let fourth = post(&gw, "/v1/chat/completions", &key, chat("mock-gpt")).await;
    assert_eq!(fourth.status(), 200);
    let fourth_id = request_id(&fourth);
    assert_eq!(mock.requests().await.len(), 4);
    assert_eq!(metric(&gw, "gateway_deployment_healthy", d).await, 1.0);

    // Each transition is logged once, with the request that caused it.
    let log = gw.log();
    let ejected: Vec<&str> = log.lines().filter(|l| l.contains("ejected")).collect();
    assert_eq!(ejected.len(), 1, "{log}");
    assert!(ejected[0].contains("mock/mock-gpt"), "{}", ejected[0]);
    assert!(ejected[0].contains(&third_id), "{}", ejected[0]);
    assert!(
        ejected[0].contains("3 consecutive failures"),
        "{}",
        ejected[0]
    );
    let recovered: Vec<&str> = log.lines().filter(|l| l.contains("recovered")).collect();
    assert_eq!(recovered.len(), 1, "{log}");
    assert!(recovered[0].contains(&fourth_id), "{}", recovered[0]);

    // Its record was cleared: it takes three failures again to eject it.
    script(&mock, 500, 2, None).await;
    for _ in 0..2 {
        post(&gw, "/v1/chat/completions", &key, chat("mock-gpt")).await;
    }
    assert_eq!(metric(&gw, "gateway_deployment_healthy", d).await, 1.0);
}

#[tokio::test]
async fn a_dead_deployment_stops_getting_attempts_after_its_ejection() {
    let mock = Mock::start(&[]);
    let extra = format!(
        r#"
[[providers]]
name = "dead"
style = "openai"
base_url = "http://127.0.0.1:{port}"
cooldown_seconds = 60

[[models]]
id = "pair"
deployments = [
  {{ provider = "dead", upstream_model = "mock-gpt", weight = 1 }},
  {{ provider = "mock", upstream_model = "mock-gpt", weight = 1 }},
]
"#,
        port = refused_port()
    );
    let gw = Gateway::start(&mock, options(&extra));
    let key = gw.user_with_key("dead@example.com", &["--rpm", "1000"]);
    for _ in 0..30 {
        let r = post(&gw, "/v1/chat/completions", &key, chat("pair")).await;
        assert_eq!(r.status(), 200, "the live deployment answers every request");
    }
    assert_eq!(mock.served().await, 30);
    let dead = r#"deployment="dead/mock-gpt""#;
    assert_eq!(
        metric(
            &gw,
            "gateway_upstream_attempts_total",
            &format!(r#"{dead},outcome="connect_error""#)
        )
        .await,
        3.0,
        "tried until its third failure, then left alone"
    );
    assert_eq!(
        metric(
            &gw,
            "gateway_deployment_ejections_total",
            &format!(r#"{dead},reason="connect_error""#)
        )
        .await,
        1.0
    );
    assert_eq!(metric(&gw, "gateway_deployment_healthy", dead).await, 0.0);
    assert_eq!(
        metric(
            &gw,
            "gateway_deployment_healthy",
            r#"deployment="mock/mock-gpt""#
        )
        .await,
        1.0
    );
    let events = gw.wait_usage(30).await;
    assert!(
        events.iter().all(|e| e["deployment"] == "mock/mock-gpt"),
        "{events:?}"
    );
}

#[tokio::test]
async fn a_429_with_retry_after_moves_traffic_away_for_that_long() {
    let mock = Mock::start(&[]);
    let other = Mock::start(&[]);
    let extra = format!(
        r#"
[[providers]]
name = "other"
style = "openai"
base_url = "{}"

[[models]]
id = "pair"
deployments = [
  {{ provider = "mock", upstream_model = "mock-gpt", weight = 1 }},
  {{ provider = "other", upstream_model = "mock-gpt", weight = 1 }},
]
"#,
        other.url()
    );
    let gw = Gateway::start(&mock, options(&extra));
    let key = gw.user_with_key("retry@example.com", &["--rpm", "1000"]);
    script(&mock, 429, 1, Some(2)).await;
    let mut asked_at = None;
    for _ in 0..40 {
        let sent = Instant::now();
        let r = post(&gw, "/v1/chat/completions", &key, chat("pair")).await;
        assert_eq!(
            r.status(),
            200,
            "the 429 fails over to the other deployment"
        );
        if mock.served().await == 1 {
            asked_at = Some(sent);
            break;
        }
    }
    let asked_at = asked_at.expect("the first deployment was chosen at some point");
    assert_eq!(
        metric(
            &gw,
            "gateway_deployment_ejections_total",
            r#"deployment="mock/mock-gpt",reason="retry_after""#
        )
        .await,
        1.0
    );
    // For the two seconds it named, every request goes to the other deployment.
    while asked_at.elapsed() < Duration::from_millis(1500) {
        let r = post(&gw, "/v1/chat/completions", &key, chat("pair")).await;
        assert_eq!(r.status(), 200);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(mock.served().await, 1, "nothing was sent during the wait");
    // Afterwards it is back in the rotation.
    tokio::time::sleep(Duration::from_millis(2300).saturating_sub(asked_at.elapsed())).await;
    for _ in 0..40 {
        let r = post(&gw, "/v1/chat/completions", &key, chat("pair")).await;
        assert_eq!(r.status(), 200);
        if mock.served().await > 1 {
            break;
        }
    }
    assert!(mock.served().await > 1, "the wait is over");
}

#[tokio::test]
async fn when_every_deployment_fails_one_is_still_tried_and_its_error_passed_on() {
    let mock = Mock::start(&[]);
    let extra = r#"
[[providers]]
name = "brittle"
style = "openai"
base_url = "MOCK_URL"
api_key_env = "MOCK_OPENAI_KEY"
eject_after_failures = 1
cooldown_seconds = 60

[[models]]
id = "down"
deployments = [
  { provider = "brittle", upstream_model = "a-fail500", weight = 1 },
  { provider = "brittle", upstream_model = "b-fail500", weight = 1 },
]
"#
    .replace("MOCK_URL", &mock.url());
    let gw = Gateway::start(&mock, options(&extra));
    let key = gw.user_with_key("down@example.com", &[]);
    // Both are tried and both ejected; the last one's error is the answer.
    let r = post(&gw, "/v1/chat/completions", &key, chat("down")).await;
    assert_eq!(r.status(), 500);
    assert_eq!(mock.requests().await.len(), 2);
    for d in ["brittle/a-fail500", "brittle/b-fail500"] {
        let labels = format!(r#"deployment="{d}""#);
        assert_eq!(
            metric(&gw, "gateway_deployment_healthy", &labels).await,
            0.0
        );
    }
    // All ejected: still one attempt per request, never a 502 without asking.
    let r = post(&gw, "/v1/chat/completions", &key, chat("down")).await;
    assert_eq!(r.status(), 500);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["message"], "mock failure", "style A: {v}");
    assert_eq!(mock.requests().await.len(), 3);
    // A style-B client gets the provider's error in its own shape.
    let r = post(&gw, "/v1/messages", &key, messages("down")).await;
    assert_eq!(r.status(), 500);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "error", "style B: {v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("mock failure"),
        "{v}"
    );
    assert_eq!(mock.requests().await.len(), 4);
}

#[tokio::test]
async fn attempts_stay_within_the_bound_and_the_deadline() {
    let mock = Mock::start(&[]);
    let tardy = Mock::start(&["--latency-ms", "1500"]);
    let extra = format!(
        r#"
[[providers]]
name = "tardy"
style = "openai"
base_url = "{tardy}"
first_byte_timeout_ms = 300

[[models]]
id = "wide"
deployments = [
  {{ provider = "mock", upstream_model = "fail500-1" }},
  {{ provider = "mock", upstream_model = "fail500-2" }},
  {{ provider = "mock", upstream_model = "fail500-3" }},
  {{ provider = "mock", upstream_model = "fail500-4" }},
  {{ provider = "mock", upstream_model = "fail500-5" }},
]

[[models]]
id = "sluggish"
deployments = [
  {{ provider = "tardy", upstream_model = "s-1" }},
  {{ provider = "tardy", upstream_model = "s-2" }},
  {{ provider = "tardy", upstream_model = "s-3" }},
]

[routing]
max_attempts = 3
failover_deadline_ms = 500
"#,
        tardy = tardy.url()
    );
    let gw = Gateway::start(&mock, options(&extra));
    let key = gw.user_with_key("bound@example.com", &[]);
    let r = post(&gw, "/v1/chat/completions", &key, chat("wide")).await;
    assert_eq!(r.status(), 500);
    assert_eq!(mock.requests().await.len(), 3, "three attempts at most");

    // 300 ms per attempt, none started after 500 ms: two attempts, then the timeout is told.
    let started = Instant::now();
    let r = post(&gw, "/v1/chat/completions", &key, chat("sluggish")).await;
    let took = started.elapsed();
    assert_eq!(r.status(), 502);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "routing_unavailable", "{v}");
    assert_eq!(v["error"]["type"], "server_error", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("did not answer in time"),
        "{v}"
    );
    assert_eq!(
        tardy.requests().await.len(),
        2,
        "the deadline stopped a third"
    );
    assert!(took < Duration::from_millis(1200), "{took:?}");
}

#[tokio::test]
async fn timeouts_are_answered_in_the_clients_style() {
    let mock = Mock::start(&[]);
    let tardy = Mock::start(&["--latency-ms", "1500"]);
    let quiet = Mock::start(&["--chunk-delay-ms", "1000", "--chunks", "3"]);
    let extra = format!(
        r#"
[[providers]]
name = "tardy"
style = "anthropic"
base_url = "{tardy}"
first_byte_timeout_ms = 300

[[providers]]
name = "quiet"
style = "openai"
base_url = "{quiet}"
idle_timeout_ms = 300

[[providers]]
name = "quiet-anthropic"
style = "anthropic"
base_url = "{quiet}"
idle_timeout_ms = 300

[[models]]
id = "claude-tardy"
provider = "tardy"

[[models]]
id = "gpt-quiet"
provider = "quiet"

[[models]]
id = "claude-quiet"
provider = "quiet-anthropic"
"#,
        tardy = tardy.url(),
        quiet = quiet.url()
    );
    let gw = Gateway::start(&mock, options(&extra));
    let key = gw.user_with_key("timeouts@example.com", &[]);

    // First byte, style A and style B.
    let r = post(&gw, "/v1/chat/completions", &key, chat("claude-tardy")).await;
    assert_eq!(r.status(), 502);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "routing_unavailable", "{v}");
    assert!(v.get("type").is_none(), "style A: {v}");
    let r = post(&gw, "/v1/messages", &key, messages("claude-tardy")).await;
    assert_eq!(r.status(), 502);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "error", "style B: {v}");
    assert_eq!(v["error"]["code"], "routing_unavailable", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("did not answer in time"),
        "{v}"
    );

    // Idle between stream chunks: a terminal error event in the client's style, and the stream
    // ends (after the idle timeout, not the provider's pause).
    let mut s = chat("gpt-quiet");
    s["stream"] = json!(true);
    let started = Instant::now();
    let r = post(&gw, "/v1/chat/completions", &key, s).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(started.elapsed() < Duration::from_millis(900));
    let last = text.trim_end().lines().last().unwrap_or("");
    assert!(last.contains("upstream_error"), "style A: {text}");
    let mut m = messages("claude-quiet");
    m["stream"] = json!(true);
    let r = post(&gw, "/v1/messages", &key, m).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains("event: error\n"), "style B: {text}");
    assert!(!text.contains("message_stop"), "{text}");

    // Both streams settled as cut by the provider.
    let events = gw.wait_usage(4).await;
    let cut = events
        .iter()
        .filter(|e| {
            e["settlement"]
                .as_str()
                .unwrap_or("")
                .ends_with("upstream_error")
        })
        .count();
    assert_eq!(cut, 2, "{events:?}");
}

#[tokio::test]
async fn weights_hold_under_even_load_and_a_slow_deployment_gets_less() {
    let mock = Mock::start(&[]);
    let fast = Mock::start(&[]);
    let slow = Mock::start(&["--latency-ms", "200"]);
    let extra = format!(
        r#"
[[providers]]
name = "fast"
style = "openai"
base_url = "{fast}"

[[providers]]
name = "slow"
style = "openai"
base_url = "{slow}"

[[models]]
id = "weighted"
deployments = [
  {{ provider = "mock", upstream_model = "mock-gpt", weight = 3 }},
  {{ provider = "fast", upstream_model = "mock-gpt", weight = 1 }},
]

[[models]]
id = "uneven"
deployments = [
  {{ provider = "fast", upstream_model = "mock-gpt", weight = 1 }},
  {{ provider = "slow", upstream_model = "mock-gpt", weight = 1 }},
]
"#,
        fast = fast.url(),
        slow = slow.url()
    );
    // Weights, not limits: the default tier's per-minute output window would hold eight
    // concurrent 4096-token reservations close to its cap.
    let extra = extra + &config::uncapped_tier("beginner", 100_000_000, 0);
    let gw = Gateway::start(&mock, options(&extra));
    let key = gw.user_with_key("weights@example.com", &["--rpm", "1000"]);
    // 200 draws: a 3:1 share falls outside 0.6..=0.9 by chance about once in a million runs
    // (80 draws: about once in eight hundred).
    for _ in 0..200 {
        let r = post(&gw, "/v1/chat/completions", &key, chat("weighted")).await;
        assert_eq!(r.status(), 200);
    }
    let share = mock.served().await as f64 / 200.0;
    assert!(
        (0.6..=0.9).contains(&share),
        "weights 3:1 give ~0.75: {share}"
    );

    // Eight clients at once: the slow deployment's requests pile up and it loses the choices.
    let before = fast.served().await;
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let url = gw.url("/v1/chat/completions");
            let key = key.clone();
            tokio::spawn(async move {
                for _ in 0..10 {
                    let r = client()
                        .post(&url)
                        .bearer_auth(&key)
                        .json(&chat("uneven"))
                        .send()
                        .await
                        .expect("request");
                    assert_eq!(r.status(), 200);
                }
            })
        })
        .collect();
    for w in workers {
        w.await.expect("worker");
    }
    let to_slow = slow.served().await;
    assert_eq!(fast.served().await - before + to_slow, 80);
    assert!(to_slow < 20, "equal weights would give ~40: {to_slow}");
}

#[tokio::test]
async fn a_provider_without_its_credential_is_not_tried_and_the_answer_says_so() {
    let mock = Mock::start(&[]);
    let extra = r#"
[[providers]]
name = "keyless"
style = "openai"
base_url = "MOCK_URL"
api_key_env = "RESILIENCE_TEST_UNSET_KEY"

[[models]]
id = "orphan"
provider = "keyless"
"#
    .replace("MOCK_URL", &mock.url());
    let gw = Gateway::start(&mock, options(&extra));
    let key = gw.user_with_key("orphan@example.com", &[]);
    let r = post(&gw, "/v1/messages", &key, messages("orphan")).await;
    assert_eq!(r.status(), 502);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["code"], "routing_unavailable", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("credential"),
        "{v}"
    );
    assert_eq!(
        mock.served().await,
        0,
        "nothing was sent without a credential"
    );
    assert!(
        gw.log().contains("RESILIENCE_TEST_UNSET_KEY"),
        "the log names the variable: {}",
        gw.log()
    );
}
