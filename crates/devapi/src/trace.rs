//! One developer request's spans, when telemetry is on: the server span (GenAI and HTTP
//! attributes), the admission span (the spec's checks and the quota reservation, which is an
//! event on it), a client span per upstream attempt whose context the provider receives in
//! `traceparent`, and the first byte and the settlement as events on the server span.
//!
//! Phases that cannot fail on their own and take microseconds are events rather than spans:
//! every span is built, queued, encoded and sent, and with every request sampled that work is
//! a measurable share of the request.
//!
//! Each span is a [`SpanRecord`] whose attributes are written in their wire form as they are set,
//! and which is written into its thread's export batch when it ends. A request whose trace is
//! not sampled records nothing; its ids still reach the provider.
//!
//! With telemetry off, [`begin`] returns `None` and every other step is skipped by the caller's
//! `if let`: no span, no allocation. Nothing secret is recorded: ids (key, account, request),
//! names (model, deployment), counts; never a key, a header value, a prompt or an answer (with
//! `[telemetry] capture_sizes`, their sizes in bytes).

use std::borrow::Cow;
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;

use gateway_core::domain::ProviderStyle;
use gateway_telemetry::{
    Attr, Attributes, SpanContext, SpanKind, SpanRecord, Telemetry, Timestamp, TraceHeaders,
};

use crate::ctx::RequestCtx;
use crate::pipeline::Admitted;
use crate::route::Endpoint;
use crate::routing::Target;
use crate::usage::FinishReasons;
use crate::Session;

/// The spans of one request under way.
pub struct RequestTrace {
    telemetry: &'static Telemetry,
    /// The server span's context: the parent of the request's other spans.
    context: SpanContext,
    /// The server span, filled in as the request goes; `None` when the trace is not sampled
    /// (its context still reaches the provider, unsampled).
    server: Option<SpanRecord>,
    /// The trace id (32 hex digits), for the access line.
    pub trace_id: gateway_telemetry::TraceIdHex,
    started: Timestamp,
    /// When settlement began.
    settled_at: Option<Timestamp>,
    /// The attributes of the deployment that gave the answer.
    answered: OnceLock<Arc<DeploymentAttributes>>,
    cached_tokens: u64,
    finish_reasons: FinishReasons,
}

/// Ends `span` now and hands it to the export.
fn ended(telemetry: &Telemetry, mut span: SpanRecord) {
    span.end = Timestamp::now();
    telemetry.submit(&span);
}

/// Starts the request's server span, as a child of the client's `traceparent` when it sent
/// one; `None` when telemetry is off.
pub fn begin(session: &Session) -> Option<Box<RequestTrace>> {
    let telemetry = gateway_telemetry::get()?;
    let req = session.req_header();
    let parent = if req.headers.contains_key(&TRACEPARENT) {
        telemetry.parent_from(&req.headers)
    } else {
        None
    };
    let context = telemetry.server_context(parent.as_ref());
    let started = Timestamp::now();
    let server = context.is_sampled().then(|| {
        let method = req.method.as_str();
        let name = match method {
            "POST" => "POST",
            "GET" => "GET",
            _ => "HTTP",
        };
        let mut span = SpanRecord::start(
            context.clone(),
            parent.as_ref().map(|p| (p, true)),
            name,
            SpanKind::Server,
            started,
        );
        match method {
            "POST" => span.set_all(&OVER_HTTP[0]),
            "GET" => span.set_all(&OVER_HTTP[1]),
            _ => {
                span.set("http.request.method", method);
                span.set_all(&OVER_HTTP[2]);
            }
        }
        span.set("url.path", req.uri.path());
        span
    });
    Some(Box::new(RequestTrace {
        telemetry,
        trace_id: gateway_telemetry::TraceIdHex::of(&context),
        context,
        server,
        started,
        settled_at: None,
        answered: OnceLock::new(),
        cached_tokens: 0,
        finish_reasons: FinishReasons::default(),
    }))
}

/// The server span's attributes that every request over the developer API's HTTP/1.1 carries
/// alike: for `POST`, for `GET`, and (without the method) for any other method.
static OVER_HTTP: LazyLock<[Attributes; 3]> = LazyLock::new(|| {
    let common = [
        ("url.scheme", Attr::Str("http")),
        ("network.protocol.version", Attr::Str("1.1")),
    ];
    let with = |method: &'static str| {
        let mut all = vec![("http.request.method", Attr::Str(method))];
        all.extend(common);
        Attributes::new(&all)
    };
    [with("POST"), with("GET"), Attributes::new(&common)]
});

/// The attributes a deployment's spans carry alike, written once (per thread) rather than for
/// every attempt and answer: an attempt's provider, deployment, address and model, and the
/// answer's provider, model and deployment.
struct DeploymentAttributes {
    /// What these were written from, held so that the addresses compared stay theirs.
    provider: Arc<gateway_core::config::Provider>,
    label: Arc<str>,
    model: Option<Arc<str>>,
    attempt: Attributes,
    /// Ends with `gateway.deployment`.
    answer: Attributes,
}

/// Deployments whose attributes a thread keeps.
const DEPLOYMENTS_KEPT: usize = 16;

thread_local! {
    /// The deployments this thread traced last, the latest first. A config reload makes new
    /// providers, which are written anew; the old ones leave as new ones come.
    static DEPLOYMENTS: std::cell::RefCell<Vec<Arc<DeploymentAttributes>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

impl DeploymentAttributes {
    fn of(target: &Target) -> Arc<Self> {
        let same = |d: &DeploymentAttributes| {
            Arc::ptr_eq(&d.provider, &target.provider)
                && Arc::ptr_eq(&d.label, &target.label)
                && match (&d.model, &target.upstream_model) {
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    (None, None) => true,
                    _ => false,
                }
        };
        DEPLOYMENTS.with_borrow_mut(|kept| {
            if let Some(d) = kept.iter().find(|d| same(d)) {
                return d.clone();
            }
            let d = Arc::new(Self::new(target));
            kept.insert(0, d.clone());
            kept.truncate(DEPLOYMENTS_KEPT);
            d
        })
    }

    fn new(target: &Target) -> Self {
        let p = &target.provider;
        let provider = ("gen_ai.provider.name", Attr::Str(provider_name(p.style)));
        let deployment = ("gateway.deployment", Attr::Str(target.label()));
        let model = target.upstream_model.as_deref().filter(|m| !m.is_empty());
        let mut attempt = vec![
            provider,
            deployment,
            ("server.address", Attr::Str(p.host.as_str())),
            ("server.port", Attr::Int(i64::from(p.port))),
        ];
        let mut answer = vec![provider];
        if let Some(m) = model {
            attempt.push(("gen_ai.request.model", Attr::Str(m)));
            answer.push(("gen_ai.response.model", Attr::Str(m)));
        }
        answer.push(deployment);
        DeploymentAttributes {
            provider: p.clone(),
            label: target.label.clone(),
            model: target.upstream_model.clone(),
            attempt: Attributes::new(&attempt),
            answer: Attributes::new(&answer),
        }
    }
}

/// The server span's attributes that follow from the endpoint: its route and operation.
static BY_ENDPOINT: LazyLock<Vec<Attributes>> = LazyLock::new(|| {
    let mut all = vec![Attributes::new(&[]); Endpoint::ALL.len()];
    for e in Endpoint::ALL {
        let mut attributes = vec![("http.route", Attr::Str(e.path()))];
        if let Some(op) = operation(e) {
            attributes.push(("gen_ai.operation.name", Attr::Str(op)));
        }
        if let Some(slot) = all.get_mut(e as usize) {
            *slot = Attributes::new(&attributes);
        }
    }
    all
});

/// Parsed once: a header name given as text is parsed on every lookup.
const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");

/// A phase of the request (admission) under way; empty when the trace is not sampled. One
/// dropped without [`Phase::end`] still ends (without an outcome), as an SDK span would.
pub struct Phase(Option<(&'static Telemetry, SpanRecord)>);

impl Phase {
    /// Ends the phase; `error` is the gateway's error code when the phase refused the request.
    pub fn end(mut self, error: Option<&'static str>) {
        let Some((telemetry, mut span)) = self.0.take() else {
            return;
        };
        if let Some(code) = error {
            span.set("error.type", code);
            span.error = Some(Cow::Borrowed(code));
        }
        ended(telemetry, span);
    }

    /// Marks the moment a step of the phase begins (`gateway.quota.reserve`).
    pub fn mark(&mut self, name: &'static str) {
        if let Some((_, span)) = &mut self.0 {
            span.event(name, Timestamp::now(), &[]);
        }
    }
}

impl Drop for Phase {
    fn drop(&mut self) {
        if let Some((telemetry, span)) = self.0.take() {
            ended(telemetry, span);
        }
    }
}

/// One upstream attempt: a client span, ended with its outcome (or, dropped without
/// [`Attempt::end`], without one).
pub struct Attempt {
    telemetry: &'static Telemetry,
    /// The W3C headers that make this attempt the parent of the provider's work.
    headers: TraceHeaders,
    /// `None` when the trace is not sampled.
    span: Option<SpanRecord>,
}

impl Attempt {
    /// The W3C headers that make this attempt the parent of the provider's work.
    pub fn headers(&self) -> impl Iterator<Item = (&'static str, Cow<'_, str>)> {
        self.headers.iter()
    }

    /// Ends the attempt: `outcome` is `ok`, `request_error`, `failover`, the failure's label,
    /// or how the relay ended; `status` the provider's HTTP status when it answered.
    pub fn end(mut self, outcome: &'static str, status: Option<u16>) {
        let Some(mut span) = self.span.take() else {
            return;
        };
        span.set("gateway.attempt.outcome", outcome);
        if let Some(s) = status {
            span.set("http.response.status_code", i64::from(s));
        }
        let failed = !matches!(outcome, "ok" | "complete" | "request_error");
        if failed {
            span.set("error.type", outcome);
            span.error = Some(Cow::Borrowed(outcome));
        }
        ended(self.telemetry, span);
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if let Some(span) = self.span.take() {
            ended(self.telemetry, span);
        }
    }
}

impl RequestTrace {
    /// A span under the server span, when the trace is sampled.
    fn child(
        &self,
        context: &SpanContext,
        name: impl Into<Cow<'static, str>>,
        kind: SpanKind,
    ) -> SpanRecord {
        SpanRecord::start(
            context.clone(),
            Some((&self.context, false)),
            name,
            kind,
            Timestamp::now(),
        )
    }

    fn child_context(&self) -> SpanContext {
        gateway_telemetry::child(
            self.context.trace_id(),
            self.context.is_sampled(),
            self.context.trace_state(),
        )
    }

    /// Starts a phase span (`gateway.admission`).
    pub fn phase(&self, name: &'static str) -> Phase {
        if self.server.is_none() {
            return Phase(None);
        }
        let context = self.child_context();
        let span = self.child(&context, name, SpanKind::Internal);
        Phase(Some((self.telemetry, span)))
    }

    /// Starts the client span of attempt `n` (0-based) at `target`.
    pub fn attempt(&self, target: &Target, n: usize, adm: &Admitted) -> Attempt {
        let context = self.child_context();
        let span = self.server.as_ref().map(|_| {
            let model = target.upstream_model.as_deref().unwrap_or(&adm.model_name);
            let mut span = self.child(&context, "", SpanKind::Client);
            match operation(adm.endpoint) {
                Some(op) if !model.is_empty() => span.set_name_spaced(op, model),
                _ => span.set_name_spaced("attempt", target.label()),
            }
            let deployment = DeploymentAttributes::of(target);
            span.set_all(&deployment.attempt);
            span.set("gateway.attempt", n as i64 + 1);
            if target.upstream_model.is_none() && !model.is_empty() {
                span.set("gen_ai.request.model", model);
            }
            span
        });
        Attempt {
            telemetry: self.telemetry,
            headers: self.telemetry.headers_for(&self.trace_id, &context),
            span,
        }
    }

    /// Notes which deployment gave the answer the client gets.
    pub fn answered_by(&self, target: &Target) {
        if self.server.is_none() {
            return;
        }
        let _ = self.answered.set(DeploymentAttributes::of(target));
    }

    /// Notes what admission learnt: the model, whether streamed.
    pub fn admitted(&mut self, adm: &Admitted) {
        let Some(s) = &mut self.server else {
            return;
        };
        if !adm.model_name.is_empty() {
            s.set("gen_ai.request.model", adm.model_name.as_str());
        }
        if !adm.endpoint.is_get() {
            s.set("gateway.stream", adm.stream);
        }
        if self.telemetry.capture_sizes && !adm.body.is_empty() {
            s.set("http.request.body.size", adm.body.len() as i64);
        }
    }

    /// Notes that settlement begins (an event on the server span).
    pub fn settling(&mut self) {
        if self.server.is_some() {
            self.settled_at = Some(Timestamp::now());
        }
    }

    /// Whether the request's spans are recorded (sampled): what is read only for them
    /// (the finish reasons) is skipped otherwise.
    pub fn recording(&self) -> bool {
        self.server.is_some()
    }

    /// Notes the settled usage that the access line does not carry.
    pub fn settled(&mut self, cached_tokens: u64, finish_reasons: FinishReasons) {
        self.cached_tokens = cached_tokens;
        self.finish_reasons = finish_reasons;
    }

    /// Ends the server span with what the request came to.
    pub fn finish(mut self, ctx: &RequestCtx) {
        let Some(mut s) = self.server.take() else {
            return;
        };
        if let Some(attributes) = ctx.endpoint.and_then(|e| BY_ENDPOINT.get(e as usize)) {
            s.set_all(attributes);
        }
        s.set("gateway.request_id", ctx.request_id.as_str());
        s.set("http.response.status_code", i64::from(ctx.status));
        if let Some(who) = &ctx.identity {
            s.set("gateway.key.id", who.key.id.as_str());
            s.set("gateway.account.id", who.user.id.as_str());
        }
        match self.answered.take() {
            // The deployment that answered: the one `ctx.deployment` names, when it is set.
            Some(a) => {
                s.set_all(&a.answer);
                if let (None, Some(model)) = (&a.model, &ctx.model) {
                    s.set("gen_ai.response.model", model);
                }
            }
            None => {
                if let Some(d) = &ctx.deployment {
                    s.set("gateway.deployment", d.as_str());
                }
            }
        }
        if ctx.input_tokens > 0 || ctx.output_tokens > 0 {
            s.set("gen_ai.usage.input_tokens", ctx.input_tokens as i64);
            s.set("gen_ai.usage.output_tokens", ctx.output_tokens as i64);
            s.set(
                "gen_ai.usage.cache_read.input_tokens",
                self.cached_tokens as i64,
            );
        }
        if !self.finish_reasons.is_empty() {
            s.set(
                "gen_ai.response.finish_reasons",
                self.finish_reasons.as_slice(),
            );
        }
        if let Some(ms) = ctx.ttfb_ms {
            let at = self.started + Duration::from_millis(ms);
            s.event(
                "gateway.first_byte",
                at,
                &[("gateway.ttfb_ms", Attr::Int(ms as i64))],
            );
        }
        if let Some(at) = self.settled_at {
            s.event("gateway.settle", at, &[]);
        }
        if let Some(e) = ctx.endpoint {
            match (operation(e), ctx.model.as_deref()) {
                (Some(op), Some(model)) => s.set_name_spaced(op, model),
                _ => s.set_name_spaced(method_of(e), e.path()),
            }
        }
        if let Some(code) = ctx.error_code {
            s.set("error.type", code);
            s.set("gateway.error_code", code);
        }
        if ctx.status >= 500 || (ctx.error_code.is_some() && ctx.status >= 400) {
            s.error = Some(Cow::Borrowed(ctx.error_code.unwrap_or("error")));
        }
        ended(self.telemetry, s);
    }
}

/// A request whose handling stopped before it finished (its task dropped, as at a forced
/// stop) still ends its server span, so that the child spans already exported keep their
/// parent.
impl Drop for RequestTrace {
    fn drop(&mut self) {
        if let Some(mut s) = self.server.take() {
            s.set("error.type", "cancelled");
            s.error = Some(Cow::Borrowed("cancelled"));
            ended(self.telemetry, s);
        }
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
