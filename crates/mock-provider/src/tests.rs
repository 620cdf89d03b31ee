//! Unit tests of the mock's answers, faults and parsing.
use bytes::Bytes;
use http::header::HeaderValue;
use http::StatusCode;
use serde_json::{json, Value};

use crate::anthropic::messages_stream;
use crate::body::Step;
use crate::endpoints::{embedding_inputs, AUDIO, AUDIO_BYTES};
use crate::faults::{forced_status, select_behaviour, Behaviour, Failure, MIDSTREAM_ERROR_AFTER};
use crate::openai::{chat_stream, responses_stream};
use crate::recording::header_map;
use crate::render::assemble;
use crate::reply::{sse_data, sse_event};
use crate::request::{ends_with_tool_result, RequestInfo, Route};

fn data_of(steps: &[Step]) -> Vec<String> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Data(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Step::Abort => None,
        })
        .collect()
}

/// Every SSE event must carry valid JSON in its data line.
fn assert_events_are_json(events: &[String]) {
    for ev in events {
        assert!(ev.ends_with("\n\n"), "event not terminated: {ev:?}");
        let data = ev
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .expect("event has a data line");
        if data != "[DONE]" {
            serde_json::from_str::<Value>(data).expect("data is JSON");
        }
    }
}

fn request(json: &str) -> RequestInfo {
    RequestInfo::parse(json.as_bytes())
}

#[test]
fn sse_formatting() {
    assert_eq!(sse_data("{}"), Bytes::from_static(b"data: {}\n\n"));
    assert_eq!(
        sse_event("ping", "{\"type\":\"ping\"}"),
        Bytes::from_static(b"event: ping\ndata: {\"type\":\"ping\"}\n\n")
    );
}

#[test]
fn behaviour_from_model_name() {
    assert_eq!(select_behaviour("mock-gpt", None), Behaviour::default());
    let b = select_behaviour("slow-cut-nousage", None);
    assert!(b.slow && b.cut && b.no_usage && !b.tools && b.failure.is_none());
    assert_eq!(
        select_behaviour("x-fail429", None).failure,
        Some(Failure::RateLimited)
    );
    assert_eq!(
        select_behaviour("fail400-fail500", None).failure,
        Some(Failure::Server)
    );
    let forced = StatusCode::SERVICE_UNAVAILABLE;
    assert_eq!(
        select_behaviour("fail400", Some(forced)).failure,
        Some(Failure::Status(forced))
    );
}

#[test]
fn forced_status_header() {
    let mut headers = http::HeaderMap::new();
    assert_eq!(forced_status(&headers), None);
    headers.insert("x-mock-status", HeaderValue::from_static(" 503"));
    assert_eq!(
        forced_status(&headers),
        Some(StatusCode::SERVICE_UNAVAILABLE)
    );
    headers.insert("x-mock-status", HeaderValue::from_static("100"));
    assert_eq!(forced_status(&headers), None);
    headers.insert("x-mock-status", HeaderValue::from_static("abc"));
    assert_eq!(forced_status(&headers), None);
}

#[test]
fn routes_with_and_without_v1() {
    assert_eq!(
        Route::from_path("/v1/chat/completions"),
        Route::ChatCompletions
    );
    assert_eq!(
        Route::from_path("/chat/completions"),
        Route::ChatCompletions
    );
    assert_eq!(Route::from_path("/messages"), Route::Messages);
    assert_eq!(
        Route::from_path("/v1/messages/count_tokens"),
        Route::CountTokens
    );
    assert_eq!(Route::from_path("/__mock/stats"), Route::MockStats);
    assert_eq!(Route::from_path("/v1/traces"), Route::Traces);
    assert!(Route::Traces.is_control() && !Route::Traces.counts_as_served());
    assert_eq!(Route::from_path("/v2/other"), Route::NotFound);
    assert!(!Route::Health.counts_as_served());
    assert!(Route::NotFound.counts_as_served());
}

#[test]
fn request_info_is_lenient() {
    let info = request("not json at all");
    assert_eq!(info.model(), "mock-model");
    assert!(!info.streaming());
    let info = request(
        r#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}"#,
    );
    assert_eq!(info.model(), "m");
    assert!(info.streaming() && info.include_usage());
    assert_eq!(request(r#"{"max_tokens":3}"#).delta_count(20), 3);
    assert_eq!(request(r#"{"max_tokens":0}"#).delta_count(20), 1);
    assert_eq!(request(r#"{}"#).delta_count(20), 20);
}

#[test]
fn chat_stream_normal_with_usage() {
    let info = request(r#"{"model":"m\"q","stream":true,"stream_options":{"include_usage":true}}"#);
    let steps = assemble(
        chat_stream(&info, &Behaviour::default(), 4),
        &Behaviour::default(),
    );
    let events = data_of(&steps);
    assert_events_are_json(&events);
    // 4 deltas + finish + usage + [DONE]
    assert_eq!(events.len(), 7);
    assert!(events[0].contains("\"role\":\"assistant\"") && events[0].contains("tok0 "));
    assert!(!events[1].contains("role"));
    assert!(events[4].contains("\"finish_reason\":\"stop\""));
    assert!(events[5].contains("\"choices\":[]") && events[5].contains("\"total_tokens\":49"));
    assert_eq!(events[6], "data: [DONE]\n\n");
}

#[test]
fn chat_stream_cut_and_midstream_error() {
    let info = request(r#"{"stream":true,"stream_options":{"include_usage":true}}"#);
    let cut = select_behaviour("cut", None);
    let steps = assemble(chat_stream(&info, &cut, 10), &cut);
    assert_eq!(steps.last(), Some(&Step::Abort));
    let events = data_of(&steps);
    assert_eq!(events.len(), 5);
    assert!(events
        .iter()
        .all(|e| !e.contains("[DONE]") && !e.contains("usage")));

    let err = select_behaviour("midstream-error", None);
    let events = data_of(&assemble(chat_stream(&info, &err, 10), &err));
    assert_events_are_json(&events);
    assert_eq!(events.len(), MIDSTREAM_ERROR_AFTER + 1);
    assert!(events[MIDSTREAM_ERROR_AFTER].contains("\"error\""));
}

#[test]
fn chat_stream_tool_call_arguments_reassemble() {
    let tools = select_behaviour("tools", None);
    let events = data_of(&assemble(chat_stream(&request("{}"), &tools, 20), &tools));
    assert_events_are_json(&events);
    let mut args = String::new();
    for ev in &events[1..4] {
        let v: Value = serde_json::from_str(&ev["data: ".len()..]).expect("json");
        args.push_str(
            v["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .expect("arguments"),
        );
    }
    assert_eq!(args, r#"{"city":"Paris"}"#);
    assert!(events[4].contains("\"finish_reason\":\"tool_calls\""));
}

#[test]
fn anthropic_stream_shape() {
    let b = Behaviour::default();
    let events = data_of(&assemble(messages_stream(&request("{}"), &b, 3), &b));
    assert_events_are_json(&events);
    let names: Vec<&str> = events
        .iter()
        .map(|e| {
            e.lines()
                .next()
                .and_then(|l| l.strip_prefix("event: "))
                .unwrap_or("")
        })
        .collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert!(events[7].contains("\"output_tokens\":24"));
    // Cumulative usage in `message_delta`, input and cache reads included.
    assert!(events[7].contains("\"input_tokens\":25"));
    assert!(events[7].contains("\"cache_read_input_tokens\":5"));
    assert!(events[0].contains("\"cache_read_input_tokens\":5"));
}

#[test]
fn anthropic_stream_nousage_and_tools() {
    let b = select_behaviour("tools-nousage", None);
    let events = data_of(&assemble(messages_stream(&request("{}"), &b, 3), &b));
    assert_events_are_json(&events);
    assert!(events.iter().all(|e| !e.contains("usage")));
    assert!(events.iter().any(|e| e.contains("input_json_delta")));
    assert!(events
        .iter()
        .any(|e| e.contains("\"stop_reason\":\"tool_use\"")));
}

#[test]
fn responses_stream_sequence_numbers() {
    let b = Behaviour::default();
    let events = data_of(&assemble(responses_stream(&request("{}"), &b, 5), &b));
    assert_events_are_json(&events);
    for (i, ev) in events.iter().enumerate() {
        let v: Value =
            serde_json::from_str(ev.lines().nth(1).unwrap_or("")["data: ".len()..].trim())
                .expect("json");
        assert_eq!(v["sequence_number"], json!(i));
    }
    let last = events.last().expect("events");
    assert!(last.starts_with("event: response.completed"));
    assert!(last.contains("\"cached_tokens\":5"));

    let err = select_behaviour("midstream-error", None);
    let events = data_of(&assemble(responses_stream(&request("{}"), &err, 5), &err));
    let v: Value =
        serde_json::from_str(&events.last().expect("events").lines().nth(1).unwrap_or("")[6..])
            .expect("json");
    assert_eq!(v["sequence_number"], json!(events.len() - 1));
}

/// The event names of a stream, in order.
fn event_names(events: &[String]) -> Vec<&str> {
    events
        .iter()
        .map(|e| {
            e.lines()
                .next()
                .and_then(|l| l.strip_prefix("event: "))
                .unwrap_or("")
        })
        .collect()
}

fn event_json(event: &str) -> Value {
    let data = event
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .expect("data line");
    serde_json::from_str(data).expect("json")
}

#[test]
fn responses_stream_tool_call() {
    let b = select_behaviour("tools", None);
    let events = data_of(&assemble(responses_stream(&request("{}"), &b, 5), &b));
    assert_events_are_json(&events);
    assert_eq!(
        event_names(&events),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let values: Vec<Value> = events.iter().map(|e| event_json(e)).collect();
    for (i, v) in values.iter().enumerate() {
        assert_eq!(v["sequence_number"], json!(i));
    }
    let args: String = values[3..6]
        .iter()
        .map(|v| v["delta"].as_str().expect("delta"))
        .collect();
    assert_eq!(args, r#"{"city":"Paris"}"#);
    assert_eq!(values[6]["arguments"], json!(args));
    let output = &values[8]["response"]["output"];
    let id = output[0]["id"].as_str().expect("an item id").to_string();
    assert!(id.starts_with("fc_mock_"), "{id}");
    assert_eq!(
        values[2]["item"]["id"],
        json!(id),
        "announced with the same id"
    );
    assert_eq!(
        output,
        &json!([{ "type": "function_call", "id": id, "call_id": "call_mock",
                  "name": "get_weather", "arguments": args, "status": "completed" }])
    );
    assert_eq!(values[8]["response"]["usage"]["output_tokens"], json!(24));
}

#[test]
fn tool_loop_ends_at_the_tool_result() {
    let ends = |route, body: Value| ends_with_tool_result(route, body.to_string().as_bytes());
    let chat =
        |last: Value| json!({ "messages": [{ "role": "user", "content": "weather?" }, last] });
    assert!(ends(
        Route::ChatCompletions,
        chat(json!({ "role": "tool", "tool_call_id": "call_mock", "content": "sunny" }))
    ));
    assert!(!ends(
        Route::ChatCompletions,
        chat(json!({ "role": "user", "content": "and Rome?" }))
    ));
    let result = json!({ "type": "tool_result", "tool_use_id": "toolu_mock", "content": "sunny" });
    let text = json!({ "type": "text", "text": "and Rome?" });
    let user = |content: Value| json!({ "messages": [{ "role": "user", "content": content }] });
    assert!(ends(Route::Messages, user(json!([result.clone()]))));
    // A new question after the result starts another round.
    assert!(!ends(Route::Messages, user(json!([result, text]))));
    assert!(!ends(Route::Messages, user(json!("weather?"))));
    let input = |last: Value| json!({ "input": [{ "role": "user", "content": "weather?" }, last] });
    assert!(ends(
        Route::Responses,
        input(json!({ "type": "function_call_output", "call_id": "call_mock", "output": "sunny" }))
    ));
    assert!(!ends(
        Route::Responses,
        input(
            json!({ "type": "function_call", "call_id": "call_mock", "name": "get_weather",
                      "arguments": "{}" })
        )
    ));
    assert!(!ends(Route::Responses, json!({ "input": "weather?" })));
    // Bodies that are not JSON, or odd shapes, are no tool result.
    assert!(!ends_with_tool_result(Route::ChatCompletions, b"not json"));
    assert!(!ends(Route::ChatCompletions, json!({ "messages": "x" })));
}

/// Each Responses answer has ids of its own, the same in every event of a stream.
#[test]
fn responses_answers_have_their_own_ids() {
    let b = Behaviour::default();
    let ids = |events: &[String]| -> Vec<String> {
        let mut out = Vec::new();
        for ev in events {
            let v: Value =
                serde_json::from_str(&ev.lines().nth(1).unwrap_or("")[6..]).expect("json");
            for id in [&v["response"]["id"], &v["item"]["id"], &v["item_id"]] {
                if let Some(id) = id.as_str() {
                    if !out.iter().any(|o| o == id) {
                        out.push(id.to_string());
                    }
                }
            }
        }
        out
    };
    let first = ids(&data_of(&assemble(
        responses_stream(&request("{}"), &b, 3),
        &b,
    )));
    let second = ids(&data_of(&assemble(
        responses_stream(&request("{}"), &b, 3),
        &b,
    )));
    assert_eq!(first.len(), 2, "{first:?}");
    assert!(first[0].starts_with("resp_mock_") && first[1].starts_with("msg_mock_"));
    assert!(
        first.iter().all(|id| !second.contains(id)),
        "{first:?} {second:?}"
    );
}

/// `think` models open with a signed thinking block, whole and streamed.
#[test]
fn thinking_comes_first_with_its_signature() {
    let b = select_behaviour("claude-think-tools", None);
    assert!(b.thinking && b.tools);
    let whole = crate::anthropic::anthropic_message("m", &b);
    let kinds: Vec<&str> = whole["content"]
        .as_array()
        .expect("content")
        .iter()
        .filter_map(|c| c["type"].as_str())
        .collect();
    assert_eq!(kinds, ["thinking", "text", "tool_use"]);
    assert_eq!(whole["content"][0]["signature"], "sig-mock");
    let events = data_of(&assemble(messages_stream(&request("{}"), &b, 3), &b));
    assert_events_are_json(&events);
    let starts: Vec<Value> = events
        .iter()
        .filter(|e| e.starts_with("event: content_block_start"))
        .map(|e| serde_json::from_str(&e.lines().nth(1).unwrap_or("")[6..]).expect("json"))
        .collect();
    let blocks: Vec<(u64, &str)> = starts
        .iter()
        .map(|s| {
            (
                s["index"].as_u64().unwrap_or(9),
                s["content_block"]["type"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(blocks, [(0, "thinking"), (1, "text"), (2, "tool_use")]);
    assert!(events
        .iter()
        .any(|e| e.contains("\"signature\":\"sig-mock\"")));
    let tool_deltas = events
        .iter()
        .filter(|e| e.contains("input_json_delta"))
        .map(|e| serde_json::from_str::<Value>(&e.lines().nth(1).unwrap_or("")[6..]).expect("json"))
        .filter(|v| v["index"] == 2)
        .count();
    assert_eq!(tool_deltas, 3);
}

#[test]
fn embedding_input_counting() {
    assert_eq!(embedding_inputs(None), 1);
    assert_eq!(embedding_inputs(Some(&json!("hi"))), 1);
    assert_eq!(embedding_inputs(Some(&json!(["a", "b", "c"]))), 3);
    assert_eq!(embedding_inputs(Some(&json!([1, 2, 3]))), 1);
    assert_eq!(embedding_inputs(Some(&json!([[1, 2], [3]]))), 2);
    assert_eq!(embedding_inputs(Some(&json!([]))), 0);
}

#[test]
fn audio_is_deterministic_and_sized() {
    assert_eq!(AUDIO.len(), AUDIO_BYTES);
    assert!(AUDIO.starts_with(b"ID3"));
}

#[test]
fn header_map_lowercases_and_joins() {
    let mut headers = http::HeaderMap::new();
    headers.append("X-Thing", HeaderValue::from_static("a"));
    headers.append("x-thing", HeaderValue::from_static("b"));
    let map = header_map(&headers);
    assert_eq!(map.get("x-thing").map(String::as_str), Some("a, b"));
}
