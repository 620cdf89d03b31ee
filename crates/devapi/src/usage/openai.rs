//! OpenAI's protocols: chat completions (and the legacy completions stream), the Responses
//! API, and the usage objects of both naming schemes (also used by embeddings, images and
//! OpenAI-compatible providers).

use std::borrow::Cow;

use gateway_core::domain::Usage;
use gateway_core::response_items::Issued;
use serde_json::Value;

use super::kind::EventVerdict;
use super::object::{count_at, UsageObject};
use super::received::Received;

/// Both OpenAI schemes: chat/embeddings (`prompt_tokens`, ...) and
/// responses/images (`input_tokens`, ...). `None` if neither total is there.
pub(super) fn openai_usage<U: UsageObject + ?Sized>(usage: &U) -> Option<Usage> {
    let input = count_at(usage, &["prompt_tokens"]).or_else(|| count_at(usage, &["input_tokens"]));
    let output =
        count_at(usage, &["completion_tokens"]).or_else(|| count_at(usage, &["output_tokens"]));
    if input.is_none() && output.is_none() {
        return None;
    }
    let cached = count_at(usage, &["prompt_tokens_details", "cached_tokens"])
        .or_else(|| count_at(usage, &["input_tokens_details", "cached_tokens"]))
        .or_else(|| count_at(usage, &["cache_read_input_tokens"]))
        .unwrap_or(0);
    let reasoning = count_at(usage, &["completion_tokens_details", "reasoning_tokens"])
        .or_else(|| count_at(usage, &["output_tokens_details", "reasoning_tokens"]))
        .unwrap_or(0);
    Some(Usage {
        input_tokens: input.unwrap_or(0),
        output_tokens: output.unwrap_or(0),
        cached_tokens: cached,
        reasoning_tokens: reasoning,
    })
}

pub(super) fn observe_chat(received: &mut Received, json: &Value) -> EventVerdict {
    if json.get("error").is_some_and(|e| !e.is_null()) {
        received.record_error(json);
    }
    if let Some(choices) = json.get("choices").and_then(Value::as_array) {
        for choice in choices {
            chat_choice_text(received, choice);
        }
    }
    let Some(usage) = json.get("usage").filter(|u| u.is_object()) else {
        return EventVerdict::Forward;
    };
    // A chunk is only dropped if it carried usage this code understood.
    let Some(u) = openai_usage(usage) else {
        return EventVerdict::Forward;
    };
    received.usage = Some(u);
    let no_choices = match json.get("choices") {
        None | Some(Value::Null) => true,
        Some(Value::Array(a)) => a.is_empty(),
        Some(_) => false,
    };
    if no_choices {
        EventVerdict::UsageOnly
    } else {
        EventVerdict::Forward
    }
}

/// [`Self::observe_chat`] for a chunk read into [`ChatChunk`]: the same result without
/// building the event's JSON tree (a chat stream is mostly such chunks).
pub(super) fn observe_chat_chunk(received: &mut Received, chunk: ChatChunk<'_>) -> EventVerdict {
    for choice in chunk.choices.iter().flatten() {
        if let Some(t) = &choice.text {
            received.deliver(t);
        }
        let Some(delta) = &choice.delta else {
            continue;
        };
        for t in [&delta.content, &delta.reasoning_content, &delta.refusal]
            .into_iter()
            .flatten()
        {
            received.deliver(t);
        }
        if let Some(calls) = delta.tool_calls.as_ref().and_then(Value::as_array) {
            for call in calls {
                if let Some(f) = call.get("function") {
                    deliver_function(received, f);
                }
            }
        }
        if let Some(f) = &delta.function_call {
            deliver_function(received, f);
        }
    }
    let Some(u) = chunk
        .usage
        .as_ref()
        .filter(|u| u.is_object())
        .and_then(openai_usage)
    else {
        return EventVerdict::Forward;
    };
    received.usage = Some(u);
    if chunk.choices.is_none_or(|c| c.is_empty()) {
        EventVerdict::UsageOnly
    } else {
        EventVerdict::Forward
    }
}

fn chat_choice_text(received: &mut Received, choice: &Value) {
    // `text` is the legacy completions stream, which shares this shape.
    if let Some(t) = choice.get("text").and_then(Value::as_str) {
        received.deliver(t);
    }
    let Some(delta) = choice.get("delta") else {
        return;
    };
    for key in ["content", "reasoning_content", "refusal"] {
        if let Some(t) = delta.get(key).and_then(Value::as_str) {
            received.deliver(t);
        }
    }
    if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
        for call in calls {
            if let Some(f) = call.get("function") {
                deliver_function(received, f);
            }
        }
    }
    if let Some(f) = delta.get("function_call") {
        deliver_function(received, f);
    }
}

fn deliver_function(received: &mut Received, f: &Value) {
    for key in ["name", "arguments"] {
        if let Some(t) = f.get(key).and_then(Value::as_str) {
            received.deliver(t);
        }
    }
}

/// The ids a Responses event shows: the response's and its output items' (the response
/// events), or one item's (`response.output_item.*`).
pub(super) fn issued_ids(issued: &mut Issued, ty: &str, json: &Value) {
    match ty {
        "response.created"
        | "response.in_progress"
        | "response.completed"
        | "response.incomplete"
        | "response.failed" => {
            if let Some(r) = json.get("response") {
                response_ids(issued, r);
            }
        }
        "response.output_item.added" | "response.output_item.done" => {
            if let Some(id) = json
                .get("item")
                .and_then(|i| i.get("id"))
                .and_then(Value::as_str)
            {
                issued.provider_id(id);
            }
        }
        _ => {}
    }
}

/// The ids of a Responses object: its own and its output items'.
pub(super) fn response_ids(issued: &mut Issued, response: &Value) {
    if let Some(id) = response.get("id").and_then(Value::as_str) {
        issued.provider_id(id);
    }
    for item in response
        .get("output")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        if let Some(id) = item.get("id").and_then(Value::as_str) {
            issued.provider_id(id);
        }
    }
}

pub(super) fn observe_responses(received: &mut Received, ty: &str, json: &Value) {
    match ty {
        "response.completed" | "response.incomplete" | "response.failed" => {
            if let Some(u) = json
                .get("response")
                .and_then(|r| r.get("usage"))
                .filter(|u| u.is_object())
                .and_then(openai_usage)
            {
                received.usage = Some(u);
            }
            if ty == "response.failed" {
                if let Some(resp) = json.get("response") {
                    received.record_error(resp);
                }
            } else {
                received.terminal = true;
            }
        }
        "response.output_text.delta"
        | "response.refusal.delta"
        | "response.function_call_arguments.delta"
        | "response.reasoning_text.delta"
        | "response.reasoning_summary_text.delta" => {
            if let Some(t) = json.get("delta").and_then(Value::as_str) {
                received.deliver(t);
            }
        }
        _ => {}
    }
}

/// The parts of an OpenAI chat stream chunk the tracker reads, borrowing the text from the
/// event where it has no escapes. A chunk of another shape (a non-string `content`, duplicate
/// keys, ...) fails to deserialize and is read as a JSON tree instead, so both readings agree.
#[derive(serde::Deserialize)]
pub(super) struct ChatChunk<'a> {
    #[serde(default, rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default)]
    error: Option<Value>,
    #[serde(default, borrow)]
    choices: Option<Vec<ChatChoice<'a>>>,
    #[serde(default)]
    usage: Option<Value>,
}

impl ChatChunk<'_> {
    /// Error chunks take the general path, which records the error.
    pub(super) fn is_error(&self) -> bool {
        self.kind.as_deref() == Some("error") || self.error.as_ref().is_some_and(|e| !e.is_null())
    }
}

#[derive(serde::Deserialize)]
struct ChatChoice<'a> {
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    delta: Option<ChatDelta<'a>>,
}

#[derive(serde::Deserialize)]
struct ChatDelta<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    refusal: Option<Cow<'a, str>>,
    #[serde(default)]
    tool_calls: Option<Value>,
    #[serde(default)]
    function_call: Option<Value>,
}
