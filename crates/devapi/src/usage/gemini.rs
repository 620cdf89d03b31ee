//! The Gemini API: `usageMetadata`, on every streamed answer's events (the counts so far, the
//! last one final) and on a whole answer.
//!
//! Gemini counts thinking apart from the answer and cached tokens inside the prompt; in the
//! gateway's terms (OpenAI's) output is the answer plus the thinking, with the thinking as its
//! reasoning part, and input is the prompt plus any tool-use prompt, with the cached part as
//! its cached tokens.

use gateway_core::domain::Usage;
use serde_json::Value;

use super::object::count_at;
use super::received::Received;

/// The usage a `usageMetadata` object states; `None` when it names no count.
pub(super) fn gemini_usage(meta: &Value) -> Option<Usage> {
    let count = |k: &str| count_at(meta, &[k]);
    let prompt = count("promptTokenCount");
    let candidates = count("candidatesTokenCount");
    let thoughts = count("thoughtsTokenCount");
    if prompt.is_none() && candidates.is_none() && thoughts.is_none() {
        return None;
    }
    let thoughts = thoughts.unwrap_or(0);
    Some(Usage {
        input_tokens: prompt
            .unwrap_or(0)
            .saturating_add(count("toolUsePromptTokenCount").unwrap_or(0)),
        output_tokens: candidates.unwrap_or(0).saturating_add(thoughts),
        cached_tokens: count("cachedContentTokenCount").unwrap_or(0),
        reasoning_tokens: thoughts,
    })
}

/// One streamed event: its usage replaces what came before (the counts are cumulative), a
/// candidate's `finishReason` ends the answer deliberately, its text is what was delivered.
pub(super) fn observe_gemini(received: &mut Received, json: &Value) {
    if json.get("error").is_some_and(|e| !e.is_null()) {
        received.record_error(json);
        return;
    }
    if let Some(u) = json.get("usageMetadata").and_then(gemini_usage) {
        received.usage = Some(u);
    }
    let Some(candidate) = json
        .get("candidates")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
    else {
        // A prompt Gemini blocked answers with its feedback and no candidate: that is the end.
        if json
            .get("promptFeedback")
            .and_then(|f| f.get("blockReason"))
            .is_some()
        {
            received.terminal = true;
        }
        return;
    };
    for part in candidate
        .get("content")
        .and_then(|c| c.get("parts"))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        if let Some(t) = part.get("text").and_then(Value::as_str) {
            received.deliver(t);
        } else if let Some(call) = part.get("functionCall") {
            if let Some(args) = call.get("args") {
                received.deliver(&args.to_string());
            }
        }
    }
    if candidate.get("finishReason").is_some_and(Value::is_string) {
        received.terminal = true;
    }
}

/// The usage of a whole answer (`usageMetadata` at its top level).
pub(super) fn usage_from_body(body: &[u8]) -> Option<Usage> {
    #[derive(serde::Deserialize)]
    struct Answer {
        #[serde(default, rename = "usageMetadata")]
        usage: Option<Value>,
    }
    let answer: Answer = serde_json::from_slice(body).ok()?;
    gemini_usage(answer.usage.as_ref()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn thoughts_are_output_and_cached_tokens_part_of_the_prompt() {
        let meta = json!({"promptTokenCount": 1200, "candidatesTokenCount": 40,
            "thoughtsTokenCount": 300, "cachedContentTokenCount": 1024,
            "toolUsePromptTokenCount": 5, "totalTokenCount": 1545});
        assert_eq!(
            gemini_usage(&meta),
            Some(Usage {
                input_tokens: 1205,
                output_tokens: 340,
                cached_tokens: 1024,
                reasoning_tokens: 300
            })
        );
        assert_eq!(gemini_usage(&json!({"totalTokenCount": 3})), None);
        assert_eq!(gemini_usage(&json!({"promptTokenCount": -1})), None);
        let body = json!({"candidates": [], "usageMetadata": meta}).to_string();
        assert_eq!(usage_from_body(body.as_bytes()).unwrap().output_tokens, 340);
        assert_eq!(usage_from_body(b"[1]"), None);
    }
}
