//! Cross-style translation end to end: OpenAI chat clients on Anthropic-style models and
//! Anthropic messages clients on OpenAI-style models, plain and streamed, text and tools, provider
//! errors, mid-stream failures, settlement from the provider's own usage, and the official SDKs.
//!
//! The mock reports 25 input and 24 output tokens everywhere, with 5 cached: Anthropic-style
//! answers add the cache read to the input (30), OpenAI-style ones count it inside (25).

mod common;

use std::time::Duration;

use common::api::event_tokens;
use common::*;
use serde_json::{json, Value};

const ANSWER: &str = "Hello from the mock provider.";

/// Models whose upstream name provokes the mock's failures, in both provider styles.
const FAILING_MODELS: &str = r#"
[[models]]
id = "claude-bad"
provider = "mock-anthropic"
upstream_model = "fail400"

[[models]]
id = "claude-down"
provider = "mock-anthropic"
upstream_model = "fail500"

[[models]]
id = "claude-broken"
provider = "mock-anthropic"
upstream_model = "midstream-error"

[[models]]
id = "claude-cut"
provider = "mock-anthropic"
upstream_model = "cut"

[[models]]
id = "gpt-bad"
provider = "mock"
upstream_model = "fail400"

[[models]]
id = "gpt-down"
provider = "mock"
upstream_model = "fail500"

[[models]]
id = "gpt-broken"
provider = "mock"
upstream_model = "midstream-error"

[[models]]
id = "gpt-cut"
provider = "mock"
upstream_model = "cut"
"#;

fn weather_tool_openai() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    }}])
}

fn weather_tool_anthropic() -> Value {
    json!([{
        "name": "get_weather",
        "description": "Weather for a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    }])
}

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello there"}
    ]})
}

fn messages(model: &str) -> Value {
    json!({"model": model, "max_tokens": 64, "system": "Be brief.",
           "messages": [{"role": "user", "content": "hello there"}]})
}

fn streamed(mut body: Value) -> Value {
    body["stream"] = json!(true);
    body
}

/// Style A: Bearer key. Style B paths get `x-api-key` and a version header.
async fn post(gw: &Gateway, path: &str, key: &str, body: &Value) -> reqwest::Response {
    api::post_in_style(gw, path, key, body).await
}

fn header<'a>(r: &'a reqwest::Response, name: &str) -> &'a str {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// The headers every translated answer carries: our content type, the request id and the
/// gateway's rate-limit headers; never the provider's length.
fn assert_gateway_headers(r: &reqwest::Response, content_type: &str) {
    assert!(
        header(r, "content-type").starts_with(content_type),
        "content-type {:?}",
        header(r, "content-type")
    );
    assert!(header(r, "x-request-id").starts_with("req_"));
    assert!(!header(r, "x-ratelimit-limit-requests").is_empty());
}

/// Splits an SSE body into `(event name, data)` frames, refusing anything but `event:`/`data:`
/// lines and blank-line terminators.
fn frames(text: &str) -> Vec<(Option<String>, String)> {
    assert!(
        text.ends_with("\n\n"),
        "stream ends with a blank line: {text:?}"
    );
    text.split("\n\n")
        .filter(|f| !f.is_empty())
        .map(|f| {
            let mut event = None;
            let mut data = None;
            for line in f.lines() {
                if let Some(e) = line.strip_prefix("event: ") {
                    event = Some(e.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = Some(d.to_string());
                } else {
                    panic!("unexpected line {line:?} in {text:?}");
                }
            }
            (event, data.expect("data line"))
        })
        .collect()
}

/// An OpenAI chat stream: `data:` frames only, ending with exactly one `[DONE]`; returns the
/// chunks before it.
fn chat_chunks(text: &str) -> Vec<Value> {
    let frames = frames(text);
    let (last, rest) = frames.split_last().expect("frames");
    assert_eq!(last, &(None, "[DONE]".to_string()), "{text}");
    rest.iter()
        .map(|(event, data)| {
            assert!(event.is_none(), "no event lines in OpenAI streams: {text}");
            serde_json::from_str(data).expect("chunk JSON")
        })
        .collect()
}

/// An Anthropic stream: every frame has an `event:` line matching the `type` inside its data.
fn anthropic_events(text: &str) -> Vec<(String, Value)> {
    frames(text)
        .into_iter()
        .map(|(event, data)| {
            let event = event.expect("event line");
            let v: Value = serde_json::from_str(&data).expect("event JSON");
            assert_eq!(v["type"], event.as_str(), "{text}");
            (event, v)
        })
        .collect()
}

fn names(events: &[(String, Value)]) -> Vec<&str> {
    events.iter().map(|(n, _)| n.as_str()).collect()
}

fn delta(chunk: &Value) -> &Value {
    &chunk["choices"][0]["delta"]
}

/// The mock's record of the last request it served: path, headers and JSON body.
async fn last_upstream(mock: &Mock) -> (String, Value, Value) {
    let seen = mock.requests().await;
    let last = seen.last().expect("the mock saw a request").clone();
    let body = serde_json::from_str(last["body"].as_str().unwrap_or("null")).expect("body JSON");
    (
        last["path"].as_str().unwrap_or("").to_string(),
        last["headers"].clone(),
        body,
    )
}

#[tokio::test]
async fn chat_client_on_anthropic_model() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, Options::default());
    let key = gw.user_with_key("chat-anthropic@example.com", &[]);

    // Text.
    let mut body = chat("claude-mock");
    body["stop"] = json!("END");
    body["user"] = json!("u-42");
    let r = post(&gw, "/v1/chat/completions", &key, &body).await;
    assert_eq!(r.status(), 200);
    assert_gateway_headers(&r, "application/json");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["id"], "chatcmpl-msg_mock");
    assert_eq!(v["model"], "claude-mock");
    assert_eq!(
        v["choices"],
        json!([{"index": 0, "message": {"role": "assistant", "content": ANSWER},
                "logprobs": null, "finish_reason": "stop"}])
    );
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 30, "completion_tokens": 24, "total_tokens": 54,
               "prompt_tokens_details": {"cached_tokens": 5}})
    );

    // What the provider received: the messages API, its credential, the translated body.
    let (path, headers, sent) = last_upstream(&mock).await;
    assert_eq!(path, "/v1/messages");
    assert_eq!(headers["x-api-key"], "provider-anthropic-secret");
    assert_eq!(headers["anthropic-version"], "2023-06-01");
    assert!(headers.get("authorization").is_none(), "{headers}");
    assert_eq!(
        sent,
        json!({"model": "claude-mock", "system": "Be brief.",
               "messages": [{"role": "user", "content": [{"type": "text", "text": "hello there"}]}],
               "max_tokens": 256, "stop_sequences": ["END"], "metadata": {"user_id": "u-42"}})
    );

    // Tools: the answer's tool_use becomes a tool call; the request's tools become Anthropic's.
    let mut body = chat("claude-tools");
    body["tools"] = weather_tool_openai();
    body["tool_choice"] = json!("required");
    body["max_completion_tokens"] = json!(100);
    let r = post(&gw, "/v1/chat/completions", &key, &body).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], "Let me check.");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["id"], "toolu_mock");
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));
    let (_, _, sent) = last_upstream(&mock).await;
    assert_eq!(sent["model"], "tools");
    assert_eq!(sent["max_tokens"], 100);
    assert_eq!(sent["tool_choice"], json!({"type": "any"}));
    assert_eq!(sent["tools"][0]["name"], "get_weather");
    assert_eq!(
        sent["tools"][0]["input_schema"]["required"],
        json!(["city"])
    );

    // A tool result goes back as a tool_result block in a user turn.
    let mut body = chat("claude-mock");
    body["messages"] = json!([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "toolu_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}
    ]);
    let r = post(&gw, "/v1/chat/completions", &key, &body).await;
    assert_eq!(r.status(), 200);
    let (_, _, sent) = last_upstream(&mock).await;
    assert_eq!(
        sent["messages"][1]["content"][0],
        json!({"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}})
    );
    assert_eq!(sent["messages"][2]["role"], "user");
    assert_eq!(sent["messages"][2]["content"][0]["type"], "tool_result");
    assert_eq!(sent["messages"][2]["content"][0]["tool_use_id"], "toolu_1");

    // Settlement records what the provider reported, in the provider's semantics.
    let events = gw.wait_usage(3).await;
    assert_eq!(events.len(), 3, "{events:?}");
    for e in &events {
        assert_eq!(e["endpoint"], "chat_completions");
        assert_eq!(e["status"], 200);
        assert_eq!(e["settlement"], "provider:complete");
        assert_eq!(event_tokens(e), (30, 24, 5), "{e}");
    }
    assert_eq!(events[0]["deployment"], "mock-anthropic/claude-mock");
    assert_eq!(events[1]["deployment"], "mock-anthropic/tools");
}

#[tokio::test]
async fn chat_stream_from_anthropic_model() {
    let mock = Mock::start(&["--chunks", "3"]);
    let gw = Gateway::start(&mock, Options::default());
    let key = gw.user_with_key("chat-stream@example.com", &[]);

    // With the usage chunk.
    let mut body = streamed(chat("claude-mock"));
    body["stream_options"] = json!({"include_usage": true});
    let r = post(&gw, "/v1/chat/completions", &key, &body).await;
    assert_eq!(r.status(), 200);
    assert_gateway_headers(&r, "text/event-stream");
    assert!(r.headers().get("content-length").is_none());
    let chunks = chat_chunks(&r.text().await.unwrap());
    assert_eq!(chunks.len(), 6, "{chunks:?}");
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["id"], "chatcmpl-msg_mock");
        assert_eq!(c["model"], "claude-mock");
    }
    assert_eq!(
        delta(&chunks[0]),
        &json!({"role": "assistant", "content": ""})
    );
    let text: Vec<&str> = chunks[1..4]
        .iter()
        .map(|c| delta(c)["content"].as_str().unwrap())
        .collect();
    assert_eq!(text, ["tok0 ", "tok1 ", "tok2 "]);
    assert!(chunks[..4]
        .iter()
        .all(|c| c["choices"][0]["finish_reason"].is_null()));
    assert_eq!(chunks[4]["choices"][0]["finish_reason"], "stop");
    assert_eq!(delta(&chunks[4]), &json!({}));
    assert_eq!(chunks[5]["choices"], json!([]));
    assert_eq!(
        chunks[5]["usage"],
        json!({"prompt_tokens": 30, "completion_tokens": 24, "total_tokens": 54,
               "prompt_tokens_details": {"cached_tokens": 5}})
    );
    let (path, _, sent) = last_upstream(&mock).await;
    assert_eq!(path, "/v1/messages");
    assert_eq!(sent["stream"], true);
    assert!(sent.get("stream_options").is_none(), "{sent}");

    // Without: no usage chunk, same ending.
    let r = post(
        &gw,
        "/v1/chat/completions",
        &key,
        &streamed(chat("claude-mock")),
    )
    .await;
    let chunks = chat_chunks(&r.text().await.unwrap());
    assert_eq!(chunks.len(), 5, "{chunks:?}");
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
    assert_eq!(chunks[4]["choices"][0]["finish_reason"], "stop");

    // Tools: text, then the call's id and name, then its arguments in pieces.
    let mut body = streamed(chat("claude-tools"));
    body["tools"] = weather_tool_openai();
    let r = post(&gw, "/v1/chat/completions", &key, &body).await;
    let chunks = chat_chunks(&r.text().await.unwrap());
    assert_eq!(delta(&chunks[0])["role"], "assistant");
    assert_eq!(delta(&chunks[1]), &json!({"content": "Let me check."}));
    assert_eq!(
        delta(&chunks[2]),
        &json!({"tool_calls": [{"index": 0, "id": "toolu_mock", "type": "function",
                                "function": {"name": "get_weather", "arguments": ""}}]})
    );
    let args: String = chunks[3..6]
        .iter()
        .map(|c| {
            let call = &delta(c)["tool_calls"][0];
            assert_eq!(call["index"], 0);
            call["function"]["arguments"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&args).unwrap(),
        json!({"city": "Paris"})
    );
    assert_eq!(chunks[6]["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(chunks.len(), 7, "{chunks:?}");

    // Usage observed on the provider's stream, before translation.
    let events = gw.wait_usage(3).await;
    assert_eq!(events.len(), 3, "{events:?}");
    for e in &events {
        assert_eq!(e["settlement"], "provider:complete");
        assert_eq!(event_tokens(e), (30, 24, 5), "{e}");
    }
}

#[tokio::test]
async fn messages_client_on_openai_model() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, Options::default());
    let key = gw.user_with_key("messages-openai@example.com", &[]);

    for path in ["/v1/messages", "/alt/v1/messages", "/alt"] {
        let mut body = messages("mock-gpt");
        body["stop_sequences"] = json!(["END"]);
        body["metadata"] = json!({"user_id": "u-7"});
        let r = post(&gw, path, &key, &body).await;
        assert_eq!(r.status(), 200, "{path}");
        assert_gateway_headers(&r, "application/json");
        let v: Value = r.json().await.unwrap();
        assert_eq!(
            v,
            json!({"id": "msg_chatcmpl-mock", "type": "message", "role": "assistant",
                   "model": "mock-gpt", "content": [{"type": "text", "text": ANSWER}],
                   "stop_reason": "end_turn", "stop_sequence": null,
                   "usage": {"input_tokens": 20, "cache_read_input_tokens": 5, "output_tokens": 24}}),
            "{path}"
        );
    }
    let (path, headers, sent) = last_upstream(&mock).await;
    assert_eq!(path, "/v1/chat/completions");
    assert_eq!(headers["authorization"], "Bearer provider-openai-secret");
    assert!(headers.get("x-api-key").is_none(), "{headers}");
    assert_eq!(
        sent,
        json!({"model": "mock-gpt", "max_tokens": 64, "stop": ["END"], "user": "u-7",
               "messages": [{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "hello there"}]})
    );

    // Tools both ways: a tool_result goes up as a tool message, a tool call comes back as tool_use.
    let mut body = messages("mock-tools");
    body["tools"] = weather_tool_anthropic();
    body["tool_choice"] = json!({"type": "tool", "name": "get_weather"});
    body["messages"] = json!([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Rome"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "rainy"},
                                     {"type": "text", "text": "and Paris?"}]}
    ]);
    let r = post(&gw, "/v1/messages", &key, &body).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["stop_reason"], "tool_use");
    assert_eq!(
        v["content"],
        json!([{"type": "tool_use", "id": "call_mock", "name": "get_weather", "input": {"city": "Paris"}}])
    );
    let (_, _, sent) = last_upstream(&mock).await;
    assert_eq!(sent["model"], "tools");
    assert_eq!(sent["tools"][0]["type"], "function");
    assert_eq!(sent["tools"][0]["function"]["name"], "get_weather");
    assert_eq!(
        sent["tool_choice"],
        json!({"type": "function", "function": {"name": "get_weather"}})
    );
    let msgs = sent["messages"].as_array().unwrap();
    assert_eq!(msgs[2]["tool_calls"][0]["id"], "call_1");
    assert_eq!(
        msgs[3],
        json!({"role": "tool", "tool_call_id": "call_1", "content": "rainy"})
    );
    assert_eq!(msgs[4]["role"], "user");

    let events = gw.wait_usage(4).await;
    assert_eq!(events.len(), 4, "{events:?}");
    for e in &events {
        assert_eq!(e["endpoint"], "messages");
        assert_eq!(e["settlement"], "provider:complete");
        assert_eq!(event_tokens(e), (25, 24, 5), "{e}");
    }
    assert_eq!(events[3]["deployment"], "mock/tools");
}

#[tokio::test]
async fn messages_stream_from_openai_model() {
    let mock = Mock::start(&["--chunks", "3"]);
    let gw = Gateway::start(&mock, Options::default());
    let key = gw.user_with_key("messages-stream@example.com", &[]);

    let r = post(
        &gw,
        "/alt/v1/messages",
        &key,
        &streamed(messages("mock-gpt")),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_gateway_headers(&r, "text/event-stream");
    let events = anthropic_events(&r.text().await.unwrap());
    assert_eq!(
        names(&events),
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    let start = &events[0].1["message"];
    assert_eq!(start["id"], "msg_chatcmpl-mock");
    assert_eq!(start["model"], "mock-gpt");
    assert_eq!(start["role"], "assistant");
    assert_eq!(start["content"], json!([]));
    assert_eq!(
        events[1].1,
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
    );
    for (i, (_, e)) in events[2..5].iter().enumerate() {
        assert_eq!(e["index"], 0);
        assert_eq!(
            e["delta"],
            json!({"type": "text_delta", "text": format!("tok{i} ")})
        );
    }
    assert_eq!(events[5].1["index"], 0);
    assert_eq!(
        events[6].1,
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
               "usage": {"input_tokens": 20, "cache_read_input_tokens": 5, "output_tokens": 24}})
    );
    // The gateway asked the provider for the usage chunk the Anthropic client needs.
    let (path, _, sent) = last_upstream(&mock).await;
    assert_eq!(path, "/v1/chat/completions");
    assert_eq!(sent["stream"], true);
    assert_eq!(sent["stream_options"], json!({"include_usage": true}));

    // Tools: one tool_use block, its input in pieces, closed before the message ends.
    let mut body = streamed(messages("mock-tools"));
    body["tools"] = weather_tool_anthropic();
    let r = post(&gw, "/v1/messages", &key, &body).await;
    let events = anthropic_events(&r.text().await.unwrap());
    assert_eq!(
        names(&events),
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(
        events[1].1["content_block"],
        json!({"type": "tool_use", "id": "call_mock", "name": "get_weather", "input": {}})
    );
    let input: String = events[2..5]
        .iter()
        .map(|(_, e)| {
            assert_eq!(e["delta"]["type"], "input_json_delta");
            e["delta"]["partial_json"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&input).unwrap(),
        json!({"city": "Paris"})
    );
    assert_eq!(events[6].1["delta"]["stop_reason"], "tool_use");

    let usage = gw.wait_usage(2).await;
    assert_eq!(usage.len(), 2, "{usage:?}");
    for e in &usage {
        assert_eq!(e["settlement"], "provider:complete");
        assert_eq!(event_tokens(e), (25, 24, 5), "{e}");
    }
}

#[tokio::test]
async fn provider_errors_in_the_client_style() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, Options::with_toml(FAILING_MODELS));
    let key = gw.user_with_key("errors@example.com", &[]);

    // OpenAI clients get the OpenAI error shape with the provider's status.
    let cases = [
        (
            chat("claude-bad"),
            400,
            json!({"error": {"message": "bad request from mock", "type": "invalid_request_error",
                             "code": "invalid_request", "param": null}}),
        ),
        (
            streamed(chat("claude-down")),
            500,
            json!({"error": {"message": "mock failure", "type": "server_error",
                             "code": "api_error", "param": null}}),
        ),
    ];
    for (body, status, want) in cases {
        let r = post(&gw, "/v1/chat/completions", &key, &body).await;
        assert_eq!(r.status(), status, "{body}");
        assert_gateway_headers(&r, "application/json");
        assert_eq!(r.json::<Value>().await.unwrap(), want);
    }

    // Anthropic clients get the Anthropic error shape.
    let cases = [
        (
            streamed(messages("gpt-bad")),
            400,
            json!({"type": "error", "error": {"type": "invalid_request_error",
                                              "message": "bad request from mock"}}),
        ),
        (
            messages("gpt-down"),
            500,
            json!({"type": "error", "error": {"type": "api_error", "message": "mock failure"}}),
        ),
    ];
    for (body, status, want) in cases {
        let r = post(&gw, "/alt/v1/messages", &key, &body).await;
        assert_eq!(r.status(), status, "{body}");
        assert_gateway_headers(&r, "application/json");
        assert_eq!(r.json::<Value>().await.unwrap(), want);
    }

    // Provider refusals are settled as such and charge nothing.
    let events = gw.wait_usage(4).await;
    assert_eq!(events.len(), 4, "{events:?}");
    for e in &events {
        assert_eq!(e["error_code"], "provider_error", "{e}");
        assert_eq!(event_tokens(e), (0, 0, 0), "{e}");
    }

    // A request the translation cannot express is refused before anything is reserved.
    let mut body = chat("claude-mock");
    body["n"] = json!(2);
    let r = post(&gw, "/v1/chat/completions", &key, &body).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_request");
    let r = post(
        &gw,
        "/v1/messages",
        &key,
        &json!({"model": "mock-gpt", "max_tokens": 8, "messages": [{"role": "tool", "content": "x"}]}),
    )
    .await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["code"], "invalid_request");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(gw.usage_events().await.len(), 4);
}

#[tokio::test]
async fn midstream_errors_and_cuts_in_the_client_style() {
    let mock = Mock::start(&["--chunks", "6"]);
    let gw = Gateway::start(&mock, Options::with_toml(FAILING_MODELS));
    let key = gw.user_with_key("midstream@example.com", &[]);

    // Anthropic `error` event -> an OpenAI error chunk, then [DONE].
    let r = post(
        &gw,
        "/v1/chat/completions",
        &key,
        &streamed(chat("claude-broken")),
    )
    .await;
    assert_eq!(r.status(), 200);
    let chunks = chat_chunks(&r.text().await.unwrap());
    let (last, text) = chunks.split_last().unwrap();
    assert_eq!(
        last,
        &json!({"error": {"message": "Overloaded", "type": "server_error", "code": "overloaded",
                          "param": null}})
    );
    assert_eq!(text.len(), 4, "role and three deltas: {chunks:?}");
    assert!(text
        .iter()
        .all(|c| c["choices"][0]["finish_reason"].is_null()));

    // OpenAI error chunk -> an Anthropic `error` event, which ends the stream.
    let r = post(&gw, "/v1/messages", &key, &streamed(messages("gpt-broken"))).await;
    let events = anthropic_events(&r.text().await.unwrap());
    assert_eq!(
        names(&events),
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "error"
        ]
    );
    assert_eq!(
        events[5].1,
        json!({"type": "error", "error": {"type": "api_error", "message": "overloaded"}})
    );

    // A provider that hangs up mid-stream: the client is told, in its style, and the stream still
    // ends the way its protocol ends.
    let r = post(
        &gw,
        "/v1/chat/completions",
        &key,
        &streamed(chat("claude-cut")),
    )
    .await;
    let chunks = chat_chunks(&r.text().await.unwrap());
    let last = chunks.last().unwrap();
    assert_eq!(last["error"]["code"], "upstream_error", "{chunks:?}");
    assert_eq!(
        last["error"]["message"],
        "The upstream stream was interrupted."
    );
    assert!(chunks
        .iter()
        .all(|c| c.get("choices").is_none() || c["choices"][0]["finish_reason"].is_null()));

    let r = post(&gw, "/v1/messages", &key, &streamed(messages("gpt-cut"))).await;
    let events = anthropic_events(&r.text().await.unwrap());
    let (last, _) = events.split_last().unwrap();
    assert_eq!(
        last.1,
        json!({"type": "error", "error": {"type": "api_error",
                                          "message": "The upstream stream was interrupted."}})
    );
    assert!(!names(&events).contains(&"message_stop"));

    // Settlement: provider-reported usage where it came (Anthropic's message_start), counted
    // delivery otherwise; cut streams are upstream errors.
    let events = gw.wait_usage(4).await;
    assert_eq!(events.len(), 4, "{events:?}");
    // A provider error event mid-stream settles as an upstream error with the provider's code.
    assert_eq!(events[0]["settlement"], "provider:upstream_error");
    assert!(events[0]["error_code"].is_string(), "{:?}", events[0]);
    // The provider's message_start said 1 output token, but the stream ended with an error
    // before its final usage: at least the delivered text is charged.
    let (input, output, cached) = event_tokens(&events[0]);
    assert_eq!((input, cached), (30, 5));
    assert!(output > 1, "delivered text counted: {output}");
    assert_eq!(events[1]["settlement"], "counted:upstream_error");
    assert!(events[1]["output_tokens"].as_i64().unwrap() >= 3);
    assert_eq!(events[2]["settlement"], "provider:upstream_error");
    assert_eq!(events[2]["error_code"], "upstream_error");
    assert_eq!(events[3]["settlement"], "counted:upstream_error");
    assert!(events[3]["output_tokens"].as_i64().unwrap() >= 1);
}

#[tokio::test]
async fn client_leaving_a_translated_stream_still_settles() {
    let mock = Mock::start(&["--chunks", "20", "--chunk-delay-ms", "100"]);
    let gw = Gateway::start(&mock, Options::default());
    let key = gw.user_with_key("leaver@example.com", &[]);

    let mut r = post(
        &gw,
        "/v1/chat/completions",
        &key,
        &streamed(chat("claude-mock")),
    )
    .await;
    let _first = r.chunk().await.unwrap();
    drop(r);
    let mut r = post(&gw, "/v1/messages", &key, &streamed(messages("mock-gpt"))).await;
    let _first = r.chunk().await.unwrap();
    drop(r);

    let events = gw.wait_usage(2).await;
    assert_eq!(events.len(), 2, "{events:?}");
    for e in &events {
        assert!(
            e["settlement"]
                .as_str()
                .unwrap()
                .ends_with(":client_disconnect"),
            "{e}"
        );
        assert!(e["input_tokens"].as_i64().unwrap() > 0, "{e}");
        assert!(e["output_tokens"].as_i64().unwrap() >= 1, "{e}");
    }
}

#[tokio::test]
async fn checks_run_before_translation() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, Options::default());
    let limited = gw.user_with_key(
        "limited@example.com",
        &["--models", "mock-gpt", "--max-output-tokens", "100"],
    );
    let r = post(&gw, "/v1/chat/completions", &limited, &chat("claude-mock")).await;
    assert_eq!(r.status(), 403);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "model_not_allowed"
    );
    let mut body = messages("mock-gpt");
    body["max_tokens"] = json!(1000);
    let r = post(&gw, "/v1/messages", &limited, &body).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["code"], "max_output_tokens_exceeded");

    // A scope covers the endpoint the client calls, whatever the provider speaks.
    let chat_only = gw.user_with_key("chatonly@example.com", &["--scopes", "chat"]);
    let r = post(
        &gw,
        "/v1/chat/completions",
        &chat_only,
        &chat("claude-mock"),
    )
    .await;
    assert_eq!(r.status(), 200);
    let r = post(&gw, "/v1/messages", &chat_only, &messages("mock-gpt")).await;
    assert_eq!(r.status(), 403);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "insufficient_scope"
    );

    // Without max_tokens, a chat request to an Anthropic-style model gets the admitted reserve
    // (the key's cap here), which the messages API requires.
    let capped = gw.user_with_key("capped@example.com", &["--max-output-tokens", "100"]);
    let r = post(&gw, "/v1/chat/completions", &capped, &chat("claude-mock")).await;
    assert_eq!(r.status(), 200);
    let (_, _, sent) = last_upstream(&mock).await;
    assert_eq!(sent["max_tokens"], 100);
}

#[tokio::test]
async fn count_tokens_in_both_styles() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, Options::default());
    let key = gw.user_with_key("count@example.com", &[]);
    let body = |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "hello there, how are you?"}]});

    // Anthropic-style model: the provider counts.
    let r = post(&gw, "/v1/messages/count_tokens", &key, &body("claude-mock")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"input_tokens": 42})
    );
    let (path, _, _) = last_upstream(&mock).await;
    assert_eq!(path, "/v1/messages/count_tokens");

    // OpenAI-style model: the gateway counts, on both paths; the provider is not asked.
    let before = mock.served().await;
    for path in ["/v1/messages/count_tokens", "/alt/messages/count_tokens"] {
        let r = post(&gw, path, &key, &body("mock-gpt")).await;
        assert_eq!(r.status(), 200);
        let n = r.json::<Value>().await.unwrap()["input_tokens"]
            .as_u64()
            .unwrap();
        assert!(n > 3 && n < 30, "{n}");
    }
    assert_eq!(mock.served().await, before);

    let events = gw.wait_usage(3).await;
    assert_eq!(events.len(), 3);
    for e in &events[1..] {
        assert_eq!(e["endpoint"], "count_tokens");
        assert_eq!(
            event_tokens(e),
            (0, 0, 0),
            "a local count costs no tokens: {e}"
        );
    }
}

#[tokio::test]
async fn mixed_style_deployments_fail_over_across_styles() {
    let mock = Mock::start(&[]);
    let extra = r#"
[[models]]
id = "hybrid"
deployments = [
  { provider = "mock-anthropic", upstream_model = "fail500", weight = 1000 },
  { provider = "mock", upstream_model = "mock-gpt", weight = 1 },
]
"#;
    let gw = Gateway::start(&mock, Options::with_toml(extra));
    let key = gw.user_with_key("hybrid@example.com", &[]);
    // Chat: translated for the Anthropic deployment, native for the OpenAI one.
    let r = post(&gw, "/v1/chat/completions", &key, &chat("hybrid")).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], ANSWER);
    let (path, _, sent) = last_upstream(&mock).await;
    assert_eq!(path, "/v1/chat/completions");
    assert_eq!(sent["model"], "mock-gpt");
    assert_eq!(
        sent["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );
    let events = gw.wait_usage(1).await;
    assert_eq!(events[0]["deployment"], "mock/mock-gpt");
}

#[tokio::test]
async fn official_sdks_across_styles() {
    let Some(python) = sdk::python() else {
        return;
    };
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, Options::default());
    let key = gw.user_with_key("sdk-cross@example.com", &[]);
    let printed = sdk::run_script(&python, "sdk_clients.py", &[&gw.api, &key, "cross"]);
    print!("{printed}");
}
