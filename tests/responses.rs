//! Coding agents on every model: the Responses API on Anthropic-style providers and on
//! OpenAI-style providers that only speak chat completions, the features agents put in
//! messages requests carried across styles, settlement from the provider's own usage on every
//! translated path, and the agents' real first requests replayed through every combination.
//!
//! The mock reports 25 input and 24 output tokens everywhere, with 5 cached: Anthropic-style
//! answers add the cache read to the input (30), OpenAI-style ones count it inside (25).

mod common;

use common::api::event_tokens;
use common::responses::{last_upstream, options, responses_events, types};
use common::*;
use serde_json::{json, Value};

const ANSWER: &str = "Hello from the mock provider.";

/// Style A: Bearer key. Style B paths get `x-api-key` and a version header.
async fn post(gw: &Gateway, path: &str, key: &str, body: &Value) -> reqwest::Response {
    api::post_in_style(gw, path, key, body).await
}

/// A messages request as agents send it: cache breakpoints, a system turn in the middle, signed
/// thinking in the history and a field newer than any translation.
fn agent_messages(model: &str) -> Value {
    json!({
        "model": model, "max_tokens": 64,
        "system": [{"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "list files", "cache_control": {"type": "ephemeral"}}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "use ls", "signature": "sig-1"},
                {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"cmd": "ls"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"}]},
            {"role": "system", "content": "Reminder: be brief."},
            {"role": "user", "content": "and now?"}
        ],
        "tools": [{"name": "bash", "description": "run", "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}],
        "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
        "brand_new_option": true
    })
}

#[tokio::test]
async fn messages_features_pass_natively_and_are_dropped_across_styles() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, Options::default());
    let key = gw.user_with_key("agent-features@example.com", &[]);

    // Same style: everything reaches the provider as the client wrote it.
    let body = agent_messages("claude-mock");
    let r = post(&gw, "/v1/messages", &key, &body).await;
    assert_eq!(r.status(), 200);
    let (path, sent) = last_upstream(&mock).await;
    assert_eq!(path, "/v1/messages");
    assert_eq!(sent, body);

    // Other style: the mid-conversation system turn stays in place, the rest is dropped, nothing
    // is refused.
    let r = post(&gw, "/alt/v1/messages", &key, &agent_messages("mock-gpt")).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "message");
    let (path, sent) = last_upstream(&mock).await;
    assert_eq!(path, "/v1/chat/completions");
    assert_eq!(
        sent["messages"],
        json!([
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "list files"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "toolu_1", "type": "function",
                "function": {"name": "bash", "arguments": "{\"cmd\":\"ls\"}"}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "a.txt"},
            {"role": "system", "content": "Reminder: be brief."},
            {"role": "user", "content": "and now?"}
        ])
    );
    for dropped in ["context_management", "brand_new_option", "system"] {
        assert!(sent.get(dropped).is_none(), "{dropped} in {sent}");
    }
    assert!(!sent.to_string().contains("cache_control"), "{sent}");

    // A chat client's signed thinking goes back to an Anthropic-style provider intact.
    let chat = json!({"model": "claude-mock", "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": null,
         "thinking_blocks": [{"type": "thinking", "thinking": "check", "signature": "sig-2"}],
         "tool_calls": [{"id": "toolu_2", "type": "function", "function": {"name": "w", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "sunny"}],
        "prompt_cache_key": "k", "verbosity": "low"});
    let r = post(&gw, "/v1/chat/completions", &key, &chat).await;
    assert_eq!(r.status(), 200);
    let (_, sent) = last_upstream(&mock).await;
    assert_eq!(
        sent["messages"][1]["content"][0],
        json!({"type": "thinking", "thinking": "check", "signature": "sig-2"})
    );
    assert!(sent.get("prompt_cache_key").is_none() && sent.get("verbosity").is_none());
}

/// A Responses request as Codex sends it: instructions, a developer item, tools, reasoning.
fn codex_like(model: &str) -> Value {
    json!({
        "model": model, "instructions": "You are a coding agent.", "store": false,
        "include": ["reasoning.encrypted_content"], "parallel_tool_calls": false,
        "reasoning": {"effort": "low", "summary": "auto"}, "max_output_tokens": 2000,
        "user": "dev-1", "metadata": {"session": "s1"}, "tool_choice": "auto",
        "tools": [{"type": "function", "name": "get_weather", "description": "Weather",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": false}],
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather in Paris?"}]}
        ]
    })
}

/// Codex's request on an Anthropic-style model and on a chat-only OpenAI-style one: whole and
/// streamed, text and tools, with what the provider received and the usage each answer reports.
#[tokio::test]
async fn responses_on_messages_and_chat_only_providers() {
    let mock = Mock::start(&["--chunks", "3"]);
    let gw = Gateway::start(&mock, options(&mock, ""));
    let key = gw.user_with_key("responses@example.com", &[]);

    // Anthropic-style: the request as a messages request.
    let r = post(&gw, "/v1/responses", &key, &codex_like("claude-mock")).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "response");
    assert_eq!(v["id"], "resp_msg_mock");
    assert_eq!(v["model"], "claude-mock");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["output"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["output"][0]["type"], "message");
    assert_eq!(v["output"][0]["content"][0]["text"], ANSWER);
    assert_eq!(
        v["usage"],
        json!({"input_tokens": 30, "input_tokens_details": {"cached_tokens": 5}, "output_tokens": 24,
               "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 54})
    );
    let (path, sent) = last_upstream(&mock).await;
    assert_eq!(path, "/v1/messages");
    assert_eq!(
        sent,
        json!({"model": "claude-mock", "system": "You are a coding agent.\n\nBe brief.",
               "messages": [{"role": "user", "content": [{"type": "text", "text": "weather in Paris?"}]}],
               "max_tokens": 2000, "thinking": {"type": "enabled", "budget_tokens": 1024},
               "tools": [{"name": "get_weather", "description": "Weather",
                          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
               "tool_choice": {"type": "auto", "disable_parallel_tool_use": true},
               "metadata": {"user_id": "dev-1"}})
    );

    // Chat-only: the same request as a chat request.
    let r = post(&gw, "/v1/responses", &key, &codex_like("gpt-chat-only")).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["id"], "resp_chatcmpl-mock");
    assert_eq!(v["output"][0]["content"][0]["text"], ANSWER);
    assert_eq!(v["usage"]["input_tokens"], 25);
    assert_eq!(v["usage"]["input_tokens_details"]["cached_tokens"], 5);
    let (path, sent) = last_upstream(&mock).await;
    assert_eq!(path, "/v1/chat/completions");
    assert_eq!(
        sent,
        json!({"model": "gpt-chat-only", "max_completion_tokens": 2000, "parallel_tool_calls": false,
               "reasoning_effort": "low", "user": "dev-1", "tool_choice": "auto",
               "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
               "messages": [{"role": "system", "content": "You are a coding agent."},
                            {"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "weather in Paris?"}]})
    );
    // An OpenAI-style provider that serves responses still gets the request as it came.
    let r = post(&gw, "/v1/responses", &key, &codex_like("mock-gpt")).await;
    assert_eq!(r.status(), 200);
    let (path, _) = last_upstream(&mock).await;
    assert_eq!(path, "/v1/responses");

    // Streamed tool calls, both ways: the full Responses event sequence.
    for model in ["claude-tools", "gpt-chat-tools"] {
        let mut body = codex_like(model);
        body["stream"] = json!(true);
        let r = post(&gw, "/v1/responses", &key, &body).await;
        assert_eq!(r.status(), 200, "{model}");
        assert!(r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        let events = responses_events(&r.text().await.unwrap());
        let mut want = vec!["response.created", "response.in_progress"];
        if model == "claude-tools" {
            want.extend([
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
            ]);
        }
        want.extend([
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]);
        assert_eq!(types(&events), want, "{model}");
        let done = &events.last().unwrap()["response"];
        let call = done["output"].as_array().unwrap().last().unwrap().clone();
        assert_eq!(call["type"], "function_call");
        assert_eq!(call["name"], "get_weather");
        assert_eq!(call["arguments"], "{\"city\":\"Paris\"}");
        let cached = &done["usage"]["input_tokens_details"]["cached_tokens"];
        assert_eq!(cached, 5, "{model}");
        let (path, sent) = last_upstream(&mock).await;
        assert_eq!(sent["stream"], true);
        if model == "gpt-chat-tools" {
            assert_eq!(path, "/v1/chat/completions");
            assert_eq!(sent["stream_options"], json!({"include_usage": true}));
            assert_eq!(done["usage"]["input_tokens"], 25);
        } else {
            assert_eq!(path, "/v1/messages");
            assert_eq!(done["usage"]["input_tokens"], 30);
            assert_eq!(call["call_id"], "toolu_mock");
        }
    }

    // The tool's result goes back as the provider expects it.
    let mut body = codex_like("claude-mock");
    let items = body["input"].as_array_mut().unwrap();
    items.push(
        json!({"type": "function_call", "call_id": "toolu_mock", "name": "get_weather",
                      "arguments": "{\"city\":\"Paris\"}"}),
    );
    items.push(json!({"type": "function_call_output", "call_id": "toolu_mock", "output": "sunny"}));
    let r = post(&gw, "/v1/responses", &key, &body).await;
    assert_eq!(r.status(), 200);
    let (_, sent) = last_upstream(&mock).await;
    assert_eq!(
        sent["messages"][1],
        json!({"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_mock",
               "name": "get_weather", "input": {"city": "Paris"}}]})
    );
    assert_eq!(
        sent["messages"][2],
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_mock", "content": "sunny"}]})
    );

    // Every translated answer settled with the provider's own usage.
    let events = gw.wait_usage(6).await;
    assert_eq!(events.len(), 6, "{events:?}");
    for e in &events {
        assert_eq!(e["endpoint"], "responses", "{e}");
        assert_eq!(e["settlement"], "provider:complete", "{e}");
        let anthropic = e["deployment"]
            .as_str()
            .unwrap()
            .starts_with("mock-anthropic/");
        let want = if anthropic { (30, 24, 5) } else { (25, 24, 5) };
        assert_eq!(event_tokens(e), want, "{e}");
    }
}

/// What the gateway cannot keep is refused before anything is spent; provider errors and cut
/// streams reach the client in the Responses error shape.
#[tokio::test]
async fn responses_refusals_and_errors_in_the_client_style() {
    let mock = Mock::start(&["--chunks", "3"]);
    let gw = Gateway::start(&mock, options(&mock, ""));
    let key = gw.user_with_key("responses-errors@example.com", &[]);

    for model in ["claude-mock", "gpt-chat-only"] {
        for (field, value, code) in [
            ("previous_response_id", json!("resp_1"), "invalid_request"),
            ("background", json!(true), "unsupported_parameter"),
        ] {
            let mut body = json!({"model": model, "input": "hi"});
            body[field] = value;
            let r = post(&gw, "/v1/responses", &key, &body).await;
            assert_eq!(r.status(), 400, "{model} {field}");
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["error"]["code"], code, "{v}");
            assert!(
                v["error"]["message"].as_str().unwrap().contains(field),
                "{v}"
            );
            assert!(v.get("type").is_none(), "OpenAI error shape: {v}");
        }
    }
    assert!(
        mock.requests().await.is_empty(),
        "nothing reached the provider"
    );

    // Provider errors keep their status, in the OpenAI error shape.
    for model in ["claude-bad", "gpt-chat-bad"] {
        let r = post(
            &gw,
            "/v1/responses",
            &key,
            &json!({"model": model, "input": "hi"}),
        )
        .await;
        assert_eq!(r.status(), 400, "{model}");
        let v: Value = r.json().await.unwrap();
        assert!(v["error"]["message"].is_string(), "{v}");
        assert!(v["error"]["type"].is_string(), "{v}");
    }

    // A stream the provider cuts ends with response.failed.
    let body = json!({"model": "claude-cut", "input": "hi", "stream": true});
    let r = post(&gw, "/v1/responses", &key, &body).await;
    assert_eq!(r.status(), 200);
    let events = responses_events(&r.text().await.unwrap());
    let last = events.last().unwrap();
    assert_eq!(last["type"], "response.failed", "{events:?}");
    assert_eq!(last["response"]["error"]["code"], "upstream_error");
    assert_eq!(
        types(&events)
            .iter()
            .filter(|t| t.starts_with("response.completed"))
            .count(),
        0
    );
}

async fn lot_remaining(gw: &Gateway, email: &str, lot_id: &str) -> u64 {
    let lots = lots::lots_of(gw, email).await;
    lots.iter().find(|l| l.id == lot_id).unwrap().remaining
}

/// The tokens charged to the account for translated answers are the provider's reported usage,
/// exactly as for native ones.
#[tokio::test]
async fn translated_paths_charge_the_provider_usage() {
    let mock = Mock::start(&["--chunks", "3"]);
    let extra = "\n[quota.tiers.beginner]\nweekly_tokens = 10\nrequests_per_minute = 600\n";
    let gw = Gateway::start(&mock, options(&mock, extra));
    let email = "charged@example.com";
    let key = gw.user_with_key(email, &[]);
    let lot = lots::grant_lot(&gw, email, "token", 100_000, &["--days", "5"]);
    let lot_id = lot["id"].as_str().unwrap();

    let plain = |model: &str| json!({"model": model, "input": "hi", "max_output_tokens": 50});
    let stream = |model: &str| json!({"model": model, "input": "hi", "stream": true});
    let messages = json!({"model": "mock-gpt", "max_tokens": 50, "stream": true,
                          "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]});
    let calls: Vec<(&str, Value, u64)> = vec![
        ("/v1/responses", plain("claude-mock"), 30 + 24),
        ("/v1/responses", stream("claude-mock"), 30 + 24),
        ("/v1/responses", plain("gpt-chat-only"), 25 + 24),
        ("/v1/responses", stream("gpt-chat-only"), 25 + 24),
        ("/v1/messages", messages, 25 + 24),
    ];
    let mut charged = 0;
    for (n, (path, body, cost)) in calls.into_iter().enumerate() {
        let r = post(&gw, path, &key, &body).await;
        assert_eq!(r.status(), 200, "{path} {body}");
        let _ = r.bytes().await.unwrap();
        gw.wait_usage(n + 1).await;
        charged += cost;
        // The first 10 tokens come from the weekly allowance, the rest from the lot.
        let left = lot_remaining(&gw, email, lot_id).await;
        assert_eq!(left, 100_000 - (charged - 10), "{path} {body}");
    }
}

/// A recorded first request of a real agent, with its model replaced.
fn fixture(name: &str, model: &str, stream: bool) -> Value {
    let path = format!(
        "{}/tests/fixtures/agents/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut v: Value = serde_json::from_str(&text).expect("fixture JSON");
    v["model"] = json!(model);
    v["stream"] = json!(stream);
    v
}

/// The agents' real first requests (Claude Code: messages with its tools, system prompt and a
/// mid-conversation system turn; Codex: Responses with its tools, developer items and
/// reasoning), replayed on every kind of model, whole and streamed: none is refused, each gets
/// a well-formed answer in its own API, and each is settled with the provider's usage.
#[tokio::test]
async fn real_agent_requests_on_every_kind_of_model() {
    let mock = Mock::start(&["--chunks", "3"]);
    let gw = Gateway::start(&mock, options(&mock, ""));
    let key = gw.user_with_key("agents@example.com", &[]);
    // Claude Code's keyless probe of its base URL.
    for base in ["/alt", "/v1"] {
        let r = client().head(gw.url(base)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{base}");
    }
    let mut served = 0;
    // Models without output limits: the agents ask for up to 32000 tokens.
    for model in ["claude-big", "mock-big", "gpt-chat-only"] {
        for stream in [false, true] {
            // Claude Code.
            let body = fixture("claude-code-messages.json", model, stream);
            let r = post(&gw, "/alt/v1/messages", &key, &body).await;
            assert_eq!(r.status(), 200, "claude-code on {model}, stream {stream}");
            let text = r.text().await.unwrap();
            if stream {
                assert!(
                    text.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"),
                    "{text}"
                );
            } else {
                let v: Value = serde_json::from_str(&text).unwrap();
                assert_eq!(v["type"], "message", "{v}");
                assert!(v["content"][0]["text"].is_string(), "{v}");
            }
            let (path, sent) = last_upstream(&mock).await;
            if model == "claude-big" {
                assert_eq!((path.as_str(), &sent), ("/v1/messages", &body));
            } else {
                assert_eq!(path, "/v1/chat/completions");
                let roles: Vec<&str> = sent["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| m["role"].as_str().unwrap())
                    .collect();
                assert_eq!(roles, ["system", "user", "system"], "{model}");
                assert_eq!(
                    sent["tools"].as_array().unwrap().len(),
                    body["tools"].as_array().unwrap().len()
                );
            }

            // Codex.
            let body = fixture("codex-responses.json", model, stream);
            let r = post(&gw, "/v1/responses", &key, &body).await;
            assert_eq!(r.status(), 200, "codex on {model}, stream {stream}");
            let text = r.text().await.unwrap();
            let done = if stream {
                let events = responses_events(&text);
                let last = events.last().unwrap().clone();
                assert_eq!(last["type"], "response.completed", "{text}");
                last["response"].clone()
            } else {
                serde_json::from_str(&text).unwrap()
            };
            assert_eq!(done["status"], "completed", "{done}");
            assert_eq!(done["output"][0]["type"], "message", "{done}");
            assert_eq!(done["usage"]["input_tokens_details"]["cached_tokens"], 5);
            let (path, sent) = last_upstream(&mock).await;
            match model {
                "claude-big" => {
                    assert_eq!(path, "/v1/messages");
                    assert!(sent["system"].as_str().unwrap().len() > 100, "{sent}");
                    let names: Vec<&str> = sent["tools"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|t| t["name"].as_str().unwrap())
                        .collect();
                    assert!(names.contains(&"exec_command"), "{names:?}");
                }
                "mock-big" => assert_eq!((path.as_str(), &sent), ("/v1/responses", &body)),
                _ => {
                    assert_eq!(path, "/v1/chat/completions");
                    assert_eq!(sent["messages"][0]["role"], "system");
                }
            }
            served += 2;
        }
    }
    let events = gw.wait_usage(served).await;
    assert_eq!(events.len(), served);
    for e in &events {
        assert_eq!(e["status"], 200, "{e}");
        assert_eq!(e["settlement"], "provider:complete", "{e}");
        assert_eq!(e["output_tokens"], 24, "{e}");
    }
}
