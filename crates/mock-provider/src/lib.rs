//! Mock model provider used by the gateway's tests and benchmarks.
//!
//! It speaks just enough of the OpenAI and Anthropic HTTP APIs for the gateway
//! to proxy real-looking traffic (JSON bodies, SSE streams, binary audio) and
//! lets tests provoke failures through the request's `model` value or an
//! `x-mock-status` header. Every request can be recorded in memory and read
//! back through `/__mock/requests`, so tests can prove what the gateway sent
//! upstream. `POST /__mock/fail` scripts the next few answers' status (a
//! provider failing N times, then well again). It doubles as the benchmark baseline, hence plain hyper, small
//! request parsing, and hand-formatted hot-path stream deltas.
//!
//! On start it prints `LISTENING <addr>` on stdout so a parent process can
//! bind to port 0 and learn the real port.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use clap::Parser;
use futures::stream::{self, StreamExt};
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;

// Replay of recorded provider answers and the optional TLS listener, each in its own file.
mod replay;
mod tls;

/// Largest request body accepted; tests push multi-megabyte bodies through
/// the gateway and check they arrive intact.
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;
/// Recorded bodies above this size are kept only as length + digest.
const MAX_RECORDED_BODY: usize = 1024 * 1024;
/// Extra wait for models whose name contains `slow`.
const SLOW_DELAY: Duration = Duration::from_millis(3000);
/// Text of every non-streamed assistant answer.
const ANSWER_TEXT: &str = "Hello from the mock provider.";
/// Size of the fake `/v1/audio/speech` payload.
const AUDIO_BYTES: usize = 64 * 1024;
/// The audio payload is sent in this many frames to exercise streaming.
const AUDIO_FRAMES: usize = 4;
/// Number of deltas sent before a `midstream-error` stream fails.
const MIDSTREAM_ERROR_AFTER: usize = 3;
/// Arguments of the mock tool call, split the way a model would stream them.
const TOOL_ARG_PARTS: [&str; 3] = ["{\"city\"", ":\"Par", "is\"}"];

// Token counts reported by every endpoint that has usage.
const PROMPT_TOKENS: u64 = 25;
const COMPLETION_TOKENS: u64 = 24;
const CACHED_TOKENS: u64 = 5;

type BoxedBody = UnsyncBoxBody<Bytes, io::Error>;

/// Command line; every knob is per process so a test can start one mock per
/// scenario.
#[derive(Parser, Debug, Clone)]
#[command(name = "mock-provider", about = "Mock OpenAI/Anthropic provider")]
struct Cli {
    /// Address to bind; port 0 picks a free port (printed on stdout).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Number of content deltas in streamed answers.
    #[arg(long, default_value_t = 20)]
    chunks: usize,
    /// Pause between SSE events, in milliseconds.
    #[arg(long, default_value_t = 0)]
    chunk_delay_ms: u64,
    /// Delay before every answer (headers included), in milliseconds.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Do not keep request records (benchmarks); /__mock/stats still counts.
    #[arg(long)]
    no_record: bool,
    /// Tokio worker threads.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Directory of recorded provider answers (`<name>.http`), replayed for the model
    /// `replay:<name>[@whole|@every-N|@awkward]` (see `mock_provider/replay.rs`).
    #[arg(long)]
    fixtures: Option<std::path::PathBuf>,
    /// PEM certificate chain: serve HTTPS instead of HTTP (with `--tls-key`).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<String>,
    /// PEM private key for `--tls-cert`.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<String>,
}

/// Settings the request handlers need, derived once from the CLI.
#[derive(Debug, Clone)]
struct Config {
    chunks: usize,
    chunk_delay: Duration,
    latency: Duration,
    record: bool,
    fixtures: Option<std::path::PathBuf>,
}

/// One recorded request, as returned by `GET /__mock/requests`.
#[derive(Serialize, Debug, Clone)]
struct Record {
    method: String,
    path: String,
    query: Option<String>,
    headers: BTreeMap<String, String>,
    body_len: usize,
    body_sha256: String,
    body: Option<String>,
    served_at_ms: u64,
}

/// Shared server state: configuration, request log and counters.
struct State {
    config: Config,
    records: Mutex<Vec<Record>>,
    served: AtomicU64,
    /// Connections accepted: tests check that the gateway reuses its provider connections.
    connections: AtomicU64,
    by_path: Mutex<HashMap<String, u64>>,
    /// Failures scripted through `/__mock/fail`, served before anything else.
    scripted: Mutex<Option<Scripted>>,
}

/// `POST /__mock/fail {"status":500,"count":1,"retry_after":2}`: the next `count` model
/// requests (default 1) are answered with `status`, with `retry-after: <retry_after>` when given;
/// `DELETE /__mock/fail` cancels. Lets a test make a provider fail a set number of times.
#[derive(Deserialize, Debug, Clone, Copy)]
struct Scripted {
    status: u16,
    #[serde(default = "one")]
    count: u64,
    retry_after: Option<u64>,
}

fn one() -> u64 {
    1
}

/// Lock a mutex even if a panicking thread poisoned it: the data (a log and
/// counters) stays usable and a mock must keep answering.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl State {
    fn new(config: Config) -> Self {
        State {
            config,
            records: Mutex::new(Vec::new()),
            served: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            by_path: Mutex::new(HashMap::new()),
            scripted: Mutex::new(None),
        }
    }

    /// The scripted failure for this request, if one is left.
    fn take_scripted(&self) -> Option<Scripted> {
        let mut scripted = lock(&self.scripted);
        let s = (*scripted)?;
        *scripted = (s.count > 1).then_some(Scripted {
            count: s.count - 1,
            ..s
        });
        Some(s)
    }

    /// Count an answered model request; called right before hyper writes the
    /// response head so cut streams are counted too.
    fn count_served(&self, path: &str) {
        self.served.fetch_add(1, Ordering::Relaxed);
        let mut by_path = lock(&self.by_path);
        match by_path.get_mut(path) {
            Some(n) => *n += 1,
            None => {
                by_path.insert(path.to_owned(), 1);
            }
        }
    }

    fn stats_json(&self) -> Value {
        let by_path = lock(&self.by_path).clone();
        json!({
            "served": self.served.load(Ordering::Relaxed),
            "connections": self.connections.load(Ordering::Relaxed),
            "by_path": by_path,
            "tls_server_names": tls::server_names(),
        })
    }
}

/// The fields of a request body that steer the answer. Unknown fields are
/// ignored; a body that is not JSON (or has odd types) yields the defaults,
/// so integrity tests can send arbitrary bytes.
#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct RequestInfo {
    model: Option<String>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<u64>,
    max_output_tokens: Option<u64>,
    url: Option<Value>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct StreamOptions {
    include_usage: Option<bool>,
}

impl RequestInfo {
    fn parse(body: &[u8]) -> Self {
        serde_json::from_slice(body).unwrap_or_default()
    }

    fn model(&self) -> &str {
        self.model.as_deref().unwrap_or("mock-model")
    }

    fn streaming(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false)
    }

    /// Number of streamed content deltas: `--chunks`, capped by the
    /// request's token budget so `max_tokens: 1` gives a one-delta stream.
    fn delta_count(&self, chunks: usize) -> usize {
        match self.max_tokens.or(self.max_output_tokens) {
            Some(limit) => chunks.min(usize::try_from(limit.max(1)).unwrap_or(usize::MAX)),
            None => chunks,
        }
    }
}

/// A forced error answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// `fail500` in the model name.
    Server,
    /// `fail429` in the model name.
    RateLimited,
    /// `fail400` in the model name.
    BadRequest,
    /// `x-mock-status` header.
    Status(StatusCode),
}

/// How to misbehave, chosen from the model name and the `x-mock-status`
/// header; flags combine (e.g. `slow-cut`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Behaviour {
    failure: Option<Failure>,
    slow: bool,
    cut: bool,
    midstream_error: bool,
    no_usage: bool,
    tools: bool,
}

/// Pick the behaviour. The header wins over model-name failures, and among
/// those 500 beats 429 beats 400, so a name can't be ambiguous.
fn select_behaviour(model: &str, forced_status: Option<StatusCode>) -> Behaviour {
    let model_failure = if model.contains("fail500") {
        Some(Failure::Server)
    } else if model.contains("fail429") {
        Some(Failure::RateLimited)
    } else if model.contains("fail400") {
        Some(Failure::BadRequest)
    } else {
        None
    };
    Behaviour {
        failure: forced_status.map(Failure::Status).or(model_failure),
        slow: model.contains("slow"),
        cut: model.contains("cut"),
        midstream_error: model.contains("midstream-error"),
        no_usage: model.contains("nousage"),
        tools: model.contains("tools"),
    }
}

/// Parse `x-mock-status`; values outside 200..=599 are ignored because hyper
/// cannot send 1xx as a final answer and anything else is not HTTP.
fn forced_status(headers: &http::HeaderMap) -> Option<StatusCode> {
    let raw = headers.get("x-mock-status")?.to_str().ok()?;
    let code: u16 = raw.trim().parse().ok()?;
    if (200..=599).contains(&code) {
        StatusCode::from_u16(code).ok()
    } else {
        None
    }
}

/// The endpoints we know. `/v1` is optional so clients configured with a
/// base URL with or without `/v1` both work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
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
    NotFound,
}

impl Route {
    fn from_path(path: &str) -> Route {
        match path {
            "/__mock/requests" => return Route::MockRequests,
            "/__mock/stats" => return Route::MockStats,
            "/__mock/fail" => return Route::MockFail,
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
    fn is_control(self) -> bool {
        matches!(
            self,
            Route::MockRequests | Route::MockStats | Route::MockFail
        )
    }

    /// Health and control answers stay out of `served`.
    fn counts_as_served(self) -> bool {
        !matches!(
            self,
            Route::MockRequests | Route::MockStats | Route::MockFail | Route::Health
        )
    }

    fn method_allowed(self, method: &Method) -> bool {
        match self {
            Route::Models | Route::Health | Route::MockStats => method == Method::GET,
            Route::MockRequests => method == Method::GET || method == Method::DELETE,
            Route::MockFail => method == Method::POST || method == Method::DELETE,
            Route::NotFound => true,
            _ => method == Method::POST,
        }
    }
}

/// What a handler wants sent; `render` turns it into a hyper response and
/// applies the transport-level misbehaviours (cut, pacing).
#[derive(Debug)]
enum Reply {
    Json {
        status: StatusCode,
        body: Bytes,
        /// Seconds sent as `retry-after`.
        retry_after: Option<u64>,
    },
    Audio(Bytes),
    Events(EventPlan),
    /// A recorded provider answer (`--fixtures`), sent as recorded.
    Replay(replay::Answer),
}

impl Reply {
    fn json(status: StatusCode, value: &Value) -> Reply {
        Reply::Json {
            status,
            body: Bytes::from(value.to_string()),
            retry_after: None,
        }
    }

    fn ok(value: &Value) -> Reply {
        Reply::json(StatusCode::OK, value)
    }
}

/// A streamed answer split into the parts misbehaviours cut at: the opening
/// events, the content deltas, the closing events, and the event to send
/// instead of the closing ones for `midstream-error`.
#[derive(Debug, Default)]
struct EventPlan {
    prelude: Vec<Bytes>,
    deltas: Vec<Bytes>,
    epilogue: Vec<Bytes>,
    error_event: Bytes,
}

/// One step of a paced body: a frame to send, or the signal to drop the
/// connection without finishing the message.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Data(Bytes),
    Abort,
}

/// Flatten an event plan into steps according to the behaviour:
/// `cut` keeps half the deltas and aborts; `midstream-error` keeps a few
/// deltas, then the error event, then ends cleanly.
fn assemble(plan: EventPlan, behaviour: &Behaviour) -> Vec<Step> {
    let EventPlan {
        prelude,
        mut deltas,
        epilogue,
        error_event,
    } = plan;
    let mut steps: Vec<Step> = prelude.into_iter().map(Step::Data).collect();
    if behaviour.cut {
        deltas.truncate(deltas.len() / 2);
        steps.extend(deltas.into_iter().map(Step::Data));
        steps.push(Step::Abort);
    } else if behaviour.midstream_error {
        deltas.truncate(MIDSTREAM_ERROR_AFTER);
        steps.extend(deltas.into_iter().map(Step::Data));
        steps.push(Step::Data(error_event));
    } else {
        steps.extend(deltas.into_iter().map(Step::Data));
        steps.extend(epilogue.into_iter().map(Step::Data));
    }
    steps
}

/// `data: <json>\n\n` — OpenAI chat completions style SSE event.
fn sse_data(json: &str) -> Bytes {
    Bytes::from(format!("data: {json}\n\n"))
}

/// `event: <name>\ndata: <json>\n\n` — Anthropic / Responses style SSE event.
fn sse_event(name: &str, json: &str) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {json}\n\n"))
}

/// JSON-escape a string (with quotes) for hand-formatted hot-path events.
fn json_string(s: &str) -> String {
    Value::from(s).to_string()
}

fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn unix_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn error_value(message: &str, kind: &str) -> Value {
    json!({ "error": { "message": message, "type": kind } })
}

fn not_found() -> Reply {
    Reply::json(
        StatusCode::NOT_FOUND,
        &error_value("not found", "invalid_request_error"),
    )
}

/// The error answer for a forced failure.
fn failure_reply(failure: Failure) -> Reply {
    match failure {
        Failure::Server => Reply::json(
            StatusCode::INTERNAL_SERVER_ERROR,
            &error_value("mock failure", "server_error"),
        ),
        Failure::RateLimited => Reply::Json {
            status: StatusCode::TOO_MANY_REQUESTS,
            body: Bytes::from(error_value("rate limited by mock", "rate_limit_error").to_string()),
            retry_after: Some(1),
        },
        Failure::BadRequest => Reply::json(
            StatusCode::BAD_REQUEST,
            &json!({ "error": {
                "message": "bad request from mock",
                "type": "invalid_request_error",
                "code": "mock_bad_request"
            }}),
        ),
        Failure::Status(status) => {
            let kind = if status.is_server_error() {
                "server_error"
            } else if status == StatusCode::TOO_MANY_REQUESTS {
                "rate_limit_error"
            } else {
                "invalid_request_error"
            };
            Reply::Json {
                status,
                body: Bytes::from(
                    error_value(&format!("mock status {}", status.as_u16()), kind).to_string(),
                ),
                retry_after: (status == StatusCode::TOO_MANY_REQUESTS).then_some(1),
            }
        }
    }
}

// ---------------------------------------------------------------------------
// OpenAI chat completions
// ---------------------------------------------------------------------------

fn chat_usage() -> Value {
    json!({
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": COMPLETION_TOKENS,
        "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
        "prompt_tokens_details": { "cached_tokens": CACHED_TOKENS }
    })
}

fn tool_call_value() -> Value {
    json!({
        "id": "call_mock",
        "type": "function",
        "function": { "name": "get_weather", "arguments": TOOL_ARG_PARTS.concat() }
    })
}

fn chat_completion(model: &str, b: &Behaviour) -> Value {
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
struct ChunkWriter {
    head: String,
}

impl ChunkWriter {
    fn new(model: &str) -> Self {
        let head = format!(
            "{{\"id\":\"chatcmpl-mock\",\"object\":\"chat.completion.chunk\",\"created\":{},\"model\":{}",
            unix_secs(),
            json_string(model)
        );
        ChunkWriter { head }
    }

    fn choice(&self, delta: &str, finish: Option<&str>) -> Bytes {
        let finish = finish.map_or_else(|| "null".to_owned(), json_string);
        sse_data(&format!(
            "{},\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}",
            self.head
        ))
    }

    fn usage(&self) -> Bytes {
        sse_data(&format!(
            "{},\"choices\":[],\"usage\":{}}}",
            self.head,
            chat_usage()
        ))
    }
}

fn chat_stream(info: &RequestInfo, b: &Behaviour, chunks: usize) -> EventPlan {
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

// ---------------------------------------------------------------------------
// OpenAI responses
// ---------------------------------------------------------------------------

fn responses_usage() -> Value {
    json!({
        "input_tokens": PROMPT_TOKENS,
        "output_tokens": COMPLETION_TOKENS,
        "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
        "input_tokens_details": { "cached_tokens": CACHED_TOKENS }
    })
}

fn output_message(text: &str, status: &str) -> Value {
    json!({
        "type": "message",
        "id": "msg_mock",
        "status": status,
        "role": "assistant",
        "content": [{ "type": "output_text", "text": text, "annotations": [] }]
    })
}

fn response_object(model: &str, status: &str, output: Vec<Value>, usage: bool) -> Value {
    let mut body = json!({
        "id": "resp_mock",
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
struct ResponseEvents {
    seq: u64,
}

impl ResponseEvents {
    fn event(&mut self, kind: &str, mut data: Value) -> Bytes {
        data["type"] = Value::from(kind);
        data["sequence_number"] = Value::from(self.seq);
        self.seq += 1;
        sse_event(kind, &data.to_string())
    }

    /// Hot path: deltas are formatted by hand.
    fn delta(&mut self, text: &str) -> Bytes {
        let json = format!(
            "{{\"type\":\"response.output_text.delta\",\"item_id\":\"msg_mock\",\"output_index\":0,\"content_index\":0,\"delta\":{},\"sequence_number\":{}}}",
            json_string(text),
            self.seq
        );
        self.seq += 1;
        sse_event("response.output_text.delta", &json)
    }
}

fn responses_stream(info: &RequestInfo, b: &Behaviour, chunks: usize) -> EventPlan {
    let model = info.model();
    let mut ev = ResponseEvents { seq: 0 };
    let mut plan = EventPlan::default();
    let pending = response_object(model, "in_progress", Vec::new(), false);
    plan.prelude = vec![
        ev.event("response.created", json!({ "response": pending })),
        ev.event("response.in_progress", json!({ "response": pending })),
        ev.event(
            "response.output_item.added",
            json!({ "output_index": 0, "item": output_message("", "in_progress") }),
        ),
        ev.event(
            "response.content_part.added",
            json!({ "item_id": "msg_mock", "output_index": 0, "content_index": 0,
                    "part": { "type": "output_text", "text": "", "annotations": [] } }),
        ),
    ];
    let pieces: Vec<String> = (0..info.delta_count(chunks))
        .map(|i| format!("tok{i} "))
        .collect();
    plan.deltas = pieces.iter().map(|p| ev.delta(p)).collect();
    // The error event replaces everything after the first few deltas.
    let error_seq = plan.prelude.len() + plan.deltas.len().min(MIDSTREAM_ERROR_AFTER);
    let text = pieces.concat();
    let item = output_message(&text, "completed");
    plan.epilogue = vec![
        ev.event(
            "response.output_text.done",
            json!({ "item_id": "msg_mock", "output_index": 0, "content_index": 0, "text": text }),
        ),
        ev.event(
            "response.content_part.done",
            json!({ "item_id": "msg_mock", "output_index": 0, "content_index": 0,
                    "part": { "type": "output_text", "text": text, "annotations": [] } }),
        ),
        ev.event(
            "response.output_item.done",
            json!({ "output_index": 0, "item": item }),
        ),
        ev.event(
            "response.completed",
            json!({ "response": response_object(model, "completed", vec![item], !b.no_usage) }),
        ),
    ];
    plan.error_event = sse_event(
        "error",
        &json!({ "type": "error", "code": "server_error", "message": "overloaded",
                 "param": null, "sequence_number": error_seq })
        .to_string(),
    );
    plan
}

// ---------------------------------------------------------------------------
// Anthropic messages
// ---------------------------------------------------------------------------

fn anthropic_usage(output_tokens: u64) -> Value {
    json!({
        "input_tokens": PROMPT_TOKENS,
        "output_tokens": output_tokens,
        "cache_read_input_tokens": CACHED_TOKENS
    })
}

fn tool_use_block() -> Value {
    json!({ "type": "tool_use", "id": "toolu_mock", "name": "get_weather", "input": { "city": "Paris" } })
}

fn anthropic_message(model: &str, b: &Behaviour) -> Value {
    let (content, stop) = if b.tools {
        let text = json!({ "type": "text", "text": "Let me check." });
        (json!([text, tool_use_block()]), "tool_use")
    } else {
        (json!([{ "type": "text", "text": ANSWER_TEXT }]), "end_turn")
    };
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
fn anthropic_event(kind: &str, mut data: Value) -> Bytes {
    data["type"] = Value::from(kind);
    sse_event(kind, &data.to_string())
}

/// Hot path: text deltas are formatted by hand.
fn anthropic_text_delta(index: usize, text: &str) -> Bytes {
    sse_event(
        "content_block_delta",
        &format!(
            "{{\"type\":\"content_block_delta\",\"index\":{index},\"delta\":{{\"type\":\"text_delta\",\"text\":{}}}}}",
            json_string(text)
        ),
    )
}

fn block_start(index: usize, block: Value) -> Bytes {
    anthropic_event(
        "content_block_start",
        json!({ "index": index, "content_block": block }),
    )
}

fn block_stop(index: usize) -> Bytes {
    anthropic_event("content_block_stop", json!({ "index": index }))
}

fn messages_stream(info: &RequestInfo, b: &Behaviour, chunks: usize) -> EventPlan {
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
    let (last_index, stop_reason) = if b.tools {
        // A short text block first, so clients see text then a tool block.
        plan.prelude.extend([
            block_start(0, json!({ "type": "text", "text": "" })),
            anthropic_event("ping", json!({})),
            anthropic_text_delta(0, "Let me check."),
            block_stop(0),
            block_start(
                1,
                json!({ "type": "tool_use", "id": "toolu_mock", "name": "get_weather", "input": {} }),
            ),
        ]);
        plan.deltas = TOOL_ARG_PARTS
            .iter()
            .map(|part| {
                let delta = json!({ "index": 1, "delta": { "type": "input_json_delta", "partial_json": part } });
                anthropic_event("content_block_delta", delta)
            })
            .collect();
        (1, "tool_use")
    } else {
        plan.prelude.extend([
            block_start(0, json!({ "type": "text", "text": "" })),
            anthropic_event("ping", json!({})),
        ]);
        plan.deltas = (0..info.delta_count(chunks))
            .map(|i| anthropic_text_delta(0, &format!("tok{i} ")))
            .collect();
        (0, "end_turn")
    };
    let mut message_delta =
        json!({ "delta": { "stop_reason": stop_reason, "stop_sequence": null } });
    if !b.no_usage {
        message_delta["usage"] = json!({ "output_tokens": COMPLETION_TOKENS });
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

// ---------------------------------------------------------------------------
// Other endpoints
// ---------------------------------------------------------------------------

/// Number of inputs in an embeddings request: a string or a token array is
/// one input, an array of strings or of token arrays is one per element.
fn embedding_inputs(input: Option<&Value>) -> usize {
    match input {
        Some(Value::Array(items)) if items.iter().all(Value::is_number) && !items.is_empty() => 1,
        Some(Value::Array(items)) => items.len(),
        _ => 1,
    }
}

fn embeddings(body: &[u8], model: &str, b: &Behaviour) -> Value {
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

fn images(b: &Behaviour) -> Value {
    let mut out = json!({ "created": unix_secs(), "data": [{ "b64_json": "aGVsbG8=" }] });
    if !b.no_usage {
        out["usage"] = json!({ "input_tokens": 10, "output_tokens": 0, "total_tokens": 10 });
    }
    out
}

/// Deterministic fake MP3: an ID3 tag then a repeating byte pattern, so a
/// test can compare bytes received through the gateway.
static AUDIO: LazyLock<Bytes> = LazyLock::new(|| {
    let mut data = Vec::with_capacity(AUDIO_BYTES);
    data.extend_from_slice(b"ID3\x04\x00\x00\x00\x00\x00\x00");
    let mut i: u32 = 0;
    while data.len() < AUDIO_BYTES {
        data.push((i.wrapping_mul(31).wrapping_add(7) % 251) as u8);
        i += 1;
    }
    Bytes::from(data)
});

fn models() -> Value {
    json!({
        "object": "list",
        "data": [
            { "id": "mock-gpt", "object": "model", "created": 0, "owned_by": "mock" },
            { "id": "claude-mock", "object": "model", "created": 0, "owned_by": "mock" }
        ]
    })
}

/// Answer a model endpoint (everything but control routes and failures).
fn model_reply(
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
            let output = vec![output_message(ANSWER_TEXT, "completed")];
            Reply::ok(&response_object(model, "completed", output, !b.no_usage))
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
        Route::MockRequests | Route::MockStats | Route::MockFail | Route::NotFound => not_found(),
    }
}

// ---------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------

/// Yield between frames so hyper flushes each one as its own write (like a
/// real provider), or sleep when `--chunk-delay-ms` asks for pacing.
async fn pause(delay: Duration) {
    if delay.is_zero() {
        tokio::task::yield_now().await;
    } else {
        tokio::time::sleep(delay).await;
    }
}

/// A body that sends the steps one frame at a time; `Abort` fails the body,
/// which makes hyper drop the connection without the final chunk.
fn paced_body(steps: Vec<Step>, delay: Duration) -> BoxedBody {
    let frames = stream::iter(steps.into_iter().enumerate()).then(move |(i, step)| async move {
        if i > 0 {
            pause(delay).await;
        }
        match step {
            Step::Data(bytes) => Ok(Frame::data(bytes)),
            Step::Abort => Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "mock: connection cut on purpose",
            )),
        }
    });
    StreamBody::new(frames).boxed_unsync()
}

fn full_body(bytes: Bytes) -> BoxedBody {
    Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn content_type(value: &'static str) -> (HeaderName, HeaderValue) {
    (CONTENT_TYPE, HeaderValue::from_static(value))
}

/// Build the response; `cut` non-streamed answers announce the full length
/// but send only half of it before dropping the connection.
fn render(
    reply: Reply,
    b: &Behaviour,
    chunk_delay: Duration,
) -> Result<Response<BoxedBody>, http::Error> {
    // What real providers add to their answers, none of which may reach a gateway's client:
    // a cookie, the provider account's organization and its own rate-limit state.
    let mut builder = Response::builder()
        .header(
            "set-cookie",
            "__cf_bm=mock-provider-cookie; path=/; HttpOnly",
        )
        .header("openai-organization", "org-mock")
        .header("x-ratelimit-limit-requests", "5000")
        .header("x-ratelimit-remaining-requests", "4999")
        .header("anthropic-ratelimit-requests-limit", "4000");
    let body = match reply {
        Reply::Json {
            status,
            body,
            retry_after,
        } => {
            builder = builder
                .status(status)
                .header(CONTENT_TYPE, "application/json");
            if let Some(secs) = retry_after {
                builder = builder.header("retry-after", secs);
            }
            if b.cut && status.is_success() {
                builder = builder.header(CONTENT_LENGTH, body.len());
                let half = body.slice(..body.len() / 2);
                paced_body(vec![Step::Data(half), Step::Abort], Duration::ZERO)
            } else {
                full_body(body)
            }
        }
        Reply::Audio(audio) => {
            let (name, value) = content_type("audio/mpeg");
            builder = builder.header(name, value);
            let frame_len = audio.len().div_ceil(AUDIO_FRAMES).max(1);
            let mut steps: Vec<Step> = (0..audio.len())
                .step_by(frame_len)
                .map(|start| Step::Data(audio.slice(start..(start + frame_len).min(audio.len()))))
                .collect();
            if b.cut {
                builder = builder.header(CONTENT_LENGTH, audio.len());
                steps.truncate(steps.len() / 2);
                steps.push(Step::Abort);
            }
            paced_body(steps, Duration::ZERO)
        }
        Reply::Events(plan) => {
            builder = builder
                .header(CONTENT_TYPE, "text/event-stream")
                .header("cache-control", "no-cache");
            paced_body(assemble(plan, b), chunk_delay)
        }
        // Sent as recorded: none of the mock's own headers.
        Reply::Replay(answer) => return replay::render(answer, chunk_delay),
    };
    builder.body(body)
}

/// Last-resort 500 when building a response failed.
fn internal_error() -> Response<BoxedBody> {
    let body = error_value("mock internal error", "server_error").to_string();
    let mut response = Response::new(full_body(Bytes::from(body)));
    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

// ---------------------------------------------------------------------------
// Request handling
// ---------------------------------------------------------------------------

fn header_map(headers: &http::HeaderMap) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in headers {
        let value = String::from_utf8_lossy(value.as_bytes());
        out.entry(name.as_str().to_owned())
            .and_modify(|v| {
                v.push_str(", ");
                v.push_str(&value);
            })
            .or_insert_with(|| value.into_owned());
    }
    out
}

fn make_record(parts: &http::request::Parts, body: &Bytes, served_at_ms: u64) -> Record {
    let text = if body.len() <= MAX_RECORDED_BODY {
        std::str::from_utf8(body).ok().map(str::to_owned)
    } else {
        None
    };
    Record {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().map(str::to_owned),
        headers: header_map(&parts.headers),
        body_len: body.len(),
        body_sha256: hex::encode(Sha256::digest(body)),
        body: text,
        served_at_ms,
    }
}

fn control_reply(route: Route, method: &Method, body: &[u8], state: &State) -> Reply {
    match (route, method) {
        (Route::MockFail, &Method::DELETE) => {
            *lock(&state.scripted) = None;
            Reply::ok(&json!({ "ok": true }))
        }
        (Route::MockFail, _) => match serde_json::from_slice::<Scripted>(body) {
            Ok(s) if StatusCode::from_u16(s.status).is_ok_and(|c| c.as_u16() >= 200) => {
                *lock(&state.scripted) = (s.count > 0).then_some(s);
                Reply::ok(&json!({ "ok": true }))
            }
            _ => Reply::json(
                StatusCode::BAD_REQUEST,
                &error_value(
                    "expected {\"status\":200..599,\"count\":n,\"retry_after\":secs}",
                    "invalid_request_error",
                ),
            ),
        },
        (Route::MockRequests, &Method::DELETE) => {
            lock(&state.records).clear();
            Reply::ok(&json!({ "ok": true }))
        }
        (Route::MockRequests, _) => {
            let records = lock(&state.records);
            match serde_json::to_vec(&*records) {
                Ok(body) => Reply::Json {
                    status: StatusCode::OK,
                    body: Bytes::from(body),
                    retry_after: None,
                },
                Err(_) => Reply::json(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &error_value("cannot encode records", "server_error"),
                ),
            }
        }
        _ => Reply::ok(&state.stats_json()),
    }
}

/// Read the whole request body, refusing more than `MAX_BODY_BYTES`.
async fn read_body(body: Incoming) -> Result<Bytes, Reply> {
    match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(Reply::json(
            StatusCode::PAYLOAD_TOO_LARGE,
            &error_value("request body too large", "invalid_request_error"),
        )),
        Err(_) => Err(Reply::json(
            StatusCode::BAD_REQUEST,
            &error_value("could not read request body", "invalid_request_error"),
        )),
    }
}

/// Work out the reply and its behaviour for one request.
async fn answer(
    route: Route,
    parts: &http::request::Parts,
    body: Incoming,
    state: &State,
) -> (Reply, Behaviour) {
    let received_ms = unix_millis();
    let body = match read_body(body).await {
        Ok(body) => body,
        Err(reply) => return (reply, Behaviour::default()),
    };
    if route.is_control() && route.method_allowed(&parts.method) {
        return (
            control_reply(route, &parts.method, &body, state),
            Behaviour::default(),
        );
    }
    if state.config.record && !route.is_control() {
        let record = make_record(parts, &body, received_ms);
        lock(&state.records).push(record);
    }
    if route != Route::Health {
        if let Some(s) = state.take_scripted() {
            let mut reply = failure_reply(Failure::Status(
                StatusCode::from_u16(s.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            ));
            if let Reply::Json { retry_after, .. } = &mut reply {
                *retry_after = s.retry_after;
            }
            return (reply, Behaviour::default());
        }
    }
    let info = RequestInfo::parse(&body);
    if let Some(recorded) = replay::answer(state.config.fixtures.as_deref(), info.model()) {
        return (Reply::Replay(recorded), Behaviour::default());
    }
    let behaviour = select_behaviour(info.model(), forced_status(&parts.headers));
    let mut delay = state.config.latency;
    if behaviour.slow {
        delay += SLOW_DELAY;
    }
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let reply = if route == Route::NotFound {
        not_found()
    } else if !route.method_allowed(&parts.method) {
        Reply::json(
            StatusCode::METHOD_NOT_ALLOWED,
            &error_value("method not allowed", "invalid_request_error"),
        )
    } else if let Some(failure) = behaviour.failure {
        failure_reply(failure)
    } else {
        model_reply(route, &info, &body, &behaviour, &state.config)
    };
    (reply, behaviour)
}

async fn handle(
    req: Request<Incoming>,
    state: Arc<State>,
) -> Result<Response<BoxedBody>, Infallible> {
    let (parts, body) = req.into_parts();
    let route = Route::from_path(parts.uri.path());
    let (reply, behaviour) = answer(route, &parts, body, &state).await;
    let response = render(reply, &behaviour, state.config.chunk_delay).unwrap_or_else(|e| {
        eprintln!("mock-provider: cannot build response: {e}");
        internal_error()
    });
    if route.counts_as_served() {
        state.count_served(parts.uri.path());
    }
    Ok(response)
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    state: Arc<State>,
    tls: Option<pingora_rustls::TlsAcceptor>,
) {
    // Small SSE frames must leave immediately, not wait for Nagle.
    let _ = stream.set_nodelay(true);
    match tls {
        None => serve_io(stream, state).await,
        Some(acceptor) => match acceptor.accept(stream).await {
            Ok(stream) => serve_io(stream, state).await,
            // Untrusting clients hang up here; that is what TLS tests provoke.
            Err(e) => eprintln!("mock-provider: TLS handshake failed: {e}"),
        },
    }
}

async fn serve_io<S>(stream: S, state: Arc<State>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req| handle(req, Arc::clone(&state)));
    // Errors here are clients going away or our own deliberate cuts.
    let _ = http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

async fn accept_loop(
    listener: TcpListener,
    state: Arc<State>,
    tls: Option<pingora_rustls::TlsAcceptor>,
) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                state.connections.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(serve_connection(stream, Arc::clone(&state), tls.clone()));
            }
            Err(e) => {
                // Typically EMFILE under load: back off instead of spinning.
                eprintln!("mock-provider: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Resolve on SIGINT or SIGTERM so the process exits 0 when a test kills it.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

async fn run(cli: Cli) -> io::Result<()> {
    if let Some(dir) = &cli.fixtures {
        replay::check_dir(dir)?;
    }
    let tls = match (&cli.tls_cert, &cli.tls_key) {
        (Some(cert), Some(key)) => Some(tls::acceptor(cert, key)?),
        _ => None,
    };
    let listener = TcpListener::bind(cli.listen)
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {}: {e}", cli.listen)))?;
    let addr = listener.local_addr()?;
    let mut stdout = io::stdout().lock();
    writeln!(stdout, "LISTENING {addr}")?;
    stdout.flush()?;
    drop(stdout);
    let state = Arc::new(State::new(Config {
        chunks: cli.chunks,
        chunk_delay: Duration::from_millis(cli.chunk_delay_ms),
        latency: Duration::from_millis(cli.latency_ms),
        record: !cli.no_record,
        fixtures: cli.fixtures.clone(),
    }));
    tokio::select! {
        _ = accept_loop(listener, state, tls) => {}
        _ = shutdown_signal() => {}
    }
    Ok(())
}

/// Runs the mock provider with the process's command line (the `mock-provider` binary).
pub fn main() {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cli.workers.max(1))
        .enable_all()
        .build()
        .expect("mock-provider: failed to build the tokio runtime");
    if let Err(e) = runtime.block_on(run(cli)) {
        eprintln!("mock-provider: {e}");
        std::process::exit(1);
    }
    // Do not wait for in-flight (possibly slow) responses on shutdown.
    runtime.shutdown_background();
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let info =
            request(r#"{"model":"m\"q","stream":true,"stream_options":{"include_usage":true}}"#);
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
}
