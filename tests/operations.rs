//! Operations: metrics on the admin listener only, the access log, live config reload, and a
//! graceful stop that lets streams finish and loses no usage record.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
    // Its settlement is recorded (with Redis, after the next renewal round): the
    // reservation gauge is back to 0.
    gw.wait_usage(1).await;
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
    // An RFC 3339 time (UTC, milliseconds) and a latency in milliseconds rounded to the
    // microsecond, printed as such (`0.309`, never `0.30880799999999997`).
    let at = time::OffsetDateTime::parse(
        v["time"].as_str().expect("time field"),
        &time::format_description::well_known::Rfc3339,
    )
    .expect("RFC 3339 time");
    let age = time::OffsetDateTime::now_utc() - at;
    assert!(
        age >= time::Duration::ZERO && age < time::Duration::minutes(1),
        "{at}"
    );
    assert!(v["time"].as_str().unwrap().ends_with('Z'));
    let latency = json_part
        .split("\"latency_ms\":")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .expect("latency field");
    let decimals = latency.split_once('.').map_or(0, |(_, d)| d.len());
    assert!(decimals <= 3, "latency printed as {latency}");
    assert!(v["latency_ms"].as_f64().unwrap() > 0.0);
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

/// A file cut short at a section boundary is valid TOML; taken live it would return every
/// later section to its defaults. A reload (by the watcher or SIGHUP) that would lose a section
/// the running config has, or every model, is refused with an error naming the file; a bare
/// section header is how a section goes back to its defaults.
#[tokio::test]
async fn a_file_cut_at_a_section_boundary_is_refused_by_watch_and_sighup() {
    let mock = Mock::start(&[]);
    let tail = "\n[tools]\nsearch_provider = \"mock\"\n\n[limits]\nrequest_code_per_hour = 1000\n";
    let gw = Gateway::start(&mock, Options::with_toml(tail));
    let key = gw.user_with_key("cut@example.com", &[]);
    let search = || {
        let (url, key) = (gw.url("/v1/search"), key.clone());
        async move {
            client()
                .post(url)
                .bearer_auth(key)
                .json(&json!({"query": "rust"}))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    let hup = || {
        let pid = gw.pid().expect("pid").to_string();
        assert!(Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success());
    };
    let refusals = || gw.log().matches("config reload refused").count();
    assert_eq!(search().await, 200);

    let original = std::fs::read_to_string(&gw.config_path).unwrap();
    let cut = &original[..original.find("[tools]").expect("[tools]")];
    let file = gw.config_path.display().to_string();
    std::fs::write(&gw.config_path, cut).unwrap();
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(search().await, 200, "the cut file went live");
    let log = gw.log();
    assert!(
        log.contains(&format!(
            "config reload refused, keeping the running config: {file}: [limits], [tools] missing"
        )),
        "{log}"
    );
    let seen = refusals();
    hup();
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(search().await, 200, "SIGHUP took the cut file");
    assert!(refusals() > seen, "{}", gw.log());

    // Cut before the models: none left, refused on either path.
    let no_models = &original[..original.find("[[models]]").expect("[[models]]")];
    let seen = refusals();
    std::fs::write(&gw.config_path, no_models).unwrap();
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(refusals() > seen, "{}", gw.log());
    let seen = refusals();
    hup();
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(refusals() > seen, "{}", gw.log());
    assert_eq!(search().await, 200);
    assert!(
        gw.log().contains(&format!(
            "{file}: models: missing: a config needs at least one"
        )),
        "{}",
        gw.log()
    );

    // A bare header returns the section to its defaults: search is off.
    let seen = refusals();
    let bare = original.replace("search_provider = \"mock\"\n", "");
    std::fs::write(&gw.config_path, bare).unwrap();
    let start = Instant::now();
    while search().await != 404 {
        assert!(start.elapsed() < Duration::from_secs(10), "{}", gw.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(refusals(), seen);
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

/// Rewrites `gw`'s config so its listeners are the addresses it has now (a graceful upgrade's
/// new process must ask for the very same ones).
fn pin_listen_addresses(gw: &Gateway) {
    let text = std::fs::read_to_string(&gw.config_path).unwrap();
    let text = text
        .replace(
            "api_listen = \"127.0.0.1:0\"",
            &format!("api_listen = \"{}\"", gw.api.trim_start_matches("http://")),
        )
        .replace(
            "site_listen = \"127.0.0.1:0\"",
            &format!(
                "site_listen = \"{}\"",
                gw.site.trim_start_matches("http://")
            ),
        );
    std::fs::write(&gw.config_path, text).unwrap();
}

/// The documented graceful upgrade of `old` (docs/operations.md): a new process on the same
/// config with `GATEWAY_UPGRADE=1` (stderr at `info` to `log`), then SIGQUIT to the pid in the
/// pid file, which must still name `old`. Returns the new process once it prints its
/// listening line.
async fn graceful_upgrade(old: &Gateway, log: &Path) -> (Child, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gateway"));
    cmd.arg("--config")
        .arg(&old.config_path)
        .arg("serve")
        .envs(old.env.iter().map(|(k, v)| (k, v)))
        .env("GATEWAY_UPGRADE", "1")
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(log).unwrap()));
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
    // The README's `kill -QUIT "$(cat data/gateway.pid)"`: until it has the listeners, the new
    // process leaves the pid file naming the old one.
    let pid_file = old.dir.path().join("data/gateway.pid");
    let old_pid = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .to_string();
    assert_eq!(Some(old_pid.parse::<u32>().unwrap()), old.pid());
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
                std::fs::read_to_string(log).unwrap_or_default()
            )
        });
    assert!(
        line.contains(old.api.trim_start_matches("http://")),
        "{line}"
    );
    (new, line)
}

/// Log lines at `ERROR` or `WARN` in `log`.
fn alarms(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains(" ERROR ") || l.contains(" WARN "))
        .collect()
}

/// Pingora's graceful upgrade: a new process takes both listeners over (SIGQUIT to the old one),
/// the old one finishes its streams and exits; no request is refused. Neither process logs an
/// alarm on this happy path: the new one says it waits for the listeners, at `INFO`.
#[tokio::test]
async fn graceful_upgrade_hands_over_both_listeners() {
    let mock = Mock::start(&["--chunks", "10", "--chunk-delay-ms", "100"]);
    let mut old = Gateway::start(
        &mock,
        Options {
            env: vec![("RUST_LOG".into(), "info".into())],
            ..Options::default()
        },
    );
    let key = old.user_with_key("upgrade@example.com", &[]);
    pin_listen_addresses(&old);

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
    let new_log = old.dir.path().join("new.log");
    let (mut new, _) = graceful_upgrade(&old, &new_log).await;

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
    // The old process exits by itself once drained, leaving the new process's pid file.
    let pid_file = old.dir.path().join("data/gateway.pid");
    let old_log_path = old.log_path();
    let exited = tokio::task::spawn_blocking(move || {
        let ok = old.terminate();
        (ok, old)
    })
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(&pid_file).unwrap().trim(),
        new.id().to_string()
    );
    let _ = new.kill();
    let _ = new.wait();
    let new_log = std::fs::read_to_string(&new_log).unwrap();
    let old_log = std::fs::read_to_string(&old_log_path).unwrap();
    drop(exited);
    assert!(
        new_log.contains("INFO  gateway::lifecycle] graceful upgrade: waiting for the running gateway to hand its listeners over"),
        "{new_log}"
    );
    for (who, log) in [("new", &new_log), ("old", &old_log)] {
        assert!(
            alarms(log).is_empty(),
            "{who} process: {:?}\n{log}",
            alarms(log)
        );
        assert!(!log.contains("No incoming socket transfer"), "{who}: {log}");
        assert!(!log.contains("_sqlx_migrations"), "{who}: {log}");
        // The listening line is on stdout, and (stderr being another file here) once in the log.
        assert_eq!(log.matches("gateway listening").count(), 1, "{who}: {log}");
    }
}

/// The per-minute windows outlive the process: a key at its limit is still refused after a
/// restart and after a graceful upgrade (in process, without Redis, the new process rebuilds
/// them from the usage events), so neither is a way around a limit.
#[tokio::test]
async fn per_minute_windows_survive_a_restart_and_a_graceful_upgrade() {
    let mock = Mock::start(&[]);
    let mut gw = Gateway::start(
        &mock,
        Options::with_toml("[quota.tiers.beginner]\nrequests_per_minute = 4\n"),
    );
    let key = gw.user_with_key("windows@example.com", &[]);
    let own = gw.user_with_key("own-window@example.com", &["--rpm", "2"]);
    // Everything below happens inside one minute.
    inside_one_minute(Duration::from_secs(40)).await;
    let send = |gw: &Gateway, key: &str| {
        client()
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(key.to_string())
            .json(&chat("mock-gpt"))
            .send()
    };
    for _ in 0..4 {
        assert_eq!(send(&gw, &key).await.unwrap().status(), 200);
    }
    for _ in 0..2 {
        assert_eq!(send(&gw, &own).await.unwrap().status(), 200);
    }
    let refused = |r: reqwest::Response| async move {
        let status = r.status();
        let body: Value = r.json().await.unwrap();
        (
            status.as_u16(),
            body["error"]["code"].as_str().unwrap_or("").to_string(),
        )
    };
    let at_limit = (429, "rate_limit_exceeded".to_string());
    assert_eq!(refused(send(&gw, &key).await.unwrap()).await, at_limit);
    assert_eq!(refused(send(&gw, &own).await.unwrap()).await, at_limit);

    // A plain restart.
    assert!(gw.terminate());
    gw.spawn();
    assert_eq!(
        refused(send(&gw, &key).await.unwrap()).await,
        at_limit,
        "after a restart"
    );
    assert_eq!(
        refused(send(&gw, &own).await.unwrap()).await,
        at_limit,
        "a key's own window"
    );

    // The documented graceful upgrade.
    pin_listen_addresses(&gw);
    let url = gw.url("/v1/chat/completions");
    let log = gw.dir.path().join("upgraded.log");
    let (mut new, _) = graceful_upgrade(&gw, &log).await;
    // The old process drains and exits, so the new one answers what follows.
    let gw = tokio::task::spawn_blocking(move || {
        gw.terminate();
        gw
    })
    .await
    .unwrap();
    for k in [&key, &own] {
        let r = client()
            .post(&url)
            .bearer_auth(k)
            .json(&chat("mock-gpt"))
            .send()
            .await
            .unwrap();
        assert_eq!(refused(r).await, at_limit, "after a graceful upgrade");
    }
    let _ = new.kill();
    let _ = new.wait();
    drop(gw);
}

/// Two gateways on one pid file (instances sharing a data directory) would overwrite each
/// other's pid and share the upgrade socket: the second start is refused, naming the key, and
/// the first keeps serving with its pid file. (The graceful upgrade's new process, started while
/// the old one lives, is the exception: `graceful_upgrade_hands_over_both_listeners`.)
#[tokio::test]
async fn a_second_instance_on_the_same_pid_file_is_refused() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, Options::default());
    let pid_file = gw.dir.path().join("data/gateway.pid");
    let first = std::fs::read_to_string(&pid_file).unwrap();
    assert_eq!(first.trim(), gw.pid().unwrap().to_string());

    // Same config (its listen addresses are port 0, so they would not collide).
    let log = gw.dir.path().join("second.log");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gateway"));
    cmd.arg("--config")
        .arg(&gw.config_path)
        .envs(gw.env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()));
    let mut second = cmd.spawn().unwrap();
    let status = wait_exit(&mut second, Duration::from_secs(10)).expect("the second one exits");
    assert_eq!(status.code(), Some(1));
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(
        stderr.contains("error: another gateway (pid ")
            && stderr.contains(&format!("pid {}", gw.pid().unwrap()))
            && stderr.contains("server.pid_file")
            && stderr.contains("server.upgrade_sock"),
        "{stderr}"
    );
    let mut stdout = String::new();
    let _ = second.stdout.take().unwrap().read_to_string(&mut stdout);
    assert!(!stdout.contains("listening"), "{stdout}");
    assert_eq!(std::fs::read_to_string(&pid_file).unwrap(), first);
    let r = client().get(gw.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), 200);

    // With its own pid file and upgrade socket, a second instance on the same data directory
    // starts.
    let own = gw.dir.path().join("own.toml");
    let text = std::fs::read_to_string(&gw.config_path).unwrap().replace(
        "shutdown_drain_seconds = 5\n",
        &format!(
            "shutdown_drain_seconds = 5\npid_file = \"{0}/data/b.pid\"\nupgrade_sock = \"{0}/data/b.sock\"\n",
            gw.dir.path().display()
        ),
    );
    std::fs::write(&own, text).unwrap();
    let mut b = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .arg("--config")
        .arg(&own)
        .envs(gw.env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let line = first_line(&mut b, Duration::from_secs(60)).expect("b starts");
    assert!(line.starts_with("gateway listening"), "{line}");
    assert_eq!(
        std::fs::read_to_string(gw.dir.path().join("data/b.pid"))
            .unwrap()
            .trim(),
        b.id().to_string()
    );
    assert_eq!(std::fs::read_to_string(&pid_file).unwrap(), first);
    let _ = b.kill();
    let _ = b.wait();

    // A pid file left by a killed gateway does not block the next start.
    let mut gw = gw;
    gw.kill();
    assert!(pid_file.exists());
    gw.spawn();
    assert_eq!(
        std::fs::read_to_string(&pid_file).unwrap().trim(),
        gw.pid().unwrap().to_string()
    );
}

/// Starts the binary on `config` with the harness's secrets, stdout piped and stderr to `log`.
fn spawn_gateway(config: &Path, log: &Path) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gateway"));
    cmd.arg("--config")
        .arg(config)
        .arg("serve")
        .env("RUST_LOG", "warn")
        .env("GATEWAY_KEY_PEPPER", PEPPER)
        .env("GATEWAY_SESSION_SECRET", SESSION_SECRET)
        .env("GATEWAY_WEBHOOK_SECRET", WEBHOOK_SECRET)
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(log).unwrap()));
    cmd.spawn().expect("start gateway")
}

/// Waits up to `limit` for `child` to exit.
fn wait_exit(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// The first stdout line of `child`, within `limit`.
fn first_line(child: &mut Child, limit: Duration) -> Option<String> {
    let out = child.stdout.take()?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(out).lines();
        if let Some(Ok(line)) = lines.next() {
            let _ = tx.send(line);
        }
        for _ in lines {}
    });
    rx.recv_timeout(limit).ok()
}

#[tokio::test]
async fn pid_file_while_serving_gone_after_sigterm_and_the_panel_url_at_start() {
    let mock = Mock::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let db = database_url(dir.path());
    let _drop = DropDatabase(db.clone());
    let config = dir.path().join("gateway.toml");
    let text = base_config(&mock, &db, None, dir.path()).replace(
        "site_origin = \"http://127.0.0.1:8081\"",
        "site_origin = \"https://gw.example.com\"",
    );
    std::fs::write(&config, text).unwrap();
    let mut child = spawn_gateway(&config, &dir.path().join("gateway.log"));
    let line = first_line(&mut child, Duration::from_secs(60)).expect("startup line");
    assert!(line.starts_with("gateway listening api="), "{line}");
    assert!(
        line.ends_with(" panel=https://gw.example.com/panel"),
        "{line}"
    );

    // The shipped default is data/gateway.pid; the harness's data directory is <dir>/data,
    // created by the gateway for its owner only.
    let pid_file = dir.path().join("data/gateway.pid");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("data"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700, "data/ is {:o}", mode & 0o777);
    }
    let written = std::fs::read_to_string(&pid_file).expect("pid file while serving");
    assert_eq!(written.trim(), child.id().to_string());

    // Serving (the signal handlers are in place once the listeners answer).
    let api = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("api="))
        .unwrap()
        .to_string();
    let mut up = false;
    for _ in 0..200 {
        if let Ok(r) = client().get(format!("http://{api}/health")).send().await {
            up = r.status() == 200;
            if up {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(up, "never served");
    assert!(pid_file.exists());
    assert!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let status = wait_exit(&mut child, Duration::from_secs(10)).expect("exits after SIGTERM");
    assert!(status.success(), "{status:?}");
    assert!(!pid_file.exists(), "the pid file outlived a clean exit");
}

/// A listen address another process holds ends the start within seconds: non-zero, the
/// address and its key named, no panic, no "listening" line, and no pid file written over.
#[test]
fn a_busy_listen_address_ends_the_start_naming_it() {
    let mock = Mock::start(&[]);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    for key in ["api_listen", "site_listen", "admin_listen"] {
        let dir = tempfile::tempdir().unwrap();
        let db = format!("sqlite://{}/gateway.db", dir.path().display());
        let mut text = base_config(&mock, &db, None, dir.path());
        text = if key == "admin_listen" {
            text.replace(
                "shutdown_drain_seconds = 5\n",
                &format!("shutdown_drain_seconds = 5\nadmin_listen = \"{addr}\"\n"),
            )
        } else {
            text.replace(
                &format!("{key} = \"127.0.0.1:0\""),
                &format!("{key} = \"{addr}\""),
            )
        };
        let config = dir.path().join("gateway.toml");
        std::fs::write(&config, text).unwrap();
        // Another gateway's pid file is left alone.
        let pid_file = dir.path().join("data/gateway.pid");
        std::fs::create_dir_all(pid_file.parent().unwrap()).unwrap();
        std::fs::write(&pid_file, "424242\n").unwrap();

        let log = dir.path().join("gateway.log");
        let started = Instant::now();
        let mut child = spawn_gateway(&config, &log);
        let status = wait_exit(&mut child, Duration::from_secs(10))
            .unwrap_or_else(|| panic!("{key}: still running after 10 s"));
        assert!(!status.success(), "{key}: {status:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
        let stderr = std::fs::read_to_string(&log).unwrap();
        assert!(
            stderr.contains(&addr) && stderr.contains(key),
            "{key}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{key}: {stderr}");
        let mut stdout = String::new();
        let _ = child.stdout.take().unwrap().read_to_string(&mut stdout);
        assert!(!stdout.contains("listening"), "{key}: {stdout}");
        assert_eq!(std::fs::read_to_string(&pid_file).unwrap(), "424242\n");
    }
    drop(taken);
}

/// Starts a private redis-server on a free loopback port (the shared one must not be stopped).
fn start_redis() -> (Child, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server");
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return (child, port);
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("redis-server did not start");
}

#[tokio::test]
async fn ready_checks_the_database_and_redis_while_health_touches_nothing() {
    let mock = Mock::start(&[]);
    let (mut redis, port) = start_redis();
    let gw = Gateway::start(
        &mock,
        Options {
            redis_url: Some(format!("redis://127.0.0.1:{port}")),
            ..Options::default()
        },
    );
    let c = client();
    let get = |path: &'static str| {
        let c = c.clone();
        let url = gw.url(path);
        async move {
            let r = c.get(url).send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap())
        }
    };
    assert_eq!(get("/ready").await, (200, json!({"ok": true})));
    assert_eq!(get("/health").await, (200, json!({"ok": true})));

    let _ = redis.kill();
    let _ = redis.wait();
    let asked = Instant::now();
    assert_eq!(
        get("/ready").await,
        (503, json!({"ok": false, "failing": ["redis"]}))
    );
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(get("/health").await, (200, json!({"ok": true})));

    if gw.database_url.starts_with("postgres") {
        // The database goes away too.
        drop_test_database(&gw.database_url);
        assert_eq!(
            get("/ready").await,
            (503, json!({"ok": false, "failing": ["database", "redis"]}))
        );
        assert_eq!(get("/health").await, (200, json!({"ok": true})));
    }
}

#[test]
fn version_names_the_commit_it_was_built_from() {
    let out = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let commit = text
        .strip_prefix(concat!("gateway ", env!("CARGO_PKG_VERSION"), " (commit "))
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("unexpected --version: {text}"));
    let repo = env!("CARGO_MANIFEST_DIR");
    let git_works = Command::new("git")
        .args(["-C", repo, "rev-parse", "HEAD"])
        .output()
        .is_ok_and(|o| o.status.success());
    if git_works && std::env::var("GATEWAY_BUILD_COMMIT").is_err() {
        assert!(
            commit.len() >= 7 && commit.bytes().all(|b| b.is_ascii_hexdigit()),
            "{text}"
        );
        let known = Command::new("git")
            .args([
                "-C",
                repo,
                "cat-file",
                "-e",
                &format!("{commit}^{{commit}}"),
            ])
            .status()
            .unwrap();
        assert!(
            known.success(),
            "{commit} is not a commit of this repository"
        );
    } else {
        assert!(!commit.is_empty(), "{text}");
    }
}

/// The account service's private socket lives in the data directory, one per process; the
/// files a killed process leaves (there, or in the temporary directory where earlier versions
/// kept them) are removed at the next start, and never a running process's.
#[tokio::test]
async fn sockets_left_by_killed_processes_are_removed_at_start() {
    use std::os::unix::net::UnixListener;
    let (_mock, mut gw) = config::start_with_toml("");
    let data = gw.dir.path().join("data");
    let killed = gw.pid().expect("pid");
    let left = data.join(format!("gateway-site-{killed}.sock"));
    assert!(left.exists(), "the socket is in the data directory");
    gw.kill();
    assert!(left.exists(), "kill -9 leaves it behind");

    let tag = gateway_core::util::random_base62(8);
    let tmp = std::env::temp_dir();
    let old_style = tmp.join(format!("gateway-site-{killed}-{tag}.sock"));
    let live = std::process::id();
    let live_here = data.join(format!("gateway-site-{live}.sock"));
    let live_tmp = tmp.join(format!("gateway-site-{live}-{tag}.sock"));
    let _listeners: Vec<UnixListener> = [&old_style, &live_here, &live_tmp]
        .iter()
        .map(|p| UnixListener::bind(p).expect("bind"))
        .collect();
    // Not a socket, whatever its name says.
    let not_a_socket = data.join(format!("gateway-site-{killed}-kept.sock"));
    std::fs::write(&not_a_socket, "x").expect("write");

    gw.spawn();
    let now = gw.pid().expect("pid");
    let after = [&left, &old_style, &live_here, &live_tmp, &not_a_socket].map(|p| p.exists());
    let _ = std::fs::remove_file(&old_style);
    let _ = std::fs::remove_file(&live_tmp);
    assert_eq!(
        after,
        [false, false, true, true, true],
        "killed process's socket, its old-style one in {}, a running process's two, a file",
        tmp.display()
    );
    assert!(data.join(format!("gateway-site-{now}.sock")).exists());
    let r = client()
        .get(gw.site_url("/api/auth/session"))
        .send()
        .await
        .expect("site");
    assert_eq!(r.status(), 200, "the site is served through the new socket");
}
