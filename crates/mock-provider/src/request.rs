//! What was asked: the route, and the body fields that steer the answer.

use http::Method;
use serde::Deserialize;
use serde_json::Value;

/// The endpoints we know. `/v1` is optional so clients configured with a
/// base URL with or without `/v1` both work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    ChatCompletions,
    Responses,
    Messages,
    CountTokens,
    Embeddings,
    Images,
    Speech,
    Search,
    WebFetch,
    Models,
    Health,
    MockRequests,
    MockStats,
    MockFail,
    /// `POST /v1/traces`: an OTLP/HTTP trace export, accepted and discarded, so that tracing
    /// benchmarks have a collector that costs the machine next to nothing.
    Traces,
    NotFound,
}

impl Route {
    pub(crate) fn from_path(path: &str) -> Route {
        match path {
            "/__mock/requests" => return Route::MockRequests,
            "/__mock/stats" => return Route::MockStats,
            "/__mock/fail" => return Route::MockFail,
            "/v1/traces" => return Route::Traces,
            _ => {}
        }
        let rest = path.strip_prefix("/v1").unwrap_or(path);
        match rest {
            "/chat/completions" => Route::ChatCompletions,
            "/responses" => Route::Responses,
            "/messages" => Route::Messages,
            "/messages/count_tokens" => Route::CountTokens,
            "/embeddings" => Route::Embeddings,
            "/images/generations" => Route::Images,
            "/audio/speech" => Route::Speech,
            "/search" => Route::Search,
            "/web/fetch" => Route::WebFetch,
            "/models" => Route::Models,
            "/health" => Route::Health,
            _ => Route::NotFound,
        }
    }

    /// Control endpoints are neither delayed, recorded nor counted.
    pub(crate) fn is_control(self) -> bool {
        matches!(
            self,
            Route::MockRequests | Route::MockStats | Route::MockFail | Route::Traces
        )
    }

    /// Health and control answers stay out of `served`.
    pub(crate) fn counts_as_served(self) -> bool {
        !matches!(
            self,
            Route::MockRequests
                | Route::MockStats
                | Route::MockFail
                | Route::Traces
                | Route::Health
        )
    }

    pub(crate) fn method_allowed(self, method: &Method) -> bool {
        match self {
            Route::Models | Route::Health | Route::MockStats => method == Method::GET,
            Route::MockRequests => method == Method::GET || method == Method::DELETE,
            Route::MockFail => method == Method::POST || method == Method::DELETE,
            Route::Traces => method == Method::POST,
            Route::NotFound => true,
            _ => method == Method::POST,
        }
    }
}

/// The fields of a request body that steer the answer. Unknown fields are
/// ignored; a body that is not JSON (or has odd types) yields the defaults,
/// so integrity tests can send arbitrary bytes.
#[derive(Deserialize, Default, Debug)]
#[serde(default)]
pub(crate) struct RequestInfo {
    pub(crate) model: Option<String>,
    pub(crate) stream: Option<bool>,
    pub(crate) stream_options: Option<StreamOptions>,
    pub(crate) max_tokens: Option<u64>,
    pub(crate) max_output_tokens: Option<u64>,
    pub(crate) url: Option<Value>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
pub(crate) struct StreamOptions {
    pub(crate) include_usage: Option<bool>,
}

impl RequestInfo {
    pub(crate) fn parse(body: &[u8]) -> Self {
        serde_json::from_slice(body).unwrap_or_default()
    }

    pub(crate) fn model(&self) -> &str {
        self.model.as_deref().unwrap_or("mock-model")
    }

    pub(crate) fn streaming(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    pub(crate) fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false)
    }

    /// Number of streamed content deltas: `--chunks`, capped by the
    /// request's token budget so `max_tokens: 1` gives a one-delta stream.
    pub(crate) fn delta_count(&self, chunks: usize) -> usize {
        match self.max_tokens.or(self.max_output_tokens) {
            Some(limit) => chunks.min(usize::try_from(limit.max(1)).unwrap_or(usize::MAX)),
            None => chunks,
        }
    }
}

/// Whether the conversation in `body` ends with a tool's result: a `tool` message (chat), a
/// user turn whose last block is a `tool_result` (messages), or a `function_call_output` item
/// (Responses). A `tools` model then answers with text, which ends a client's tool loop; a
/// tool result followed by a new question still gets a tool call. Parsed only for `tools`
/// models, so the other answers build no JSON tree.
pub(crate) fn ends_with_tool_result(route: Route, body: &[u8]) -> bool {
    #[derive(Deserialize, Default)]
    #[serde(default)]
    struct Conversation {
        messages: Option<Vec<Value>>,
        input: Option<Value>,
    }
    let conversation: Conversation = serde_json::from_slice(body).unwrap_or_default();
    fn field<'a>(v: &'a Value, name: &str) -> Option<&'a str> {
        v.get(name).and_then(Value::as_str)
    }
    match route {
        Route::ChatCompletions => conversation
            .messages
            .as_ref()
            .and_then(|m| m.last())
            .is_some_and(|m| matches!(field(m, "role"), Some("tool" | "function"))),
        Route::Messages => conversation
            .messages
            .as_ref()
            .and_then(|m| m.last())
            .filter(|m| field(m, "role") == Some("user"))
            .and_then(|m| m.get("content")?.as_array()?.last())
            .is_some_and(|block| field(block, "type") == Some("tool_result")),
        Route::Responses => conversation
            .input
            .as_ref()
            .and_then(Value::as_array)
            .and_then(|items| items.last())
            .is_some_and(|item| field(item, "type") == Some("function_call_output")),
        _ => false,
    }
}
