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
//! The translation keeps no state: `previous_response_id`, `conversation` and `background`
//! are refused, and so is any `item_reference` left in `input`. The gateway resolves references
//! to the output items it issued itself ([`is_issued_item_id`]) into the items before the
//! request gets here.

mod answer;
mod events;
mod request;
mod stream;

use serde_json::{json, Value};

pub use answer::{from_chat, from_messages};
pub use request::{to_chat, to_messages};
pub use stream::{ChatStream, MessagesStream};

/// The prefixes of the output items a translated answer issues.
const ITEM_PREFIXES: [&str; 3] = ["msg_", "fc_", "rs_"];
/// Random hex digits after the prefix (96 bits).
const ITEM_ID_DIGITS: usize = 24;

/// A fresh id for an output item of a translated answer (`prefix` one of [`ITEM_PREFIXES`]).
fn item_id(prefix: &str) -> String {
    format!(
        "{prefix}{:016x}{:08x}",
        rand::random::<u64>(),
        rand::random::<u32>()
    )
}

/// True when `id` has the shape of the output item ids translated answers issue: `msg_`,
/// `fc_` or `rs_` and 24 lowercase hex digits. Only such ids can name an item the gateway
/// keeps; anything else (an OpenAI id, a client's own) is known to be none without a lookup.
pub fn is_issued_item_id(id: &str) -> bool {
    ITEM_PREFIXES.iter().any(|p| {
        id.strip_prefix(p).is_some_and(|rest| {
            rest.len() == ITEM_ID_DIGITS
                && rest
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
    })
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_item_ids_are_recognised() {
        for prefix in ITEM_PREFIXES {
            let id = item_id(prefix);
            assert!(is_issued_item_id(&id), "{id}");
            assert!(!is_issued_item_id(&format!("{id}0")), "{id}");
            assert!(!is_issued_item_id(&id[..id.len() - 1]), "{id}");
            assert!(!is_issued_item_id(&id.to_uppercase()), "{id}");
        }
        for other in [
            "msg_68b65c5082e48190a83636c52ee5de6508cd5796c3342f15",
            "msg_01a2157e-0703-7282-bb73-ae22ab60d3a9",
            "resp_0123456789abcdef01234567",
            "call_0123456789abcdef01234567",
            "",
        ] {
            assert!(!is_issued_item_id(other), "{other}");
        }
    }
}
