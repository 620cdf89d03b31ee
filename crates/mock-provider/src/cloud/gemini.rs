//! Gemini answers: `generateContent` whole, and `streamGenerateContent?alt=sse` as events.

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::faults::Behaviour;
use crate::reply::{EventPlan, ANSWER_TEXT, CACHED_TOKENS, COMPLETION_TOKENS, PROMPT_TOKENS};

/// The thought summary of `think` models, and its token count.
const THOUGHT_TEXT: &str = "Let me think.";
const THOUGHT_TOKENS: u64 = 8;

/// What of a Gemini request steers the answer.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct GeminiRequest {
    contents: Vec<Value>,
    generation_config: Option<Value>,
}

impl GeminiRequest {
    pub(crate) fn parse(body: &[u8]) -> GeminiRequest {
        serde_json::from_slice(body).unwrap_or_default()
    }

    /// The conversation ends with a function's result: a `tools` model answers with text.
    pub(crate) fn ends_with_function_response(&self) -> bool {
        self.contents
            .last()
            .and_then(|c| c.get("parts"))
            .and_then(Value::as_array)
            .is_some_and(|parts| parts.iter().any(|p| p.get("functionResponse").is_some()))
    }

    fn delta_count(&self, chunks: usize) -> usize {
        match self
            .generation_config
            .as_ref()
            .and_then(|g| g.get("maxOutputTokens"))
            .and_then(Value::as_u64)
        {
            Some(n) => chunks.min(usize::try_from(n.max(1)).unwrap_or(usize::MAX)),
            None => chunks,
        }
    }
}

fn usage(b: &Behaviour, complete: bool) -> Value {
    let thoughts = if b.thinking { THOUGHT_TOKENS } else { 0 };
    let mut u = json!({
        "promptTokenCount": PROMPT_TOKENS,
        "cachedContentTokenCount": CACHED_TOKENS,
        "totalTokenCount": PROMPT_TOKENS,
    });
    if complete {
        u["candidatesTokenCount"] = json!(COMPLETION_TOKENS);
        u["totalTokenCount"] = json!(PROMPT_TOKENS + COMPLETION_TOKENS + thoughts);
        if thoughts > 0 {
            u["thoughtsTokenCount"] = json!(thoughts);
        }
    }
    u
}

fn function_call() -> Value {
    json!({ "functionCall": { "name": "get_weather", "args": { "city": "Paris" } },
            "thoughtSignature": "bW9jay1zaWduYXR1cmU=" })
}

fn response(model: &str, parts: Vec<Value>, finish: Option<&str>, usage: Option<Value>) -> Value {
    let mut candidate = json!({ "content": { "parts": parts, "role": "model" }, "index": 0 });
    if let Some(f) = finish {
        candidate["finishReason"] = json!(f);
    }
    let mut out = json!({
        "candidates": [candidate],
        "modelVersion": model,
        "responseId": "mock-gemini-response",
    });
    if let Some(u) = usage {
        out["usageMetadata"] = u;
    }
    out
}

/// A whole `GenerateContentResponse`.
pub(crate) fn generate(model: &str, b: &Behaviour) -> Value {
    let mut parts = Vec::new();
    if b.thinking {
        parts.push(json!({ "text": THOUGHT_TEXT, "thought": true }));
    }
    if b.tools {
        parts.push(json!({ "text": "Let me check." }));
        parts.push(function_call());
    } else {
        parts.push(json!({ "text": ANSWER_TEXT }));
    }
    let usage = (!b.no_usage).then(|| usage(b, true));
    response(model, parts, Some("STOP"), usage)
}

/// `data: <json>\r\n\r\n`, as Gemini writes its events.
fn event(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\r\n\r\n"))
}

/// A streamed answer: text in pieces (the usage so far on each event), the last event with
/// the finish reason and the whole usage.
pub(crate) fn stream(model: &str, req: &GeminiRequest, b: &Behaviour, chunks: usize) -> EventPlan {
    let partial = (!b.no_usage).then(|| usage(b, false));
    let mut plan = EventPlan::default();
    if b.thinking {
        plan.prelude.push(event(&response(
            model,
            vec![json!({ "text": THOUGHT_TEXT, "thought": true })],
            None,
            partial.clone(),
        )));
    }
    let last = if b.tools {
        plan.deltas = vec![event(&response(
            model,
            vec![json!({ "text": "Let me check." })],
            None,
            partial.clone(),
        ))];
        vec![function_call()]
    } else {
        plan.deltas = (0..req.delta_count(chunks))
            .map(|i| {
                event(&response(
                    model,
                    vec![json!({ "text": format!("tok{i} ") })],
                    None,
                    partial.clone(),
                ))
            })
            .collect();
        vec![json!({ "text": "" })]
    };
    plan.epilogue = vec![event(&response(
        model,
        last,
        Some("STOP"),
        (!b.no_usage).then(|| usage(b, true)),
    ))];
    plan.error_event = event(&json!({ "error": {
        "code": 500, "message": "An internal error has occurred.", "status": "INTERNAL" } }));
    plan
}
