//! Hostile input: property tests on every parser that sees client or provider bytes. None may
//! panic or hang, and each answers something documented.

use gateway_devapi::cloud::EventStreamReader;
use gateway_devapi::query::has_sensitive_param;
use gateway_devapi::route::{classify, Route};
use gateway_devapi::sse::SseParser;
use gateway_devapi::tokens::{requested_output, TokenCounter};
use gateway_devapi::usage::{usage_from_body, StreamKind, StreamUsageTracker};
use gateway_translate::{chat_to_messages, gemini, messages_to_chat, responses};
use proptest::prelude::*;
use serde_json::Value;
use std::sync::LazyLock;

static COUNTER: LazyLock<TokenCounter> =
    LazyLock::new(|| TokenCounter::new().unwrap_or_else(|e| panic!("tokenizer: {e}")));

/// Arbitrary JSON values, a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,40}".prop_map(Value::String),
        prop_oneof![
            Just("messages"),
            Just("content"),
            Just("role"),
            Just("text"),
            Just("tool_calls"),
            Just("max_tokens"),
            Just("stream"),
            Just("usage"),
            Just("choices"),
            Just("delta"),
            Just("type"),
            Just("input"),
            Just("system"),
            Just("tools"),
            Just("model"),
            Just("user"),
            Just("tool"),
            Just("STOP"),
            Just("RESOURCE_EXHAUSTED")
        ]
        .prop_map(|s| Value::String(s.to_string())),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("messages".to_string()),
                    Just("content".to_string()),
                    Just("role".to_string()),
                    Just("model".to_string()),
                    Just("max_tokens".to_string()),
                    Just("usage".to_string()),
                    Just("choices".to_string()),
                    Just("delta".to_string()),
                    Just("type".to_string()),
                    Just("input".to_string()),
                    Just("tools".to_string()),
                    Just("system".to_string()),
                    Just("tool_call_id".to_string()),
                    Just("function".to_string()),
                    Just("candidates".to_string()),
                    Just("parts".to_string()),
                    Just("functionCall".to_string()),
                    Just("usageMetadata".to_string()),
                    Just("finishReason".to_string()),
                    Just("error".to_string()),
                    "[a-z_]{1,12}",
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn routing_never_panics_and_aliases_are_whole_segments(method in "[A-Z]{1,7}", path in "/[a-zA-Z0-9/_.%?=&-]{0,60}") {
        match classify(&method, &path) {
            Route::Api { .. } => {
                let p = path.split('?').next().unwrap_or("");
                prop_assert!(p == "/alt" || p.starts_with("/alt/") || p == "/v1" || p.starts_with("/v1/"));
            }
            Route::Health => prop_assert!(path.starts_with("/health") || path == "/" || path.starts_with("/?")),
            Route::Ready => prop_assert!(path == "/ready" || path.starts_with("/ready?")),
            Route::NotFound => {}
        }
    }

    #[test]
    fn query_check_is_total(q in ".{0,200}") {
        let _ = has_sensitive_param(&q);
    }

    #[test]
    fn query_check_catches_keys_anywhere(prefix in "[a-z=&]{0,20}", name in "(?i-u)(key|api_key|token|secret|session)") {
        let q = format!("{prefix}&{name}=x");
        prop_assert!(has_sensitive_param(&q));
    }

    #[test]
    fn sse_parser_is_chunking_independent(body in prop::collection::vec(any::<u8>(), 0..2000), cuts in prop::collection::vec(0usize..2000, 0..20)) {
        let mut whole = SseParser::new();
        let mut a = whole.feed(&body);
        a.extend(whole.finish());
        let mut split = SseParser::new();
        let mut points: Vec<usize> = cuts.into_iter().map(|c| c.min(body.len())).collect();
        points.sort_unstable();
        let mut b = Vec::new();
        let mut last = 0;
        for p in points {
            b.extend(split.feed(&body[last..p]));
            last = p;
        }
        b.extend(split.feed(&body[last..]));
        b.extend(split.finish());
        prop_assert_eq!(a, b);
    }

    #[test]
    fn usage_trackers_take_any_event(events in prop::collection::vec((prop::option::of("[a-z_]{0,20}"), json_value()), 0..20)) {
        for kind in [StreamKind::OpenAiChat, StreamKind::OpenAiResponses, StreamKind::Anthropic, StreamKind::Gemini] {
            let mut t = StreamUsageTracker::new(kind);
            let mut p = SseParser::new();
            for (name, data) in &events {
                let frame = match name {
                    Some(n) => format!("event: {n}\ndata: {data}\n\n"),
                    None => format!("data: {data}\n\n"),
                };
                for ev in p.feed(frame.as_bytes()) {
                    let _ = t.observe(&ev);
                }
            }
            let _ = t.usage();
            let _ = t.delivered_text();
        }
    }

    /// Bedrock's binary event stream, whatever arrives and however it is cut: never a panic,
    /// and nothing read past a frame that failed.
    #[test]
    fn event_stream_reader_takes_any_bytes(body in prop::collection::vec(any::<u8>(), 0..3000), step in 1usize..64) {
        let mut r = EventStreamReader::default();
        for piece in body.chunks(step) {
            for ev in r.feed(piece) {
                prop_assert!(ev.event.is_some());
                prop_assert!(serde_json::from_str::<Value>(&ev.data).is_ok());
            }
        }
        prop_assert!(r.finish().is_none());
    }

    #[test]
    fn body_usage_and_estimates_are_total(v in json_value()) {
        let bytes = serde_json::to_vec(&v).unwrap_or_default();
        for kind in [StreamKind::OpenAiChat, StreamKind::OpenAiResponses, StreamKind::Anthropic, StreamKind::Gemini] {
            let _ = usage_from_body(kind, &bytes);
        }
        let _ = COUNTER.estimate_input(&v);
        let _ = requested_output(&v);
    }

    #[test]
    fn translation_is_total(v in json_value(), events in prop::collection::vec((prop::option::of("[a-z_]{0,20}"), json_value()), 0..12)) {
        let _ = chat_to_messages::request(&v, "m", 256);
        let _ = chat_to_messages::response(&v, "m");
        let _ = messages_to_chat::request(&v, "m");
        let _ = messages_to_chat::response(&v, "m");
        let _ = responses::to_chat(&v, "m", true);
        let _ = responses::to_messages(&v, "m", 256);
        let _ = responses::from_chat(&v, "m");
        let _ = responses::from_messages(&v, "m");
        let raw = serde_json::to_vec(&v).unwrap_or_default();
        let _ = chat_to_messages::error(&raw);
        let _ = messages_to_chat::error(&raw);
        let mut a = chat_to_messages::StreamTranslator::new("m", true);
        let mut b = messages_to_chat::StreamTranslator::new("m");
        let mut c = responses::MessagesStream::new("m");
        let mut d = responses::ChatStream::new("m");
        for (name, data) in &events {
            let data = data.to_string();
            let _ = a.on_event(name.as_deref(), &data);
            let _ = b.on_event(name.as_deref(), &data);
            let _ = c.on_event(name.as_deref(), &data);
            let _ = d.on_event(name.as_deref(), &data);
        }
        let _ = a.finish();
        let _ = b.finish();
        let _ = c.finish(true);
        let _ = d.finish(false);
    }

    /// Whatever a client sends, the Gemini request is either refused or well formed: turns of
    /// `user` and `model` only, none empty, never two of one role in a row; and whatever Gemini
    /// answers (or sends as events), the chat client gets a chat answer and well-formed frames
    /// ending in `[DONE]`.
    #[test]
    fn gemini_translation_is_total_and_well_formed(v in json_value(), events in prop::collection::vec(json_value(), 0..12)) {
        if let Ok(out) = gemini::request(&v) {
            let contents = out["contents"].as_array().expect("contents");
            prop_assert!(!contents.is_empty());
            let mut last = "";
            for turn in contents {
                let role = turn["role"].as_str().unwrap_or("");
                prop_assert!(role == "user" || role == "model", "{}", turn);
                prop_assert!(role != last, "{}", out);
                prop_assert!(!turn["parts"].as_array().expect("parts").is_empty());
                last = role;
            }
        }
        let answer = gemini::response(&v, "m");
        prop_assert!(answer["choices"][0]["finish_reason"].is_string());
        prop_assert!(answer["usage"]["total_tokens"].is_u64());
        let raw = serde_json::to_vec(&v).unwrap_or_default();
        prop_assert!(gemini::error(&raw)["error"]["message"].is_string());
        let mut t = gemini::StreamTranslator::new("m", true);
        let mut frames = Vec::new();
        for data in &events {
            frames.extend(t.on_event_frames(&data.to_string()));
        }
        frames.extend(t.finish_frames());
        let text: String = frames.iter().map(|f| String::from_utf8_lossy(f).into_owned()).collect();
        prop_assert!(text.ends_with("data: [DONE]\n\n"), "{}", text);
        for frame in text.split_terminator("\n\n") {
            let data = frame.strip_prefix("data: ").expect("data frame");
            prop_assert!(data == "[DONE]" || serde_json::from_str::<Value>(data).is_ok(), "{}", frame);
        }
    }
}

#[test]
fn garbage_bytes_as_sse_and_bodies() {
    let junk: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    let mut p = SseParser::new();
    let _ = p.feed(&junk);
    let _ = p.finish();
    for kind in [
        StreamKind::OpenAiChat,
        StreamKind::OpenAiResponses,
        StreamKind::Anthropic,
        StreamKind::Gemini,
    ] {
        assert!(usage_from_body(kind, &junk).is_none());
    }
    let mut r = EventStreamReader::default();
    let events = r.feed(&junk);
    assert!(events.len() <= 1, "one error event, then nothing");
    // Deep nesting does not overflow the stack.
    let deep = format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000));
    let v: Result<Value, _> = serde_json::from_str(&deep);
    assert!(v.is_err(), "serde_json refuses pathological nesting");
}

mod common;

/// Arbitrary bodies and raw garbage through the real server: always a documented JSON error or
/// a normal answer, never a 5xx from the gateway itself, never a hang, and the server lives on.
#[tokio::test]
async fn random_bodies_through_the_server() {
    use common::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, Options::default());
    let key = gw.user_with_key("fuzz@example.com", &[]);
    let c = client();
    let mut runner = TestRunner::default();
    let bodies = prop::collection::vec(any::<u8>(), 0..300);
    let documented = [
        "invalid_json",
        "missing_model",
        "invalid_model",
        "model_not_found",
        "unsupported_endpoint",
        "max_input_tokens_exceeded",
        "max_output_tokens_exceeded",
        "context_window_exceeded",
        "invalid_request",
        "request_too_large",
    ];
    for i in 0..150 {
        let body: Vec<u8> = if i % 2 == 0 {
            bodies.new_tree(&mut runner).unwrap().current()
        } else {
            let v = json_value().new_tree(&mut runner).unwrap().current();
            let mut v = if v.is_object() {
                v
            } else {
                serde_json::json!({ "messages": v })
            };
            if i % 4 == 1 {
                v["model"] = Value::from("mock-gpt");
            }
            serde_json::to_vec(&v).unwrap()
        };
        for path in [
            "/v1/chat/completions",
            "/v1/messages",
            "/v1/responses",
            "/v1/embeddings",
        ] {
            let r = c
                .post(gw.url(path))
                .bearer_auth(&key)
                .body(body.clone())
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let v: Value = r.json().await.unwrap_or(Value::Null);
            if status >= 500 {
                panic!(
                    "{path}: status {status} for {:?}",
                    String::from_utf8_lossy(&body)
                );
            }
            if (400..500).contains(&status) && status != 429 {
                let code = v["error"]["code"].as_str().unwrap_or("");
                // 4xx from the mock pass through; the gateway's own are documented.
                assert!(
                    documented.contains(&code) || v["error"]["type"].is_string(),
                    "undocumented answer: {path} {status} {v}"
                );
            }
        }
    }
    // Raw garbage on the socket does not take the server down.
    use std::io::Write;
    let addr = gw.api.trim_start_matches("http://").to_string();
    for junk in [
        &b"\x00\x01\x02GARBAGE\r\n\r\n"[..],
        b"GET / HTTP/9.9\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
    ] {
        if let Ok(mut s) = std::net::TcpStream::connect(&addr) {
            let _ = s.write_all(junk);
        }
    }
    let r = c.get(gw.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

/// Deeply nested bodies on every route (translated or not), odd sign-in addresses and
/// credentials smuggled past the query check each get a documented 400, never a 500.
#[tokio::test]
async fn deep_nesting_odd_emails_and_smuggled_query_keys_answer_400() {
    use common::*;
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, Options::default());
    let key = gw.user_with_key("nest@example.com", &[]);
    let c = client();

    let deep = |depth: usize| {
        let mut v = Value::from("x");
        for _ in 0..depth {
            v = serde_json::json!([v]);
        }
        v
    };
    let deep_text = format!("{}\"x\"{}", "[".repeat(1000), "]".repeat(1000));
    let deep_object = format!("{}1{}", "{\"a\":".repeat(1000), "}".repeat(1000));
    for (path, model) in [
        ("/v1/chat/completions", "mock-gpt"),
        ("/v1/chat/completions", "claude-mock"),
        ("/v1/messages", "claude-mock"),
        ("/v1/messages", "mock-gpt"),
        ("/v1/responses", "mock-gpt"),
        ("/v1/responses", "claude-mock"),
        ("/v1/messages/count_tokens", "mock-gpt"),
    ] {
        let bodies = [
            // Plain chat bodies are admitted without a tree, so depth in a field admission
            // skips reaches translation and rewriting.
            format!(
                r#"{{"model":"{model}","max_tokens":16,"messages":[{{"role":"user","content":"hi"}}],"metadata":{deep_text}}}"#
            ),
            format!(
                r#"{{"model":"{model}","max_tokens":16,"stream":true,"messages":[{{"role":"user","content":"hi"}}],"user":{deep_object}}}"#
            ),
            format!(
                r#"{{"model":"{model}","max_tokens":16,"messages":[{{"role":"user","content":{deep_text}}}]}}"#
            ),
            format!(
                r#"{{"model":"{model}","max_tokens":16,"input":{deep_text},"messages":[{{"role":"user","content":"hi"}}]}}"#
            ),
            format!(
                r#"{{"model":"{model}","max_tokens":16,"messages":[{{"role":"user","content":"hi"}}],"tools":[{{"type":"function","name":"f","input_schema":{deep_object},"function":{{"name":"f","parameters":{deep_object}}}}}]}}"#
            ),
            // Within serde's limit but deep enough to hurt a recursive translation.
            serde_json::json!({"model": model, "max_tokens": 16,
                "messages": [{"role": "user", "content": "hi"}],
                "metadata": deep(120),
                "tools": [{"type": "function", "name": "f", "input_schema": {"type": "object", "properties": {"a": deep(120)}},
                           "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": deep(120)}}}}]})
            .to_string(),
            serde_json::json!({"model": model, "max_tokens": 16, "stream": true,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "x": deep(126)}]}],
                "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi", "x": deep(126)}]}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": deep(126)}},
                "tool_choice": deep(126)})
            .to_string(),
        ];
        for body in bodies {
            let r = c
                .post(gw.url(path))
                .bearer_auth(&key)
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let v: Value = r.json().await.unwrap_or(Value::Null);
            assert!(
                status < 500,
                "{path} {model}: {status} {v} for {}",
                &body[..120.min(body.len())]
            );
            if status != 200 {
                assert_eq!(status, 400, "{path} {model}: {v}");
                assert!(
                    v["error"]["code"].is_string() || v["error"]["type"].is_string(),
                    "{v}"
                );
            }
        }
    }

    for email in [
        "a\"b@example.com",
        "\"a b\"@example.com",
        "a@[127.0.0.1]",
        "a@[IPv6:::1]",
        "a@b@example.com",
        "a@-example.com",
        "a@example..com",
        "a..b@example.com",
        ".a@example.com",
        "a(comment)@example.com",
        "a\\b@example.com",
        "a@exa_mple.com",
    ] {
        let r = c
            .post(gw.site_url("/api/auth/request-code"))
            .header("origin", "http://127.0.0.1:8081")
            .json(&serde_json::json!({"email": email, "acceptedTerms": true}))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(
            (status, &v),
            (
                400,
                &serde_json::json!({"ok": false, "code": "invalid_email"})
            ),
            "{email}"
        );
    }
    // An ordinary odd-but-valid address still gets its code.
    let r = c
        .post(gw.site_url("/api/auth/request-code"))
        .header("origin", "http://127.0.0.1:8081")
        .json(
            &serde_json::json!({"email": "first.last+tag@sub.example.com", "acceptedTerms": true}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let body =
        serde_json::json!({"model": "mock-gpt", "messages": [{"role": "user", "content": "hi"}]});
    for query in [
        "a=1;key=sk-abc",
        "x=1;api_key=abc",
        "key[]=abc",
        "api_key[0]=abc",
        "api.key=abc",
        "auth.token=abc",
        "x=%2573k-abc",
        "x=%252573k-abc",
        "%256Bey=abc",
        "x=%2573%256B-abc",
    ] {
        let r = c
            .post(gw.url(&format!("/v1/chat/completions?{query}")))
            .bearer_auth(&key)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (400, Some("sensitive_query_param")),
            "{query}: {v}"
        );
    }
    // Ordinary parameters still pass.
    let r = c
        .post(gw.url("/v1/chat/completions?monkey=1;tokens=2&keyboard[]=3&a.b=%2541"))
        .bearer_auth(&key)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

const FAILING_MODELS: &str = r#"
[[models]]
id = "cutter"
provider = "mock"
upstream_model = "cut"

[[models]]
id = "broken"
provider = "mock"
upstream_model = "midstream-error"

[[models]]
id = "claude-cut"
provider = "mock-anthropic"
upstream_model = "cut"

[[models]]
id = "claude-broken"
provider = "mock-anthropic"
upstream_model = "midstream-error"
"#;

/// A non-streamed answer cut mid-body is recorded as a 502 upstream error (not the 200 its
/// header announced), and a provider `error` event mid-stream settles as `upstream_error` with
/// the provider's own code, plain or translated.
#[tokio::test]
async fn cut_bodies_and_midstream_errors_are_recorded_as_upstream_errors() {
    use common::*;
    let mock = Mock::start(&["--chunks", "6"]);
    let gw = Gateway::start(&mock, Options::with_toml(FAILING_MODELS));
    let key = gw.user_with_key("cuts@example.com", &[]);
    let c = client();
    let post = |path: &str, body: Value| c.post(gw.url(path)).bearer_auth(&key).json(&body).send();
    let chat = |model: &str, stream: bool| {
        serde_json::json!({"model": model, "stream": stream,
            "messages": [{"role": "user", "content": "hi"}]})
    };
    let messages = |model: &str, stream: bool| {
        serde_json::json!({"model": model, "stream": stream, "max_tokens": 64,
            "messages": [{"role": "user", "content": "hi"}]})
    };

    // Non-streamed, relayed byte for byte: the client sees a truncated body.
    let r = post("/v1/chat/completions", chat("cutter", false))
        .await
        .unwrap();
    assert!(r.bytes().await.is_err(), "the client sees the truncation");
    // Non-streamed, translated (held whole): a 502 in the client's shape.
    let r = post("/v1/chat/completions", chat("claude-cut", false))
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    r.bytes().await.unwrap();
    let events = gw.wait_usage(2).await;
    assert_eq!(events.len(), 2, "{events:#?}");
    for e in &events {
        assert_eq!(e["status"], 502, "{e}");
        assert_eq!(e["error_code"], "upstream_error", "{e}");
        assert!(
            e["settlement"]
                .as_str()
                .unwrap()
                .ends_with(":upstream_error"),
            "{e}"
        );
    }

    // Mid-stream provider errors, plain and translated both ways.
    for (path, body, code) in [
        ("/v1/chat/completions", chat("broken", true), "server_error"),
        (
            "/v1/messages",
            messages("claude-broken", true),
            "overloaded_error",
        ),
        ("/v1/messages", messages("broken", true), "server_error"),
        (
            "/v1/chat/completions",
            chat("claude-broken", true),
            "overloaded_error",
        ),
    ] {
        let before = gw.usage_events().await.len();
        let r = post(path, body).await.unwrap();
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap_or_default();
        assert!(text.contains("rror"), "the client sees the error: {text}");
        let events = gw.wait_usage(before + 1).await;
        let e = events.last().unwrap();
        assert_eq!(events.len(), before + 1, "{events:#?}");
        assert!(
            e["settlement"]
                .as_str()
                .unwrap()
                .ends_with(":upstream_error"),
            "{path} {code}: {e}"
        );
        assert_eq!(e["error_code"], code, "{path}: {e}");
    }
}

/// Streams still running when the shutdown drain ends get a terminal error event in their
/// style (not a silent stop), and are recorded once as aborted.
#[tokio::test]
async fn streams_cut_by_the_end_of_the_drain_end_with_an_error_event() {
    use common::*;
    let mock = Mock::start(&["--chunks", "40", "--chunk-delay-ms", "200"]);
    let mut gw = Gateway::start(&mock, Options::default());
    let key = gw.user_with_key("drain@example.com", &[]);
    gw.kill();
    let text = std::fs::read_to_string(&gw.config_path).unwrap();
    std::fs::write(
        &gw.config_path,
        text.replace("shutdown_drain_seconds = 5", "shutdown_drain_seconds = 1"),
    )
    .unwrap();
    gw.spawn();
    let c = client();
    let mut streams = Vec::new();
    for (path, model, style_b) in [
        ("/v1/chat/completions", "mock-gpt", false),
        ("/v1/messages", "claude-mock", true),
        ("/v1/chat/completions", "claude-mock", false),
        ("/v1/messages", "mock-gpt", true),
    ] {
        let mut r = c
            .post(gw.url(path))
            .bearer_auth(&key)
            .json(
                &serde_json::json!({"model": model, "stream": true, "max_tokens": 64,
                "messages": [{"role": "user", "content": "hi"}]}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let first = r.chunk().await.unwrap().unwrap_or_default();
        streams.push((path, model, style_b, first, r));
    }
    let mut stopping = std::process::Command::new("kill");
    stopping.args(["-TERM", &gw.pid().unwrap().to_string()]);
    assert!(stopping.status().unwrap().success());
    for (path, model, style_b, first, mut r) in streams {
        let mut text = String::from_utf8_lossy(&first).into_owned();
        while let Ok(Some(chunk)) = r.chunk().await {
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
        let tail: String = text
            .chars()
            .rev()
            .take(400)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        if style_b {
            assert!(
                tail.contains("event: error") && tail.contains("\"type\":\"error\""),
                "{path} {model}: {tail}"
            );
        } else {
            assert!(tail.contains("\"error\":{"), "{path} {model}: {tail}");
        }
    }
    // Restarted, every stream is recorded exactly once as aborted.
    gw.terminate();
    gw.spawn();
    let events = gw.wait_usage(4).await;
    assert_eq!(events.len(), 4, "{events:#?}");
    for e in &events {
        assert!(
            e["settlement"].as_str().unwrap().ends_with(":aborted"),
            "{e}"
        );
        assert_eq!(e["error_code"], "shutting_down", "{e}");
        assert!(e["output_tokens"].as_i64().unwrap() >= 1, "{e}");
    }
}
