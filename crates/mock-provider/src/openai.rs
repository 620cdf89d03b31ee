//! OpenAI answers: chat completions and the Responses API, whole and streamed.

use bytes::Bytes;
use serde_json::{json, Value};

use crate::faults::{Behaviour, MIDSTREAM_ERROR_AFTER};
use crate::reply::{
    error_value, json_string, sse_data, sse_event, unix_secs, EventPlan, ANSWER_TEXT,
    CACHED_TOKENS, COMPLETION_TOKENS, PROMPT_TOKENS, TOOL_ARG_PARTS,
};
use crate::request::RequestInfo;

pub(crate) fn chat_usage() -> Value {
    json!({
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": COMPLETION_TOKENS,
        "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
        "prompt_tokens_details": { "cached_tokens": CACHED_TOKENS }
    })
}

pub(crate) fn tool_call_value() -> Value {
    json!({
        "id": "call_mock",
        "type": "function",
        "function": { "name": "get_weather", "arguments": TOOL_ARG_PARTS.concat() }
    })
}

pub(crate) fn chat_completion(model: &str, b: &Behaviour) -> Value {
    let (message, finish) = if b.tools {
        let message = json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [tool_call_value()]
        });
        (message, "tool_calls")
    } else {
        (
            json!({ "role": "assistant", "content": ANSWER_TEXT }),
            "stop",
        )
    };
    let mut body = json!({
        "id": "chatcmpl-mock",
        "object": "chat.completion",
        "created": unix_secs(),
        "model": model,
        "choices": [{ "index": 0, "message": message, "finish_reason": finish }]
    });
    if !b.no_usage {
        body["usage"] = chat_usage();
    }
    body
}

/// Renders `chat.completion.chunk` events; the common head is escaped once.
pub(crate) struct ChunkWriter {
    pub(crate) head: String,
}

impl ChunkWriter {
    pub(crate) fn new(model: &str) -> Self {
        let head = format!(
            "{{\"id\":\"chatcmpl-mock\",\"object\":\"chat.completion.chunk\",\"created\":{},\"model\":{}",
            unix_secs(),
            json_string(model)
        );
        ChunkWriter { head }
    }

    pub(crate) fn choice(&self, delta: &str, finish: Option<&str>) -> Bytes {
        let finish = finish.map_or_else(|| "null".to_owned(), json_string);
        sse_data(&format!(
            "{},\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}",
            self.head
        ))
    }

    pub(crate) fn usage(&self) -> Bytes {
        sse_data(&format!(
            "{},\"choices\":[],\"usage\":{}}}",
            self.head,
            chat_usage()
        ))
    }
}

pub(crate) fn chat_stream(info: &RequestInfo, b: &Behaviour, chunks: usize) -> EventPlan {
    let w = ChunkWriter::new(info.model());
    let mut plan = EventPlan::default();
    let finish = if b.tools {
        let first = json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [{
                "index": 0, "id": "call_mock", "type": "function",
                "function": { "name": "get_weather", "arguments": "" }
            }]
        });
        plan.prelude.push(w.choice(&first.to_string(), None));
        plan.deltas = TOOL_ARG_PARTS
            .iter()
            .map(|part| {
                let delta =
                    json!({ "tool_calls": [{ "index": 0, "function": { "arguments": part } }] });
                w.choice(&delta.to_string(), None)
            })
            .collect();
        "tool_calls"
    } else {
        plan.deltas = (0..info.delta_count(chunks))
            .map(|i| {
                let role = if i == 0 {
                    "\"role\":\"assistant\","
                } else {
                    ""
                };
                w.choice(&format!("{{{role}\"content\":\"tok{i} \"}}"), None)
            })
            .collect();
        "stop"
    };
    plan.epilogue.push(w.choice("{}", Some(finish)));
    if info.include_usage() && !b.no_usage {
        plan.epilogue.push(w.usage());
    }
    plan.epilogue.push(Bytes::from_static(b"data: [DONE]\n\n"));
    plan.error_event = sse_data(&error_value("overloaded", "server_error").to_string());
    plan
}

pub(crate) fn responses_usage() -> Value {
    json!({
        "input_tokens": PROMPT_TOKENS,
        "output_tokens": COMPLETION_TOKENS,
        "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
        "input_tokens_details": { "cached_tokens": CACHED_TOKENS }
    })
}

/// The ids of one Responses answer: every answer gets its own, as the real API's are unique
/// (`resp_mock_<n>`, `msg_mock_<n>`, `fc_mock_<n>`).
pub(crate) struct AnswerIds {
    pub(crate) response: String,
    pub(crate) message: String,
    pub(crate) call: String,
}

impl AnswerIds {
    pub(crate) fn next() -> AnswerIds {
        static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let n = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        AnswerIds {
            response: format!("resp_mock_{n}"),
            message: format!("msg_mock_{n}"),
            call: format!("fc_mock_{n}"),
        }
    }
}

pub(crate) fn output_message(id: &str, text: &str, status: &str) -> Value {
    json!({
        "type": "message",
        "id": id,
        "status": status,
        "role": "assistant",
        "content": [{ "type": "output_text", "text": text, "annotations": [] }]
    })
}

/// The Responses API's tool call: the same call as the chat answer's, as a `function_call`
/// output item.
pub(crate) fn function_call_item(id: &str, arguments: &str, status: &str) -> Value {
    json!({
        "type": "function_call",
        "id": id,
        "call_id": "call_mock",
        "name": "get_weather",
        "arguments": arguments,
        "status": status
    })
}

pub(crate) fn response_object(
    id: &str,
    model: &str,
    status: &str,
    output: Vec<Value>,
    usage: bool,
) -> Value {
    let mut body = json!({
        "id": id,
        "object": "response",
        "created_at": unix_secs(),
        "status": status,
        "model": model,
        "output": output
    });
    if usage {
        body["usage"] = responses_usage();
    }
    body
}

/// Builds Responses API events, numbering them as the real API does.
pub(crate) struct ResponseEvents {
    pub(crate) seq: u64,
    /// The message item the deltas belong to.
    pub(crate) item_id: String,
}

impl ResponseEvents {
    pub(crate) fn event(&mut self, kind: &str, mut data: Value) -> Bytes {
        data["type"] = Value::from(kind);
        data["sequence_number"] = Value::from(self.seq);
        self.seq += 1;
        sse_event(kind, &data.to_string())
    }

    /// Hot path: deltas are formatted by hand.
    pub(crate) fn delta(&mut self, text: &str) -> Bytes {
        let json = format!(
            "{{\"type\":\"response.output_text.delta\",\"item_id\":{},\"output_index\":0,\"content_index\":0,\"delta\":{},\"sequence_number\":{}}}",
            json_string(&self.item_id),
            json_string(text),
            self.seq
        );
        self.seq += 1;
        sse_event("response.output_text.delta", &json)
    }
}

pub(crate) fn responses_stream(info: &RequestInfo, b: &Behaviour, chunks: usize) -> EventPlan {
    let model = info.model();
    let ids = AnswerIds::next();
    let mut ev = ResponseEvents {
        seq: 0,
        item_id: ids.message.clone(),
    };
    let pending = response_object(&ids.response, model, "in_progress", Vec::new(), false);
    let mut plan = EventPlan {
        prelude: vec![
            ev.event("response.created", json!({ "response": pending })),
            ev.event("response.in_progress", json!({ "response": pending })),
        ],
        ..EventPlan::default()
    };
    let item = if b.tools {
        function_call_events(&mut plan, &mut ev, &ids.call)
    } else {
        text_events(&mut plan, &mut ev, info.delta_count(chunks))
    };
    plan.epilogue.push(ev.event(
        "response.output_item.done",
        json!({ "output_index": 0, "item": item }),
    ));
    plan.epilogue.push(ev.event(
        "response.completed",
        json!({ "response": response_object(&ids.response, model, "completed", vec![item], !b.no_usage) }),
    ));
    // The error event replaces everything after the first few deltas.
    let error_seq = plan.prelude.len() + plan.deltas.len().min(MIDSTREAM_ERROR_AFTER);
    plan.error_event = sse_event(
        "error",
        &json!({ "type": "error", "code": "server_error", "message": "overloaded",
                 "param": null, "sequence_number": error_seq })
        .to_string(),
    );
    plan
}

/// The events of one streamed text message, up to its `output_text.done` and
/// `content_part.done`; returns the finished item.
fn text_events(plan: &mut EventPlan, ev: &mut ResponseEvents, deltas: usize) -> Value {
    let id = ev.item_id.clone();
    plan.prelude.extend([
        ev.event(
            "response.output_item.added",
            json!({ "output_index": 0, "item": output_message(&id, "", "in_progress") }),
        ),
        ev.event(
            "response.content_part.added",
            json!({ "item_id": id, "output_index": 0, "content_index": 0,
                    "part": { "type": "output_text", "text": "", "annotations": [] } }),
        ),
    ]);
    let pieces: Vec<String> = (0..deltas).map(|i| format!("tok{i} ")).collect();
    plan.deltas = pieces.iter().map(|p| ev.delta(p)).collect();
    let text = pieces.concat();
    plan.epilogue = vec![
        ev.event(
            "response.output_text.done",
            json!({ "item_id": id, "output_index": 0, "content_index": 0, "text": text }),
        ),
        ev.event(
            "response.content_part.done",
            json!({ "item_id": id, "output_index": 0, "content_index": 0,
                    "part": { "type": "output_text", "text": text, "annotations": [] } }),
        ),
    ];
    output_message(&id, &text, "completed")
}

/// The events of one streamed tool call, its arguments in the same pieces as the chat stream's,
/// up to `function_call_arguments.done`; returns the finished item.
fn function_call_events(plan: &mut EventPlan, ev: &mut ResponseEvents, id: &str) -> Value {
    plan.prelude.push(ev.event(
        "response.output_item.added",
        json!({ "output_index": 0, "item": function_call_item(id, "", "in_progress") }),
    ));
    plan.deltas = TOOL_ARG_PARTS
        .iter()
        .map(|part| {
            ev.event(
                "response.function_call_arguments.delta",
                json!({ "item_id": id, "output_index": 0, "delta": part }),
            )
        })
        .collect();
    let arguments = TOOL_ARG_PARTS.concat();
    plan.epilogue = vec![ev.event(
        "response.function_call_arguments.done",
        json!({ "item_id": id, "output_index": 0, "name": "get_weather",
                "arguments": arguments }),
    )];
    function_call_item(id, &arguments, "completed")
}
