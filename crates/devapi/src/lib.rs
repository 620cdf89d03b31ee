//! The developer API: a Pingora `ProxyHttp` service. This file is the table of contents of one
//! request's walk; each step lives in its own module:
//!
//! `route` (surface, aliases) → `pipeline` (checks 1–8) → `routing` (deployments) → `items`
//! (what a Responses request refers to of earlier answers: the account's own, resolved for
//! translated deployments) → `shape` (the request translated for deployments of the other
//! style) → quota reserve (check 9) → `forward` (exchange, streaming, answers shaped into the
//! client's style, their Responses ids recorded) → `settle` (exactly once).
//!
//! The service is a Pingora `HttpServerApp` of its own (`DevApi::process_new_http`): it reads
//! the head, answers the request itself and hands the connection back for the next one. The
//! body has to be read before routing (the model is in it), and Pingora 0.9 cannot re-send a
//! read body larger than its 64 KiB retry buffer through the stock proxy path.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod accesslog;
pub mod affinity;
pub mod auth;
pub mod cloud;
pub mod conn_limits;
pub mod ctx;
pub mod error;
pub mod forward;
pub mod http1;
pub mod in_flight;
pub mod items;
pub mod local;
pub mod pipeline;
pub mod pool;
pub mod query;
pub mod rate_headers;
pub mod ready;
pub mod respond;
pub mod route;
pub mod routing;
pub mod sanitize;
pub mod settle;
pub mod shape;
pub mod sse;
pub mod state;
pub mod tokens;
pub mod trace;
pub mod upstream;
pub mod usage;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use pingora_core::apps::{HttpPersistentSettings, HttpServerApp, ReusedHttpStream};
use pingora_core::protocols::http::ServerSession;
use pingora_core::server::ShutdownWatch;
use tokio::sync::Notify;

use crate::ctx::RequestCtx;
use crate::error::ApiError;
use crate::pipeline::{Admitted, Stop};
use crate::route::{Endpoint, Route};
use crate::settle::{new_event, InFlight, Reason};
use crate::state::SharedApiState;
use gateway_core::quota::{Denied, RateView};
use gateway_core::util::new_id;

/// The downstream HTTP session one developer request is read from and answered on.
pub type Session = ServerSession;

/// The developer-API service: a Pingora HTTP application of its own, not a `ProxyHttp` behind
/// `pingora_proxy`. Every request is answered here (the body has to be read before routing,
/// and the exchange with the provider is the gateway's own), so the proxy's phases, its
/// per-request session wrapper and its large per-request state machine were all overhead: the
/// state machine alone was copied into each request's task.
pub struct DevApi {
    pub state: SharedApiState,
    /// Set when the service shuts down: kept-alive connections stop waiting for a next request.
    shutting_down: AtomicBool,
    shutdown: Notify,
}

impl DevApi {
    pub fn new(state: SharedApiState) -> DevApi {
        DevApi {
            state,
            shutting_down: AtomicBool::new(false),
            shutdown: Notify::new(),
        }
    }

    fn new_ctx(key_memo: Box<crate::auth::KeyMemo>) -> RequestCtx {
        RequestCtx {
            key_memo,
            request_id: new_id("req"),
            started: Instant::now(),
            endpoint: None,
            model: None,
            identity: None,
            status: 0,
            error_code: None,
            input_tokens: 0,
            output_tokens: 0,
            deployment: None,
            rate: RateView::default(),
            ttfb_ms: None,
            trace: None,
        }
    }

    /// Reads the next request head on a (possibly kept-alive) connection; false when there is
    /// none to serve (closed, bad head answered with 400, or the service is shutting down).
    async fn read_head(&self, session: &mut Session) -> bool {
        let read = tokio::select! {
            // Biased: a request already buffered is served before a shutdown is noticed.
            biased;
            read = session.read_request() => read,
            _ = self.shutdown.notified() => return false,
        };
        match read {
            Ok(true) => {}
            Ok(false) => return false,
            Err(e) => {
                if matches!(e.etype, pingora_error::ErrorType::InvalidHTTPHeader) {
                    let _ = session.respond_error(400).await;
                }
                session.shutdown().await;
                return false;
            }
        }
        if session.req_header().method == http::Method::CONNECT {
            let _ = session.respond_error(405).await;
            session.shutdown().await;
            return false;
        }
        true
    }

    /// Answers one request (`request_filter` of the proxy this replaced) and records it.
    async fn serve(&self, session: &mut Session, ctx: &mut RequestCtx) {
        let _in_flight = crate::in_flight::InFlightGuard::enter();
        ctx.trace = crate::trace::begin(session);
        // Boxed (as are the large futures below it): an async state machine is moved by value
        // when it is built, and a request's nested states inline would be copied in `memcpy`
        // at every step.
        match Box::pin(self.handle(session, ctx)).await {
            Ok(()) => {}
            Err((Stop::ClientGone, _)) => ctx.status = 499,
            Err((Stop::Api(err), style_b)) => {
                ctx.status = err.status();
                ctx.error_code = Some(err.code());
                respond::error(session, &err, style_b, &ctx.request_id, &ctx.rate).await;
            }
        }
        crate::affinity::request_done(session);
        crate::accesslog::developer_request(ctx, self.state.config.load().server.access_log);
        if let Some(trace) = ctx.trace.take() {
            trace.finish(ctx);
        }
    }
}

#[async_trait]
impl HttpServerApp for DevApi {
    async fn process_new_http(
        self: &Arc<Self>,
        mut session: ServerSession,
        shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        if !self.read_head(&mut session).await {
            return None;
        }
        if *shutdown.borrow() || self.shutting_down.load(Ordering::Acquire) {
            // Shutting down soon: no next request on this connection.
            session.set_keepalive(None);
        }
        // What the connection's previous request left: the key it presented and its hash.
        let key_memo = session
            .take_connection_user_context()
            .and_then(|c| c.downcast::<crate::auth::KeyMemo>().ok())
            .unwrap_or_default();
        let mut ctx = DevApi::new_ctx(key_memo);
        self.serve(&mut session, &mut ctx).await;
        let mut settings = HttpPersistentSettings::for_session(&session);
        settings.set_user_context(ctx.key_memo);
        session
            .finish()
            .await
            .ok()
            .flatten()
            .map(|s| ReusedHttpStream::from_reusable_stream(s, settings))
    }

    async fn http_cleanup(&self) {
        self.shutting_down.store(true, Ordering::Release);
        // Kept-alive connections waiting for a next request end now.
        self.shutdown.notify_waiters();
    }
}

impl DevApi {
    /// Runs one request, in the spec's order: the route, checks 1–8 (`admit`), the plan, the
    /// reservation (check 9, `reserve`), then the answer and its settlement (`serve`). An `Err`
    /// carries what to answer and whether in style B.
    async fn handle(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<(), (Stop, bool)> {
        keep_pipelined_bytes(session);
        let cfg = self.state.config();
        let asked = match Asked::of(session) {
            Ok(asked) => asked,
            Err(Route::Health) => {
                ctx.status = 200;
                let style_b = route::style_b_path(session.req_header().uri.path());
                let extra = respond::gateway_headers(&ctx.rate, style_b, &ctx.request_id);
                respond::json(
                    session,
                    200,
                    Bytes::from_static(b"{\"ok\":true}"),
                    &ctx.request_id,
                    &extra,
                )
                .await;
                return Ok(());
            }
            Err(Route::Ready) => {
                let (status, body) = crate::ready::probe(&self.state).await;
                ctx.status = status;
                respond::json(session, status, body, &ctx.request_id, &[]).await;
                return Ok(());
            }
            Err(_) => {
                let style_b = route::style_b_path(session.req_header().uri.path());
                return Err((ApiError::NotFound.into(), style_b));
            }
        };
        let style_b = asked.style_b;
        let fail = |e: ApiError| (Stop::Api(e), style_b);

        // One span from the first check to the reservation (check 9), which is an event on it.
        let mut phase = ctx.trace.as_ref().map(|t| t.phase("gateway.admission"));
        // Held until the request ends: its body is in memory until then.
        let (mut adm, _body_permit) = match self.admit(session, ctx, &cfg, &asked).await {
            Ok(admitted) => admitted,
            Err(stop) => {
                if let Some(phase) = phase {
                    phase.end(Some(stop_code(&stop)));
                }
                return Err((stop, style_b));
            }
        };
        if let Some(t) = ctx.trace.as_deref_mut() {
            t.admitted(&adm);
        }

        // Where it would go, what it refers to and how it is translated, before reserving
        // anything for it.
        let targets = match self.plan(&cfg, &mut adm).await {
            Ok(targets) => targets,
            Err(e) => {
                if let Some(phase) = phase {
                    phase.end(Some(e.code()));
                }
                return Err(fail(e));
            }
        };

        if let Some(phase) = &mut phase {
            phase.mark("gateway.quota.reserve");
        }
        let reserved = self.reserve(ctx, &cfg, &adm).await;
        if let Some(phase) = phase {
            phase.end(reserved.as_ref().err().map(ApiError::code));
        }
        let mut flight = reserved.map_err(fail)?;
        let result = match targets {
            Plan::Local => {
                self.answer_locally(session, ctx, &cfg, &adm, style_b, &mut flight)
                    .await
            }
            Plan::Forward(attempts) => {
                let reply = forward::Reply {
                    request_id: &ctx.request_id,
                    style_b,
                    rate: &ctx.rate,
                    trace: ctx.trace.as_deref(),
                };
                Box::pin(forward::forward(
                    &self.state,
                    session,
                    &adm,
                    &attempts,
                    &mut flight,
                    &reply,
                ))
                .await
            }
        };
        if let Some(t) = ctx.trace.as_deref_mut() {
            t.settling();
        }
        settle(ctx, flight, adm.endpoint, result).map_err(fail)
    }

    /// The plan: where the request would go, what it refers to and how it is translated.
    async fn plan(
        &self,
        cfg: &gateway_core::config::Config,
        adm: &mut Admitted,
    ) -> Result<Plan, ApiError> {
        let mut targets = self.targets(cfg, adm)?;
        if let Plan::Forward(attempts) = &mut targets {
            items::check(&self.state, adm, &attempts.targets).await?;
            attempts.translated = shape::translate_request(adm, &attempts.targets)?;
        }
        Ok(targets)
    }

    /// Checks 1–8: the key, the gate, then the body (read only if the key could be admitted)
    /// and the checks that need it.
    async fn admit(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        cfg: &gateway_core::config::Config,
        asked: &Asked,
    ) -> Result<(Admitted, pipeline::BodyPermit), Stop> {
        // Checks 1–5.
        let identity = pipeline::authenticate(&self.state, session, &mut ctx.key_memo).await?;
        ctx.identity = Some(identity.clone());
        let endpoint = pipeline::gate(
            &identity,
            asked.sensitive_query,
            asked.endpoint,
            asked.method_ok,
        )?;
        ctx.endpoint = Some(endpoint);

        // Checks 6–8 need the body. A large one is read only if the key could be admitted at
        // all: a key with nothing left cannot make the gateway read and parse megabytes.
        if !endpoint.is_get() && pipeline::large_body(session) {
            let tokens = endpoint != Endpoint::CountTokens;
            if let Err(denied) = self
                .state
                .quota
                .precheck(&cfg.quota, &identity, tokens)
                .await
            {
                // The body stays unread: the connection cannot be reused.
                session.set_keepalive(None);
                return Err(denied_error(denied).into());
            }
        }
        let (body, body_permit) = if endpoint.is_get() {
            (Bytes::new(), pipeline::BodyPermit::none())
        } else {
            pipeline::read_body(
                session,
                cfg.server.max_body_bytes,
                cfg.server.limits.max_body_bytes_in_flight,
            )
            .await?
        };
        let mut adm = pipeline::admit(&self.state, cfg, endpoint, identity, body).await?;
        if endpoint == Endpoint::Model {
            // A retrieval names its model in the path, not in a body.
            adm.model_name = route::model_id(session.req_header().uri.path()).unwrap_or_default();
        }
        if !adm.model_name.is_empty() {
            ctx.model = Some(adm.model_name.clone());
        }
        Ok((adm, body_permit))
    }

    /// Check 9: the reservation (after the per-minute limits), and the settlement guard that
    /// owns it from here on.
    async fn reserve(
        &self,
        ctx: &mut RequestCtx,
        cfg: &gateway_core::config::Config,
        adm: &Admitted,
    ) -> Result<Box<InFlight>, ApiError> {
        let identity = &adm.identity;
        let reservation = match self
            .state
            .quota
            .reserve(
                &cfg.quota,
                identity,
                adm.reserved_input(),
                adm.output_reserve,
                adm.weights(),
            )
            .await
        {
            Ok(r) => r,
            Err((denied, mut rate)) => {
                if let Denied::RateLimited {
                    retry_after_secs,
                    what,
                } = denied
                {
                    crate::rate_headers::refused(&mut rate, what, retry_after_secs);
                }
                ctx.rate = rate;
                return Err(denied_error(denied));
            }
        };
        ctx.rate = reservation.rate;
        let mut event = new_event(
            &identity.user.id,
            &identity.key.id,
            &adm.model_name,
            adm.endpoint.name(),
        );
        event.reasoning_effort = adm.reasoning_effort.clone();
        // Boxed: the guard is some thousand bytes, and it passes through several futures'
        // states by value on its way to settlement.
        let mut flight = Box::new(InFlight::new(
            self.state.clone(),
            reservation,
            ctx.started,
            event,
            adm.input_estimate,
        ));
        if adm.endpoint == Endpoint::CountTokens {
            // Counting tokens is not generation: it costs one request and no tokens.
            flight.waive_input_estimate();
        }
        if ctx
            .trace
            .as_deref()
            .is_some_and(trace::RequestTrace::recording)
        {
            flight.want_finish_reasons();
        }
        Ok(flight)
    }

    /// Decides whether the gateway answers itself or which deployments to try. A chat or
    /// Responses request for an Anthropic-style model, a messages request for an OpenAI-style
    /// model and a Responses request for a provider without `/v1/responses` are served by
    /// translation, which `handle` runs next, before anything is reserved.
    fn targets(
        &self,
        cfg: &gateway_core::config::Config,
        adm: &Admitted,
    ) -> Result<Plan, ApiError> {
        use gateway_core::domain::ProviderStyle;
        match adm.endpoint {
            Endpoint::Models | Endpoint::ModelInfo => Ok(Plan::Local),
            // An unknown id, or one the key may not see, is not found before anything is
            // reserved for it.
            Endpoint::Model => local::visible_model(cfg, &adm.identity, &adm.model_name)
                .map(|_| Plan::Local)
                .ok_or_else(|| ApiError::UnknownModel(adm.model_name.clone())),
            Endpoint::Search | Endpoint::WebFetch => {
                let provider = if adm.endpoint == Endpoint::Search {
                    cfg.tools.search.as_ref()
                } else {
                    cfg.tools.web_fetch.as_ref()
                };
                let provider = provider.ok_or(ApiError::EndpointNotEnabled)?;
                let targets = self.state.routing.plan_tool(provider)?;
                Ok(Plan::Forward(forward::Attempts {
                    targets,
                    translated: shape::Translated::none(),
                    deadline: cfg.routing.failover_deadline,
                }))
            }
            endpoint => {
                let model = adm.model.as_ref().ok_or(ApiError::ServerError)?;
                let style = model.style();
                if endpoint == Endpoint::CountTokens && style != ProviderStyle::Anthropic {
                    return Ok(Plan::Local);
                }
                if !local::endpoints_for(style).contains(&endpoint) {
                    return Err(ApiError::invalid(
                        "unsupported_endpoint",
                        format!("Model {:?} does not support {}.", model.id, endpoint.path()),
                    ));
                }
                // A model may mix provider styles; keep the deployments that can serve this
                // endpoint, natively or by translation.
                let targets = self.state.routing.plan(
                    model,
                    |d| shape::Crossing::of(endpoint, &d.provider).is_some(),
                    cfg.routing.max_attempts,
                )?;
                Ok(Plan::Forward(forward::Attempts {
                    targets,
                    translated: shape::Translated::none(),
                    deadline: cfg.routing.failover_deadline,
                }))
            }
        }
    }

    async fn answer_locally(
        &self,
        session: &mut Session,
        ctx: &RequestCtx,
        cfg: &gateway_core::config::Config,
        adm: &Admitted,
        style_b: bool,
        flight: &mut InFlight,
    ) -> Result<forward::Outcome, ApiError> {
        let who = &adm.identity;
        let body = match adm.endpoint {
            Endpoint::Models => {
                let query = session.req_header().uri.query();
                local::models(cfg, who, style_b, query)?
            }
            Endpoint::Model => local::model(cfg, who, &adm.model_name, style_b)
                .ok_or_else(|| ApiError::UnknownModel(adm.model_name.clone()))?,
            Endpoint::ModelInfo => local::model_info(cfg, who),
            _ => serde_json::json!({ "input_tokens": adm.input_estimate }),
        };
        // Listings and local counts cost one request and no tokens.
        flight.waive_input_estimate();
        flight.costs_no_tokens();
        flight.mark_first_byte();
        let extra = respond::gateway_headers(&ctx.rate, style_b, &ctx.request_id);
        respond::json(
            session,
            200,
            Bytes::from(body.to_string()),
            &ctx.request_id,
            &extra,
        )
        .await;
        Ok(forward::Outcome {
            status: 200,
            reason: Reason::Complete,
            error_code: None,
        })
    }
}

/// The error code a refused admission answers with.
fn stop_code(stop: &Stop) -> &'static str {
    match stop {
        Stop::Api(e) => e.code(),
        Stop::ClientGone => "client_disconnect",
    }
}

/// The answer to a refused reservation.
fn denied_error(denied: Denied) -> ApiError {
    match denied {
        Denied::InsufficientQuota => ApiError::InsufficientQuota,
        Denied::RateLimited {
            retry_after_secs,
            what,
        } => ApiError::RateLimited {
            retry_after_secs,
            what,
        },
        Denied::Unavailable => ApiError::QuotaUnavailable,
    }
}

enum Plan {
    Local,
    Forward(forward::Attempts),
}

/// Settles the request with what its answer showed, and notes the outcome for the access log.
fn settle(
    ctx: &mut RequestCtx,
    mut flight: Box<InFlight>,
    endpoint: Endpoint,
    result: Result<forward::Outcome, ApiError>,
) -> Result<(), ApiError> {
    if endpoint == Endpoint::CountTokens {
        // Whatever the provider's count answer looks like, counting costs no tokens.
        flight.costs_no_tokens();
    }
    match result {
        Ok(outcome) => {
            let (status, reason, error_code) =
                flight.judge(outcome.status, outcome.reason, outcome.error_code);
            ctx.status = status;
            ctx.error_code = error_code;
            ctx.deployment = flight.deployment();
            ctx.ttfb_ms = flight.ttfb_ms();
            let finish_reasons = flight.finish_reasons();
            let used = flight.finish(status, reason, error_code);
            if let Some(t) = ctx.trace.as_deref_mut() {
                t.settled(used.cached_tokens, finish_reasons);
            }
            ctx.input_tokens = used.input_tokens;
            ctx.output_tokens = used.output_tokens;
            Ok(())
        }
        Err(e) => {
            // Nothing reached the provider or the client: release the reservation.
            flight.waive_input_estimate();
            flight.finish(e.status(), Reason::Unrouted, Some(e.code()));
            Err(e)
        }
    }
}

/// What the request line asked for, read while the request header is borrowed (no copies of
/// the method, path or query). The query is judged here but refused in check 2's place, after
/// the key. `Err` is a route that is not an API endpoint.
struct Asked {
    endpoint: Option<Endpoint>,
    method_ok: bool,
    style_b: bool,
    sensitive_query: bool,
}

impl Asked {
    fn of(session: &Session) -> Result<Asked, Route> {
        let req = session.req_header();
        match route::classify(req.method.as_str(), req.uri.path()) {
            Route::Api {
                endpoint,
                method_ok,
                style_b,
            } => Ok(Asked {
                endpoint,
                method_ok,
                style_b,
                sensitive_query: req.uri.query().is_some_and(query::has_sensitive_param),
            }),
            other => Err(other),
        }
    }
}

/// A client may send its next request before this one is answered (pipelining), or as soon as
/// it has the answer whole while the relay still watches the connection for a disconnect: with
/// pipelining on, Pingora keeps those bytes for the next request instead of dropping them (the
/// next request would then arrive cut).
fn keep_pipelined_bytes(session: &mut Session) {
    if let ServerSession::H1(h1) = session {
        h1.set_pipelining_enabled(true);
        // The head is in: no read deadline until a body is read (a streamed answer watches
        // the connection for a disconnect for as long as it runs).
        crate::affinity::set_phase(h1.stream(), crate::conn_limits::Phase::Serving);
    }
}
