//! The answer of each model endpoint; the other endpoints (embeddings, images, audio, tools,
//! the model list) are answered here too.

use std::sync::LazyLock;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::anthropic::{anthropic_message, messages_stream};
use crate::faults::Behaviour;
use crate::openai::{
    chat_completion, chat_stream, function_call_item, output_message, response_object,
    responses_stream, AnswerIds,
};
use crate::recording::Config;
use crate::reply::{not_found, unix_secs, Reply, ANSWER_TEXT, TOOL_ARG_PARTS};
use crate::request::{RequestInfo, Route};

/// Size of the fake `/v1/audio/speech` payload.
pub(crate) const AUDIO_BYTES: usize = 64 * 1024;

/// Number of inputs in an embeddings request: a string or a token array is
/// one input, an array of strings or of token arrays is one per element.
pub(crate) fn embedding_inputs(input: Option<&Value>) -> usize {
    match input {
        Some(Value::Array(items)) if items.iter().all(Value::is_number) && !items.is_empty() => 1,
        Some(Value::Array(items)) => items.len(),
        _ => 1,
    }
}

pub(crate) fn embeddings(body: &[u8], model: &str, b: &Behaviour) -> Value {
    #[derive(Deserialize, Default)]
    #[serde(default)]
    struct EmbeddingRequest {
        input: Option<Value>,
    }
    let req: EmbeddingRequest = serde_json::from_slice(body).unwrap_or_default();
    let data: Vec<Value> = (0..embedding_inputs(req.input.as_ref()))
        .map(|i| {
            let vector: Vec<f64> = (0..8).map(|k| (k as f64 + 1.0) / 10.0).collect();
            json!({ "object": "embedding", "index": i, "embedding": vector })
        })
        .collect();
    let mut out = json!({ "object": "list", "data": data, "model": model });
    if !b.no_usage {
        out["usage"] = json!({ "prompt_tokens": 8, "total_tokens": 8 });
    }
    out
}

pub(crate) fn images(b: &Behaviour) -> Value {
    let mut out = json!({ "created": unix_secs(), "data": [{ "b64_json": "aGVsbG8=" }] });
    if !b.no_usage {
        out["usage"] = json!({ "input_tokens": 10, "output_tokens": 0, "total_tokens": 10 });
    }
    out
}

/// Deterministic fake MP3: an ID3 tag then a repeating byte pattern, so a
/// test can compare bytes received through the gateway.
pub(crate) static AUDIO: LazyLock<Bytes> = LazyLock::new(|| {
    let mut data = Vec::with_capacity(AUDIO_BYTES);
    data.extend_from_slice(b"ID3\x04\x00\x00\x00\x00\x00\x00");
    let mut i: u32 = 0;
    while data.len() < AUDIO_BYTES {
        data.push((i.wrapping_mul(31).wrapping_add(7) % 251) as u8);
        i += 1;
    }
    Bytes::from(data)
});

pub(crate) fn models() -> Value {
    json!({
        "object": "list",
        "data": [
            { "id": "mock-gpt", "object": "model", "created": 0, "owned_by": "mock" },
            { "id": "claude-mock", "object": "model", "created": 0, "owned_by": "mock" }
        ]
    })
}

/// Answer a model endpoint (everything but control routes and failures).
pub(crate) fn model_reply(
    route: Route,
    info: &RequestInfo,
    body: &[u8],
    b: &Behaviour,
    cfg: &Config,
) -> Reply {
    let model = info.model();
    match route {
        Route::ChatCompletions if info.streaming() => {
            Reply::Events(chat_stream(info, b, cfg.chunks))
        }
        Route::ChatCompletions => Reply::ok(&chat_completion(model, b)),
        Route::Responses if info.streaming() => {
            Reply::Events(responses_stream(info, b, cfg.chunks))
        }
        Route::Responses => {
            let ids = AnswerIds::next();
            let output = if b.tools {
                vec![function_call_item(
                    &ids.call,
                    &TOOL_ARG_PARTS.concat(),
                    "completed",
                )]
            } else {
                vec![output_message(&ids.message, ANSWER_TEXT, "completed")]
            };
            Reply::ok(&response_object(
                &ids.response,
                model,
                "completed",
                output,
                !b.no_usage,
            ))
        }
        Route::Messages if info.streaming() => Reply::Events(messages_stream(info, b, cfg.chunks)),
        Route::Messages => Reply::ok(&anthropic_message(model, b)),
        Route::CountTokens => Reply::ok(&json!({ "input_tokens": 42 })),
        Route::Embeddings => Reply::ok(&embeddings(body, model, b)),
        Route::Images => Reply::ok(&images(b)),
        Route::Speech => Reply::Audio(AUDIO.clone()),
        Route::Search => Reply::ok(&json!({ "results": [{
            "title": "Mock result",
            "url": "https://example.com",
            "snippet": "This is a mock search result."
        }]})),
        Route::WebFetch => Reply::ok(&json!({
            "url": info.url.clone().unwrap_or(Value::Null),
            "content": "mock page"
        })),
        Route::Models => Reply::ok(&models()),
        Route::Health => Reply::ok(&json!({ "ok": true })),
        Route::MockRequests
        | Route::MockStats
        | Route::MockFail
        | Route::Traces
        | Route::NotFound => not_found(),
    }
}
