//! Anthropic answers: messages, whole and streamed.

use bytes::Bytes;
use serde_json::{json, Value};

use crate::faults::Behaviour;
use crate::reply::{
    json_string, sse_event, EventPlan, ANSWER_TEXT, CACHED_TOKENS, COMPLETION_TOKENS,
    PROMPT_TOKENS, TOOL_ARG_PARTS,
};
use crate::request::RequestInfo;

pub(crate) fn anthropic_usage(output_tokens: u64) -> Value {
    json!({
        "input_tokens": PROMPT_TOKENS,
        "output_tokens": output_tokens,
        "cache_read_input_tokens": CACHED_TOKENS
    })
}

pub(crate) fn tool_use_block() -> Value {
    json!({ "type": "tool_use", "id": "toolu_mock", "name": "get_weather", "input": { "city": "Paris" } })
}

/// The thinking of `think` models, and its signature.
pub(crate) const THINKING_TEXT: &str = "Let me think.";
pub(crate) const THINKING_SIGNATURE: &str = "sig-mock";

pub(crate) fn anthropic_message(model: &str, b: &Behaviour) -> Value {
    let (mut content, stop) = if b.tools {
        let text = json!({ "type": "text", "text": "Let me check." });
        (vec![text, tool_use_block()], "tool_use")
    } else {
        (
            vec![json!({ "type": "text", "text": ANSWER_TEXT })],
            "end_turn",
        )
    };
    if b.thinking {
        let thinking = json!({ "type": "thinking", "thinking": THINKING_TEXT,
                               "signature": THINKING_SIGNATURE });
        content.insert(0, thinking);
    }
    let mut body = json!({
        "id": "msg_mock",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": null
    });
    if !b.no_usage {
        body["usage"] = anthropic_usage(COMPLETION_TOKENS);
    }
    body
}

/// An Anthropic SSE event whose `type` field matches its event name.
pub(crate) fn anthropic_event(kind: &str, mut data: Value) -> Bytes {
    data["type"] = Value::from(kind);
    sse_event(kind, &data.to_string())
}

/// Hot path: text deltas are formatted by hand.
pub(crate) fn anthropic_text_delta(index: usize, text: &str) -> Bytes {
    sse_event(
        "content_block_delta",
        &format!(
            "{{\"type\":\"content_block_delta\",\"index\":{index},\"delta\":{{\"type\":\"text_delta\",\"text\":{}}}}}",
            json_string(text)
        ),
    )
}

pub(crate) fn block_start(index: usize, block: Value) -> Bytes {
    anthropic_event(
        "content_block_start",
        json!({ "index": index, "content_block": block }),
    )
}

pub(crate) fn block_stop(index: usize) -> Bytes {
    anthropic_event("content_block_stop", json!({ "index": index }))
}

pub(crate) fn messages_stream(info: &RequestInfo, b: &Behaviour, chunks: usize) -> EventPlan {
    let mut start = json!({
        "id": "msg_mock", "type": "message", "role": "assistant", "model": info.model(),
        "content": [], "stop_reason": null, "stop_sequence": null
    });
    if !b.no_usage {
        start["usage"] = anthropic_usage(1);
    }
    let mut plan = EventPlan {
        prelude: vec![anthropic_event(
            "message_start",
            json!({ "message": start }),
        )],
        ..EventPlan::default()
    };
    // A signed thinking block first for `think` models; the other blocks follow it.
    let first = usize::from(b.thinking);
    if b.thinking {
        let delta =
            |d: Value| anthropic_event("content_block_delta", json!({ "index": 0, "delta": d }));
        plan.prelude.extend([
            block_start(0, json!({ "type": "thinking", "thinking": "" })),
            delta(json!({ "type": "thinking_delta", "thinking": THINKING_TEXT })),
            delta(json!({ "type": "signature_delta", "signature": THINKING_SIGNATURE })),
            block_stop(0),
        ]);
    }
    let (last_index, stop_reason) = if b.tools {
        // A short text block first, so clients see text then a tool block.
        let tool = first + 1;
        plan.prelude.extend([
            block_start(first, json!({ "type": "text", "text": "" })),
            anthropic_event("ping", json!({})),
            anthropic_text_delta(first, "Let me check."),
            block_stop(first),
            block_start(
                tool,
                json!({ "type": "tool_use", "id": "toolu_mock", "name": "get_weather", "input": {} }),
            ),
        ]);
        plan.deltas = TOOL_ARG_PARTS
            .iter()
            .map(|part| {
                let delta = json!({ "index": tool, "delta": { "type": "input_json_delta", "partial_json": part } });
                anthropic_event("content_block_delta", delta)
            })
            .collect();
        (tool, "tool_use")
    } else {
        plan.prelude.extend([
            block_start(first, json!({ "type": "text", "text": "" })),
            anthropic_event("ping", json!({})),
        ]);
        plan.deltas = (0..info.delta_count(chunks))
            .map(|i| anthropic_text_delta(first, &format!("tok{i} ")))
            .collect();
        (first, "end_turn")
    };
    let mut message_delta =
        json!({ "delta": { "stop_reason": stop_reason, "stop_sequence": null } });
    if !b.no_usage {
        // Cumulative, input included, as Anthropic sends it today: some clients
        // (langchain-anthropic) read the usage of a stream from this event alone.
        message_delta["usage"] = anthropic_usage(COMPLETION_TOKENS);
    }
    plan.epilogue = vec![
        block_stop(last_index),
        anthropic_event("message_delta", message_delta),
        anthropic_event("message_stop", json!({})),
    ];
    plan.error_event = anthropic_event(
        "error",
        json!({ "error": { "type": "overloaded_error", "message": "Overloaded" } }),
    );
    plan
}
