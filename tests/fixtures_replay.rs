//! Real wire formats, replayed: the mock provider sends the recorded answers under
//! `tests/fixtures/providers/` byte for byte, cut into frames in awkward places (mid-line,
//! between an event's two line ends, inside multi-byte UTF-8 characters), and the gateway must
//! pass same-style answers through unchanged (apart from the documented header changes),
//! translate the others into valid events of the client's style, bill exactly the usage the
//! fixture reports (cached and reasoning tokens included), and keep every provider error's status
//! in the client's error shape.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use common::*;
use serde_json::{json, Value};

const CHUNKINGS: [&str; 3] = ["whole", "every-7", "awkward"];

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/providers")
}

/// A recorded provider answer as the test reads it: status, headers, body.
struct Fixture {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

fn fixture(name: &str) -> Fixture {
    let raw = std::fs::read(fixture_dir().join(format!("{name}.http"))).expect("fixture");
    let at = raw.windows(2).position(|w| w == b"\n\n").expect("head");
    let head = std::str::from_utf8(&raw[..at]).expect("utf-8 head");
    let mut lines = head.lines();
    let status = lines.next().unwrap().split_whitespace().nth(1).unwrap();
    Fixture {
        status: status.parse().unwrap(),
        headers: lines
            .map(|l| {
                let (n, v) = l.split_once(':').unwrap();
                (n.trim().to_ascii_lowercase(), v.trim().to_string())
            })
            .collect(),
        body: raw[at + 2..].to_vec(),
    }
}

impl Fixture {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn text(&self) -> &str {
        std::str::from_utf8(&self.body).expect("utf-8 body")
    }
}

/// The `data` of every event (with its `event` name) of an SSE body.
fn events(text: &str) -> Vec<(Option<String>, String)> {
    text.split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .map(|block| {
            let mut name = None;
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.push(d);
                }
            }
            (name, data.join("\n"))
        })
        .collect()
}

fn json_events(text: &str) -> Vec<Value> {
    events(text)
        .into_iter()
        .filter(|(_, d)| d != "[DONE]")
        .map(|(_, d)| serde_json::from_str(&d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}

/// The gateway, the mock in replay mode, and one model per case: model `m{i}` replays
/// `cases[i]` (a fixture name and a chunking) on its own deployment, so one case's 429 or 5xx
/// cools down nothing another case uses.
struct Replay {
    _mock: Mock,
    gw: Gateway,
    key: String,
}

fn start(cases: &[(&str, &str)]) -> Replay {
    let mock = Mock::start(&["--fixtures", fixture_dir().to_str().unwrap()]);
    let mut toml = String::new();
    for (i, (name, chunking)) in cases.iter().enumerate() {
        let provider = if name.starts_with("openai/") {
            "mock"
        } else {
            "mock-anthropic"
        };
        toml.push_str(&format!(
            "\n[[models]]\nid = \"m{i}\"\nprovider = \"{provider}\"\n\
             upstream_model = \"replay:{name}@{chunking}#{i}\"\nmax_output_tokens = 64000\n"
        ));
    }
    let gw = Gateway::start(&mock, Options::with_toml(toml));
    let key = gw.user_with_key(
        "replay@example.com",
        &["--rpm", "9000", "--itpm", "90000000", "--otpm", "90000000"],
    );
    Replay {
        _mock: mock,
        gw,
        key,
    }
}

/// The client's view of one answer.
struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    fn text(&self) -> &str {
        std::str::from_utf8(&self.body).expect("utf-8 answer")
    }
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.text()))
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl Replay {
    /// POSTs `body` (its `model` set to `m{case}`) to `path`; `/v1/messages` goes style B.
    async fn call(&self, path: &str, case: usize, mut body: Value) -> Answer {
        body["model"] = json!(format!("m{case}"));
        let mut req = client().post(self.gw.url(path)).json(&body);
        req = if path.starts_with("/v1/messages") {
            req.header("x-api-key", &self.key)
                .header("anthropic-version", "2023-06-01")
        } else {
            req.bearer_auth(&self.key)
        };
        let resp = req.send().await.expect("send");
        Answer {
            status: resp.status().as_u16(),
            headers: resp.headers().clone(),
            body: resp.bytes().await.expect("body").to_vec(),
        }
    }

    /// The usage event of case `case`: (input, output, cached).
    async fn usage(&self, case: usize) -> Tokens {
        let model = format!("m{case}");
        for _ in 0..200 {
            let events = self.gw.usage_events().await;
            if let Some(e) = events.iter().find(|e| e["model"] == model.as_str()) {
                return (
                    e["input_tokens"].as_i64().unwrap(),
                    e["output_tokens"].as_i64().unwrap(),
                    e["cached_tokens"].as_i64().unwrap(),
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        panic!("no usage event for {model}");
    }
}

fn chat(stream: bool) -> Value {
    json!({"messages": [{"role": "user", "content": "Grüß dich"}], "stream": stream,
           "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null }})
}

fn messages(stream: bool) -> Value {
    json!({"max_tokens": 1024, "messages": [{"role": "user", "content": "Grüß dich"}],
           "stream": stream})
}

/// The headers a provider answer may show the client (README, "The developer API"): content
/// headers and `retry-after` as they came, the provider's request id as
/// `x-provider-request-id`; nothing else of the provider's.
fn assert_headers_sanitised(fx: &Fixture, got: &Answer) {
    const PASSED: [&str; 4] = ["content-type", "cache-control", "retry-after", "vary"];
    // The gateway's own framing and date, whatever the provider said.
    const OWN: [&str; 3] = ["connection", "transfer-encoding", "date"];
    for (name, value) in &fx.headers {
        let shown = got.headers.get_all(name.as_str());
        if PASSED.contains(&name.as_str()) || OWN.contains(&name.as_str()) {
            continue;
        }
        assert!(
            shown
                .iter()
                .all(|v| v.to_str().ok() != Some(value.as_str())),
            "provider header {name}: {value} reached the client"
        );
    }
    for name in ["server", "set-cookie", "cf-ray", "www-authenticate", "via"] {
        assert!(got.header(name).is_none(), "{name} reached the client");
    }
    let provider_id = fx.header("x-request-id").or(fx.header("request-id"));
    assert_eq!(got.header("x-provider-request-id"), provider_id);
    let own = got.header("x-request-id").expect("gateway request id");
    assert_ne!(Some(own), provider_id);
    for name in ["retry-after", "cache-control"] {
        assert_eq!(got.header(name), fx.header(name), "{name}");
    }
}

/// Input, output and cached tokens of a usage event.
type Tokens = (i64, i64, i64);

#[tokio::test]
async fn native_streams_pass_through_byte_for_byte_and_bill_the_fixture_usage() {
    // (fixture, endpoint, expected (input, output, cached) of the provider's own usage)
    let streams: [(&str, &str, Option<Tokens>); 8] = [
        (
            "openai/chat_stream_text",
            "/v1/chat/completions",
            Some((1342, 9, 1152)),
        ),
        // 286 completion tokens, 192 of them reasoning: billed as output.
        (
            "openai/chat_stream_tools",
            "/v1/chat/completions",
            Some((412, 286, 0)),
        ),
        (
            "openai/chat_stream_refusal",
            "/v1/chat/completions",
            Some((57, 10, 0)),
        ),
        (
            "openai/responses_stream",
            "/v1/responses",
            Some((2084, 14, 1920)),
        ),
        (
            "openai/responses_stream_incomplete",
            "/v1/responses",
            Some((31, 16, 0)),
        ),
        ("openai/responses_stream_failed", "/v1/responses", None),
        // Anthropic's input is the uncached input plus cache writes plus cache reads.
        (
            "anthropic/messages_stream_text",
            "/v1/messages",
            Some((18 + 1024 + 2048, 15, 2048)),
        ),
        (
            "anthropic/messages_stream_thinking_tools",
            "/v1/messages",
            Some((472, 187, 0)),
        ),
    ];
    let mut cases = Vec::new();
    for (name, _, _) in &streams {
        for chunking in CHUNKINGS {
            cases.push((*name, chunking));
        }
    }
    let r = start(&cases);
    for (i, (name, chunking)) in cases.iter().enumerate() {
        let (_, path, usage) = streams.iter().find(|s| s.0 == *name).unwrap();
        let body = match *path {
            "/v1/chat/completions" => chat(true),
            "/v1/responses" => json!({"input": "Grüß dich", "stream": true}),
            _ => messages(true),
        };
        let fx = fixture(name);
        let got = r.call(path, i, body).await;
        assert_eq!(got.status, 200, "{name}@{chunking}: {}", got.text());
        assert!(
            got.body == fx.body,
            "{name}@{chunking}: bytes changed\n--- got\n{}\n--- fixture\n{}",
            got.text(),
            fx.text()
        );
        assert_headers_sanitised(&fx, &got);
        if let Some(want) = usage {
            assert_eq!(r.usage(i).await, *want, "{name}@{chunking}");
        }
    }
}

#[tokio::test]
async fn the_unasked_usage_chunk_is_the_only_change_to_a_native_chat_stream() {
    let r = start(&[("openai/chat_stream_text", "awkward")]);
    let mut body = chat(true);
    body.as_object_mut().unwrap().remove("stream_options");
    let got = r.call("/v1/chat/completions", 0, body).await;
    let fx = fixture("openai/chat_stream_text");
    let usage_chunk = fx
        .text()
        .split_inclusive("\n\n")
        .find(|e| e.contains("\"choices\":[]"))
        .unwrap();
    assert_eq!(got.text(), fx.text().replace(usage_chunk, ""));
    // The gateway asked for the usage itself and bills it.
    assert_eq!(r.usage(0).await, (1342, 9, 1152));
}

/// Checks an OpenAI chat stream as a client library reads it; returns the concatenated
/// content, reasoning, tool arguments by index, and the usage chunk.
struct ChatStream {
    content: String,
    reasoning: String,
    tools: BTreeMap<u64, (String, String)>,
    usage: Option<Value>,
    error: Option<Value>,
    finish: Option<String>,
}

fn read_chat_stream(text: &str, model: &str) -> ChatStream {
    let evs = events(text);
    assert_eq!(evs.last().map(|e| e.1.as_str()), Some("[DONE]"), "{text}");
    let mut out = ChatStream {
        content: String::new(),
        reasoning: String::new(),
        tools: BTreeMap::new(),
        usage: None,
        error: None,
        finish: None,
    };
    for v in json_events(text) {
        if v.get("error").is_some() {
            assert!(out.error.is_none(), "one error frame: {text}");
            out.error = Some(v);
            continue;
        }
        assert_eq!(v["object"], "chat.completion.chunk", "{v}");
        assert_eq!(v["model"], model, "{v}");
        assert!(v["id"].as_str().is_some_and(|s| !s.is_empty()), "{v}");
        assert!(v["created"].is_u64(), "{v}");
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            assert_eq!(v["choices"], json!([]), "{v}");
            out.usage = Some(u.clone());
        }
        for c in v["choices"].as_array().expect("choices") {
            assert_eq!(c["index"], 0);
            let d = &c["delta"];
            out.content.push_str(d["content"].as_str().unwrap_or(""));
            out.reasoning
                .push_str(d["reasoning_content"].as_str().unwrap_or(""));
            for t in d["tool_calls"].as_array().into_iter().flatten() {
                let idx = t["index"].as_u64().expect("tool index");
                let e = out.tools.entry(idx).or_default();
                if let Some(name) = t["function"]["name"].as_str() {
                    assert!(
                        t["id"].as_str().is_some(),
                        "first tool delta has an id: {t}"
                    );
                    e.0 = name.to_string();
                }
                e.1.push_str(t["function"]["arguments"].as_str().unwrap_or(""));
            }
            if let Some(f) = c["finish_reason"].as_str() {
                assert!(out.finish.is_none(), "one finish_reason: {text}");
                out.finish = Some(f.to_string());
            }
        }
    }
    out
}

/// Checks an Anthropic message stream's grammar; returns the blocks (type, text or JSON) and
/// the `message_delta`.
fn read_message_stream(text: &str, model: Option<&str>) -> (Vec<(String, String)>, Value) {
    let evs = events(text);
    let mut blocks: Vec<(String, String)> = Vec::new();
    let mut open: Option<usize> = None;
    let mut delta = Value::Null;
    for (n, (name, data)) in evs.iter().enumerate() {
        let v: Value = serde_json::from_str(data).unwrap();
        assert_eq!(
            name.as_deref(),
            v["type"].as_str(),
            "event name = type: {data}"
        );
        match v["type"].as_str().unwrap() {
            "message_start" => {
                assert_eq!(n, 0, "message_start first: {text}");
                if let Some(model) = model {
                    assert_eq!(v["message"]["model"], model);
                }
                assert_eq!(v["message"]["role"], "assistant");
            }
            "content_block_start" => {
                assert!(open.is_none(), "blocks do not overlap: {text}");
                assert_eq!(v["index"], blocks.len() as u64);
                let kind = v["content_block"]["type"].as_str().unwrap().to_string();
                blocks.push((kind, String::new()));
                open = Some(blocks.len() - 1);
            }
            "content_block_delta" => {
                let i = open.expect("delta inside a block");
                assert_eq!(v["index"], i as u64);
                let d = &v["delta"];
                let piece = match d["type"].as_str().unwrap() {
                    "text_delta" => d["text"].as_str(),
                    "input_json_delta" => d["partial_json"].as_str(),
                    "thinking_delta" => d["thinking"].as_str(),
                    "signature_delta" => Some(""),
                    other => panic!("unexpected delta {other}"),
                };
                blocks[i].1.push_str(piece.unwrap());
            }
            "content_block_stop" => {
                assert_eq!(
                    v["index"],
                    open.take().expect("stop of an open block") as u64
                );
            }
            "message_delta" => {
                assert!(open.is_none());
                delta = v.clone();
            }
            "message_stop" => assert_eq!(n, evs.len() - 1, "message_stop last: {text}"),
            "ping" => {}
            "error" => {
                assert_eq!(n, evs.len() - 1, "nothing after an error: {text}");
                delta = v.clone();
            }
            other => panic!("unexpected event {other}"),
        }
    }
    (blocks, delta)
}

#[tokio::test]
async fn translated_streams_are_valid_in_the_clients_style_and_bill_the_fixture_usage() {
    let mut cases = Vec::new();
    for name in [
        "anthropic/messages_stream_text",
        "anthropic/messages_stream_thinking_tools",
        "openai/chat_stream_text",
        "openai/chat_stream_tools",
        "openai/chat_stream_refusal",
    ] {
        for chunking in ["whole", "awkward"] {
            cases.push((name, chunking));
        }
    }
    let r = start(&cases);
    for (i, (name, chunking)) in cases.iter().enumerate() {
        let model = format!("m{i}");
        let fx = fixture(name);
        let fx_events = json_events(fx.text());
        let at = format!("{name}@{chunking}");
        if name.starts_with("anthropic/") {
            // An OpenAI chat client on an Anthropic-style provider.
            let got = r.call("/v1/chat/completions", i, chat(true)).await;
            assert_eq!(got.status, 200, "{at}");
            assert_eq!(
                got.header("content-type"),
                Some("text/event-stream"),
                "{at}"
            );
            let s = read_chat_stream(got.text(), &model);
            let piece = |kind: &str, field: &str| -> String {
                fx_events
                    .iter()
                    .filter(|e| e["delta"]["type"] == kind)
                    .map(|e| e["delta"][field].as_str().unwrap())
                    .collect()
            };
            assert_eq!(s.content, piece("text_delta", "text"), "{at}");
            assert_eq!(s.reasoning, piece("thinking_delta", "thinking"), "{at}");
            let args = piece("input_json_delta", "partial_json");
            if args.is_empty() {
                assert!(s.tools.is_empty(), "{at}");
                assert_eq!(s.finish.as_deref(), Some("stop"), "{at}");
            } else {
                assert_eq!(s.tools.len(), 1, "{at}");
                assert_eq!(s.tools[&0].0, "get_weather");
                let sent: Value = serde_json::from_str(&s.tools[&0].1).unwrap();
                assert_eq!(sent, serde_json::from_str::<Value>(&args).unwrap(), "{at}");
                assert_eq!(s.finish.as_deref(), Some("tool_calls"), "{at}");
            }
            let start_usage = &fx_events[0]["message"]["usage"];
            let last = fx_events
                .iter()
                .rfind(|e| e["type"] == "message_delta")
                .unwrap();
            let cached = start_usage["cache_read_input_tokens"].as_i64().unwrap();
            let input = start_usage["input_tokens"].as_i64().unwrap()
                + start_usage["cache_creation_input_tokens"].as_i64().unwrap()
                + cached;
            let output = last["usage"]["output_tokens"].as_i64().unwrap();
            let u = s.usage.expect("usage chunk");
            assert_eq!(u["prompt_tokens"], input, "{at}");
            assert_eq!(u["completion_tokens"], output, "{at}");
            assert_eq!(u["total_tokens"], input + output, "{at}");
            assert_eq!(u["prompt_tokens_details"]["cached_tokens"], cached, "{at}");
            assert_eq!(r.usage(i).await, (input, output, cached), "{at}");
        } else {
            // An Anthropic messages client on an OpenAI-style provider.
            let got = r.call("/v1/messages", i, messages(true)).await;
            assert_eq!(got.status, 200, "{at}");
            let (blocks, delta) = read_message_stream(got.text(), Some(&model));
            let delta_of = |field: &str| -> String {
                fx_events
                    .iter()
                    .flat_map(|e| e["choices"].as_array().cloned().unwrap_or_default())
                    .filter_map(|c| c["delta"][field].as_str().map(str::to_string))
                    .collect()
            };
            let text: String = blocks
                .iter()
                .filter(|b| b.0 == "text")
                .map(|b| b.1.as_str())
                .collect();
            // A refusal is what the model said: the client reads it as text.
            assert_eq!(text, delta_of("content") + &delta_of("refusal"), "{at}");
            let tools: Vec<Value> = blocks
                .iter()
                .filter(|b| b.0 == "tool_use")
                .map(|b| serde_json::from_str(&b.1).unwrap())
                .collect();
            let mut want_tools: BTreeMap<u64, String> = BTreeMap::new();
            for e in &fx_events {
                for c in e["choices"].as_array().into_iter().flatten() {
                    for t in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
                        want_tools
                            .entry(t["index"].as_u64().unwrap())
                            .or_default()
                            .push_str(t["function"]["arguments"].as_str().unwrap_or(""));
                    }
                }
            }
            let want_tools: Vec<Value> = want_tools
                .values()
                .map(|a| serde_json::from_str(a).unwrap())
                .collect();
            assert_eq!(tools, want_tools, "{at}");
            let want_stop = if want_tools.is_empty() {
                "end_turn"
            } else {
                "tool_use"
            };
            assert_eq!(delta["delta"]["stop_reason"], want_stop, "{at}");
            let fu = &fx_events.last().unwrap()["usage"];
            let prompt = fu["prompt_tokens"].as_i64().unwrap();
            let cached = fu["prompt_tokens_details"]["cached_tokens"]
                .as_i64()
                .unwrap();
            let output = fu["completion_tokens"].as_i64().unwrap();
            assert_eq!(delta["usage"]["output_tokens"], output, "{at}");
            assert_eq!(r.usage(i).await, (prompt, output, cached), "{at}");
        }
    }
}

#[tokio::test]
async fn a_mid_stream_overloaded_error_reaches_both_styles() {
    let r = start(&[
        ("anthropic/messages_stream_overloaded", "awkward"),
        ("anthropic/messages_stream_overloaded", "every-7"),
    ]);
    let fx = fixture("anthropic/messages_stream_overloaded");
    // Same style: the error event arrives as the provider sent it.
    let got = r.call("/v1/messages", 0, messages(true)).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.body, fx.body);
    let (_, last) = read_message_stream(got.text(), None);
    assert_eq!(last["error"]["type"], "overloaded_error");
    // A chat client gets the text so far, then an OpenAI-style error frame, then [DONE].
    let got = r.call("/v1/chat/completions", 1, chat(true)).await;
    assert_eq!(got.status, 200);
    let s = read_chat_stream(got.text(), "m1");
    assert_eq!(s.content, "Zunächst die Grün");
    let err = s.error.expect("error frame");
    assert_eq!(err["error"]["message"], "Overloaded", "{err}");
    assert_eq!(err["error"]["type"], "server_error", "{err}");
    // Both settle the input the provider reported (96 + 64 cached) without a completion.
    for case in 0..2 {
        let (input, _, cached) = r.usage(case).await;
        assert_eq!((input, cached), (160, 64), "case {case}");
    }
}

#[tokio::test]
async fn non_streamed_bodies_pass_through_or_translate_with_the_fixture_usage() {
    let cases = [
        ("openai/chat_completion", "every-7"),
        ("openai/responses", "awkward"),
        ("openai/embeddings", "whole"),
        ("anthropic/message", "awkward"),
        ("openai/chat_completion", "awkward"),
        ("anthropic/message", "whole"),
    ];
    let r = start(&cases);
    // Same style: byte for byte.
    for (i, path, body) in [
        (0, "/v1/chat/completions", chat(false)),
        (1, "/v1/responses", json!({"input": "Grüß dich"})),
        (2, "/v1/embeddings", json!({"input": ["Grüß", "dich"]})),
        (3, "/v1/messages", messages(false)),
    ] {
        let fx = fixture(cases[i].0);
        let got = r.call(path, i, body).await;
        assert_eq!(got.status, 200, "{}: {}", cases[i].0, got.text());
        assert_eq!(got.body, fx.body, "{}", cases[i].0);
        assert_headers_sanitised(&fx, &got);
    }
    assert_eq!(r.usage(0).await, (1342, 9, 1152));
    assert_eq!(r.usage(1).await, (2084, 14, 1920));
    assert_eq!(r.usage(2).await, (9, 0, 0));
    assert_eq!(r.usage(3).await, (3090, 15, 2048));

    // An Anthropic client on the OpenAI answer: Anthropic counts cached input apart.
    let got = r.call("/v1/messages", 4, messages(false)).await;
    let v = got.json();
    assert_eq!(v["type"], "message");
    assert_eq!(v["content"][0]["text"], "Grüße aus Zürich — 東京へ 👋🏽!");
    assert_eq!(
        v["usage"],
        json!({"input_tokens": 1342 - 1152, "cache_read_input_tokens": 1152, "output_tokens": 9})
    );
    assert_eq!(r.usage(4).await, (1342, 9, 1152));
    // A chat client on the Anthropic answer.
    let got = r.call("/v1/chat/completions", 5, chat(false)).await;
    let v = got.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "Grüße aus Zürich — 東京へ 👋🏽!"
    );
    assert_eq!(v["usage"]["prompt_tokens"], 3090);
    assert_eq!(v["usage"]["completion_tokens"], 15);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 2048);
    assert_eq!(r.usage(5).await, (3090, 15, 2048));
}

#[tokio::test]
async fn provider_errors_keep_their_status_in_the_clients_shape() {
    let errors = [
        "openai/error_400",
        "openai/error_429",
        "openai/error_500",
        "openai/error_503",
        "anthropic/error_400",
        "anthropic/error_429",
        "anthropic/error_500",
        "anthropic/error_529",
    ];
    // Each error twice: once to a client of its own style, once translated.
    let mut cases = Vec::new();
    for name in errors {
        cases.push((name, "whole"));
        cases.push((name, "awkward"));
    }
    let r = start(&cases);
    for (i, (name, _)) in cases.iter().enumerate() {
        let fx = fixture(name);
        let fx_json: Value = serde_json::from_slice(&fx.body).unwrap();
        let message = fx_json["error"]["message"].as_str().unwrap();
        let openai = name.starts_with("openai/");
        let native = i % 2 == 0;
        let (path, body) = match (openai, native) {
            (true, true) | (false, false) => ("/v1/chat/completions", chat(true)),
            _ => ("/v1/messages", messages(true)),
        };
        let got = r.call(path, i, body).await;
        assert_eq!(got.status, fx.status, "{name} via {path}: {}", got.text());
        assert_eq!(
            got.header("retry-after"),
            fx.header("retry-after"),
            "{name}"
        );
        assert_headers_sanitised(&fx, &got);
        if native {
            assert_eq!(got.body, fx.body, "{name}");
            continue;
        }
        let v = got.json();
        if path == "/v1/messages" {
            assert_eq!(v["type"], "error", "{v}");
            assert_eq!(v["error"]["message"], message, "{v}");
            let want = match fx.status {
                400 => "invalid_request_error",
                429 => "rate_limit_error",
                529 => "overloaded_error",
                _ => "api_error",
            };
            assert_eq!(v["error"]["type"], want, "{name}: {v}");
        } else {
            assert_eq!(v["error"]["message"], message, "{v}");
            let want = match fx.status {
                400 => "invalid_request_error",
                429 => "rate_limit_error",
                _ => "server_error",
            };
            assert_eq!(v["error"]["type"], want, "{name}: {v}");
        }
    }
}

const OPENAI_SECRET: &str = "provider-openai-secret";
const ANTHROPIC_SECRET: &str = "provider-anthropic-secret";

#[tokio::test]
async fn provider_credential_refusals_become_502_with_a_code_of_their_own() {
    // (fixture, client path): same style and translated, both providers, 401 and 403.
    let cases = [
        ("openai/error_401", "/v1/chat/completions"),
        ("openai/error_403", "/v1/chat/completions"),
        ("anthropic/error_401", "/v1/messages"),
        ("anthropic/error_401", "/v1/chat/completions"),
        ("openai/error_401", "/v1/messages"),
    ];
    let names: Vec<(&str, &str)> = cases.iter().map(|c| (c.0, "awkward")).collect();
    let r = start(&names);
    for (i, (name, path)) in cases.iter().enumerate() {
        let fx = fixture(name);
        let fx_json: Value = serde_json::from_slice(&fx.body).unwrap();
        let provider_message = fx_json["error"]["message"].as_str().unwrap();
        let body = if path.starts_with("/v1/messages") {
            messages(true)
        } else {
            chat(true)
        };
        let got = r.call(path, i, body).await;
        assert_eq!(got.status, 502, "{name} via {path}: {}", got.text());
        let v = got.json();
        assert_eq!(v["error"]["code"], "provider_auth_failed", "{v}");
        // Each style's own type for the gateway's failure.
        let want = if path.starts_with("/v1/messages") {
            "api_error"
        } else {
            "server_error"
        };
        assert_eq!(v["error"]["type"], want, "{v}");
        assert_eq!(
            v.get("type").is_some(),
            path.starts_with("/v1/messages"),
            "{v}"
        );
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains("Your API key is fine"), "{message}");
        for leaked in [provider_message, OPENAI_SECRET, ANTHROPIC_SECRET] {
            assert!(!got.text().contains(leaked), "{name}: {}", got.text());
        }
        for name in ["www-authenticate", "x-should-retry", "server", "set-cookie"] {
            assert!(got.header(name).is_none(), "{name} reached the client");
        }
        assert_eq!(
            got.header("content-type"),
            Some("application/json; charset=utf-8")
        );
    }
    // Settled as the gateway's failure: nothing charged, the code recorded.
    for i in 0..cases.len() {
        assert_eq!(r.usage(i).await, (0, 0, 0), "case {i}");
    }
    let events = r.gw.usage_events().await;
    assert!(events
        .iter()
        .all(|e| e["status"] == 502 && e["error_code"] == "provider_auth_failed"));
    // The operator reads the provider's word in the log, without the credential.
    let log = r.gw.log();
    assert!(
        log.contains("refused the gateway's credential (401)"),
        "{log}"
    );
    assert!(
        log.contains("refused the gateway's credential (403)"),
        "{log}"
    );
    // The message is masked by the sanitiser (`***`) or by the log scrubber (`<redacted>`).
    assert!(
        log.contains("invalid x-api-key: ***") || log.contains("invalid x-api-key: <redacted>"),
        "{log}"
    );
    assert!(!log.contains(OPENAI_SECRET) && !log.contains(ANTHROPIC_SECRET));
}

#[tokio::test]
async fn an_echoed_provider_credential_is_masked_in_relayed_errors() {
    let r = start(&[
        ("openai/error_400_key_echo", "awkward"),
        ("openai/error_400_key_echo", "every-7"),
    ]);
    let fx = fixture("openai/error_400_key_echo");
    assert!(
        fx.text().contains(OPENAI_SECRET),
        "the fixture echoes the key"
    );
    let got = r.call("/v1/chat/completions", 0, chat(false)).await;
    assert_eq!(got.status, 400);
    assert_eq!(got.text(), fx.text().replace(OPENAI_SECRET, "***"));
    assert_headers_sanitised(&fx, &got);
    // Translated for an Anthropic client: same status, its shape, still masked.
    let got = r.call("/v1/messages", 1, messages(false)).await;
    assert_eq!(got.status, 400);
    let v = got.json();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(
        v["error"]["message"],
        "Project-scoped key *** cannot be used with organization org-operator0123456789 for \
         this model."
    );
}

#[tokio::test]
async fn official_sdks_read_the_replayed_answers() {
    let Some(python) = sdk::python() else {
        return;
    };
    // The models tests/sdk/sdk_replay.py expects, in order.
    let r = start(&[
        ("anthropic/messages_stream_thinking_tools", "awkward"),
        ("openai/chat_stream_tools", "awkward"),
        ("anthropic/messages_stream_thinking_tools", "every-7"),
        ("openai/chat_stream_text", "awkward"),
        ("openai/responses_stream", "awkward"),
        ("anthropic/error_529", "whole"),
        ("openai/error_429", "whole"),
        ("openai/error_401", "whole"),
        ("anthropic/messages_stream_overloaded", "awkward"),
    ]);
    sdk::run_script(&python, "sdk_replay.py", &[&r.gw.api, &r.key]);
}
