//! One developer request's spans, when telemetry is on: the server span (GenAI and HTTP
//! attributes), the admission span (the spec's checks and the quota reservation, which is an
//! event on it), a client span per upstream attempt whose context the provider receives in
//! `traceparent`, and the first byte and the settlement as events on the server span.
//!
//! Phases that cannot fail on their own and take microseconds are events rather than spans:
//! every span is built, queued, encoded and sent, and with every request sampled that work is
//! a measurable share of the request.
//!
//! With telemetry off, [`begin`] returns `None` and every other step is skipped by the caller's
//! `if let`: no span, no allocation. Nothing secret is recorded: ids (key, account, request),
//! names (model, deployment), counts; never a key, a header value, a prompt or an answer (with
//! `[telemetry] capture_sizes`, their sizes in bytes).

use std::borrow::Cow;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use gateway_core::domain::ProviderStyle;
use gateway_telemetry::{KeyValue, SdkSpan, Span, SpanKind, Status, Tracer};
use opentelemetry::trace::TraceContextExt;
use opentelemetry::Context;

use crate::ctx::RequestCtx;
use crate::pipeline::Admitted;
use crate::route::Endpoint;
use crate::routing::Target;
use crate::Session;

/// The spans of one request under way.
pub struct RequestTrace {
    telemetry: &'static gateway_telemetry::Telemetry,
    server: SdkSpan,
    /// The server span as the parent of the request's other spans.
    cx: Context,
    /// The trace id (32 hex digits), for the access line.
    pub trace_id: String,
    started: SystemTime,
    /// When settlement began.
    settled_at: Option<SystemTime>,
    /// What the answering deployment was asked: its provider and model.
    answered: OnceLock<(&'static str, String)>,
    cached_tokens: u64,
    finish_reasons: Vec<String>,
}

/// Starts the request's server span, as a child of the client's `traceparent` when it sent
/// one; `None` when telemetry is off.
pub fn begin(session: &Session) -> Option<Box<RequestTrace>> {
    let telemetry = gateway_telemetry::get()?;
    let req = session.req_header();
    let parent = if req.headers.contains_key(&TRACEPARENT) {
        telemetry.parent_from(&req.headers)
    } else {
        Context::new()
    };
    let started = SystemTime::now();
    let method: Cow<'static, str> = match req.method.as_str() {
        "POST" => Cow::Borrowed("POST"),
        "GET" => Cow::Borrowed("GET"),
        other => Cow::Owned(other.to_owned()),
    };
    // Room for every attribute `finish` adds: the list is not grown on the way.
    let mut attrs = Vec::with_capacity(SERVER_ATTRIBUTES);
    attrs.extend([
        KeyValue::new("http.request.method", method.clone()),
        KeyValue::new("url.path", req.uri.path().to_owned()),
        KeyValue::new("url.scheme", "http"),
        KeyValue::new("network.protocol.version", "1.1"),
    ]);
    let builder = telemetry
        .tracer()
        .span_builder(method)
        .with_kind(SpanKind::Server)
        .with_start_time(started)
        .with_attributes(attrs);
    let server = telemetry.tracer().build_with_context(builder, &parent);
    let span_context = server.span_context().clone();
    Some(Box::new(RequestTrace {
        telemetry,
        trace_id: gateway_telemetry::trace_id_hex(&span_context),
        cx: Context::new().with_remote_span_context(span_context),
        server,
        started,
        settled_at: None,
        answered: OnceLock::new(),
        cached_tokens: 0,
        finish_reasons: Vec::new(),
    }))
}

/// Parsed once: a header name given as text is parsed on every lookup.
const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");

/// `a b`, as span names are (`chat gpt-4o`); `format!` costs several times as much.
fn spaced(a: &str, b: &str) -> String {
    let mut s = String::with_capacity(a.len() + 1 + b.len());
    s.push_str(a);
    s.push(' ');
    s.push_str(b);
    s
}

/// The most attributes a server span carries.
const SERVER_ATTRIBUTES: usize = 24;
/// The most attributes an attempt span carries.
const ATTEMPT_ATTRIBUTES: usize = 10;

/// A phase of the request (admission) under way.
pub struct Phase(SdkSpan);

impl Phase {
    /// Ends the phase; `error` is the gateway's error code when the phase refused the request.
    pub fn end(mut self, error: Option<&'static str>) {
        if let Some(code) = error {
            self.0.set_attribute(KeyValue::new("error.type", code));
            self.0.set_status(Status::error(code));
        }
        self.0.end();
    }

    pub fn set(&mut self, kv: KeyValue) {
        self.0.set_attribute(kv);
    }

    /// Marks the moment a step of the phase begins (`gateway.quota.reserve`).
    pub fn mark(&mut self, name: &'static str) {
        self.0.add_event(name, Vec::new());
    }
}

/// One upstream attempt: a client span, ended with its outcome.
pub struct Attempt(SdkSpan);

impl Attempt {
    /// The W3C headers that make this attempt the parent of the provider's work.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        gateway_telemetry::get()
            .map(|t| t.headers_for(self.0.span_context()))
            .unwrap_or_default()
    }

    /// Ends the attempt: `outcome` is `ok`, `request_error`, `failover`, the failure's label,
    /// or how the relay ended; `status` the provider's HTTP status when it answered.
    pub fn end(mut self, outcome: &'static str, status: Option<u16>) {
        self.0
            .set_attribute(KeyValue::new("gateway.attempt.outcome", outcome));
        if let Some(s) = status {
            self.0
                .set_attribute(KeyValue::new("http.response.status_code", i64::from(s)));
        }
        let failed = !matches!(outcome, "ok" | "complete" | "request_error");
        if failed {
            self.0.set_attribute(KeyValue::new("error.type", outcome));
            self.0.set_status(Status::error(outcome));
        }
        self.0.end();
    }
}

impl RequestTrace {
    /// Starts a phase span (`gateway.admission`).
    pub fn phase(&self, name: &'static str) -> Phase {
        let builder = self
            .telemetry
            .tracer()
            .span_builder(name)
            .with_kind(SpanKind::Internal);
        Phase(
            self.telemetry
                .tracer()
                .build_with_context(builder, &self.cx),
        )
    }

    /// Starts the client span of attempt `n` (0-based) at `target`.
    pub fn attempt(&self, target: &Target, n: usize, adm: &Admitted) -> Attempt {
        let p = &target.provider;
        let model = target.upstream_model.as_deref().unwrap_or(&adm.model_name);
        let mut attrs = Vec::with_capacity(ATTEMPT_ATTRIBUTES);
        attrs.extend([
            KeyValue::new("gen_ai.provider.name", provider_name(p.style)),
            KeyValue::new("gateway.deployment", target.label().to_owned()),
            KeyValue::new("gateway.attempt", n as i64 + 1),
            KeyValue::new("server.address", p.host.clone()),
            KeyValue::new("server.port", i64::from(p.port)),
        ]);
        if !model.is_empty() {
            attrs.push(KeyValue::new("gen_ai.request.model", model.to_owned()));
        }
        let name = match operation(adm.endpoint) {
            Some(op) if !model.is_empty() => spaced(op, model),
            _ => spaced("attempt", target.label()),
        };
        let builder = self
            .telemetry
            .tracer()
            .span_builder(name)
            .with_kind(SpanKind::Client)
            .with_attributes(attrs);
        Attempt(
            self.telemetry
                .tracer()
                .build_with_context(builder, &self.cx),
        )
    }

    /// Notes which deployment gave the answer the client gets.
    pub fn answered_by(&self, target: &Target, adm: &Admitted) {
        let model = target.upstream_model.as_deref().unwrap_or(&adm.model_name);
        let _ = self
            .answered
            .set((provider_name(target.provider.style), model.to_owned()));
    }

    /// Notes what admission learnt: the operation, the model, whether streamed.
    pub fn admitted(&mut self, adm: &Admitted) {
        let s = &mut self.server;
        if let Some(op) = operation(adm.endpoint) {
            s.set_attribute(KeyValue::new("gen_ai.operation.name", op));
        }
        if !adm.model_name.is_empty() {
            s.set_attribute(KeyValue::new(
                "gen_ai.request.model",
                adm.model_name.clone(),
            ));
        }
        if !adm.endpoint.is_get() {
            s.set_attribute(KeyValue::new("gateway.stream", adm.stream));
        }
        if self.telemetry.capture_sizes && !adm.body.is_empty() {
            s.set_attribute(KeyValue::new(
                "http.request.body.size",
                adm.body.len() as i64,
            ));
        }
    }

    /// Notes that settlement begins (an event on the server span).
    pub fn settling(&mut self) {
        self.settled_at = Some(SystemTime::now());
    }

    /// Whether the request's spans are recorded (sampled): what is read only for them
    /// (the finish reasons) is skipped otherwise.
    pub fn recording(&self) -> bool {
        self.server.is_recording()
    }

    /// Notes the settled usage that the access line does not carry.
    pub fn settled(&mut self, cached_tokens: u64, finish_reasons: Vec<String>) {
        self.cached_tokens = cached_tokens;
        self.finish_reasons = finish_reasons;
    }

    /// Ends the server span with what the request came to.
    pub fn finish(mut self, ctx: &RequestCtx) {
        let s = &mut self.server;
        if let Some(e) = ctx.endpoint {
            s.set_attribute(KeyValue::new("http.route", e.path()));
        }
        s.set_attribute(KeyValue::new("gateway.request_id", ctx.request_id.clone()));
        s.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(ctx.status),
        ));
        if let Some(who) = &ctx.identity {
            s.set_attribute(KeyValue::new("gateway.key.id", who.key.id.clone()));
            s.set_attribute(KeyValue::new("gateway.account.id", who.user.id.clone()));
        }
        if let Some((provider, model)) = self.answered.take() {
            s.set_attribute(KeyValue::new("gen_ai.provider.name", provider));
            s.set_attribute(KeyValue::new("gen_ai.response.model", model));
        }
        if let Some(d) = &ctx.deployment {
            s.set_attribute(KeyValue::new("gateway.deployment", d.clone()));
        }
        if ctx.input_tokens > 0 || ctx.output_tokens > 0 {
            s.set_attribute(KeyValue::new(
                "gen_ai.usage.input_tokens",
                ctx.input_tokens as i64,
            ));
            s.set_attribute(KeyValue::new(
                "gen_ai.usage.output_tokens",
                ctx.output_tokens as i64,
            ));
            s.set_attribute(KeyValue::new(
                "gen_ai.usage.cache_read.input_tokens",
                self.cached_tokens as i64,
            ));
        }
        if !self.finish_reasons.is_empty() {
            let reasons = std::mem::take(&mut self.finish_reasons);
            s.set_attribute(KeyValue::new(
                "gen_ai.response.finish_reasons",
                opentelemetry::Value::Array(opentelemetry::Array::String(
                    reasons.into_iter().map(Into::into).collect(),
                )),
            ));
        }
        if let Some(ms) = ctx.ttfb_ms {
            let at = self.started + Duration::from_millis(ms);
            s.add_event_with_timestamp(
                "gateway.first_byte",
                at,
                vec![KeyValue::new("gateway.ttfb_ms", ms as i64)],
            );
        }
        if let Some(at) = self.settled_at {
            s.add_event_with_timestamp("gateway.settle", at, Vec::new());
        }
        let name = match (ctx.endpoint.and_then(operation), ctx.model.as_deref()) {
            (Some(op), Some(model)) => Some(Cow::Owned(spaced(op, model))),
            _ => ctx
                .endpoint
                .map(|e| Cow::Owned(spaced(method_of(e), e.path()))),
        };
        if let Some(name) = name {
            s.update_name(name);
        }
        if let Some(code) = ctx.error_code {
            s.set_attribute(KeyValue::new("error.type", code));
            s.set_attribute(KeyValue::new("gateway.error_code", code));
        }
        if ctx.status >= 500 || (ctx.error_code.is_some() && ctx.status >= 400) {
            s.set_status(Status::error(ctx.error_code.unwrap_or("error")));
        }
        s.end();
    }
}

/// `gen_ai.operation.name` for an endpoint that runs a model.
fn operation(e: Endpoint) -> Option<&'static str> {
    match e {
        Endpoint::ChatCompletions | Endpoint::Messages | Endpoint::Responses => Some("chat"),
        Endpoint::Embeddings => Some("embeddings"),
        Endpoint::Images | Endpoint::Speech => Some("generate_content"),
        Endpoint::CountTokens => Some("count_tokens"),
        Endpoint::Search | Endpoint::WebFetch => Some("execute_tool"),
        Endpoint::Models | Endpoint::Model | Endpoint::ModelInfo => None,
    }
}

fn method_of(e: Endpoint) -> &'static str {
    if e.is_get() {
        "GET"
    } else {
        "POST"
    }
}

/// `gen_ai.provider.name` of the GenAI semantic conventions for a provider style.
fn provider_name(style: ProviderStyle) -> &'static str {
    match style {
        ProviderStyle::OpenAi => "openai",
        ProviderStyle::Anthropic => "anthropic",
        ProviderStyle::Azure => "azure.ai.openai",
        ProviderStyle::Bedrock => "aws.bedrock",
        ProviderStyle::VertexAnthropic => "gcp.vertex_ai",
        ProviderStyle::Gemini => "gcp.gemini",
    }
}
