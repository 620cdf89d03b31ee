//! The client speaks the OpenAI Responses API; the provider speaks chat completions
//! (an OpenAI-style provider that has no `/v1/responses`) or Anthropic messages.
//!
//! The request is translated to a chat request first ([`to_chat`]); for an Anthropic-style
//! provider that chat request then goes through [`crate::chat_to_messages`], which already
//! knows every rule of the messages API (alternation, tool results first, thinking budgets).
//! Signed thinking survives the two steps in the chat message's `thinking_blocks`. Answers
//! come back the same way: a whole Anthropic answer is read as a chat answer first, while
//! streams are translated directly from either provider's events by one Responses event
//! writer ([`stream`]), so nothing is parsed twice on the hot path.
//!
//! The gateway keeps no conversations, so `previous_response_id`, `store: true`,
//! `background` and item references are refused: a translated request must carry its whole
//! history, as Codex does with `store: false`.

mod answer;
mod events;
mod request;
mod stream;

use serde_json::{json, Value};

pub use answer::{from_chat, from_messages};
pub use request::{to_chat, to_messages};
pub use stream::{ChatStream, MessagesStream};

/// Anthropic thinking signatures travel to the client as a reasoning item's
/// `encrypted_content` behind this mark, so only signatures the gateway handed out are ever
/// sent back to Anthropic (an OpenAI encrypted blob would make it refuse the request).
const SIGNATURE_MARK: &str = "gw-anthropic-signature:";

/// Responses usage: `input_tokens` includes cached tokens (as in chat completions),
/// reasoning tokens are part of `output_tokens`.
fn usage(input: u64, cached: u64, output: u64, reasoning: u64) -> Value {
    json!({
        "input_tokens": input,
        "input_tokens_details": { "cached_tokens": cached },
        "output_tokens": output,
        "output_tokens_details": { "reasoning_tokens": reasoning },
        "total_tokens": input.saturating_add(output),
    })
}

/// The parts of a Responses object that do not depend on its output.
fn response_object(id: &str, created: u64, model: &str, status: &str) -> Value {
    json!({
        "id": id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": null,
        "incomplete_details": null,
        "model": model,
        "output": [],
        "parallel_tool_calls": true,
        "tool_choice": "auto",
        "tools": [],
        "usage": null,
    })
}

/// A reasoning output item. Thinking text is shown as its summary; a signature goes into
/// `encrypted_content` so the client can send the thinking back on the next turn.
fn reasoning_item(id: &str, text: &str, signature: Option<&str>) -> Value {
    let summary = if text.is_empty() {
        json!([])
    } else {
        json!([{ "type": "summary_text", "text": text }])
    };
    let mut item = json!({ "id": id, "type": "reasoning", "summary": summary });
    if let Some(sig) = signature.filter(|s| !s.is_empty()) {
        set(
            &mut item,
            "encrypted_content",
            json!(format!("{SIGNATURE_MARK}{sig}")),
        );
    }
    item
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({
        "id": id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [{ "type": "output_text", "text": text, "annotations": [] }],
    })
}

fn call_item(id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({
        "id": id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    })
}

/// Sets a field of a JSON object; indexing would panic on anything else.
fn set(v: &mut Value, key: &str, x: Value) {
    if let Some(o) = v.as_object_mut() {
        o.insert(key.to_string(), x);
    }
}
