//! Unit tests of shaping: crossings, shapers and the bytes the client gets.
use super::*;
use gateway_core::domain::ProviderStyle;

fn client(endpoint: Endpoint, wants_usage: bool) -> ClientSide<'static> {
    ClientSide {
        endpoint,
        model: "client-model",
        wants_usage,
        style_b: endpoint == Endpoint::Messages,
        keep_items: endpoint == Endpoint::Responses,
    }
}

fn anthropic_stream() -> String {
    [
        r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"usage":{"input_tokens":25,"output_tokens":1,"cache_read_input_tokens":5}}}"#,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        r#"{"type":"ping"}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hé"}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"llo"}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":24}}"#,
        r#"{"type":"message_stop"}"#,
    ]
    .iter()
    .map(|d| {
        let v: Value = serde_json::from_str(d).unwrap();
        format!("event: {}\r\ndata: {d}\r\n\r\n", v["type"].as_str().unwrap())
    })
    .collect::<Vec<_>>()
    .join(": keep-alive\n\n")
}

fn openai_stream() -> String {
    [
        r#"{"id":"c1","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}"#,
        r#"{"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\""}}]},"finish_reason":null}]}"#,
        r#"{"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]},"finish_reason":null}]}"#,
        r#"{"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
        r#"{"id":"c1","choices":[],"usage":{"prompt_tokens":25,"completion_tokens":24,"prompt_tokens_details":{"cached_tokens":5}}}"#,
        "[DONE]",
    ]
    .iter()
    .map(|d| format!("data: {d}\n\n"))
    .collect()
}

/// Feeds `input` in pieces of `step` bytes, then ends with `reason`.
fn run(
    crossing: Crossing,
    client: ClientSide<'_>,
    input: &str,
    step: usize,
    reason: Reason,
) -> (String, Option<gateway_core::domain::Usage>) {
    let mut shaper = Shaper::new(crossing, client, 200, Some("text/event-stream"));
    let mut tracker = shaper.tracker();
    let mut out = Vec::new();
    for piece in input.as_bytes().chunks(step) {
        let b = shaper.feed(Bytes::copy_from_slice(piece), tracker.as_mut());
        out.extend_from_slice(&b);
    }
    out.extend_from_slice(&shaper.end(reason, tracker.as_mut()));
    let usage = tracker.and_then(|t| t.usage());
    (String::from_utf8(out).unwrap(), usage)
}

/// Frames with the per-stream `created` timestamp removed, for comparing runs.
fn normalized(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter(|f| !f.is_empty())
        .map(|f| {
            let data = f.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
            let mut v: Value = serde_json::from_str(data).unwrap_or(json!(data));
            if let Some(o) = v.as_object_mut() {
                o.remove("created");
            }
            v
        })
        .collect()
}

use serde_json::json;

/// A provider of `style` (only the style and `serves_responses` matter to crossings).
fn provider(style: ProviderStyle, serves_responses: bool) -> Provider {
    let toml =
        "[[providers]]\nname = \"p\"\nstyle = \"openai\"\nbase_url = \"http://127.0.0.1:9\"\n";
    let cfg = gateway_core::config::Config::from_str(std::path::Path::new("t.toml"), toml).unwrap();
    let mut p = (*cfg.providers["p"]).clone();
    p.style = style;
    p.serves_responses = serves_responses;
    p
}

#[test]
fn crossings() {
    use Crossing::*;
    use ProviderStyle::*;
    let cases = [
        (
            Endpoint::ChatCompletions,
            Anthropic,
            true,
            Some(ChatToMessages),
        ),
        (Endpoint::ChatCompletions, OpenAi, true, Some(Native)),
        (Endpoint::Messages, OpenAi, true, Some(MessagesToChat)),
        (Endpoint::Messages, Anthropic, false, Some(Native)),
        (Endpoint::CountTokens, Anthropic, false, Some(Native)),
        (Endpoint::CountTokens, OpenAi, true, None),
        (
            Endpoint::Responses,
            Anthropic,
            false,
            Some(ResponsesToMessages),
        ),
        (Endpoint::Responses, OpenAi, true, Some(Native)),
        (Endpoint::Responses, OpenAi, false, Some(ResponsesToChat)),
        (Endpoint::Embeddings, Anthropic, false, None),
        (Endpoint::Search, Anthropic, false, Some(Native)),
        // The clouds speak one of the protocols (Gemini its own), never serve the tools, and
        // count no tokens (the gateway counts for them).
        (Endpoint::ChatCompletions, Azure, false, Some(Native)),
        (Endpoint::Messages, Azure, false, Some(MessagesToChat)),
        (Endpoint::Responses, Azure, false, Some(ResponsesToChat)),
        (Endpoint::Embeddings, Azure, false, Some(Native)),
        (Endpoint::Search, Azure, false, None),
        (Endpoint::Messages, Bedrock, false, Some(Native)),
        (
            Endpoint::ChatCompletions,
            Bedrock,
            false,
            Some(ChatToMessages),
        ),
        (Endpoint::CountTokens, Bedrock, false, None),
        (Endpoint::Messages, VertexAnthropic, false, Some(Native)),
        (
            Endpoint::Responses,
            VertexAnthropic,
            false,
            Some(ResponsesToMessages),
        ),
        (Endpoint::WebFetch, VertexAnthropic, false, None),
        (Endpoint::ChatCompletions, Gemini, false, Some(ChatToGemini)),
        (Endpoint::Messages, Gemini, false, Some(MessagesToGemini)),
        (Endpoint::Responses, Gemini, false, Some(ResponsesToGemini)),
        (Endpoint::Embeddings, Gemini, false, None),
        (Endpoint::CountTokens, Gemini, false, None),
    ];
    for (endpoint, style, responses, want) in cases {
        assert_eq!(
            Crossing::of(endpoint, &provider(style, responses)),
            want,
            "{endpoint:?} {style:?} {responses}"
        );
    }
    assert_eq!(
        ResponsesToMessages.provider_endpoint(Endpoint::Responses),
        Endpoint::Messages
    );
    assert_eq!(
        ResponsesToChat.provider_endpoint(Endpoint::Responses),
        Endpoint::ChatCompletions
    );
    assert_eq!(
        ChatToMessages.provider_endpoint(Endpoint::ChatCompletions),
        Endpoint::Messages
    );
    assert_eq!(
        MessagesToChat.provider_endpoint(Endpoint::Messages),
        Endpoint::ChatCompletions
    );
}

#[test]
fn translated_stream_ignores_chunk_boundaries_and_bills_the_provider_usage() {
    let input = anthropic_stream();
    let chat = client(Endpoint::ChatCompletions, true);
    let (whole, usage) = run(
        Crossing::ChatToMessages,
        chat,
        &input,
        input.len(),
        Reason::Complete,
    );
    let (bytewise, usage_bytewise) =
        run(Crossing::ChatToMessages, chat, &input, 1, Reason::Complete);
    assert_eq!(normalized(&whole), normalized(&bytewise));
    assert_eq!(usage, usage_bytewise);
    let u = usage.unwrap();
    assert_eq!(
        (u.input_tokens, u.output_tokens, u.cached_tokens),
        (30, 24, 5)
    );
    let frames = normalized(&whole);
    assert_eq!(frames.len(), 6, "{whole}");
    assert_eq!(frames[1]["choices"][0]["delta"]["content"], "Hé");
    assert_eq!(frames[4]["usage"]["prompt_tokens"], 30);
    assert_eq!(frames[5], json!("[DONE]"));

    let input = openai_stream();
    let messages = client(Endpoint::Messages, false);
    let (whole, usage) = run(
        Crossing::MessagesToChat,
        messages,
        &input,
        input.len(),
        Reason::Complete,
    );
    let (bytewise, _) = run(
        Crossing::MessagesToChat,
        messages,
        &input,
        7,
        Reason::Complete,
    );
    assert_eq!(whole, bytewise);
    let u = usage.unwrap();
    assert_eq!(
        (u.input_tokens, u.output_tokens, u.cached_tokens),
        (25, 24, 5)
    );
    let types: Vec<String> = normalized(&whole)
        .iter()
        .map(|v| v["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        types,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
}

#[test]
fn cut_streams_tell_the_client_once() {
    // Cut after the second delta: an OpenAI client gets the error frame, then [DONE].
    let input = anthropic_stream();
    let cut_at = input.find("\"llo\"").unwrap();
    let chat = client(Endpoint::ChatCompletions, false);
    let (text, _) = run(
        Crossing::ChatToMessages,
        chat,
        &input[..cut_at],
        64,
        Reason::UpstreamError,
    );
    let frames = normalized(&text);
    let n = frames.len();
    assert_eq!(frames[n - 2]["error"]["code"], "upstream_error", "{text}");
    assert_eq!(frames[n - 1], json!("[DONE]"));
    assert!(frames[..n - 2]
        .iter()
        .all(|f| f["choices"][0]["finish_reason"].is_null()));

    // A stream the provider had finished gets nothing more, even if the connection then fails.
    let (text, _) = run(
        Crossing::ChatToMessages,
        chat,
        &input,
        64,
        Reason::UpstreamError,
    );
    assert!(!text.contains("upstream_error"), "{text}");
    assert_eq!(text.matches("[DONE]").count(), 1);

    // An Anthropic client gets an error event and nothing after it.
    let input = openai_stream();
    let cut_at = input.find("[DONE]").unwrap() - 6;
    let messages = client(Endpoint::Messages, false);
    let (text, _) = run(
        Crossing::MessagesToChat,
        messages,
        &input[..cut_at],
        64,
        Reason::UpstreamError,
    );
    // Usage came with the usage chunk: the message is complete before the cut.
    assert!(
        text.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"),
        "{text}"
    );
    let cut_at = input.find("\"finish_reason\":\"tool_calls\"").unwrap();
    let (text, _) = run(
        Crossing::MessagesToChat,
        messages,
        &input[..cut_at],
        64,
        Reason::UpstreamError,
    );
    let last = normalized(&text).pop().unwrap();
    assert_eq!(
        last,
        json!({"type": "error", "error": {"type": "api_error", "message": "The upstream stream was interrupted."}})
    );
}

#[test]
fn passthrough_drops_only_the_unrequested_usage_chunk() {
    let input = openai_stream();
    let native = client(Endpoint::ChatCompletions, false);
    let (text, usage) = run(Crossing::Native, native, &input, 5, Reason::Complete);
    assert!(!text.contains("\"usage\""), "{text}");
    assert_eq!(
        text,
        input.replace(
            &input[input.find("data: {\"id\":\"c1\",\"choices\":[],").unwrap()
                ..input.find("data: [DONE]").unwrap()],
            ""
        )
    );
    assert_eq!(usage.unwrap().output_tokens, 24);
    let wants = client(Endpoint::ChatCompletions, true);
    let (text, _) = run(Crossing::Native, wants, &input, 5, Reason::Complete);
    assert_eq!(text, input);
    // A last event without its blank line still reaches the client.
    let unterminated = input.trim_end();
    let (text, _) = run(Crossing::Native, native, unterminated, 5, Reason::Complete);
    assert!(text.ends_with("data: [DONE]"), "{text}");
}

#[test]
fn held_answers_are_translated_whole() {
    let chat = client(Endpoint::ChatCompletions, false);
    let body = br#"{"id":"msg_1","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":2}}"#;
    let mut s = Shaper::new(
        Crossing::ChatToMessages,
        chat,
        200,
        Some("application/json"),
    );
    assert!(s.holds_header() && s.tracker().is_none());
    for piece in body.chunks(10) {
        assert!(s.feed(Bytes::copy_from_slice(piece), None).is_empty());
    }
    let (status, out) = s.whole(Reason::Complete);
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(status, 200);
    assert_eq!(v["choices"][0]["message"]["content"], "Hi");
    assert_eq!(v["model"], "client-model");
    assert_eq!(s.provider_body(), Some(&body[..]));
    assert_eq!(s.content_type(), Some(respond::JSON));
    // The same answer cut short is a 502 in the client's shape.
    let (status, out) = s.whole(Reason::UpstreamError);
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (502, Some("api_error"))
    );

    // Errors keep the provider's status; a streamed request's error is held too.
    let messages = client(Endpoint::Messages, false);
    let mut s = Shaper::new(
        Crossing::MessagesToChat,
        messages,
        429,
        Some("text/event-stream"),
    );
    assert!(s.holds_header());
    s.feed(
        Bytes::from_static(
            br#"{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}"#,
        ),
        None,
    );
    let (status, out) = s.whole(Reason::Complete);
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(status, 429);
    assert_eq!(
        v,
        json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}})
    );
    assert_eq!(s.provider_body(), None);

    // Content types in any case: an SSE answer is shaped by event, a JSON one is kept to
    // read its usage.
    let chat = client(Endpoint::ChatCompletions, true);
    let s = Shaper::new(Crossing::Native, chat, 200, Some("Text/Event-Stream"));
    assert!(s.tracker().is_some());
    for json in [
        "application/json",
        "Application/JSON; charset=utf-8",
        "x/y+Json",
    ] {
        let mut s = Shaper::new(Crossing::Native, chat, 200, Some(json));
        s.feed(Bytes::from_static(b"{}"), None);
        assert_eq!(s.provider_body(), Some(&b"{}"[..]), "{json}");
    }
    for other in ["text/plain", "text/event", "js", ""] {
        let mut s = Shaper::new(Crossing::Native, chat, 200, Some(other));
        s.feed(Bytes::from_static(b"{}"), None);
        assert_eq!(s.provider_body(), None, "{other}");
        assert!(s.tracker().is_none(), "{other}");
    }

    // A same-style error is held too (the caller masks the credential in it) and handed
    // back as it came; cut short, it becomes a 502 in the client's own shape.
    for (endpoint, ct) in [
        (Endpoint::ChatCompletions, "text/event-stream"),
        (Endpoint::Messages, "application/json"),
    ] {
        let native = client(endpoint, false);
        let mut s = Shaper::new(Crossing::Native, native, 429, Some(ct));
        assert!(s.holds_header() && s.tracker().is_none());
        let body = br#"{"error":{"message":"slow down"}}"#;
        for piece in body.chunks(5) {
            assert!(s.feed(Bytes::copy_from_slice(piece), None).is_empty());
        }
        assert_eq!(s.whole(Reason::Complete), (429, Bytes::from_static(body)));
        assert_eq!(s.content_type(), None, "the provider's content type stays");
        let (status, out) = s.whole(Reason::UpstreamError);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(status, 502);
        assert_eq!(v["type"] == "error", endpoint == Endpoint::Messages, "{v}");
    }

    // A success that is not JSON cannot be translated.
    let mut s = Shaper::new(Crossing::MessagesToChat, messages, 200, Some("text/html"));
    s.feed(Bytes::from_static(b"<html>oops</html>"), None);
    let (status, out) = s.whole(Reason::Complete);
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(status, 502);
    assert_eq!(v["error"]["message"], "<html>oops</html>");
}

/// A translated Responses answer hands its output items over to be kept, whole or streamed,
/// exactly as the client received them; with `store: false` (no keeping) it hands none.
#[test]
fn translated_responses_answers_hand_over_their_items() {
    let body = br#"{"id":"msg_1","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":2}}"#;
    for keep in [true, false] {
        let mut responses = client(Endpoint::Responses, false);
        responses.keep_items = keep;
        let mut s = Shaper::new(
            Crossing::ResponsesToMessages,
            responses,
            200,
            Some("application/json"),
        );
        s.feed(Bytes::from_static(body), None);
        let (status, out) = s.whole(Reason::Complete);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(status, 200);
        let issued = s.take_issued();
        if !keep {
            assert!(issued.is_empty());
            continue;
        }
        assert_eq!(issued.ids.len(), 1);
        assert_eq!(issued.ids[0].id, v["output"][0]["id"].as_str().unwrap());
        let kept: Value = serde_json::from_str(issued.ids[0].item.as_deref().unwrap()).unwrap();
        assert_eq!(kept, v["output"][0]);
    }

    let responses = client(Endpoint::Responses, false);
    let mut shaper = Shaper::new(
        Crossing::ResponsesToChat,
        responses,
        200,
        Some("text/event-stream"),
    );
    let mut tracker = shaper.tracker();
    let mut out = shaper
        .feed(Bytes::from(openai_stream()), tracker.as_mut())
        .to_vec();
    out.extend_from_slice(&shaper.end(Reason::Complete, tracker.as_mut()));
    let text = String::from_utf8(out).unwrap();
    let done = normalized(&text).pop().unwrap();
    assert_eq!(done["type"], "response.completed", "{text}");
    let issued = shaper.take_issued();
    let kept: Vec<Value> = issued
        .ids
        .iter()
        .map(|i| serde_json::from_str(i.item.as_deref().unwrap()).unwrap())
        .collect();
    assert_eq!(Value::Array(kept), done["response"]["output"]);
    assert_eq!(issued.ids.len(), 2, "the message and the call");
}

/// A Gemini stream reaches a Responses client through chat chunks: the response completes,
/// its output items are handed over for the registry, and the usage is read from Gemini's own
/// events.
#[test]
fn gemini_streams_reach_responses_clients_with_their_items_and_usage() {
    let stream = concat!(
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Hal\"}],\"role\":\"model\"},\"index\":0}],",
        "\"usageMetadata\":{\"promptTokenCount\":40,\"totalTokenCount\":40},\"responseId\":\"r1\"}\r\n\r\n",
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"lo\"}],\"role\":\"model\"},",
        "\"finishReason\":\"STOP\",\"index\":0}],\"usageMetadata\":{\"promptTokenCount\":40,",
        "\"candidatesTokenCount\":3,\"thoughtsTokenCount\":7,\"cachedContentTokenCount\":32,",
        "\"totalTokenCount\":50},\"responseId\":\"r1\"}\r\n\r\n",
    );
    for step in [1, 5, stream.len()] {
        let responses = client(Endpoint::Responses, false);
        let mut shaper = Shaper::new(
            Crossing::ResponsesToGemini,
            responses,
            200,
            Some("text/event-stream"),
        );
        let mut tracker = shaper.tracker();
        let mut out = Vec::new();
        for piece in stream.as_bytes().chunks(step) {
            out.extend_from_slice(&shaper.feed(Bytes::copy_from_slice(piece), tracker.as_mut()));
        }
        out.extend_from_slice(&shaper.end(Reason::Complete, tracker.as_mut()));
        let text = String::from_utf8(out).unwrap();
        let done = normalized(&text).pop().unwrap();
        assert_eq!(done["type"], "response.completed", "{text}");
        assert_eq!(done["response"]["output"][0]["content"][0]["text"], "Hallo");
        assert_eq!(done["response"]["usage"]["output_tokens"], 10);
        let issued = shaper.take_issued();
        assert_eq!(issued.ids.len(), 1, "{text}");
        let usage = tracker.unwrap().usage().unwrap();
        assert_eq!(
            (
                usage.input_tokens,
                usage.output_tokens,
                usage.cached_tokens,
                usage.reasoning_tokens
            ),
            (40, 10, 32, 7)
        );
    }
}
