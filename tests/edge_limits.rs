//! Connection and request-size limits of both listeners (`[server.limits]`), through the real
//! server with raw sockets: a slow head is cut at its deadline however it drips, an oversized
//! head gets 431, connection caps refuse the excess and recover, idle keep-alives close, slow
//! bodies are cut, a key with nothing left is refused before its large body is read, and the
//! body budget answers 503 `server_busy`.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

fn options(limits: &str, extra: &str) -> Options {
    Options::with_toml(format!("{extra}\n[server.limits]\n{limits}\n")).on_test_redis()
}

fn host(base: &str) -> String {
    base.trim_start_matches("http://").to_string()
}

async fn connect(base: &str) -> TcpStream {
    TcpStream::connect(host(base)).await.expect("connect")
}

/// A connection from another loopback address (Linux routes all of 127/8 to loopback).
async fn connect_from(local: &str, base: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(format!("{local}:0").parse().expect("local address"))
        .expect("bind");
    socket
        .connect(host(base).parse().expect("address"))
        .await
        .expect("connect")
}

/// Reads until the server closes the connection (end of stream or reset); returns how long that
/// took and what arrived. Fails the test if it stays open past `max`.
async fn until_closed(s: &mut TcpStream, max: Duration) -> (Duration, String) {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at((start + max).into(), s.read(&mut buf)).await {
            Err(_) => panic!(
                "connection still open after {max:?}; got {:?}",
                String::from_utf8_lossy(&got)
            ),
            Ok(Ok(0)) | Ok(Err(_)) => {
                return (start.elapsed(), String::from_utf8_lossy(&got).to_string())
            }
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Sends one `GET /health` on `s` and reads its answer's head and (small) body; the
/// connection stays open.
async fn health(s: &mut TcpStream) -> String {
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(5);
    while !String::from_utf8_lossy(&got).contains("{\"ok\":true}") {
        match tokio::time::timeout_at(deadline.into(), s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            other => panic!(
                "no health answer ({other:?}): {:?}",
                String::from_utf8_lossy(&got)
            ),
        }
    }
    String::from_utf8_lossy(&got).to_string()
}

/// Whether the server closed `s` at once without answering (a refused connection).
async fn refused(s: &mut TcpStream) -> bool {
    let _ = s
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

/// A head dripped a line at a time (each byte arriving well within any per-read timeout) is
/// cut at the head deadline, on both listeners; a prompt request still works.
#[tokio::test]
async fn slow_header_drip_is_cut_at_the_head_deadline() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, options("header_timeout_seconds = 1", ""));
    for base in [&gw.api, &gw.site] {
        let mut s = connect(base).await;
        s.write_all(b"GET /health HTTP/1.1\r\n")
            .await
            .expect("write");
        let start = Instant::now();
        let drip = async {
            for i in 0..40 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if s.write_all(format!("x-drip-{i}: y\r\n").as_bytes())
                    .await
                    .is_err()
                {
                    break;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(5), drip)
            .await
            .expect("drip");
        let (_, got) = until_closed(&mut s, Duration::from_secs(3)).await;
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(800) && took < Duration::from_millis(2500),
            "{base}: closed after {took:?}"
        );
        assert!(
            !got.contains("200"),
            "{base}: a dripped head was served: {got}"
        );

        let mut prompt = connect(base).await;
        assert!(health(&mut prompt).await.starts_with("HTTP/1.1 200"));
    }
}

/// A head over `max_header_bytes` gets 431 in each listener's error shape; one under it is
/// served.
#[tokio::test]
async fn oversized_headers_get_431() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, options("max_header_bytes = 8192", ""));
    let big = "a".repeat(16 * 1024);
    for (base, code_path) in [(&gw.api, "/error/code"), (&gw.site, "/code")] {
        let mut s = connect(base).await;
        let head = format!("GET /health HTTP/1.1\r\nHost: x\r\nx-big: {big}\r\n\r\n");
        let _ = s.write_all(head.as_bytes()).await;
        let (_, got) = until_closed(&mut s, Duration::from_secs(5)).await;
        assert!(
            got.starts_with("HTTP/1.1 431"),
            "{base}: {:?}",
            &got[..got.len().min(200)]
        );
        let body = got.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        let v: Value = serde_json::from_str(body).expect("JSON error body");
        assert_eq!(
            v.pointer(code_path).and_then(Value::as_str),
            Some("request_header_too_large"),
            "{base}: {v}"
        );

        let mut s = connect(base).await;
        let fine = format!(
            "GET /health HTTP/1.1\r\nHost: x\r\nx-fine: {}\r\n\r\n",
            "b".repeat(4096)
        );
        s.write_all(fine.as_bytes()).await.expect("write");
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).await.expect("read");
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{base}");
    }
}

/// Connections over the per-address cap and over the total cap are closed at once without an
/// answer, across both listeners; once connections close, new ones are served again. The
/// refusal is logged once per address.
#[tokio::test]
async fn connection_caps_refuse_the_excess_and_recover() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(
        &mock,
        options(
            "max_connections = 5\nmax_connections_per_address = 3\nheader_timeout_seconds = 30",
            "",
        ),
    );
    // The harness's readiness probes (from 127.0.0.1) close their connections at once.
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Three from 127.0.0.4, over both listeners: the per-address cap. Each is answered once
    // (and kept alive) before the next, so the server has counted it.
    let mut held = Vec::new();
    for base in [&gw.api, &gw.site, &gw.api] {
        let mut s = connect_from("127.0.0.4", base).await;
        assert!(health(&mut s).await.starts_with("HTTP/1.1 200"));
        held.push(s);
    }
    for base in [&gw.api, &gw.site] {
        let mut extra = connect_from("127.0.0.4", base).await;
        assert!(
            refused(&mut extra).await,
            "{base}: over the per-address cap"
        );
    }
    // Two more from 127.0.0.5 reach the total; a third address is refused too.
    for base in [&gw.api, &gw.site] {
        let mut s = connect_from("127.0.0.5", base).await;
        assert!(health(&mut s).await.starts_with("HTTP/1.1 200"));
        held.push(s);
    }
    let mut third = connect_from("127.0.0.6", &gw.api).await;
    assert!(refused(&mut third).await, "over the total cap");

    // Closing frees the slots.
    held.truncate(1);
    let mut back = None;
    for _ in 0..40 {
        let mut s = connect_from("127.0.0.4", &gw.api).await;
        if !refused(&mut s).await {
            back = Some(());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(back.is_some(), "no recovery after connections closed");
    let mut s = connect_from("127.0.0.6", &gw.site).await;
    assert!(health(&mut s).await.starts_with("HTTP/1.1 200"));

    let log = gw.log();
    assert_eq!(
        log.matches("refusing connections from 127.0.0.4").count(),
        1,
        "{log}"
    );
    assert_eq!(
        log.matches("refusing connections from 127.0.0.6").count(),
        1,
        "{log}"
    );
}

/// A kept-alive connection with no next request is closed after the idle timeout, on both
/// listeners.
#[tokio::test]
async fn idle_keep_alive_closes() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, options("idle_timeout_seconds = 1", ""));
    for base in [&gw.api, &gw.site] {
        let mut s = connect(base).await;
        assert!(health(&mut s).await.starts_with("HTTP/1.1 200"));
        // Still open for a prompt next request.
        assert!(health(&mut s).await.starts_with("HTTP/1.1 200"));
        let (took, _) = until_closed(&mut s, Duration::from_secs(4)).await;
        assert!(
            took >= Duration::from_millis(800) && took < Duration::from_millis(2500),
            "{base}: idle connection closed after {took:?}"
        );
    }
}

/// A body dripped slower than the minimum rate is cut; the request never reaches the provider.
#[tokio::test]
async fn slow_body_is_cut() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, options("body_timeout_seconds = 1", ""));
    let key = gw.user_with_key("drip@example.com", &[]);
    let mut s = connect(&gw.api).await;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{"
    );
    s.write_all(head.as_bytes()).await.expect("write");
    let start = Instant::now();
    let drip = async {
        for _ in 0..40 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if s.write_all(b" ").await.is_err() {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), drip)
        .await
        .expect("drip");
    let _ = until_closed(&mut s, Duration::from_secs(3)).await;
    let took = start.elapsed();
    assert!(took < Duration::from_millis(2500), "closed after {took:?}");
    assert_eq!(mock.served().await, 0);
}

/// No weekly allowance and no lots: a key with nothing left.
fn no_quota() -> String {
    config::uncapped_tier("beginner", 0, 0)
}

/// A key with no quota left announcing a 32 MiB body is answered 429 without the body being
/// read: the client waits for `100 Continue`, sends nothing, and still gets its answer at once.
#[tokio::test]
async fn a_key_without_quota_is_refused_before_its_big_body() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, options("", &no_quota()));
    let key = gw.user_with_key("broke@example.com", &[]);
    // A small request is refused by the reservation itself (and, with Redis, teaches this
    // instance that the key has nothing left).
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&json!({"model": "mock-gpt", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 429);

    let mut s = connect(&gw.api).await;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        32 * 1024 * 1024
    );
    let start = Instant::now();
    s.write_all(head.as_bytes()).await.expect("write");
    let (_, got) = until_closed(&mut s, Duration::from_secs(3)).await;
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    assert!(got.starts_with("HTTP/1.1 429"), "{got}");
    assert!(
        !got.contains("100 Continue"),
        "the body was asked for: {got}"
    );
    assert!(got.contains("insufficient_quota"), "{got}");
    assert_eq!(mock.served().await, 0);
}

/// While one request holds most of the body budget, another body that would not fit gets 503
/// `server_busy` (with `retry-after`) at once; once the first is gone, it is served.
#[tokio::test]
async fn the_body_budget_answers_its_error() {
    let mock = Mock::start(&[]);
    let mut o = options("max_body_bytes_in_flight = 100000", "");
    o.server_toml = "max_body_bytes = 65536".into();
    let gw = Gateway::start(&mock, o);
    let key = gw.user_with_key("budget@example.com", &[]);

    // The first request declares 60,000 bytes and waits for `100 Continue`, which comes once
    // its share of the budget is taken; it sends nothing more.
    let mut first = connect(&gw.api).await;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: 60000\r\nExpect: 100-continue\r\n\r\n"
    );
    first.write_all(head.as_bytes()).await.expect("write");
    let mut buf = [0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(10), first.read(&mut buf))
        .await
        .expect("100 Continue in time")
        .expect("read");
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 100"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );

    let filler = "x".repeat(59_000);
    let body = json!({"model": "mock-gpt", "messages": [{"role": "user", "content": filler}]});
    let send = || {
        client()
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(&key)
            .json(&body)
            .send()
    };
    let started = Instant::now();
    let r = send().await.expect("send");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(r.status().as_u16(), 503);

    assert_eq!(
        r.headers().get("retry-after").and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let v: Value = r.json().await.expect("JSON");
    assert_eq!(v["error"]["code"], "server_busy", "{v}");
    assert_eq!(v["error"]["type"], "server_error", "{v}");

    drop(first);
    let mut served = false;
    for _ in 0..40 {
        if send().await.expect("send").status().is_success() {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(served, "the budget was not given back");
}
